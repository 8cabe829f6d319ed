//! The `sluice check` and `sluice explain` commands, run as a user runs them.

use std::process::Command;

fn sluice() -> Command {
    Command::new(env!("CARGO_BIN_EXE_sluice"))
}

fn write(dir: &std::path::Path, name: &str, text: &str) {
    std::fs::write(dir.join(name), text).expect("write rule file");
}

#[test]
fn check_prints_every_rule_and_exits_zero() {
    let output = sluice()
        .args(["check", concat!(env!("CARGO_MANIFEST_DIR"), "/config")])
        .output()
        .expect("run sluice check");
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(
        output.status.success(),
        "{stdout}{}",
        String::from_utf8_lossy(&output.stderr)
    );
    assert!(
        stdout.contains("example.user (example.yaml: descriptors[0]) [5/minute fixed_window"),
        "{stdout}"
    );
    assert!(stdout.contains("ok: 5 rules from 1 files"), "{stdout}");
}

#[test]
fn check_reports_every_error_with_file_and_reason() {
    let dir = tempfile::tempdir().expect("temp dir");
    write(dir.path(), "a.yaml", "domain: a\ndescriptors:\n  - key: k\n    rate_limit: {unit: fortnight, requests_per_unit: 1}\n");
    write(dir.path(), "b.yaml", "domain: b\ndescriptors:\n  - key: k\n    rate_limit: {unit: second, requests_per_unit: 1, algorithm: sliding_log, burst: 3}\n");
    let output = sluice()
        .arg("check")
        .arg(dir.path())
        .output()
        .expect("run sluice check");
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(output.status.code(), Some(1), "{stderr}");
    assert!(
        stderr.contains("a.yaml: invalid rate limit unit 'fortnight'"),
        "{stderr}"
    );
    assert!(
        stderr.contains("b.yaml: descriptors[0].rate_limit.burst"),
        "{stderr}"
    );
}

#[test]
fn explain_names_rule_path_and_counter_key() {
    let output = sluice()
        .args([
            "explain",
            "--config",
            concat!(env!("CARGO_MANIFEST_DIR"), "/config"),
            "--domain",
            "example",
            "--descriptor",
            "remote_address=10.0.0.1,path=/login",
            "--descriptor",
            "nothing=here",
            "--json",
        ])
        .output()
        .expect("run sluice explain");
    assert!(
        output.status.success(),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
    let explained: serde_json::Value = serde_json::from_slice(&output.stdout).expect("json");
    let first = &explained[0];
    assert_eq!(first["outcome"], "limited");
    assert_eq!(
        first["matched_by"],
        serde_json::json!(["key only", "exact value"])
    );
    assert_eq!(
        first["rule"]["stats_key"],
        "example.remote_address.path_/login"
    );
    assert_eq!(
        first["rule"]["config_path"],
        "example.yaml: descriptors[2].descriptors[0]"
    );
    assert_eq!(first["rule"]["limits"][0]["requests_per_unit"], 10);
    assert_eq!(first["counter_key"].as_str().map(str::len), Some(32));
    assert_eq!(explained[1]["outcome"], "no_match");
}

#[test]
fn explain_rejects_malformed_descriptor() {
    let output = sluice()
        .args([
            "explain",
            "--config",
            concat!(env!("CARGO_MANIFEST_DIR"), "/config"),
            "--domain",
            "example",
            "--descriptor",
            "novalue",
        ])
        .output()
        .expect("run sluice explain");
    assert_eq!(output.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&output.stderr).contains("is not key=value"));
}

/// `on_over_limit: charge` is visible where a user looks: `sluice check`'s line and
/// `sluice explain`'s text and JSON.
#[test]
fn check_and_explain_show_on_over_limit() {
    let dir = tempfile::tempdir().expect("temp dir");
    write(
        dir.path(),
        "tokens.yaml",
        "domain: llm\ndescriptors:\n  - key: user\n    rate_limit: {unit: minute, requests_per_unit: 1000, algorithm: gcra, on_over_limit: charge}\n",
    );
    let check = sluice()
        .arg("check")
        .arg(dir.path())
        .output()
        .expect("run sluice check");
    let stdout = String::from_utf8_lossy(&check.stdout);
    assert!(check.status.success(), "{stdout}");
    assert!(
        stdout.contains("[1000/minute gcra on_over_limit=charge failure_mode=open]"),
        "{stdout}"
    );
    let explain = |json: bool| {
        let mut command = sluice();
        command
            .arg("explain")
            .arg("--config")
            .arg(dir.path())
            .args(["--domain", "llm", "--descriptor", "user=alice"]);
        if json {
            command.arg("--json");
        }
        let output = command.output().expect("run sluice explain");
        assert!(output.status.success());
        String::from_utf8_lossy(&output.stdout).into_owned()
    };
    assert!(explain(false).contains("on_over_limit=charge"));
    let explained: serde_json::Value = serde_json::from_str(&explain(true)).expect("json");
    assert_eq!(explained[0]["rule"]["limits"][0]["on_over_limit"], "charge");
    assert_eq!(explained[0]["refund"], false);
}
