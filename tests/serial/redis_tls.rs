//! Redis over TLS with the minimal ACL user (README, "Shared counters in Redis"): a real
//! `redis-server` that listens on TLS only (`--port 0 --tls-port P`), requires client
//! certificates, and knows one user — the README's `sluice` user; the default user is
//! off. Sluice reaches it with `rediss://sluice:PASS@localhost:P`, the CA and a client
//! certificate, and counts exactly with every algorithm (limit 5: five OK then
//! OVER_LIMIT, on `failure_mode: closed` rules, so an OK can only come from Redis).
//!
//! Refused: a CA that did not sign the server certificate, a server certificate whose
//! names do not match the URL host (host names are checked by default), and no client
//! certificate. Each of these takes the rule's failure mode (OVER_LIMIT at once), and
//! the password never appears in the log.
//!
//! Rotated: the CA bundle and the client certificate replaced on disk (a new CA, as
//! when a Kubernetes secret is renewed) are used at the next connection, without a
//! restart.

use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use support::fault::{call, captured_log, log_lines_with, serial, Outcome};
use support::pki::{write_atomic, Ca, Leaf};
use support::redis::free_port;
use support::TestServer;

const PASSWORD: &str = "tls-acl-s3cret";

/// The README's minimal ACL user (the "Shared counters in Redis" section), verbatim but for the
/// password.
const ACL_USER: &str = "sluice on >PASSWORD ~sluice:* resetchannels -@all +fcall +function|load +evalsha +script|load +time +get +mget +set +del +pexpire +zadd +zrem +zrange +zcount +zcard +zremrangebyscore +zremrangebyrank +zrangebyscore +zscore +type +pttl +auth +client|id +info +select +cluster|slots +cluster|shards +cluster|info";

/// Every algorithm, so that every command the script runs meets the ACL.
const ALGORITHMS: [&str; 5] = [
    "fixed_window",
    "sliding_window",
    "sliding_log",
    "token_bucket",
    "gcra",
];

fn rules() -> String {
    let mut yaml = String::from("domain: faults\ndescriptors:\n");
    for key in std::iter::once("exact").chain(ALGORITHMS) {
        let algorithm = if key == "exact" { "fixed_window" } else { key };
        yaml.push_str(&format!(
            "  - key: {key}\n    rate_limit: {{unit: day, requests_per_unit: 5, algorithm: {algorithm}, failure_mode: closed}}\n"
        ));
    }
    // A limit shared between regions (with --region; whole without).
    yaml.push_str(
        "  - key: global\n    rate_limit: {unit: day, requests_per_unit: 5, scope: global, sharing: aggregate, failure_mode: closed}\n",
    );
    // A concurrency limit (the hold script): every request its own slot.
    yaml.push_str(
        "  - key: slot\n    slot: true\n    rate_limit: {algorithm: concurrency, max_in_flight: 5, failure_mode: closed}\n",
    );
    yaml
}

/// A request phase (`release` false) or stream end of the request whose slot is `slot`.
async fn hold(server: &TestServer, slot: &str, release: bool) -> Outcome {
    use sluice::proto::common::rate_limit_descriptor::Entry;
    use sluice::proto::common::RateLimitDescriptor;
    use sluice::proto::rls::rate_limit_response::Code;
    use sluice::proto::rls::RateLimitRequest;
    let request = RateLimitRequest {
        domain: "faults".into(),
        descriptors: vec![RateLimitDescriptor {
            entries: vec![Entry {
                key: "slot".into(),
                value: slot.into(),
            }],
            limit: None,
            hits_addend: Some(1),
            is_negative_hits: release,
        }],
        hits_addend: 0,
    };
    let answer = server.client().await.should_rate_limit(request).await;
    match answer.map(|a| a.into_inner().overall_code) {
        Ok(code) if code == Code::Ok as i32 => Outcome::Ok,
        Ok(code) if code == Code::OverLimit as i32 => Outcome::Over,
        Ok(code) => Outcome::Other(tonic::Code::Ok, code),
        Err(status) => Outcome::Other(status.code(), -1),
    }
}

