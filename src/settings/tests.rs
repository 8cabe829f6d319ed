use std::collections::HashMap;
use std::path::Path;

use clap::Parser;

use super::*;
use crate::service::HeaderMode;
use crate::store::redis::RedisOptions;
use crate::telemetry::OtlpProtocol;

fn resolve(argv: &[&str], env: &[(&str, &str)]) -> Result<Settings, SettingsError> {
    let mut full = vec!["sluice", "serve"];
    full.extend_from_slice(argv);
    let cli = Cli::try_parse_from(full).expect("arguments parse");
    let Command::Serve(args) = cli.into_command() else {
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

#[test]
fn reference_values_that_change_what_is_limited_are_refused_by_name() {
    for (name, value) in [
        ("BACKEND_TYPE", "memcache"),
        ("REDIS_PERSECOND", "true"),
        ("REDIS_PERSECOND", "1"),
        ("GRPC_UDS", "/tmp/ratelimit.sock"),
    ] {
        let error = resolve(&[], &[(name, value)]).expect_err("refused");
        assert_eq!(error.name, name, "{error}");
        assert!(error.to_string().contains(name), "{error}");
    }
    // The values Sluice honours are accepted, and not logged as ignored either.
    let settings = resolve(
        &[],
        &[
            ("BACKEND_TYPE", "redis"),
            ("REDIS_PERSECOND", "false"),
            ("GRPC_UDS", ""),
        ],
    )
    .expect("harmless values");
    assert!(
        settings.ignored_env.is_empty(),
        "{:?}",
        settings.ignored_env
    );
}

#[test]
fn each_reference_variable_has_one_status() {
    let read_and_ignored = ["LOCAL_CACHE_SIZE_IN_BYTES", "CACHE_KEY_PREFIX"];
    for name in read_and_ignored {
        assert!(!reference::IGNORED.contains(&name), "{name}");
    }
    for refusal in reference::REFUSED {
        assert!(
            !reference::IGNORED.contains(&refusal.name),
            "{}",
            refusal.name
        );
    }
    // Parsed once, then ignored, is no longer: any value is simply ignored.
    let settings = resolve(&[], &[("HEALTHY_WITH_AT_LEAST_ONE_CONFIG_LOADED", "yes")])
        .expect("ignored whatever its value");
    assert_eq!(
        settings.ignored_env,
        vec!["HEALTHY_WITH_AT_LEAST_ONE_CONFIG_LOADED".to_owned()]
    );
}

#[test]
fn cache_key_prefix_from_the_flag_or_the_reference() {
    let prefix = |argv: &[&str], env: &[(&str, &str)]| {
        resolve(argv, env).map(|settings| settings.redis.key_prefix.as_str().to_owned())
    };
    assert_eq!(prefix(&[], &[]).expect("none"), "");
    assert_eq!(
        prefix(&[], &[("CACHE_KEY_PREFIX", "tenant-a:")]).expect("reference"),
        "tenant-a:"
    );
    assert_eq!(
        prefix(
            &["--cache-key-prefix", "b_"],
            &[("CACHE_KEY_PREFIX", "tenant-a:")]
        )
        .expect("the flag wins"),
        "b_"
    );
    // A brace would make the prefix choose every key's Redis Cluster slot.
    let error = prefix(&[], &[("CACHE_KEY_PREFIX", "{a}")]).expect_err("refused");
    assert!(error.to_string().contains("CACHE_KEY_PREFIX"), "{error}");
    let error = prefix(&["--cache-key-prefix", "a{"], &[]).expect_err("refused");
    assert!(error.to_string().contains("cache-key-prefix"), "{error}");
    let long = "p".repeat(129);
    let error = prefix(&[], &[("CACHE_KEY_PREFIX", long.as_str())]).expect_err("too long");
    assert!(error.to_string().contains("at most 128 bytes"), "{error}");
}

#[test]
fn redis_tls_files_from_the_reference() {
    let env = [
        ("REDIS_URL", "redis:6380"),
        ("REDIS_TLS", "true"),
        ("REDIS_TLS_CACERT", "/tls/ca.pem"),
        ("REDIS_TLS_CLIENT_CERT", "/tls/client.pem"),
        ("REDIS_TLS_CLIENT_KEY", "/tls/client.key"),
        ("REDIS_TLS_SKIP_HOSTNAME_VERIFICATION", "true"),
    ];
    let settings = resolve(&[], &env).expect("resolves");
    let files = &settings.redis.tls_files;
    assert!(settings.redis.tls);
    assert_eq!(files.ca.as_deref(), Some(Path::new("/tls/ca.pem")));
    assert_eq!(files.cert.as_deref(), Some(Path::new("/tls/client.pem")));
    assert_eq!(files.key.as_deref(), Some(Path::new("/tls/client.key")));
    assert!(files.insecure_skip_hostname);

    let flags = resolve(&["--redis-tls-ca", "/flag/ca.pem"], &env).expect("resolves");
    assert_eq!(
        flags.redis.tls_files.ca.as_deref(),
        Some(Path::new("/flag/ca.pem"))
    );
    let error = resolve(&[], &[("REDIS_TLS_SKIP_HOSTNAME_VERIFICATION", "maybe")])
        .expect_err("not a boolean");
    assert!(error
        .to_string()
        .contains("REDIS_TLS_SKIP_HOSTNAME_VERIFICATION"));
}

#[test]
fn envoy_gateway_grpc_ca_name_is_the_client_ca() {
    let env = [
        ("GRPC_SERVER_USE_TLS", "true"),
        ("GRPC_SERVER_TLS_CERT", "/certs/tls.crt"),
        ("GRPC_SERVER_TLS_KEY", "/certs/tls.key"),
        ("GRPC_SERVER_TLS_CA_CERT", "/certs/ca.crt"),
    ];
    let tls = resolve(&[], &env).expect("resolves").grpc_tls.expect("TLS");
    assert_eq!(tls.client_ca.as_deref(), Some(Path::new("/certs/ca.crt")));
}

#[test]
fn prometheus_listener_from_use_prometheus() {
    let prometheus = |argv: &[&str], env: &[(&str, &str)]| {
        resolve(argv, env).map(|settings| settings.prometheus)
    };
    assert_eq!(
        prometheus(&[], &[("PROMETHEUS_ADDR", ":1")]).expect("off"),
        None
    );
    let on = prometheus(
        &[],
        &[
            ("USE_PROMETHEUS", "true"),
            ("PROMETHEUS_ADDR", ":19001"),
            ("PROMETHEUS_PATH", "/stats"),
        ],
    )
    .expect("on")
    .expect("a listener");
    assert_eq!(on.addr.to_string(), "0.0.0.0:19001");
    assert_eq!(on.path, "/stats");
    let default = prometheus(&[], &[("USE_PROMETHEUS", "1")])
        .expect("on")
        .expect("a listener");
    assert_eq!(
        (default.addr.to_string().as_str(), default.path.as_str()),
        ("0.0.0.0:9090", "/metrics")
    );
    let flag = prometheus(&["--prometheus-addr", "127.0.0.1:9"], &[])
        .expect("flag")
        .expect("a listener");
    assert_eq!(flag.addr.to_string(), "127.0.0.1:9");
    for (name, value) in [
        ("PROMETHEUS_ADDR", "nowhere"),
        ("PROMETHEUS_PATH", "metrics"),
    ] {
        let error =
            prometheus(&[], &[("USE_PROMETHEUS", "true"), (name, value)]).expect_err("refused");
        assert!(error.to_string().contains(name), "{error}");
    }
    // On the admin address the admin listener serves them at /metrics only.
    prometheus(
        &[],
        &[("USE_PROMETHEUS", "true"), ("PROMETHEUS_ADDR", ":8080")],
    )
    .expect("the admin address");
    prometheus(
        &[],
        &[
            ("USE_PROMETHEUS", "true"),
            ("PROMETHEUS_ADDR", ":8080"),
            ("PROMETHEUS_PATH", "/other"),
        ],
    )
    .expect_err("another path on the admin address");
}

#[test]
fn tracing_from_the_reference_variables() {
    let tracing =
        |argv: &[&str], env: &[(&str, &str)]| resolve(argv, env).map(|settings| settings.tracing);
    let grpc = [
        ("TRACING_ENABLED", "true"),
        ("TRACING_EXPORTER_PROTOCOL", "grpc"),
        ("OTEL_EXPORTER_OTLP_ENDPOINT", "collector:4317"),
        ("TRACING_SERVICE_NAME", "ratelimit"),
        ("TRACING_SERVICE_NAMESPACE", "envoy-gateway-system"),
        ("TRACING_SERVICE_INSTANCE_ID", "pod-1"),
        ("TRACING_SAMPLING_RATE", "0.25"),
    ];
    let export = tracing(&[], &grpc).expect("resolves").expect("exports");
    assert_eq!(export.protocol, OtlpProtocol::Grpc);
    assert_eq!(export.endpoint, "http://collector:4317");
    assert_eq!(export.service_name, "ratelimit");
    assert_eq!(
        export.service_namespace.as_deref(),
        Some("envoy-gateway-system")
    );
    assert_eq!(export.service_instance_id.as_deref(), Some("pod-1"));
    assert!((export.sampling_ratio - 0.25).abs() < f64::EPSILON);

    // TRACING_ENABLED=false wins over the endpoint; unset, the endpoint alone exports.
    let off = tracing(&[], &[("TRACING_ENABLED", "false"), grpc[2]]).expect("resolves");
    assert_eq!(off, None);
    let endpoint_only = tracing(&[], &[grpc[2]])
        .expect("resolves")
        .expect("exports");
    assert_eq!(endpoint_only.service_name, "sluice");
    assert!((endpoint_only.sampling_ratio - 1.0).abs() < f64::EPSILON);

    // OTLP/HTTP, the reference's default protocol: to the endpoint's /v1/traces.
    let http = tracing(
        &[],
        &[
            ("TRACING_ENABLED", "true"),
            ("OTEL_EXPORTER_OTLP_ENDPOINT", "collector:4318/"),
        ],
    )
    .expect("resolves")
    .expect("exports");
    assert_eq!(http.protocol, OtlpProtocol::Http);
    assert_eq!(http.endpoint, "http://collector:4318/v1/traces");
    let default = tracing(&[], &[("TRACING_ENABLED", "true")])
        .expect("resolves")
        .expect("exports");
    assert_eq!(default.endpoint, "http://localhost:4318/v1/traces");

    for (name, value) in [
        ("TRACING_SAMPLING_RATE", "1.5"),
        ("TRACING_SAMPLING_RATE", "-0.1"),
        ("TRACING_SAMPLING_RATE", "half"),
        ("TRACING_EXPORTER_PROTOCOL", "zipkin"),
    ] {
        let error = tracing(&[], &[(name, value)]).expect_err("refused");
        assert!(error.to_string().contains(name), "{error}");
    }
    let flag = tracing(
        &["--otlp-endpoint", "http://c:4317"],
        &[("TRACING_ENABLED", "false")],
    )
    .expect("resolves")
    .expect("the flag exports");
    assert_eq!(flag.endpoint, "http://c:4317");
}

#[test]
fn no_subcommand_is_serve_from_the_environment() {
    let command = Cli::try_parse_from(["/bin/ratelimit"])
        .expect("no arguments parse")
        .into_command();
    assert!(matches!(command, Command::Serve(_)));
}

#[test]
fn check_and_explain_read_merge_domain_config() {
    let env = |name: &str| (name == "MERGE_DOMAIN_CONFIG").then(|| "true".to_owned());
    assert!(load_options(None, &env).expect("resolves").merge_domains);
    assert!(
        !load_options(Some(false), &env)
            .expect("resolves")
            .merge_domains
    );
    let runtime = |name: &str| match name {
        "RUNTIME_ROOT" => Some("/data".to_owned()),
        "RUNTIME_SUBDIRECTORY" => Some("ratelimit".to_owned()),
        _ => None,
    };
    assert_eq!(
        config_path(None, &runtime),
        PathBuf::from("/data/ratelimit/config")
    );
}

#[test]
fn regions_from_the_flags() {
    let settings = resolve(
        &[
            "--store",
            "redis",
            "--redis-url",
            "redis://local:6379",
            "--region",
            "eu",
            "--peer-region",
            "us=redis://u:p@us:6379",
            "--peer-region",
            "ap=redis://ap:6379",
        ],
        &[("REDIS_AUTH", "secret")],
    )
    .expect("resolves");
    let regions = settings.regions.expect("regions");
    assert_eq!(regions.plan.local_name(), "eu");
    let names: Vec<&str> = regions.plan.names().iter().map(|n| &**n).collect();
    assert_eq!(names, ["ap", "eu", "us"]);
    assert_eq!(settings.load.regions.as_ref(), Some(&regions.plan));
    let peers: Vec<(&str, &str)> = regions
        .peers
        .iter()
        .map(|(name, options)| (&**name, options.url.as_str()))
        .collect();
    assert_eq!(
        peers,
        [("ap", "redis://ap:6379"), ("us", "redis://u:p@us:6379")]
    );
    // A peer's store is the local one at another URL.
    for (_, peer) in &regions.peers {
        let local = RedisOptions {
            url: peer.url.clone(),
            ..settings.redis.clone()
        };
        assert_eq!(format!("{peer:?}"), format!("{local:?}"));
        assert_eq!(peer.auth.as_deref(), Some("secret"));
    }
    assert_eq!(regions.sync_interval, Duration::from_secs(1));
    assert_eq!(regions.stale_after, Duration::from_secs(3));
    // Debug output (and so any log of the settings) masks the peers' passwords.
    assert!(!format!("{:?}", regions.peers).contains("u:p"));
}

#[test]
fn peer_regions_from_the_variable_split_on_semicolons() {
    let command = <Cli as clap::CommandFactory>::command();
    let serve = command.find_subcommand("serve").expect("serve");
    let arg = serve
        .get_arguments()
        .find(|arg| arg.get_long() == Some("peer-region"))
        .expect("--peer-region");
    assert_eq!(
        arg.get_env().and_then(|name| name.to_str()),
        Some("SLUICE_PEER_REGIONS")
    );
    assert!(arg.is_hide_env_values_set(), "peer URLs may hold passwords");
    let peers = peers_from_variable(
        "us-east=redis://c:7000,redis://d:7000;ap=e:7000;",
        &[
            "--store",
            "redis-cluster",
            "--redis-url",
            "redis://a:7000,redis://b:7000",
            "--region",
            "eu-west",
            "--region-sync-interval",
            "250ms",
        ],
    );
    let regions = peers.regions.expect("regions");
    let urls: Vec<(&str, &str)> = regions
        .peers
        .iter()
        .map(|(name, options)| (&**name, options.url.as_str()))
        .collect();
    assert_eq!(
        urls,
        [
            ("ap", "e:7000"),
            ("us-east", "redis://c:7000,redis://d:7000")
        ]
    );
    assert!(regions
        .peers
        .iter()
        .all(|(_, options)| options.mode == peers.redis.mode));
    assert_eq!(regions.sync_interval, Duration::from_millis(250));
    assert_eq!(regions.stale_after, Duration::from_millis(750));
}

/// `serve` with `argv` and `value` in the `--peer-region` variable. The variable is
/// renamed to one no other test reads (clap reads the process's environment, which
/// tests running in parallel share); the real name is asserted above.
fn peers_from_variable(value: &str, argv: &[&str]) -> Settings {
    const VARIABLE: &str = "SLUICE_TEST_ONLY_PEER_REGIONS";
    // `Arg::env` reads the variable when it is called.
    std::env::set_var(VARIABLE, value);
    let command = <Cli as clap::CommandFactory>::command().mut_subcommand("serve", |serve| {
        serve.mut_arg("peer_regions", |arg| arg.env(VARIABLE))
    });
    std::env::remove_var(VARIABLE);
    let mut full = vec!["sluice", "serve"];
    full.extend_from_slice(argv);
    let matches = command.try_get_matches_from(full).expect("arguments parse");
    let cli = <Cli as clap::FromArgMatches>::from_arg_matches(&matches).expect("a command line");
    let Command::Serve(args) = cli.into_command() else {
        panic!("not serve");
    };
    Settings::resolve(&args, &|_| None).expect("resolves")
}

#[test]
fn one_region_alone_is_allowed() {
    let settings = resolve(
        &[
            "--store",
            "redis",
            "--redis-url",
            "redis:6379",
            "--region",
            "eu",
        ],
        &[],
    )
    .expect("resolves");
    let regions = settings.regions.expect("regions");
    assert!(regions.peers.is_empty());
    assert_eq!(regions.plan.names().len(), 1);
    assert!(settings.load.regions.is_some());
    // Without --region, nothing is shared.
    let none = resolve(&["--store", "redis", "--redis-url", "redis:6379"], &[]).expect("resolves");
    assert!(none.regions.is_none() && none.load.regions.is_none());
}

#[test]
fn bad_region_settings_are_refused_by_flag() {
    let redis = ["--store", "redis", "--redis-url", "redis:6379"];
    let error = |argv: &[&str]| {
        let mut full = redis.to_vec();
        full.extend_from_slice(argv);
        resolve(&full, &[]).expect_err("refused")
    };
    for (argv, name, says) in [
        (
            &["--peer-region", "us=redis:6379"][..],
            "--peer-region",
            "needs --region",
        ),
        (
            &["--region-sync-interval", "2s"],
            "--region-sync-interval",
            "needs --region",
        ),
        (
            &["--region-stale-after", "9s"],
            "--region-stale-after",
            "needs --region",
        ),
        (
            &["--region", "eu", "--peer-region", "us"],
            "--peer-region",
            "NAME=URL",
        ),
        (
            &["--region", "eu", "--peer-region", "us="],
            "--peer-region",
            "no Redis URL",
        ),
        (&["--region", "EU"], "--region", "a-z, 0-9 and -"),
        (
            &["--region", "eu", "--peer-region", "u_s=redis:1"],
            "--peer-region",
            "a-z, 0-9 and -",
        ),
        (
            &["--region", "eu", "--peer-region", "eu=redis:1"],
            "--peer-region",
            "named twice",
        ),
        (
            &[
                "--region",
                "eu",
                "--peer-region",
                "us=redis:1",
                "--peer-region",
                "us=redis:2",
            ],
            "--peer-region",
            "named twice",
        ),
        (
            &[
                "--region",
                "a",
                "--peer-region",
                "b=r:1;c=r:1;d=r:1;e=r:1;f=r:1;g=r:1;h=r:1;i=r:1",
            ],
            "--peer-region",
            "at most 8 regions",
        ),
        (
            &["--region", "eu", "--region-sync-interval", "5ms"],
            "--region-sync-interval",
            "10ms to 60s",
        ),
        (
            &["--region", "eu", "--region-sync-interval", "61s"],
            "--region-sync-interval",
            "10ms to 60s",
        ),
        (
            &["--region", "eu", "--region-stale-after", "1s"],
            "--region-stale-after",
            "longer than",
        ),
        (
            &["--region", "eu", "--region-stale-after", "11m"],
            "--region-stale-after",
            "at most 10m",
        ),
        (
            &["--region", "eu", "--region-sync-interval", "5m"],
            "--region-sync-interval",
            "10ms to 60s",
        ),
    ] {
        let error = error(argv);
        assert_eq!(error.name, name, "{argv:?}: {error}");
        assert!(error.to_string().contains(says), "{argv:?}: {error}");
    }
    let memory = resolve(&["--region", "eu"], &[]).expect_err("the memory store");
    assert_eq!(memory.name, "--region");
    assert!(
        memory
            .to_string()
            .contains("--store redis, redis-cluster or redis-sentinel"),
        "{memory}"
    );
    // A password in an entry without `=` is not printed.
    let masked = error(&[
        "--region",
        "eu",
        "--peer-region",
        "redis://u:secret@us:6379",
    ]);
    assert!(!masked.to_string().contains("secret"), "{masked}");
}

#[test]
fn check_and_explain_share_no_regions() {
    let env = |name: &str| (name == "SLUICE_REGION").then(|| "eu".to_owned());
    assert!(load_options(None, &env)
        .expect("resolves")
        .regions
        .is_none());
}
