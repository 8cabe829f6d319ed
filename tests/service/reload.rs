//! Live reload against a real server: every way files change is seen within a second
//! by the file watcher alone (the rescan backstop is set to an hour), bad edits never
//! disturb serving, and counters survive a reload of an unchanged rule identity.

use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use sluice::proto::common::rate_limit_descriptor::Entry;
use sluice::proto::common::RateLimitDescriptor;
use sluice::proto::rls::rate_limit_response::rate_limit::Unit;
use sluice::proto::rls::rate_limit_response::Code;
use sluice::proto::rls::{RateLimitRequest, RateLimitResponse};
use support::TestServer;

/// No backstop: what reloads in these tests is the watcher.
const WATCH_ONLY: &[&str] = &["--reload-interval", "1h"];
/// Every change must be served within this long.
const DEADLINE: Duration = Duration::from_secs(1);

fn rules(domain: &str, limit: u32) -> String {
    format!(
        "domain: {domain}\ndescriptors:\n  - key: k\n    rate_limit: {{unit: hour, requests_per_unit: {limit}}}\n"
    )
}

fn request(domain: &str, value: &str, hits: Option<u64>) -> RateLimitRequest {
    RateLimitRequest {
        domain: domain.into(),
        descriptors: vec![RateLimitDescriptor {
            entries: vec![Entry {
                key: "k".into(),
                value: value.into(),
            }],
            limit: None,
            hits_addend: hits,
            is_negative_hits: false,
        }],
        hits_addend: 0,
    }
}

async fn call(server: &TestServer, request: RateLimitRequest) -> RateLimitResponse {
    server
        .client()
        .await
        .should_rate_limit(request)
        .await
        .expect("ShouldRateLimit")
        .into_inner()
}

/// The limit `domain` answers with now (`None`: no rule applies), charging nothing.
async fn served_limit(server: &TestServer, domain: &str) -> Option<u32> {
    let response = call(server, request(domain, "probe", Some(0))).await;
    response.statuses[0]
        .current_limit
        .as_ref()
        .map(|limit| limit.requests_per_unit)
}

