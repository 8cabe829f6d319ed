//! TLS to the ledger's PostgreSQL, set by the URL's libpq parameters (`sslmode`,
//! `sslrootcert`, `sslcert`, `sslkey`), against a real PostgreSQL that serves TLS with a
//! test CA's certificate for `localhost` and refuses every TCP connection without TLS.

use std::process::Command;

use support::fault::{call, serial, Outcome};
use support::pki::Ca;
use support::postgres::Postgres;
use support::TestServer;

const RULES: &str = "domain: faults
descriptors:
  - key: customer
    rate_limit: {unit: day, requests_per_unit: 1000, ledger: true}
";

/// `sluice ledger migrate --ledger-url url`: its stdout, or its stderr when it fails.
fn migrate(url: &str) -> Result<String, String> {
    let output = Command::new(env!("CARGO_BIN_EXE_sluice"))
        .args(["ledger", "migrate", "--ledger-url", url])
        .output()
        .expect("run sluice ledger migrate");
    let text = |bytes: &[u8]| String::from_utf8_lossy(bytes).into_owned();
    if output.status.success() {
        Ok(text(&output.stdout))
    } else {
        Err(text(&output.stderr))
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_ledger_url_sets_tls_as_libpq_reads_it() {
    let _serial = serial().await;
    let dir = tempfile::tempdir().expect("temp dir");
    let ca = Ca::new("ledger test CA");
    let ca_file = dir.path().join("ca.pem");
    std::fs::write(&ca_file, ca.pem()).expect("write CA");
    let stranger_file = dir.path().join("stranger.pem");
    std::fs::write(&stranger_file, Ca::new("another CA").pem()).expect("write CA");
    let postgres = Postgres::start_with_tls(&ca.server(&["localhost"]));
    let port = postgres.port;
    // The certificate names `localhost`; `hostaddr` keeps the connection on IPv4.
    let by_name = format!("postgres://sluice@localhost:{port}/postgres?hostaddr=127.0.0.1");
    let by_address = format!("postgres://sluice@127.0.0.1:{port}/postgres?");
    let ca = ca_file.display();
    let stranger = stranger_file.display();

    // Refused by the server: no TLS.
    let plain = migrate(&format!("{by_address}sslmode=disable")).expect_err("plain refused");
    assert!(plain.contains("no encryption"), "{plain}");
    // Encrypted without a check (libpq's `require` and `prefer` without roots).
    for mode in ["require", "prefer"] {
        migrate(&format!("{by_address}sslmode={mode}"))
            .unwrap_or_else(|error| panic!("sslmode={mode}: {error}"));
    }
    // The chain: checked against the given roots, whatever the name.
    migrate(&format!("{by_address}sslmode=verify-ca&sslrootcert={ca}")).expect("verify-ca");
    migrate(&format!("{by_address}sslmode=require&sslrootcert={ca}"))
        .expect("require with roots checks the chain");
    for mode in ["verify-ca", "require"] {
        let error = migrate(&format!(
            "{by_address}sslmode={mode}&sslrootcert={stranger}"
        ))
        .expect_err("an unknown issuer is refused");
        assert!(error.contains("certificate"), "sslmode={mode}: {error}");
    }
    // The chain and the name.
    let error = migrate(&format!("{by_address}sslmode=verify-full&sslrootcert={ca}"))
        .expect_err("127.0.0.1 is not a name of the certificate");
    assert!(error.contains("certificate"), "{error}");
    let applied = migrate(&format!("{by_name}&sslmode=verify-full&sslrootcert={ca}"))
        .expect("verify-full by the certificate's name");
    assert!(applied.contains("version"), "{applied}");
    // A client certificate is presented when given (the server does not ask for one).
    let client = support::pki::Ca::new("client CA").client(&["sluice"]);
    let (cert, key) = client.write(dir.path(), "client");
    migrate(&format!(
        "{by_name}&sslmode=verify-full&sslrootcert={ca}&sslcert={}&sslkey={}",
        cert.display(),
        key.display()
    ))
    .expect("with a client certificate");

    // Serving: the ledger is written over TLS (the server takes nothing else).
    let url = format!("{by_name}&sslmode=verify-full&sslrootcert={ca}");
    let server = TestServer::start(
        &[("ledger.yaml".to_owned(), RULES.to_owned())],
        &[],
        &["--ledger-url", &url, "--ledger-interval", "100ms"],
    )
    .await;
    let mut client = server.client().await;
    for _ in 0..10 {
        let answer = call(
            &mut client,
            "customer",
            "tls",
            std::time::Duration::from_secs(1),
        )
        .await;
        assert_eq!(answer.outcome, Outcome::Ok, "{answer:?}");
    }
    let started = std::time::Instant::now();
    loop {
        let units = postgres.query(
            "SELECT coalesce(sum(units), 0) FROM sluice_usage WHERE descriptor = 'customer=tls'",
        );
        if units == "10" {
            break;
        }
        assert!(
            started.elapsed() < std::time::Duration::from_secs(10),
            "ledger holds {units} units, want 10"
        );
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }

    // A setting that cannot work stops `serve` at start, naming the flag.
    let output = Command::new(env!("CARGO_BIN_EXE_sluice"))
        .args(["serve", "--config"])
        .arg(dir.path())
        .args(["--grpc-addr", "127.0.0.1:0", "--http-addr", "127.0.0.1:0"])
        .args([
            "--ledger-url",
            &format!("{by_name}&sslmode=verify-full&sslrootcert=/no/such/ca.pem"),
        ])
        .output()
        .expect("run sluice serve");
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(!output.status.success(), "serve started: {stderr}");
    assert!(
        stderr.contains("--ledger-url") && stderr.contains("/no/such/ca.pem"),
        "{stderr}"
    );
}
