//! The usage ledger (issue #45) against a real PostgreSQL (Debian's, started by the test
//! as an unprivileged user): every unit admitted for a `ledger: true` limit (by the store
//! or by the `open` failure mode while Redis is down) is written once, with its domain, descriptor, limit and window; refused requests are not;
//! the schema is made by `sluice ledger migrate` (versioned, a second run changes
//! nothing); with PostgreSQL killed, Sluice keeps serving, spools the usage and says so
//! in `/status` and `/metrics`, and writes it all when the database returns; a Redis
//! restarted empty is restored from the ledger.

use std::time::{Duration, Instant};

use support::fault::{call, serial, Outcome};
use support::postgres::Postgres;
use support::redis::RedisServer;
use support::TestServer;

/// One ledger rule (a daily quota of 1 000) and one without a ledger.
const RULES: &str = "domain: faults
descriptors:
  - key: customer
    rate_limit: {unit: day, requests_per_unit: 1000, ledger: true}
  - key: plain
    rate_limit: {unit: day, requests_per_unit: 1000}
  - key: quota
    rate_limit: {unit: day, requests_per_unit: 1000, ledger: true, failure_mode: closed}
  - key: probe
    rate_limit: {unit: day, requests_per_unit: 1000000000, failure_mode: closed}
";

const DEADLINE: Duration = Duration::from_millis(500);

async fn sluice(postgres: &Postgres) -> TestServer {
    TestServer::start(
        &[("ledger.yaml".to_owned(), RULES.to_owned())],
        &[],
        &[
            "--ledger-url",
            &postgres.url(),
            "--ledger-interval",
            "100ms",
        ],
    )
    .await
}

async fn sluice_on_redis(postgres: &Postgres, redis: &RedisServer) -> TestServer {
    TestServer::start(
        &[("ledger.yaml".to_owned(), RULES.to_owned())],
        &[],
        &[
            "--store",
            "redis",
            "--redis-url",
            &redis.url(),
            "--redis-timeout",
            "100ms",
            "--ledger-url",
            &postgres.url(),
            "--ledger-interval",
            "100ms",
        ],
    )
    .await
}

