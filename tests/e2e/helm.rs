//! The Helm chart (`deploy/helm/sluice/`) as Helm and Kubernetes see it: `tests/e2e/helm_chart.py`
//! renders it with Helm's engine (helm-python-sdk), lints it and validates every object
//! against the Kubernetes schemas (kubernetes-validate); this test then runs `sluice
//! check` on the rendered rules ConfigMap and `sluice serve --check-config-only` with the
//! rendered container arguments and environment.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use serde_json::Value;
use support::e2e::python_bin;
use support::{repo_root, sluice_bin};

/// The rendered scenarios, in `tests/e2e/helm_chart.py`'s order.
const SCENARIOS: &[&str] = &[
    "defaults",
    "everything-memory",
    "existing-configmap",
    "monitoring",
    "redis",
    "scaling",
    "tls",
];

#[test]
fn helm_chart_renders_lints_and_validates() {
    let out = tempfile::tempdir().expect("temp dir");
    let root = repo_root();
    let output = Command::new(python_bin())
        .arg(root.join("tests/e2e/helm_chart.py"))
        .arg(root.join("deploy/helm/sluice"))
        .arg(out.path())
        .output()
        .expect("run tests/e2e/helm_chart.py");
    eprintln!("{}", String::from_utf8_lossy(&output.stdout));
    assert!(
        output.status.success(),
        "tests/e2e/helm_chart.py failed:\n{}",
        String::from_utf8_lossy(&output.stderr)
    );
    for scenario in SCENARIOS {
        check_scenario(&out.path().join(scenario), scenario);
    }
}

#[test]
fn serve_check_config_only_refuses_bad_rules_and_flags() {
    let dir = tempfile::tempdir().expect("temp dir");
    std::fs::write(dir.path().join("bad.yaml"), "domain: x\ndescriptors:\n  - key: k\n    rate_limit: {unit: fortnight, requests_per_unit: 1}\n")
        .expect("write rule file");
    let serve = |extra: &[&str]| {
        run(Command::new(sluice_bin())
            .args(["serve", "--check-config-only", "--config"])
            .arg(dir.path())
            .args(extra))
    };
    assert!(!serve(&[]).status.success(), "invalid rules accepted");
    std::fs::write(dir.path().join("bad.yaml"), "domain: x\ndescriptors: []\n").expect("write");
    assert!(serve(&[]).status.success(), "valid rules refused");
    assert!(
        !serve(&["--store", "nowhere"]).status.success(),
        "bad flag accepted"
    );
    assert!(
        !serve(&["--near-limit-ratio", "2"]).status.success(),
        "bad setting accepted"
    );
}

