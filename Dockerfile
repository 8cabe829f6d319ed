# syntax=docker/dockerfile:1
# Sluice image: a static-ish Rust binary on distroless (glibc + libgcc, no shell), non-root.
#   docker build -t sluice .
#   docker run -p 8081:8081 -p 8080:8080 sluice            # serves config/ (example rules)
#   docker run -v $PWD/rules:/etc/sluice/rules:ro sluice   # your rules
# The build needs no protoc (build.rs uses a vendored one).

FROM rust:1-bookworm AS build
WORKDIR /src
COPY Cargo.toml Cargo.lock build.rs ./
COPY proto ./proto
COPY src ./src
# Not built, but the manifest names them: the workspace member tests/support, the test
# binaries under tests/ and the [[bench]] targets must exist for it to parse.
COPY tests ./tests
COPY benches ./benches
RUN --mount=type=cache,target=/usr/local/cargo/registry \
    --mount=type=cache,target=/src/target \
    cargo build --release --locked --bin sluice \
    && cp target/release/sluice /usr/local/bin/sluice

FROM gcr.io/distroless/cc-debian12:nonroot
COPY --from=build /usr/local/bin/sluice /usr/local/bin/sluice
COPY config/ /etc/sluice/rules/
# distroless "nonroot": uid/gid 65532, as the Helm chart's securityContext expects.
USER 65532:65532
# 8081: gRPC (Envoy's rate limit service, grpc.health.v1); 8080: HTTP (probes, metrics).
EXPOSE 8081 8080
ENTRYPOINT ["/usr/local/bin/sluice"]
CMD ["serve", "--config", "/etc/sluice/rules"]
