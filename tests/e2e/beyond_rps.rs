//! End-to-end: the patterns of "Beyond requests per second" (`docs/src/beyond-rps.md`,
//! #44), with a real Envoy running the page's bootstraps in front of a stand-in API and
//! the `sluice` binary serving the page's rule files: a concurrency limit (one Sluice,
//! then two replicas sharing one Redis), a token budget charged after the response, and
//! delay instead of refusal. `wire` first pins down, with a recording rate limit
//! service, what Envoy 1.40 sends for them.
//!
//! The concurrency and delay tests need `algorithm: concurrency`, `slot` and `max_delay`;
//! a Sluice without them refuses the page's rule files at start-up.

use std::time::{Duration, Instant};

use reqwest::{Response, StatusCode};
use support::e2e::envoy::{render_ports, spawn_ready};
use support::e2e::sluice::{Sluice, Store};
use support::e2e::upstream::Upstream;
use support::e2e::{doc_block, free_ports, Process};
use support::redis::RedisServer;
use tokio::task::JoinHandle;

mod wire;

/// The page whose blocks these tests run.
const PAGE: &str = "docs/src/beyond-rps.md";
/// The ports of the page's bootstraps: admin, listener, Sluice, the API.
const ADMIN: u16 = 9901;
const INGRESS: u16 = 10000;
const SLUICE: u16 = 8081;
const API: u16 = 9000;
/// How long a call Envoy makes when a stream ends may take to be decided. Envoy makes
/// it after the response is sent, so the client's next request may be decided first.
const SETTLE: Duration = Duration::from_secs(2);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrency_limit_holds_slots_until_the_stream_ends() {
    let rules = rules("concurrency-rules");
    let sluice = Sluice::start(rules.path(), Store::Memory).await;
    let upstream = Upstream::holding().await;
    let edge = Edge::start(
        &doc_block(PAGE, "concurrency-envoy"),
        &[sluice.grpc_port],
        upstream.port,
    )
    .await;
    concurrency_scenario(&edge, &upstream).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrency_limit_across_two_replicas_on_one_redis() {
    let redis = RedisServer::start();
    let rules = rules("concurrency-rules");
    let first = Sluice::start(rules.path(), Store::Redis(redis.url())).await;
    let second = Sluice::start(rules.path(), Store::Redis(redis.url())).await;
    let upstream = Upstream::holding().await;
    let services = [first.grpc_port, second.grpc_port];
    let edge = Edge::start(
        &doc_block(PAGE, "concurrency-envoy"),
        &services,
        upstream.port,
    )
    .await;
    concurrency_scenario(&edge, &upstream).await;
    for replica in services {
        let calls = edge.calls_to(replica).await;
        assert!(calls > 0, "Envoy sent no call to the replica on {replica}");
    }
}

/// 3 in flight per user: the 4th is refused, a finished request lets the next one in,
/// a client that disconnects frees its slot, a refused request's release frees nothing.
async fn concurrency_scenario(edge: &Edge, upstream: &Upstream) {
    let alice = [("x-user", "alice")];
    let mut held: Vec<JoinHandle<Response>> = (0..3).map(|_| edge.spawn(&alice)).collect();
    upstream.wait_for_arrivals(3, SETTLE).await;
    refused(edge, upstream, &alice, "a 4th request in flight").await;
    // Envoy sends the release of a refused request too: it must free nothing.
    tokio::time::sleep(Duration::from_millis(300)).await;
    refused(edge, upstream, &alice, "after a refused request's release").await;
    // Another user's slots are their own.
    held.push(edge.spawn(&[("x-user", "bob")]));
    upstream.wait_for_arrivals(4, SETTLE).await;

    // One of alice's requests finishes: its release lets the next one in.
    upstream.release(1);
    assert_eq!(one_finished(&mut held).await, StatusCode::OK);
    held.push(admitted_eventually(edge, upstream, &alice).await);
    refused(edge, upstream, &alice, "3 in flight again").await;

    // A client that disconnects mid-request releases its slot.
    let gone = held.pop().expect("alice's newest request");
    gone.abort();
    let _ = gone.await;
    held.push(admitted_eventually(edge, upstream, &alice).await);

    // Held requests (and the disconnected one, if the upstream still holds it) finish.
    upstream.release(held.len() + 1);
    for request in held {
        assert_eq!(
            request.await.expect("request task").status(),
            StatusCode::OK
        );
    }
}

/// Sends `headers` and fails at once if the request reaches the upstream: it must be
/// refused (`when` says why), with a `Retry-After` of 1 s (the wait for the oldest slot's
/// `max_hold`, capped at 1 s).
async fn refused(edge: &Edge, upstream: &Upstream, headers: &[(&str, &str)], when: &str) {
    let before = upstream.arrived();
    let mut request = edge.spawn(headers);
    while !request.is_finished() {
        assert_eq!(upstream.arrived(), before, "admitted, {when}");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let response = (&mut request).await.expect("request task");
    assert_eq!(response.status(), StatusCode::TOO_MANY_REQUESTS, "{when}");
    assert_eq!(header(&response, "retry-after"), "1", "{when}");
}

/// Waits for one request of `held` to finish (any: the upstream's order of arrival is
/// not the order they were sent in) and returns its status.
async fn one_finished(held: &mut Vec<JoinHandle<Response>>) -> StatusCode {
    let started = Instant::now();
    loop {
        if let Some(at) = held.iter().position(JoinHandle::is_finished) {
            return held.remove(at).await.expect("request task").status();
        }
        assert!(started.elapsed() < SETTLE, "no request finished");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

/// Sends `headers` until a request is admitted (it reaches the upstream, which holds it)
/// instead of refused; panics after [`SETTLE`].
async fn admitted_eventually(
    edge: &Edge,
    upstream: &Upstream,
    headers: &[(&str, &str)],
) -> JoinHandle<Response> {
    let started = Instant::now();
    loop {
        let before = upstream.arrived();
        let mut request = edge.spawn(headers);
        loop {
            if upstream.arrived() > before {
                eprintln!("admitted {:?} after a slot was freed", started.elapsed());
                return request;
            }
            if request.is_finished() {
                let response = (&mut request).await.expect("request task");
                assert_eq!(response.status(), StatusCode::TOO_MANY_REQUESTS);
                break;
            }
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        assert!(
            started.elapsed() < SETTLE,
            "still refused {SETTLE:?} after a slot was freed"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn token_budget_is_charged_after_the_response() {
    let rules = rules("budget-rules");
    let sluice = Sluice::start(rules.path(), Store::Memory).await;
    let upstream = Upstream::start().await;
    let edge = Edge::start(
        &doc_block(PAGE, "budget-envoy"),
        &[sluice.grpc_port],
        upstream.port,
    )
    .await;

    // Each response's cost is charged: 4 × 150 of globex's 1 000 a minute.
    let globex = [("x-tenant", "globex"), ("x-echo-x-tokens-used", "150")];
    for _ in 0..4 {
        assert_eq!(edge.status(&globex).await, StatusCode::OK);
    }
    let started = Instant::now();
    loop {
        let response = edge
            .request(&[("x-tenant", "globex")])
            .send()
            .await
            .expect("check");
        assert_eq!(response.status(), StatusCode::OK);
        let remaining: u64 = header(&response, "ratelimit-remaining")
            .parse()
            .expect("a number");
        if remaining <= 450 {
            assert!(remaining >= 400, "remaining {remaining} after 600 charged");
            break;
        }
        assert!(
            started.elapsed() < SETTLE,
            "remaining {remaining}: the charges did not land"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }

    // A response costing 1 500 of acme's 1 000 passes (the check charges nothing); the
    // charge puts acme 500 in debt, so its next requests are refused for 30 s.
    let acme = [("x-tenant", "acme"), ("x-echo-x-tokens-used", "1500")];
    assert_eq!(edge.status(&acme).await, StatusCode::OK);
    let started = Instant::now();
    let refused = loop {
        let response = edge
            .request(&[("x-tenant", "acme")])
            .send()
            .await
            .expect("check");
        if response.status() == StatusCode::TOO_MANY_REQUESTS {
            break response;
        }
        assert_eq!(response.status(), StatusCode::OK);
        assert!(
            started.elapsed() < SETTLE,
            "acme's 1 500 tokens not charged after {SETTLE:?}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    let retry: u64 = header(&refused, "retry-after")
        .parse()
        .expect("Retry-After in seconds");
    assert!(
        (28..=31).contains(&retry),
        "Retry-After {retry} for a debt of 500 at 1 000 a minute"
    );
    for _ in 0..3 {
        assert_eq!(
            edge.status(&[("x-tenant", "acme")]).await,
            StatusCode::TOO_MANY_REQUESTS
        );
    }
    assert_eq!(edge.status(&[("x-tenant", "globex")]).await, StatusCode::OK);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn delay_spaces_a_burst_instead_of_refusing_it() {
    let rules = rules("delay-rules");
    let sluice = Sluice::start(rules.path(), Store::Memory).await;
    let upstream = Upstream::start().await;
    let edge = Edge::start(
        &doc_block(PAGE, "delay-envoy"),
        &[sluice.grpc_port],
        upstream.port,
    )
    .await;

    // 20 at once against 10 a second, burst 1, max_delay 2 s: the n-th waits n × 100 ms.
    let burst: Vec<_> = (0..20).map(|_| edge.spawn(&[("x-client", "c1")])).collect();
    for request in burst {
        assert_eq!(
            request.await.expect("request task").status(),
            StatusCode::OK
        );
    }
    let mut arrivals = upstream.arrivals();
    assert_eq!(arrivals.len(), 20);
    arrivals.sort();
    let mut gaps: Vec<Duration> = arrivals.windows(2).map(|pair| pair[1] - pair[0]).collect();
    gaps.sort();
    let median = gaps[gaps.len() / 2];
    let span = arrivals[19] - arrivals[0];
    eprintln!("arrivals span {span:?}, median gap {median:?}, gaps {gaps:?}");
    assert!(
        (Duration::from_millis(70)..=Duration::from_millis(130)).contains(&median),
        "median gap {median:?}, not about 100 ms"
    );
    assert!(
        span >= Duration::from_millis(1600),
        "20 requests spread over {span:?} only"
    );
}

/// A rules directory holding the page's rule file `name`.
fn rules(name: &str) -> tempfile::TempDir {
    let dir = tempfile::tempdir().expect("temp dir");
    std::fs::write(dir.path().join("beyond.yaml"), doc_block(PAGE, name)).expect("write rules");
    dir
}

/// A response header as text; panics naming it when absent.
fn header(response: &Response, name: &str) -> String {
    response
        .headers()
        .get(name)
        .and_then(|value| value.to_str().ok())
        .map(str::to_owned)
        .unwrap_or_else(|| panic!("no {name} header; headers: {:?}", response.headers()))
}

/// Envoy running a bootstrap of the page.
struct Edge {
    admin: u16,
    ingress: u16,
    client: reqwest::Client,
    _process: Process,
    _dir: tempfile::TempDir,
}

impl Edge {
    /// Starts `bootstrap` with its rate limit cluster on `services` (one endpoint each;
    /// Envoy's default round robin between them) and its API cluster on port `api`.
    async fn start(bootstrap: &str, services: &[u16], api: u16) -> Self {
        let endpoint = format!("port_value: {SLUICE}}}");
        assert_eq!(
            bootstrap.matches(&endpoint).count(),
            1,
            "one Sluice endpoint in the bootstrap"
        );
        let bootstrap: String = bootstrap
            .lines()
            .flat_map(|line| match line.contains(&endpoint) {
                true => services
                    .iter()
                    .map(|port| line.replace(&endpoint, &format!("port_value: {port}}}")))
                    .collect(),
                false => vec![line.to_owned()],
            })
            .map(|line| line + "\n")
            .collect();
        let [admin, ingress] = free_ports();
        let bootstrap = render_ports(
            &bootstrap,
            &[(ADMIN, admin), (INGRESS, ingress), (API, api)],
        )
        .replace("address: 0.0.0.0,", "address: 127.0.0.1,");
        let dir = tempfile::tempdir().expect("temp dir");
        let process = spawn_ready(dir.path(), &bootstrap, admin).await;
        Self {
            admin,
            ingress,
            client: reqwest::Client::new(),
            _process: process,
            _dir: dir,
        }
    }

    /// Calls Envoy made to the rate limit endpoint on `port` (admin `/clusters`).
    async fn calls_to(&self, port: u16) -> u64 {
        let url = format!("http://127.0.0.1:{}/clusters", self.admin);
        let text = self.client.get(url).send().await.expect("GET /clusters");
        let text = text.text().await.expect("/clusters body");
        let prefix = format!("sluice::127.0.0.1:{port}::rq_total::");
        let line = text
            .lines()
            .find_map(|line| line.strip_prefix(prefix.as_str()));
        line.and_then(|count| count.trim().parse().ok())
            .unwrap_or_else(|| panic!("no {prefix} in /clusters:\n{text}"))
    }

    /// A request to the listener with `headers`.
    fn request(&self, headers: &[(&str, &str)]) -> reqwest::RequestBuilder {
        let request = self
            .client
            .get(format!("http://127.0.0.1:{}/", self.ingress));
        headers.iter().fold(request, |request, (name, value)| {
            request.header(*name, *value)
        })
    }

    /// The status of a request with `headers`.
    async fn status(&self, headers: &[(&str, &str)]) -> StatusCode {
        self.request(headers)
            .send()
            .await
            .expect("request through Envoy")
            .status()
    }

    /// A request in flight; aborting the task disconnects the client.
    fn spawn(&self, headers: &[(&str, &str)]) -> JoinHandle<Response> {
        let request = self.request(headers);
        tokio::spawn(async move { request.send().await.expect("request through Envoy") })
    }
}