const INSTALL: &str =
    "install redis-server (scripts/test does: apt-get install redis-server redis-tools)";

/// A TLS-only `redis-server` whose only enabled user is the README's; killed on drop.
struct TlsRedis {
    port: u16,
    child: Child,
    _dir: tempfile::TempDir,
}

impl TlsRedis {
    /// Serves `server` (certificate and key) and requires client certificates from `ca`.
    fn start(ca: &Ca, server: &Leaf) -> Self {
        Self::start_on(ca, server, free_port())
    }

    /// [`TlsRedis::start`] on `port`.
    fn start_on(ca: &Ca, server: &Leaf, port: u16) -> Self {
        let dir = tempfile::tempdir().expect("temp dir");
        let (cert, key) = server.write(dir.path(), "redis");
        let ca_file = dir.path().join("ca.crt");
        write_atomic(&ca_file, &ca.pem());
        let acl_file = dir.path().join("users.acl");
        let acl = format!(
            "user default off resetkeys resetchannels -@all\nuser {}\n",
            ACL_USER.replace(">PASSWORD", &format!(">{PASSWORD}"))
        );
        std::fs::write(&acl_file, acl).expect("write users.acl");
        let text = |path: &Path| path.to_string_lossy().into_owned();
        let child = Command::new(
            std::env::var("SLUICE_REDIS_SERVER_BIN").unwrap_or_else(|_| "redis-server".into()),
        )
        .args(["--port", "0", "--tls-port", &port.to_string()])
        .args(["--bind", "127.0.0.1", "--save", "", "--appendonly", "no"])
        .args(["--dir", &text(dir.path())])
        .args([
            "--tls-cert-file",
            &text(&cert),
            "--tls-key-file",
            &text(&key),
        ])
        .args(["--tls-ca-cert-file", &text(&ca_file)])
        .args(["--tls-auth-clients", "yes"])
        .args(["--aclfile", &text(&acl_file)])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap_or_else(|error| panic!("cannot run redis-server ({error}): {INSTALL}"));
        let redis = Self {
            port,
            child,
            _dir: dir,
        };
        let deadline = Instant::now() + Duration::from_secs(10);
        while TcpStream::connect(("127.0.0.1", port)).is_err() {
            assert!(
                Instant::now() < deadline,
                "redis-server did not listen on TLS port {port} (built without TLS?)"
            );
            std::thread::sleep(Duration::from_millis(20));
        }
        redis
    }

    fn url(&self) -> String {
        format!("rediss://sluice:{PASSWORD}@localhost:{}", self.port)
    }
}