/// Waits until `domain` is served with `expected`; fails after [`DEADLINE`] from `since`.
async fn expect_served(server: &TestServer, domain: &str, expected: Option<u32>, since: Instant) {
    loop {
        let got = served_limit(server, domain).await;
        if got == expected {
            eprintln!("{domain}: {expected:?} served after {:?}", since.elapsed());
            return;
        }
        assert!(
            since.elapsed() < DEADLINE,
            "{domain}: expected limit {expected:?} within {DEADLINE:?}, still {got:?}"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

async fn start(files: &[(&str, String)]) -> TestServer {
    let files: Vec<(String, String)> = files
        .iter()
        .map(|(name, text)| ((*name).to_owned(), text.clone()))
        .collect();
    TestServer::start(&files, &[], WATCH_ONLY).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn write_in_place() {
    let server = start(&[("rules.yaml", rules("a", 10))]).await;
    expect_served(&server, "a", Some(10), Instant::now()).await;
    for limit in [11, 12, 13] {
        let since = Instant::now();
        std::fs::write(
            server.config_dir.path().join("rules.yaml"),
            rules("a", limit),
        )
        .expect("write");
        expect_served(&server, "a", Some(limit), since).await;
    }
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn temp_file_renamed_over() {
    let server = start(&[("rules.yaml", rules("a", 10))]).await;
    expect_served(&server, "a", Some(10), Instant::now()).await;
    let dir = server.config_dir.path();
    for limit in [20, 30, 40] {
        let since = Instant::now();
        std::fs::write(dir.join("rules.yaml.tmp"), rules("a", limit)).expect("write temp");
        std::fs::rename(dir.join("rules.yaml.tmp"), dir.join("rules.yaml")).expect("rename");
        expect_served(&server, "a", Some(limit), since).await;
    }
    server.stop().await;
}

/// One kubelet ConfigMap update: files in a new `..<timestamp>` directory, a `..data_tmp`
/// symlink to it renamed over `..data`, the old directory removed.
fn kubelet_update(dir: &Path, generation: u32, files: &[(&str, String)]) {
    let timestamped = format!("..2025_01_01_00_00_00.{generation:09}");
    std::fs::create_dir(dir.join(&timestamped)).expect("timestamp dir");
    for (name, text) in files {
        std::fs::write(dir.join(&timestamped).join(name), text).expect("write");
    }
    let old = std::fs::read_link(dir.join("..data")).ok();
    std::os::unix::fs::symlink(&timestamped, dir.join("..data_tmp")).expect("symlink");
    std::fs::rename(dir.join("..data_tmp"), dir.join("..data")).expect("swap ..data");
    for (name, _) in files {
        let user = dir.join(name);
        if std::fs::symlink_metadata(&user).is_err() {
            std::os::unix::fs::symlink(format!("..data/{name}"), user).expect("user link");
        }
    }
    if let Some(old) = old {
        std::fs::remove_dir_all(dir.join(old)).expect("remove old generation");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kubelet_configmap_swaps() {
    let server = start(&[]).await;
    let dir = server.config_dir.path().to_path_buf();
    let files = |n: u32| vec![("a.yaml", rules("a", n)), ("b.yaml", rules("b", n + 1))];
    let since = Instant::now();
    kubelet_update(&dir, 0, &files(1000));
    expect_served(&server, "a", Some(1000), since).await;
    expect_served(&server, "b", Some(1001), since).await;
    // A single swap is seen.
    let since = Instant::now();
    kubelet_update(&dir, 1, &files(2000));
    expect_served(&server, "a", Some(2000), since).await;
    // 100 swaps in a burst: the last one is what serves.
    for generation in 2..102 {
        kubelet_update(&dir, generation, &files(3000 + generation));
    }
    let since = Instant::now();
    expect_served(&server, "a", Some(3101), since).await;
    expect_served(&server, "b", Some(3102), since).await;
    let status = server.status().await;
    assert_eq!(status["last_reload"]["result"], "success", "{status}");
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn file_added_then_removed() {
    let server = start(&[("a.yaml", rules("a", 10))]).await;
    expect_served(&server, "a", Some(10), Instant::now()).await;
    assert_eq!(served_limit(&server, "b").await, None);
    let since = Instant::now();
    server.write_config("b.yaml", &rules("b", 7));
    expect_served(&server, "b", Some(7), since).await;
    let since = Instant::now();
    server.write_config("nested/c.yaml", &rules("c", 3));
    expect_served(&server, "c", Some(3), since).await;
    let since = Instant::now();
    server.remove_config("b.yaml");
    expect_served(&server, "b", None, since).await;
    expect_served(&server, "a", Some(10), since).await;
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn config_directory_replaced() {
    let server = start(&[("a.yaml", rules("a", 10))]).await;
    expect_served(&server, "a", Some(10), Instant::now()).await;
    let dir = server.config_dir.path();
    let since = Instant::now();
    std::fs::remove_dir_all(dir).expect("remove config dir");
    std::fs::create_dir(dir).expect("re-create config dir");
    std::fs::write(dir.join("a.yaml"), rules("a", 11)).expect("write");
    expect_served(&server, "a", Some(11), since).await;
    // The re-armed watch sees later edits too.
    let since = Instant::now();
    std::fs::write(dir.join("a.yaml"), rules("a", 12)).expect("write");
    expect_served(&server, "a", Some(12), since).await;
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_edits_keep_the_old_rules_serving() {
    let server = Arc::new(
        start(&[
            ("rules.yaml", rules("a", 1000)),
            ("other.yaml", rules("o", 5)),
        ])
        .await,
    );
    expect_served(&server, "a", Some(1000), Instant::now()).await;

    // Calls run throughout; any error or unanswered descriptor is a failure.
    let calls = Arc::new(AtomicU64::new(0));
    let failures = Arc::new(AtomicU64::new(0));
    let running = Arc::new(std::sync::atomic::AtomicBool::new(true));
    let caller = {
        let (server, calls, failures, running) = (
            server.clone(),
            calls.clone(),
            failures.clone(),
            running.clone(),
        );
        tokio::spawn(async move {
            let mut client = server.client().await;
            let mut n = 0u64;
            while running.load(Ordering::SeqCst) {
                n += 1;
                let result = client
                    .should_rate_limit(request("a", &format!("v{n}"), None))
                    .await;
                calls.fetch_add(1, Ordering::SeqCst);
                match result {
                    Ok(response) => {
                        let response = response.into_inner();
                        if response.overall_code != Code::Ok as i32
                            || response.statuses[0].current_limit.is_none()
                        {
                            failures.fetch_add(1, Ordering::SeqCst);
                        }
                    }
                    Err(_) => {
                        failures.fetch_add(1, Ordering::SeqCst);
                    }
                }
            }
        })
    };

    let bad_edits = [
        ("invalid YAML", "domain: a\ndescriptors:\n  - key: k\n    rate_limit: {unit: hour\n", true),
        (
            "unknown field",
            "domain: a\ndescriptors:\n  - key: k\n    rate_limit: {unit: hour, requests_per_unit: 1, per: 2}\n",
            false,
        ),
        (
            "duplicate key",
            "domain: a\ndescriptors:\n  - key: k\n    key: j\n    rate_limit: {unit: hour, requests_per_unit: 1}\n",
            false,
        ),
        (
            "bad unit",
            "domain: a\ndescriptors:\n  - key: k\n    rate_limit: {unit: fortnight, requests_per_unit: 1}\n",
            false,
        ),
    ];
    let error_sample = "sluice_config_reload_total{result=\"error\"}";
    for (what, text, has_position) in &bad_edits {
        let before = server.metrics().await.get(error_sample);
        let since = Instant::now();
        server.write_config("rules.yaml", text);
        loop {
            if server.metrics().await.get(error_sample) >= before + 1.0 {
                break;
            }
            assert!(
                since.elapsed() < DEADLINE,
                "{what}: no reload error within {DEADLINE:?}"
            );
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        let status = server.status().await;
        let last = &status["last_reload"];
        assert_eq!(last["result"], "error", "{what}: {status}");
        let error = &last["errors"][0];
        assert_eq!(error["file"], "rules.yaml", "{what}: {status}");
        assert!(
            !error["reason"].as_str().unwrap_or("").is_empty(),
            "{what}: {status}"
        );
        if *has_position {
            assert!(
                error["line"].as_u64().is_some(),
                "{what}: no line in {status}"
            );
        }
        eprintln!("{what}: {}", last["error"]);
        // The whole old set keeps serving, the other file included.
        assert_eq!(served_limit(&server, "a").await, Some(1000));
        assert_eq!(served_limit(&server, "o").await, Some(5));
        // A rescan of the same broken content is not a new error.
        assert_eq!(
            server.metrics().await.get(error_sample),
            before + 1.0,
            "{what}"
        );
    }
    let since = Instant::now();
    server.write_config("rules.yaml", &rules("a", 2000));
    expect_served(&server, "a", Some(2000), since).await;
    assert_eq!(server.status().await["last_reload"]["result"], "success");

    running.store(false, Ordering::SeqCst);
    caller.await.expect("caller task");
    let (calls, failures) = (
        calls.load(Ordering::SeqCst),
        failures.load(Ordering::SeqCst),
    );
    eprintln!("{calls} calls during bad edits, {failures} failed");
    assert!(calls > 100, "too few calls ({calls}) to show anything");
    assert_eq!(failures, 0);
    if let Ok(server) = Arc::try_unwrap(server) {
        server.stop().await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn counters_survive_a_limit_change() {
    let server = start(&[("rules.yaml", rules("a", 10))]).await;
    let mut remaining = 0;
    for _ in 0..5 {
        remaining = call(&server, request("a", "alice", None)).await.statuses[0].limit_remaining;
    }
    assert_eq!(remaining, 5, "5 used of 10");
    // Same domain, descriptor path and limit position; only the number changes.
    let since = Instant::now();
    server.write_config("rules.yaml", &rules("a", 8));
    expect_served(&server, "a", Some(8), since).await;
    let peek = call(&server, request("a", "alice", Some(0))).await;
    let status = &peek.statuses[0];
    assert_eq!(
        status.current_limit.as_ref().map(|l| l.requests_per_unit),
        Some(8)
    );
    assert_eq!(status.limit_remaining, 3, "5 used of the new limit 8");
    let next = call(&server, request("a", "alice", None)).await;
    assert_eq!(next.statuses[0].limit_remaining, 2);
    server.stop().await;
}

/// A rule whose unit changes counts afresh in windows of the new unit (the reference's
/// key holds the unit's window start), never in the state of the old unit's window.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_new_unit_counts_afresh() {
    let minute = "domain: a\ndescriptors:\n  - key: k\n    rate_limit: {unit: minute, requests_per_unit: 5}\n";
    let day = minute.replace("minute", "day");
    let server = start(&[("rules.yaml", minute.to_owned())]).await;
    for _ in 0..3 {
        call(&server, request("a", "alice", None)).await;
    }
    let since = Instant::now();
    server.write_config("rules.yaml", &day);
    loop {
        let peek = call(&server, request("a", "alice", Some(0))).await;
        let status = &peek.statuses[0];
        let unit = status.current_limit.as_ref().map(|limit| limit.unit);
        if unit == Some(Unit::Day as i32) {
            assert_eq!(
                status.limit_remaining, 5,
                "nothing used in the day's window"
            );
            // Aligned to the day, as a fresh fixed window is: what is left of today.
            let seconds_into_day = support::unix_seconds() % 86_400;
            let reset = status.duration_until_reset.as_ref().expect("reset").seconds;
            assert!(
                (reset - (86_400 - seconds_into_day as i64)).abs() <= 2,
                "reset {reset} s, {seconds_into_day} s into the day"
            );
            break;
        }
        assert!(
            since.elapsed() < DEADLINE,
            "day rule not served within {DEADLINE:?}"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    server.stop().await;
}

/// The per-rule series (`rule="…"` labels) exported now.
async fn rule_series(server: &TestServer) -> Vec<String> {
    let mut series: Vec<String> = server
        .metrics()
        .await
        .0
        .into_keys()
        .filter(|name| name.contains("rule=\""))
        .collect();
    series.sort();
    series
}

/// The series of a rule that a reload removed go with that reload: the count returns to
/// what it was before the rule came (documented: with the reload, within a second of the
/// file change); the rules that stay keep theirs and their counts.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn series_of_removed_rules_go_with_the_reload() {
    let server = start(&[("a.yaml", rules("a", 10))]).await;
    expect_served(&server, "a", Some(10), Instant::now()).await;
    call(&server, request("a", "x", Some(1))).await;
    let baseline = rule_series(&server).await;
    assert!(!baseline.is_empty());

    let since = Instant::now();
    server.write_config("b.yaml", &rules("b", 7));
    expect_served(&server, "b", Some(7), since).await;
    call(&server, request("b", "x", Some(1))).await;
    let with_b = rule_series(&server).await;
    assert!(
        with_b.iter().any(|series| series.contains("rule=\"b.")),
        "{with_b:?}"
    );

    let since = Instant::now();
    server.remove_config("b.yaml");
    expect_served(&server, "b", None, since).await;
    call(&server, request("a", "x", Some(1))).await;
    let after = rule_series(&server).await;
    assert_eq!(after, baseline, "series after b's rules were removed");
    let hits = "sluice_rule_hits_total{rule=\"a.k\",stat=\"total_hits\"}";
    assert_eq!(server.metrics().await.get(hits), 2.0, "a's counts kept");
    server.stop().await;
}
