//! Sluice as a drop-in for envoyproxy/ratelimit's container, run as the real binary:
//! Envoy Gateway starts the image with no arguments and configures it through the
//! reference's environment alone; a reference setting Sluice cannot honour stops it
//! with the variable's name; `check` reads the environment `serve` reads.

use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use support::e2e::free_ports;
use support::process::SluiceProcess;

/// A rule file of domain `d`.
const RULES: &str =
    "domain: d\ndescriptors:\n  - key: user\n    rate_limit: {unit: minute, requests_per_unit: 2}\n";

/// Runs `sluice ARGS` with `env`, and waits for it to exit (it must, within 20 s).
fn exit_of(args: &[&str], env: &[(&str, &str)]) -> (Option<i32>, String) {
    let mut child = Command::new(support::sluice_bin())
        .args(args)
        .envs(env.iter().copied())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("start sluice");
    let deadline = Instant::now() + Duration::from_secs(20);
    while child.try_wait().expect("wait").is_none() {
        if Instant::now() > deadline {
            let _ = child.kill();
            panic!("sluice {args:?} with {env:?} did not exit: it started");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    let output = child.wait_with_output().expect("output");
    (
        output.status.code(),
        String::from_utf8_lossy(&output.stderr).into_owned(),
    )
}

#[test]
fn reference_settings_sluice_cannot_honour_stop_startup_by_name() {
    let config = tempfile::tempdir().expect("temp dir");
    support::write_file(config.path(), "rules.yaml", RULES);
    let dir = config.path().to_str().expect("UTF-8");
    let serve = [
        "serve",
        "--config",
        dir,
        "--grpc-addr",
        "127.0.0.1:0",
        "--http-addr",
        "127.0.0.1:0",
    ];
    for (name, value, advice) in [
        (
            "BACKEND_TYPE",
            "memcache",
            "unset BACKEND_TYPE or set it to redis",
        ),
        (
            "REDIS_PERSECOND",
            "true",
            "no second Redis for per-second limits",
        ),
        ("GRPC_UDS", "/tmp/ratelimit.sock", "gRPC on TCP only"),
        ("CACHE_KEY_PREFIX", "{tenant}", "Redis Cluster slot"),
        ("TRACING_SAMPLING_RATE", "2", "between 0.0 and 1.0"),
    ] {
        let (code, stderr) = exit_of(&serve, &[(name, value)]);
        assert!(
            code.is_some_and(|code| code != 0),
            "{name}={value}: exit {code:?}"
        );
        assert!(stderr.contains(name), "{name}: {stderr}");
        assert!(stderr.contains(advice), "{name}: {stderr}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_arguments_serve_from_envoy_gateways_environment() {
    let runtime = tempfile::tempdir().expect("temp dir");
    let rules = runtime.path().join("ratelimit").join("config");
    std::fs::create_dir_all(&rules).expect("runtime directory");
    support::write_file(&rules, "rules.yaml", RULES);
    support::write_file(&rules, ".hidden.yaml", "not: rules\n");
    let root = runtime.path().to_str().expect("UTF-8");
    let [port, prometheus_port] = free_ports();
    let (port, prometheus_addr) = (port.to_string(), format!(":{prometheus_port}"));
    // What Envoy Gateway sets (no Redis and no gRPC TLS here: other tests cover them),
    // and nothing else: no argument at all.
    let env = [
        ("RUNTIME_ROOT", root),
        ("RUNTIME_SUBDIRECTORY", "ratelimit"),
        ("RUNTIME_IGNOREDOTFILES", "true"),
        ("RUNTIME_WATCH_ROOT", "false"),
        ("LOG_LEVEL", "info"),
        ("LOG_FORMAT", "json"),
        ("USE_STATSD", "false"),
        ("HOST", "127.0.0.1"),
        ("PORT", &port),
        ("GRPC_HOST", "127.0.0.1"),
        ("GRPC_PORT", "0"),
        ("USE_PROMETHEUS", "true"),
        ("PROMETHEUS_ADDR", &prometheus_addr),
        ("PROMETHEUS_MAPPER_YAML", "/etc/ratelimit/mapper.yaml"),
        ("BACKEND_TYPE", "redis"),
    ];
    let (sluice, _grpc, http) = SluiceProcess::start(&[], &env);
    assert_eq!(http, format!("127.0.0.1:{port}"));

    let body = serde_json::json!({
        "domain": "d",
        "descriptors": [{"entries": [{"key": "user", "value": "alice"}]}],
    });
    let client = reqwest::Client::new();
    for expected in ["OK", "OK", "OVER_LIMIT"] {
        let answer: serde_json::Value = client
            .post(format!("http://{http}/json"))
            .json(&body)
            .send()
            .await
            .expect("POST /json")
            .json()
            .await
            .expect("a JSON answer");
        assert_eq!(answer["overallCode"], expected, "{answer}");
    }

    // The same registry on the Prometheus listener as on the admin port.
    let scraped =
        support::fetch_metrics(&format!("http://127.0.0.1:{prometheus_port}/metrics")).await;
    let admin = support::fetch_metrics(&format!("http://{http}/metrics")).await;
    let over = r#"sluice_rule_hits_total{rule="d.user",stat="over_limit"}"#;
    assert_eq!(scraped.get(over), 1.0, "{:?}", scraped.0);
    assert_eq!(admin.get(over), scraped.get(over));

    // The mapper file renames metrics only: said once, not applied.
    let mapper = sluice.log_lines_with("PROMETHEUS_MAPPER_YAML");
    assert_eq!(mapper.len(), 1, "{mapper:?}");
    assert!(mapper[0].contains("not applied"), "{mapper:?}");
    assert!(sluice.log_lines_with("BACKEND_TYPE").is_empty());
}

#[test]
fn check_reads_the_environment_serve_reads() {
    let runtime = tempfile::tempdir().expect("temp dir");
    let rules = runtime.path().join("app").join("config");
    std::fs::create_dir_all(&rules).expect("config directory");
    support::write_file(&rules, "a.yaml", RULES);
    support::write_file(
        &rules,
        "b.yaml",
        "domain: d\ndescriptors:\n  - key: path\n    rate_limit: {unit: second, requests_per_unit: 5}\n",
    );
    let dir = rules.to_str().expect("UTF-8");
    let (code, stderr) = exit_of(&["check", dir], &[]);
    assert_eq!(
        code,
        Some(1),
        "two files of one domain need merging: {stderr}"
    );
    let (code, stderr) = exit_of(&["check", dir], &[("MERGE_DOMAIN_CONFIG", "true")]);
    assert_eq!(code, Some(0), "{stderr}");
    // Without a path, the one serve would read.
    let root = runtime.path().to_str().expect("UTF-8");
    let serve_env = [
        ("RUNTIME_ROOT", root),
        ("RUNTIME_SUBDIRECTORY", "app"),
        ("MERGE_DOMAIN_CONFIG", "true"),
    ];
    let (code, stderr) = exit_of(&["check"], &serve_env);
    assert_eq!(code, Some(0), "{stderr}");
    let (code, _) = exit_of(&["check"], &serve_env[..2]);
    assert_eq!(code, Some(1));
}
