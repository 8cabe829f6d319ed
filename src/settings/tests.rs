use std::collections::HashMap;

use clap::Parser;

use super::*;
use crate::service::HeaderMode;

fn resolve(argv: &[&str], env: &[(&str, &str)]) -> Result<Settings, SettingsError> {
    let mut full = vec!["sluice", "serve"];
    full.extend_from_slice(argv);
    let cli = Cli::try_parse_from(full).expect("arguments parse");
    let Command::Serve(args) = cli.command else {
        panic!("not serve");
    };
    let env: HashMap<String, String> = env
        .iter()
        .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
        .collect();
    Settings::resolve(&args, &|name| env.get(name).cloned())
}

#[test]
fn defaults() {
    let settings = resolve(&[], &[]).expect("defaults resolve");
    assert_eq!(settings.config, PathBuf::from("config/"));
    assert_eq!(settings.grpc_addr.to_string(), "0.0.0.0:8081");
    assert_eq!(settings.http_addr.to_string(), "0.0.0.0:8080");
    assert_eq!(settings.response.header_mode, HeaderMode::None);
    assert!((settings.limiter.near_limit_ratio - 0.8).abs() < f32::EPSILON);
}

#[test]
fn reference_variables_map_and_flags_win() {
    let env = [
        ("RUNTIME_ROOT", "/srv/runtime"),
        ("RUNTIME_SUBDIRECTORY", "ratelimit"),
        ("GRPC_PORT", "9091"),
        ("PORT", "9090"),
        ("SHADOW_MODE", "true"),
        ("LIMIT_RESPONSE_HEADERS_ENABLED", "1"),
        ("LIMIT_LIMIT_HEADER", "X-Limit"),
        ("NEAR_LIMIT_RATIO", "0.5"),
        ("USE_STATSD", "false"),
    ];
    let settings = resolve(&[], &env).expect("resolves");
    assert_eq!(
        settings.config,
        PathBuf::from("/srv/runtime/ratelimit/config")
    );
    assert_eq!(settings.grpc_addr.port(), 9091);
    assert_eq!(settings.http_addr.port(), 9090);
    assert!(settings.response.global_shadow_mode);
    assert_eq!(settings.response.header_mode, HeaderMode::Reference);
    assert_eq!(settings.response.limit_header, "X-Limit");
    assert!((settings.limiter.near_limit_ratio - 0.5).abs() < f32::EPSILON);
    assert_eq!(settings.ignored_env, vec!["USE_STATSD".to_owned()]);

    let flags = resolve(
        &["--shadow-mode", "false", "--grpc-addr", "127.0.0.1:1"],
        &env,
    )
    .expect("resolves");
    assert!(!flags.response.global_shadow_mode);
    assert_eq!(flags.grpc_addr.to_string(), "127.0.0.1:1");
}

#[test]
fn bad_reference_values_are_named() {
    let error = resolve(&[], &[("SHADOW_MODE", "yes")]).expect_err("rejects");
    assert!(error.to_string().contains("SHADOW_MODE"), "{error}");
    let error = resolve(&[], &[("GRPC_PORT", "http")]).expect_err("rejects");
    assert!(error.to_string().contains("GRPC_PORT"), "{error}");
}

#[test]
fn redis_socket_type_matches_the_url() {
    let unix = resolve(
        &[],
        &[
            ("REDIS_SOCKET_TYPE", "unix"),
            ("REDIS_URL", "/run/redis.sock"),
        ],
    )
    .expect("a socket path");
    assert_eq!(unix.redis.url, "/run/redis.sock");
    resolve(
        &[],
        &[("REDIS_SOCKET_TYPE", "tcp"), ("REDIS_URL", "redis:6379")],
    )
    .expect("tcp");
    for (kind, url) in [
        ("unix", "redis:6379"),
        ("tcp", "/run/redis.sock"),
        ("udp", "redis:6379"),
    ] {
        let error =
            resolve(&[], &[("REDIS_SOCKET_TYPE", kind), ("REDIS_URL", url)]).expect_err("rejects");
        assert!(error.to_string().contains("REDIS_SOCKET_TYPE"), "{error}");
    }
    // A flag's URL wins over the reference's pair.
    resolve(
        &["--redis-url", "redis://a:6379"],
        &[
            ("REDIS_SOCKET_TYPE", "unix"),
            ("REDIS_URL", "/run/redis.sock"),
        ],
    )
    .expect("the flag wins");
}

#[test]
fn connection_age_reads_go_durations_and_zero_turns_it_off() {
    let age = |argv: &[&str], env: &[(&str, &str)]| {
        resolve(argv, env)
            .expect("resolves")
            .grpc_connection_age
            .map(|age| (age.max.as_secs(), age.grace.as_secs()))
    };
    assert_eq!(
        age(&[], &[]),
        Some((86_400, 3_600)),
        "the reference's defaults"
    );
    let env = [
        ("GRPC_MAX_CONNECTION_AGE", "5m"),
        ("GRPC_MAX_CONNECTION_AGE_GRACE", "1m30s"),
    ];
    assert_eq!(age(&[], &env), Some((300, 90)));
    assert_eq!(
        age(&["--grpc-max-connection-age", "2m"], &env),
        Some((120, 90))
    );
    assert_eq!(age(&[], &[("GRPC_MAX_CONNECTION_AGE", "0s")]), None);
    let bad = resolve(&[], &[("GRPC_MAX_CONNECTION_AGE", "5 minutes")]).expect_err("refused");
    assert_eq!(bad.name, "GRPC_MAX_CONNECTION_AGE");
}

#[test]
fn config_source_follows_config_type() {
    let source = |env: &[(&str, &str)]| resolve(&[], env).map(|s| s.config_source);
    assert_eq!(source(&[]).expect("files"), ConfigSource::Files);
    let ConfigSource::Xds(xds) = source(&[
        ("CONFIG_TYPE", "GRPC_XDS_SOTW"),
        ("CONFIG_GRPC_XDS_SERVER_URL", "envoy-gateway:18001"),
        ("CONFIG_GRPC_XDS_NODE_ID", "envoy-ratelimit"),
        (
            "CONFIG_GRPC_XDS_CLIENT_ADDITIONAL_HEADERS",
            "X-Tenant:blue,x-zone:a",
        ),
        ("XDS_CLIENT_BACKOFF_INITIAL_INTERVAL", "1s"),
    ])
    .expect("xds") else {
        panic!("not xds");
    };
    assert_eq!(xds.server, "envoy-gateway:18001");
    assert_eq!(xds.node_id, "envoy-ratelimit");
    assert_eq!(
        xds.headers,
        [
            ("x-tenant".to_owned(), "blue".to_owned()),
            ("x-zone".to_owned(), "a".to_owned())
        ]
    );
    assert_eq!(xds.backoff.initial.as_secs(), 1);
    assert!(!xds.force_start);
    for (name, value) in [
        ("CONFIG_TYPE", "GRPC_XDS_DELTA"),
        ("XDS_CLIENT_BACKOFF_RANDOM_FACTOR", "2"),
        ("CONFIG_GRPC_XDS_CLIENT_ADDITIONAL_HEADERS", "no-colon"),
    ] {
        let mut env = vec![("CONFIG_TYPE", "GRPC_XDS_SOTW")];
        env.retain(|(n, _)| *n != name);
        env.push((name, value));
        let error = source(&env).expect_err("refused");
        assert_eq!(error.name, name, "{error}");
    }
}