fn check_scenario(dir: &Path, scenario: &str) {
    let text = std::fs::read_to_string(dir.join("container.json")).expect("container.json");
    let container: Value = serde_json::from_str(&text).expect("container.json is JSON");
    let args: Vec<String> = container["args"]
        .as_array()
        .expect("args")
        .iter()
        .map(|arg| arg.as_str().expect("string arg").to_owned())
        .collect();
    check_pod(&container["pod"], scenario);
    assert_eq!(
        args.first().map(String::as_str),
        Some("serve"),
        "{scenario}"
    );
    assert_eq!(
        flag(&args, "--config"),
        container["rules_mount"].as_str(),
        "{scenario}: --config is the rules mount"
    );

    let rules = dir.join("rules");
    if scenario == "existing-configmap" {
        assert_eq!(container["rules_configmap"], "my-rules");
        assert!(!container["objects"]
            .as_array()
            .expect("objects")
            .contains(&Value::from("ConfigMap")));
    } else {
        let check = run(Command::new(sluice_bin()).arg("check").arg(&rules));
        assert!(
            check.status.success(),
            "{scenario}: sluice check on the rendered ConfigMap:\n{}{}",
            String::from_utf8_lossy(&check.stdout),
            String::from_utf8_lossy(&check.stderr)
        );
        // The same files as the kubelet mounts a ConfigMap: each rule loads once.
        let mounted = kubelet_mount(&rules);
        let check_mounted = run(Command::new(sluice_bin()).arg("check").arg(mounted.path()));
        assert!(check_mounted.status.success(), "{scenario}: mounted layout");
        assert_eq!(
            String::from_utf8_lossy(&check_mounted.stdout)
                .lines()
                .last(),
            String::from_utf8_lossy(&check.stdout).lines().last(),
            "{scenario}: the ConfigMap mount loads what the flat files load"
        );
    }
    if scenario == "defaults" {
        // No rules given: the example rules, so that a bare install answers.
        let example = std::fs::read_to_string(rules.join("example.yaml")).expect("example.yaml");
        let config = std::fs::read_to_string(repo_root().join("config/example.yaml"))
            .expect("config/example.yaml");
        assert_eq!(
            example.trim_end(),
            config.trim_end(),
            "the chart's files/example-rules.yaml is config/example.yaml"
        );
    }
    if scenario == "everything-memory" {
        let rule_files = std::fs::read_dir(&rules).expect("rules").count();
        assert_eq!(rule_files, 2, "only the rules given (no merged defaults)");
    }
    if scenario == "redis" {
        assert_eq!(flag(&args, "--store"), Some("redis"));
        assert!(flag(&args, "--redis-url").is_some_and(|url| url.starts_with("redis://")));
        let auth = &container["env"][0];
        assert_eq!(auth["name"], "REDIS_AUTH");
        assert_eq!(auth["valueFrom"]["secretKeyRef"]["name"], "redis-auth");
        // The ledger's URL (it holds a password) only from a Secret.
        let ledger = &container["env"][1];
        assert_eq!(ledger["name"], "SLUICE_LEDGER_URL");
        assert_eq!(ledger["valueFrom"]["secretKeyRef"]["name"], "ledger-db");
        assert_eq!(ledger["valueFrom"]["secretKeyRef"]["key"], "url");
        assert_eq!(flag(&args, "--ledger-interval"), Some("1s"));
        assert!(args.iter().any(|arg| arg == "--ledger-migrate"));
    }
    if scenario == "monitoring" {
        crate::monitoring::check_rendered(dir);
    }
    if scenario == "tls" {
        check_tls_files(&args, &container["pod"]);
        assert_eq!(flag(&args, "--grpc-tls-client-san"), Some("envoy.example"));
    }
    if container["check_args"] == Value::Bool(true) {
        check_serve_accepts(&args, &container["env"], &rules, scenario);
    }
}

