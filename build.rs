//! Compiles the Envoy RLS protos with a vendored protoc, so no system protoc is needed.

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let protoc = protoc_bin_vendored::protoc_bin_path()?;
    // Build scripts are single-threaded; prost-build reads PROTOC from the environment.
    std::env::set_var("PROTOC", protoc);
    let include = protoc_bin_vendored::include_path()?;
    tonic_prost_build::configure()
        .build_client(true)
        .build_server(true)
        .codec_path("crate::codec::RlsCodec")
        .file_descriptor_set_path(
            std::path::PathBuf::from(std::env::var("OUT_DIR")?).join("rls_descriptor.bin"),
        )
        .compile_protos(
            &[std::path::Path::new(
                "proto/envoy/service/ratelimit/v3/rls.proto",
            )],
            &[std::path::Path::new("proto"), include.as_path()],
        )?;
    // The xDS config source: the aggregated discovery service (client for `serve`,
    // server for the tests' management server) and the rate limit config resource,
    // with tonic's own protobuf codec.
    tonic_prost_build::configure()
        .build_client(true)
        .build_server(true)
        .compile_protos(
            &[
                std::path::Path::new("proto/envoy/service/discovery/v3/discovery.proto"),
                std::path::Path::new("proto/ratelimit/config/ratelimit/v3/rls_conf.proto"),
            ],
            &[std::path::Path::new("proto"), include.as_path()],
        )?;
    println!("cargo:rerun-if-changed=proto");
    Ok(())
}