/// Waits until Redis answers Sluice again (`probe` refuses by failure mode until then).
async fn wait_store(server: &TestServer) {
    let mut client = server.client().await;
    let started = Instant::now();
    while call(&mut client, "probe", "x", DEADLINE).await.outcome != Outcome::Ok {
        assert!(
            started.elapsed() < Duration::from_secs(10),
            "Redis not back"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Calls `key=value` until one is refused; how many passed.
async fn passes_until_refused(server: &TestServer, key: &str, value: &str) -> usize {
    let mut client = server.client().await;
    let mut passed = 0;
    loop {
        match call(&mut client, key, value, DEADLINE).await.outcome {
            Outcome::Ok => passed += 1,
            Outcome::Over => return passed,
            other => panic!("{key}={value}: {other:?}"),
        }
        assert!(passed <= 1000, "{key}={value}: never refused");
    }
}

/// `n` calls on `key=value`, each answered OK.
async fn charge(server: &TestServer, key: &str, value: &str, n: usize) {
    let mut client = server.client().await;
    for _ in 0..n {
        let answer = call(&mut client, key, value, DEADLINE).await;
        assert_eq!(answer.outcome, Outcome::Ok, "{key}={value}: {answer:?}");
    }
}

/// Units the ledger holds for `customer=value`.
fn ledger_units(postgres: &Postgres, value: &str) -> u64 {
    postgres
        .query(&format!(
            "SELECT coalesce(sum(units), 0) FROM sluice_usage \
             WHERE domain = 'faults' AND descriptor = 'customer={value}'"
        ))
        .parse()
        .expect("a sum")
}

/// Waits (at most `within`) until the ledger holds `units` for `customer=value`.
async fn wait_units(postgres: &Postgres, value: &str, units: u64, within: Duration) {
    let started = Instant::now();
    loop {
        let found = ledger_units(postgres, value);
        if found == units {
            return;
        }
        assert!(
            started.elapsed() < within,
            "ledger holds {found} units for customer={value}, want {units}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// `sluice ledger migrate`, its standard output.
fn migrate(postgres: &Postgres) -> String {
    let output = std::process::Command::new(env!("CARGO_BIN_EXE_sluice"))
        .args(["ledger", "migrate", "--ledger-url", &postgres.url()])
        .output()
        .expect("run sluice ledger migrate");
    assert!(
        output.status.success(),
        "sluice ledger migrate: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    String::from_utf8_lossy(&output.stdout).into_owned()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_admitted_unit_is_written_once() {
    let _serial = serial().await;
    let postgres = Postgres::start();
    assert!(migrate(&postgres).contains("applied versions [1]"));
    assert!(migrate(&postgres).contains("already at version 1"));
    let server = sluice(&postgres).await;

    charge(&server, "customer", "a", 120).await;
    charge(&server, "customer", "b", 30).await;
    charge(&server, "plain", "a", 10).await;
    wait_units(&postgres, "a", 120, Duration::from_secs(10)).await;
    wait_units(&postgres, "b", 30, Duration::from_secs(10)).await;

    // Past the quota: refused, and not recorded.
    charge(&server, "customer", "c", 1000).await;
    let mut client = server.client().await;
    for _ in 0..5 {
        let answer = call(&mut client, "customer", "c", DEADLINE).await;
        assert_eq!(answer.outcome, Outcome::Over);
    }
    wait_units(&postgres, "c", 1000, Duration::from_secs(10)).await;
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert_eq!(ledger_units(&postgres, "c"), 1000, "refused units recorded");

    // The rows: the rule's limit, today's UTC day, no other descriptor, no duplicate.
    let rows = postgres.query(
        "SELECT DISTINCT domain, limit_name, window_seconds, \
                window_start = date_trunc('day', now() AT TIME ZONE 'UTC') AT TIME ZONE 'UTC' \
         FROM sluice_usage",
    );
    assert_eq!(rows, "faults|faults.customer:day|86400|t");
    let descriptors =
        postgres.query("SELECT string_agg(DISTINCT descriptor, ' ') FROM sluice_usage");
    assert_eq!(descriptors, "customer=a customer=b customer=c");
    // The usage API: the current window from the store and the ledger, charging nothing.
    for _ in 0..2 {
        let usage: serde_json::Value =
            reqwest::get(server.url("/usage?domain=faults&descriptor=customer=a"))
                .await
                .expect("GET /usage")
                .json()
                .await
                .expect("JSON");
        let limit = &usage["limits"][0];
        assert_eq!(usage["outcome"], "limited", "{usage}");
        assert_eq!(limit["name"], "faults.customer:day", "{usage}");
        assert_eq!(limit["limit"], 1000, "{usage}");
        assert_eq!(limit["store_used"], 120, "{usage}");
        assert_eq!(limit["ledger_admitted"], 120, "{usage}");
        assert_eq!(limit["remaining"], 880, "{usage}");
        assert!(limit["reset_seconds"].as_u64() <= Some(86_400), "{usage}");
    }

    // The same from the command line, through the admin port.
    let output = std::process::Command::new(env!("CARGO_BIN_EXE_sluice"))
        .args(["usage", "--admin", &server.url("")])
        .args(["--domain", "faults", "--descriptor", "customer=b"])
        .output()
        .expect("run sluice usage");
    assert!(
        output.status.success(),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
    let usage: serde_json::Value = serde_json::from_slice(&output.stdout).expect("JSON");
    assert_eq!(usage["limits"][0]["store_used"], 30, "{usage}");
    assert_eq!(usage["limits"][0]["ledger_admitted"], 30, "{usage}");

    // The export an invoice needs: per key and window, from the ledger alone.
    let output = std::process::Command::new(env!("CARGO_BIN_EXE_sluice"))
        .args(["usage", "export", "--ledger-url", &postgres.url()])
        .args([
            "--from",
            "2000-01-01",
            "--to",
            "2100-01-01",
            "--format",
            "csv",
        ])
        .output()
        .expect("run sluice usage export");
    assert!(
        output.status.success(),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
    let csv = String::from_utf8_lossy(&output.stdout);
    let lines: Vec<&str> = csv.lines().collect();
    assert_eq!(
        lines[0],
        "domain,descriptor,limit,window_start,window_seconds,units,batches,instances"
    );
    let units: Vec<(&str, &str)> = lines[1..]
        .iter()
        .map(|line| {
            let fields: Vec<&str> = line.split(',').collect();
            (fields[1], fields[5])
        })
        .collect();
    assert_eq!(
        units,
        [
            ("customer=a", "120"),
            ("customer=b", "30"),
            ("customer=c", "1000")
        ],
        "{csv}"
    );

    let status = server.status().await;
    assert_eq!(status["ledger"]["written_units"], 1150, "{status}");
    assert_eq!(status["ledger"]["dropped_units"], 0, "{status}");
    assert_eq!(status["ledger"]["schema_ok"], true, "{status}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn usage_is_spooled_while_postgresql_is_down() {
    let _serial = serial().await;
    let mut postgres = Postgres::start();
    migrate(&postgres);
    let server = sluice(&postgres).await;
    charge(&server, "customer", "d", 100).await;
    wait_units(&postgres, "d", 100, Duration::from_secs(10)).await;

    // Killed mid-run: Sluice keeps serving (the store enforces the quota) and spools.
    postgres.kill();
    charge(&server, "customer", "d", 200).await;
    let started = Instant::now();
    loop {
        let status = server.status().await;
        let ledger = &status["ledger"];
        if ledger["spooled_units"] == 200 && ledger["write_failures"].as_u64() > Some(0) {
            assert!(ledger["lag_seconds"].as_f64() > Some(0.0), "{status}");
            break;
        }
        assert!(
            started.elapsed() < Duration::from_secs(10),
            "spool not reported: {status}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let metrics = server.metrics().await;
    assert_eq!(metrics.get("sluice_ledger_spooled_units"), 200.0);
    assert!(metrics.get("sluice_ledger_write_failures_total") > 0.0);
    assert!(metrics.get("sluice_ledger_oldest_unwritten_timestamp_seconds") > 0.0);

    // Back: the spool is written, each unit once.
    postgres.restart();
    wait_units(&postgres, "d", 300, Duration::from_secs(15)).await;
    let status = server.status().await;
    assert_eq!(status["ledger"]["spooled_units"], 0, "{status}");
    assert_eq!(status["ledger"]["lag_seconds"], serde_json::Value::Null);
    assert_eq!(
        server
            .metrics()
            .await
            .get("sluice_ledger_dropped_units_total"),
        0.0
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_redis_restarted_empty_is_restored_from_the_ledger() {
    let _serial = serial().await;
    let postgres = Postgres::start();
    migrate(&postgres);
    let mut redis = RedisServer::start();

    // The same process: it knows what it admitted.
    let server = sluice_on_redis(&postgres, &redis).await;
    charge(&server, "quota", "same", 900).await;
    redis.restart();
    wait_store(&server).await;
    assert_eq!(passes_until_refused(&server, "quota", "same").await, 100);
    assert_eq!(
        server
            .metrics()
            .await
            .get("sluice_ledger_restored_units_total"),
        900.0
    );

    // A new process too: what was admitted comes from the ledger's rows.
    charge(&server, "quota", "new", 900).await;
    wait_units_of(&postgres, "quota=new", 900).await;
    drop(server);
    redis.restart();
    let server = sluice_on_redis(&postgres, &redis).await;
    wait_store(&server).await;
    assert_eq!(passes_until_refused(&server, "quota", "new").await, 100);
    let status = server.status().await;
    assert_eq!(status["ledger"]["restored_units"], 900, "{status}");
    // Nothing was recorded twice: the ledger holds exactly the quota.
    wait_units_of(&postgres, "quota=new", 1000).await;
    wait_units_of(&postgres, "quota=same", 1000).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn units_the_failure_mode_admits_are_recorded_and_charged_when_redis_returns() {
    let _serial = serial().await;
    let postgres = Postgres::start();
    migrate(&postgres);
    let mut redis = RedisServer::start();
    let server = sluice_on_redis(&postgres, &redis).await;

    // 100 units admitted by Redis, then 50 by the `open` failure mode while it is down.
    charge(&server, "customer", "served", 100).await;
    redis.kill();
    charge(&server, "customer", "served", 50).await;
    let fallbacks = server
        .metrics()
        .await
        .get("sluice_store_fallback_total{rule=\"faults.customer\",mode=\"open\"}");
    assert_eq!(
        fallbacks, 50.0,
        "the last 50 calls were answered by the failure mode"
    );
    wait_units(&postgres, "served", 150, Duration::from_secs(10)).await;

    // Redis returns empty: the 150 served units count against the quota of 1 000.
    redis.restart();
    wait_store(&server).await;
    assert_eq!(
        passes_until_refused(&server, "customer", "served").await,
        850
    );
    wait_units(&postgres, "served", 1000, Duration::from_secs(10)).await;
}

/// Waits until the ledger holds `units` for `descriptor`.
async fn wait_units_of(postgres: &Postgres, descriptor: &str, units: u64) {
    let started = Instant::now();
    loop {
        let found: u64 = postgres
            .query(&format!(
                "SELECT coalesce(sum(units), 0) FROM sluice_usage WHERE descriptor = '{descriptor}'"
            ))
            .parse()
            .expect("a sum");
        if found == units {
            return;
        }
        assert!(
            started.elapsed() < Duration::from_secs(10),
            "ledger holds {found} units for {descriptor}, want {units}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}