impl Drop for TlsRedis {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// PEM files for Sluice: the CA it trusts and its client certificate.
struct ClientFiles {
    dir: tempfile::TempDir,
    ca: PathBuf,
    cert: PathBuf,
    key: PathBuf,
}

impl ClientFiles {
    /// Sluice's flags for the three files.
    fn flags(&self) -> [&str; 6] {
        [
            "--redis-tls-ca",
            path(&self.ca),
            "--redis-tls-cert",
            path(&self.cert),
            "--redis-tls-key",
            path(&self.key),
        ]
    }
}

fn client_files(trusted: &Ca, issuer: &Ca) -> ClientFiles {
    let dir = tempfile::tempdir().expect("temp dir");
    let ca = dir.path().join("trusted-ca.crt");
    write_atomic(&ca, &trusted.pem());
    let (cert, key) = issuer.client(&["sluice"]).write(dir.path(), "client");
    ClientFiles { dir, ca, cert, key }
}

async fn sluice(url: &str, flags: &[&str]) -> TestServer {
    let mut all = vec![
        "--store",
        "redis",
        "--redis-url",
        url,
        "--redis-timeout",
        "500ms",
    ];
    all.extend_from_slice(flags);
    TestServer::start(&[("tls.yaml".to_owned(), rules())], &[], &all).await
}

/// `flags` borrowed as the flags of [`sluice`].
fn as_strs(flags: &[String]) -> Vec<&str> {
    flags.iter().map(String::as_str).collect()
}

fn path(path: &Path) -> &str {
    path.to_str().expect("utf-8 temp path")
}

/// Ten calls on one descriptor.
async fn outcomes(server: &TestServer, key: &str, value: &str) -> Vec<Outcome> {
    let mut client = server.client().await;
    let mut outcomes = Vec::new();
    for _ in 0..10 {
        let answer = call(&mut client, key, value, Duration::from_secs(3)).await;
        outcomes.push(answer.outcome);
    }
    outcomes
}

/// Five OK then OVER_LIMIT: every OK came from Redis.
fn exact() -> Vec<Outcome> {
    let mut expected = vec![Outcome::Ok; 5];
    expected.extend([Outcome::Over; 5]);
    expected
}

/// Waits until Redis answers (the connection is made in the background), then checks
/// exactness on `value` (not used before: a refused value is remembered locally) of
/// every algorithm.
async fn assert_exact(server: &TestServer, value: &str) {
    let mut client = server.client().await;
    let deadline = Instant::now() + Duration::from_secs(10);
    while call(&mut client, "exact", "warm-up", Duration::from_secs(3))
        .await
        .outcome
        != Outcome::Ok
    {
        assert!(Instant::now() < deadline, "Redis over TLS never answered");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    for algorithm in ALGORITHMS {
        assert_eq!(
            outcomes(server, algorithm, value).await,
            exact(),
            "{algorithm}"
        );
    }
    // Concurrency: 5 slots held, then every request's release (5 free theirs).
    let mut held = Vec::new();
    for n in 0..10 {
        held.push(hold(server, &format!("{value}-{n}"), false).await);
    }
    assert_eq!(held, exact(), "concurrency");
    for n in 0..10 {
        assert_eq!(
            hold(server, &format!("{value}-{n}"), true).await,
            Outcome::Ok
        );
    }
}

/// Calls take the failure mode (`closed`: OVER_LIMIT from the first call) and keep
/// taking it: the connection is refused.
async fn assert_refused(server: &TestServer, case: &str) {
    // Long enough for several connection attempts.
    tokio::time::sleep(Duration::from_millis(1500)).await;
    assert_eq!(
        outcomes(server, "exact", case).await,
        vec![Outcome::Over; 10],
        "{case}: a call reached Redis"
    );
    assert!(
        log_lines_with(PASSWORD).is_empty(),
        "{case}: password in the log"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tls_with_client_certificate_and_minimal_acl_is_exact() {
    let _serial = serial().await;
    captured_log();
    // The log is the process's: other tests of this binary log refusals of their own.
    let refused_before = log_lines_with("NOPERM").len();
    let ca = Ca::new("redis test ca");
    let redis = TlsRedis::start(&ca, &ca.server(&["localhost", "127.0.0.1"]));
    let files = client_files(&ca, &ca);
    let server = sluice(&redis.url(), &files.flags()).await;
    assert_exact(&server, "exact").await;
    assert_eq!(
        log_lines_with("NOPERM").len(),
        refused_before,
        "the ACL refused a command"
    );
    assert!(log_lines_with(PASSWORD).is_empty(), "password in the log");
    server.stop().await;
    drop(files.dir);
}

/// Two regions, each its own Redis over TLS with a client certificate and the minimal
/// ACL: each region's Sluice reaches the other's store as it reaches its own, and the
/// usage one admits is counted by the other.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn regions_share_usage_over_tls_with_the_minimal_acl() {
    let _serial = serial().await;
    captured_log();
    let refused_before = log_lines_with("NOPERM").len();
    let ca = Ca::new("redis test ca");
    let leaf = ca.server(&["localhost", "127.0.0.1"]);
    let (redis_a, redis_b) = (TlsRedis::start(&ca, &leaf), TlsRedis::start(&ca, &leaf));
    let files = client_files(&ca, &ca);
    let region = |name: &'static str, peer: String| {
        let mut flags: Vec<String> = files.flags().iter().map(|f| (*f).to_owned()).collect();
        flags.extend(["--region".into(), name.into(), "--peer-region".into(), peer]);
        flags.extend(["--region-sync-interval".into(), "100ms".into()]);
        flags
    };
    let flags_a = region("a", format!("b={}", redis_b.url()));
    let flags_b = region("b", format!("a={}", redis_a.url()));
    let a = sluice(&redis_a.url(), &as_strs(&flags_a)).await;
    let b = sluice(&redis_b.url(), &as_strs(&flags_b)).await;
    let deadline = Instant::now() + Duration::from_secs(10);
    for server in [&a, &b] {
        while server.status().await["regions"]["links"][0]["cut"] != false {
            assert!(
                Instant::now() < deadline,
                "the regions never saw each other"
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
    let mut client_a = a.client().await;
    for _ in 0..3 {
        let answer = call(&mut client_a, "global", "shared", Duration::from_secs(3)).await;
        assert_eq!(answer.outcome, Outcome::Ok);
    }
    while a
        .metrics()
        .await
        .get("sluice_region_sent_keys_total{region=\"b\"}")
        < 1.0
    {
        assert!(Instant::now() < deadline, "a never published to b");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    // b counts a's 3 of the 5.
    let mut client_b = b.client().await;
    let mut outcomes = Vec::new();
    for _ in 0..3 {
        outcomes.push(
            call(&mut client_b, "global", "shared", Duration::from_secs(3))
                .await
                .outcome,
        );
    }
    assert_eq!(outcomes, [Outcome::Ok, Outcome::Ok, Outcome::Over]);
    assert_eq!(
        log_lines_with("NOPERM").len(),
        refused_before,
        "the ACL refused a command"
    );
    assert!(log_lines_with(PASSWORD).is_empty(), "password in the log");
    a.stop().await;
    b.stop().await;
    drop(files.dir);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn wrong_ca_takes_the_failure_mode_and_logs_without_the_password() {
    let _serial = serial().await;
    captured_log();
    let ca = Ca::new("redis test ca");
    let other = Ca::new("some other ca");
    let redis = TlsRedis::start(&ca, &ca.server(&["localhost", "127.0.0.1"]));
    let files = client_files(&other, &ca);
    let server = sluice(&redis.url(), &files.flags()).await;
    assert_refused(&server, "wrong-ca").await;
    let lines = log_lines_with("UnknownIssuer");
    assert!(!lines.is_empty(), "no log line names the certificate error");
    assert!(
        lines
            .iter()
            .all(|line| line.contains("redis connection error")),
        "{lines:?}"
    );
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hostname_mismatch_is_refused_unless_explicitly_skipped() {
    let _serial = serial().await;
    captured_log();
    let ca = Ca::new("redis test ca");
    let redis = TlsRedis::start(&ca, &ca.server(&["redis.elsewhere.example"]));
    let files = client_files(&ca, &ca);
    let flags = files.flags();
    let server = sluice(&redis.url(), &flags).await;
    assert_refused(&server, "hostname").await;
    assert!(
        !log_lines_with("NotValidForName").is_empty(),
        "no log line names the host name error"
    );
    server.stop().await;

    // The chain is still verified with the check off; the name is not.
    let mut skip = flags.to_vec();
    skip.push("--redis-tls-insecure-skip-hostname");
    let server = sluice(&redis.url(), &skip).await;
    assert_exact(&server, "exact").await;
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_a_client_certificate_redis_refuses() {
    let _serial = serial().await;
    captured_log();
    let ca = Ca::new("redis test ca");
    let redis = TlsRedis::start(&ca, &ca.server(&["localhost", "127.0.0.1"]));
    let files = client_files(&ca, &ca);
    let server = sluice(&redis.url(), &["--redis-tls-ca", path(&files.ca)]).await;
    assert_refused(&server, "no-client-cert").await;
    server.stop().await;
}

/// Certificates rotated on disk are used without a restart: Redis comes back on the same
/// port with a server certificate from a new CA and trusts only client certificates from
/// it. Until Sluice's CA bundle and client certificate are replaced, its reconnections
/// are refused (failure mode); once they are, the next connection uses them and the
/// counts are exact again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rotated_ca_and_client_certificate_are_used_without_a_restart() {
    let _serial = serial().await;
    captured_log();
    let old = Ca::new("redis test ca");
    let redis = TlsRedis::start(&old, &old.server(&["localhost", "127.0.0.1"]));
    let port = redis.port;
    let files = client_files(&old, &old);
    let server = sluice(&redis.url(), &files.flags()).await;
    assert_exact(&server, "exact").await;

    drop(redis);
    let new = Ca::new("rotated redis test ca");
    let redis = TlsRedis::start_on(&new, &new.server(&["localhost", "127.0.0.1"]), port);
    assert_refused(&server, "old certificates, new Redis").await;

    write_atomic(&files.ca, &new.pem());
    let (cert, key) = new.client(&["sluice"]).write(files.dir.path(), "client");
    assert_eq!((&cert, &key), (&files.cert, &files.key));
    assert_exact(&server, "rotated").await;
    assert!(
        !log_lines_with("TLS files reloaded").is_empty(),
        "the reload is logged"
    );
    assert!(log_lines_with(PASSWORD).is_empty(), "password in the log");
    server.stop().await;
    drop(redis);
}

/// Envoy Gateway's way: no Redis flag at all, only the reference's variables
/// (`REDIS_URL` without a scheme, `REDIS_TLS`, `REDIS_AUTH`, `REDIS_TLS_CACERT`,
/// `REDIS_TLS_CLIENT_CERT`, `REDIS_TLS_CLIENT_KEY`), and
/// `REDIS_TLS_SKIP_HOSTNAME_VERIFICATION` for a certificate of another name.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_references_tls_variables_alone_configure_mutual_tls() {
    let _serial = serial().await;
    captured_log();
    let ca = Ca::new("redis test ca");
    let redis = TlsRedis::start(&ca, &ca.server(&["redis.elsewhere.example"]));
    let files = client_files(&ca, &ca);
    let env = |skip: &str| -> Vec<(String, String)> {
        [
            ("REDIS_SOCKET_TYPE", "tcp".to_owned()),
            ("REDIS_URL", format!("localhost:{}", redis.port)),
            ("REDIS_TLS", "true".to_owned()),
            ("REDIS_AUTH", format!("sluice:{PASSWORD}")),
            ("REDIS_TLS_CACERT", path(&files.ca).to_owned()),
            ("REDIS_TLS_CLIENT_CERT", path(&files.cert).to_owned()),
            ("REDIS_TLS_CLIENT_KEY", path(&files.key).to_owned()),
            ("REDIS_TLS_SKIP_HOSTNAME_VERIFICATION", skip.to_owned()),
        ]
        .into_iter()
        .map(|(name, value)| (name.to_owned(), value))
        .collect()
    };
    let start = |env: Vec<(String, String)>| async move {
        let rules = [("tls.yaml".to_owned(), rules())];
        TestServer::start(&rules, &env, &["--redis-timeout", "500ms"]).await
    };
    let server = start(env("false")).await;
    assert_refused(&server, "reference-hostname").await;
    server.stop().await;
    let server = start(env("true")).await;
    assert_exact(&server, "reference").await;
    server.stop().await;
}