/// `sluice serve` resolves the container's arguments and environment (with the rules
/// mount replaced by the rendered rules) and validates the rules, without serving.
fn check_serve_accepts(args: &[String], env: &Value, rules: &Path, scenario: &str) {
    let mut args = args.to_vec();
    let config = args
        .iter()
        .position(|arg| arg == "--config")
        .expect("--config")
        + 1;
    let rules_dir = if std::fs::read_dir(rules).expect("rules").count() == 0 {
        // An existing ConfigMap: serve the example rules in its place.
        repo_root().join("deploy/envoy/rules")
    } else {
        PathBuf::from(rules)
    };
    args[config] = rules_dir.to_string_lossy().into_owned();
    let mut command = Command::new(sluice_bin());
    command.args(&args).arg("--check-config-only");
    for var in env.as_array().expect("env") {
        if let (Some(name), Some(value)) = (var["name"].as_str(), var["value"].as_str()) {
            command.env(name, value);
        }
    }
    let output = run(&mut command);
    assert!(
        output.status.success(),
        "{scenario}: sluice {args:?} refused:\n{}{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
}

/// Each TLS flag names a file of the right Secret, mounted read-only as a whole volume
/// (no `subPath`, which the kubelet would never update: a renewed Secret must reach the
/// running Sluice).
fn check_tls_files(args: &[String], pod: &Value) {
    let mounts = pod["containers"][0]["volumeMounts"]
        .as_array()
        .expect("volumeMounts");
    let volumes = pod["volumes"].as_array().expect("volumes");
    for (name, secret) in [
        ("--redis-tls-ca", "redis-client-tls"),
        ("--redis-tls-cert", "redis-client-tls"),
        ("--redis-tls-key", "redis-client-tls"),
        ("--grpc-tls-cert", "sluice-grpc-tls"),
        ("--grpc-tls-key", "sluice-grpc-tls"),
        ("--grpc-tls-client-ca", "sluice-grpc-tls"),
    ] {
        let path = flag(args, name).unwrap_or_else(|| panic!("tls: {name} missing"));
        let (dir, _) = path.rsplit_once('/').expect("an absolute path");
        let mount = mounts
            .iter()
            .find(|mount| mount["mountPath"] == dir)
            .unwrap_or_else(|| panic!("tls: {name} {path}: no mount at {dir}"));
        assert_eq!(mount["readOnly"], true, "{name}");
        assert!(mount.get("subPath").is_none(), "{name}: subPath");
        let volume = volumes
            .iter()
            .find(|volume| volume["name"] == mount["name"])
            .expect("the mount's volume");
        assert_eq!(volume["secret"]["secretName"], secret, "{name}");
    }
}

/// The pod spec keeps its promises: probes, drain, non-root, read-only root, ports.
fn check_pod(pod: &Value, scenario: &str) {
    let container = &pod["containers"][0];
    assert_eq!(container["livenessProbe"]["httpGet"]["path"], "/livez");
    assert_eq!(container["readinessProbe"]["httpGet"]["path"], "/readyz");
    assert_eq!(container["livenessProbe"]["httpGet"]["port"], "http");
    assert!(
        container["lifecycle"]["preStop"]["sleep"]["seconds"]
            .as_u64()
            .is_some_and(|s| s > 0),
        "{scenario}: preStop sleep"
    );
    assert_eq!(pod["securityContext"]["runAsNonRoot"], true);
    assert_eq!(container["securityContext"]["readOnlyRootFilesystem"], true);
    assert_eq!(
        container["securityContext"]["allowPrivilegeEscalation"],
        false
    );
    let ports: Vec<(String, u64)> = container["ports"]
        .as_array()
        .expect("ports")
        .iter()
        .map(|port| {
            (
                port["name"].as_str().unwrap_or_default().to_owned(),
                port["containerPort"].as_u64().unwrap_or_default(),
            )
        })
        .collect();
    assert_eq!(ports, [("grpc".into(), 8081), ("http".into(), 8080)]);
    assert!(container["resources"]["requests"].is_object());
}

/// The files of `dir` laid out as the kubelet mounts a ConfigMap: a timestamped
/// directory, a `..data` link to it, and a link per key into `..data`.
fn kubelet_mount(dir: &Path) -> tempfile::TempDir {
    use std::os::unix::fs::symlink;
    let mount = tempfile::tempdir().expect("temp dir");
    let data = mount.path().join("..2026_01_01_00_00_00.000000001");
    std::fs::create_dir(&data).expect("data dir");
    symlink(
        "..2026_01_01_00_00_00.000000001",
        mount.path().join("..data"),
    )
    .expect("..data");
    for entry in std::fs::read_dir(dir).expect("rules") {
        let name = entry.expect("entry").file_name();
        std::fs::copy(dir.join(&name), data.join(&name)).expect("copy rule file");
        symlink(Path::new("..data").join(&name), mount.path().join(&name)).expect("key link");
    }
    mount
}

fn flag<'a>(args: &'a [String], name: &str) -> Option<&'a str> {
    args.iter()
        .position(|arg| arg == name)
        .and_then(|i| args.get(i + 1))
        .map(String::as_str)
}

fn run(command: &mut Command) -> Output {
    command
        .output()
        .unwrap_or_else(|error| panic!("run {command:?}: {error}"))
}
