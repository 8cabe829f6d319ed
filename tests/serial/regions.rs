//! Several regions, as users run them: three `redis-server` processes stand for three
//! regions' stores, one `sluice serve` process per region checks its own, and each
//! publishes usage to the other two through a loopback TCP proxy per link (20 ms each
//! way) that the test can cut. One `scope: global`, `sharing: aggregate` limit of 100
//! per second (fixed window, and sliding window), synced every 100 ms.
//!
//! What must hold (docs/src/regions.md, "The bound"):
//! - links up: in every window, the units admitted in all regions together are at most
//!   the limit plus the bound, Σ over the other regions of their request rate × (sync
//!   interval + link delay), with the interval and delay as measured (`/status`: each
//!   link's lag since its last publication and its round trip);
//! - a quiet region does not hold a busy one back: alone, it gets the whole limit;
//! - one region cut off keeps answering every call at once, within its own share (34 of
//!   100); the others count it at its share; `/status` and `/metrics` show the cut;
//! - healed, the links reconcile: marks and the keys charged during the cut go through,
//!   and the cut region gets the whole limit again when alone.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use sluice::clock::SystemClock;
use sluice::proto::common::rate_limit_descriptor::Entry;
use sluice::proto::common::RateLimitDescriptor;
use sluice::proto::rls::rate_limit_response::Code;
use sluice::proto::rls::rate_limit_service_client::RateLimitServiceClient;
use sluice::proto::rls::RateLimitRequest;
use support::fault::serial;
use support::process::SluiceProcess;
use support::proxy::{Faults, Proxy};
use support::redis::RedisServer;
use support::{fetch_metrics, write_file};
use tonic::transport::Channel;

/// The regions, sorted (their static shares of 100 are 34, 33, 33).
const REGIONS: [&str; 3] = ["ap", "eu", "us"];
const LIMIT: u64 = 100;
const SYNC: Duration = Duration::from_millis(100);
/// Added by each link's proxy to every chunk, each way.
const LINK_LATENCY: Duration = Duration::from_millis(20);
/// Longest answer tolerated, links up or cut: no call waits on another region.
const ANSWER_WITHIN: Duration = Duration::from_millis(250);

/// One region: its store, its Sluice, and the proxies of its links to the others.
struct Region {
    name: &'static str,
    _redis: RedisServer,
    _sluice: SluiceProcess,
    client: RateLimitServiceClient<Channel>,
    http: String,
}

/// One answered call: when it was sent and answered (µs since the epoch), allowed or
/// not.
#[derive(Clone, Copy, Debug)]
struct Answered {
    sent: u64,
    answered: u64,
    allowed: bool,
}

/// No call is sent this close to the end of a second (µs), nor [`GUARD_AFTER`] into
/// the next: every call is then decided in the second it is sent in, the window it is
/// counted in (windows are whole seconds on the same clock).
const GUARD_BEFORE: u64 = 20_000;
/// See [`GUARD_BEFORE`].
const GUARD_AFTER: u64 = 2_000;

const RULES: &str = "domain: regions
descriptors:
  - key: user
    value: fixed
    rate_limit: {unit: second, requests_per_unit: 100, scope: global, sharing: aggregate}
  - key: user
    value: sliding
    rate_limit: {unit: second, requests_per_unit: 100, algorithm: sliding_window, scope: global, sharing: aggregate}
";

fn now_micros() -> u64 {
    SystemClock::shared().now()
}

fn addr(redis: &RedisServer) -> SocketAddr {
    SocketAddr::from(([127, 0, 0, 1], redis.port))
}

/// Sends `rate` calls per second on `value` to `client` for `length`; every answer.
async fn traffic(
    client: RateLimitServiceClient<Channel>,
    value: &'static str,
    rate: u32,
    length: Duration,
) -> Vec<Answered> {
    let answers = Arc::new(Mutex::new(Vec::new()));
    let mut tick = tokio::time::interval(Duration::from_secs(1) / rate);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Burst);
    let started = Instant::now();
    let mut calls = tokio::task::JoinSet::new();
    while started.elapsed() < length {
        tick.tick().await;
        let into_second = now_micros() % 1_000_000;
        if !(GUARD_AFTER..=1_000_000 - GUARD_BEFORE).contains(&into_second) {
            continue;
        }
        let mut client = client.clone();
        let answers = answers.clone();
        calls.spawn(async move {
            let sent = now_micros();
            let response = client
                .should_rate_limit(RateLimitRequest {
                    domain: "regions".into(),
                    descriptors: vec![RateLimitDescriptor {
                        entries: vec![Entry {
                            key: "user".into(),
                            value: value.into(),
                        }],
                        ..RateLimitDescriptor::default()
                    }],
                    hits_addend: 1,
                })
                .await
                .expect("every call is answered");
            let answered = now_micros();
            answers.lock().expect("answers").push(Answered {
                sent,
                answered,
                allowed: response.into_inner().overall_code == Code::Ok as i32,
            });
        });
    }
    while calls.join_next().await.is_some() {}
    let answers = answers.lock().expect("answers").clone();
    answers
}

/// Admitted calls per window (second), of every region's answers together, each in the
/// second it was sent and answered in (one answered past [`GUARD_BEFORE`] counts in
/// both: an upper bound). The first and last seconds, partly covered, are left out.
fn per_window(answers: &[Vec<Answered>]) -> BTreeMap<u64, u64> {
    let mut windows: BTreeMap<u64, u64> = BTreeMap::new();
    let (mut first, mut last) = (u64::MAX, 0);
    for answer in answers.iter().flatten() {
        first = first.min(answer.sent / 1_000_000);
        last = last.max(answer.answered / 1_000_000);
        if !answer.allowed {
            continue;
        }
        for second in answer.sent / 1_000_000..=answer.answered / 1_000_000 {
            *windows.entry(second).or_default() += 1;
        }
    }
    windows.retain(|&second, _| second > first && second < last);
    windows
}

/// The slowest answer.
fn slowest(answers: &[Vec<Answered>]) -> Duration {
    let micros = answers
        .iter()
        .flatten()
        .map(|a| a.answered - a.sent)
        .max()
        .unwrap_or(0);
    Duration::from_micros(micros)
}

/// `/status` of a region.
async fn status(region: &Region) -> serde_json::Value {
    reqwest::get(format!("http://{}/status", region.http))
        .await
        .expect("GET /status")
        .json()
        .await
        .expect("JSON")
}

/// The links of `region`'s `/status`, by the other region's name.
async fn links(region: &Region) -> BTreeMap<String, serde_json::Value> {
    let status = status(region).await;
    status["regions"]["links"]
        .as_array()
        .expect("regions.links")
        .iter()
        .map(|link| {
            (
                link["region"].as_str().expect("name").to_owned(),
                link.clone(),
            )
        })
        .collect()
}

/// The longest sync lag (time since a link's last publication) plus the longest
/// publication round trip the `/status` of `regions` shows now, of their links to each
/// other: the age of what one knows of another.
async fn staleness(regions: &[&Region]) -> f64 {
    let names: Vec<&str> = regions.iter().map(|r| r.name).collect();
    let mut worst: f64 = 0.0;
    for region in regions {
        for (peer, link) in links(region).await {
            if names.contains(&peer.as_str()) {
                let lag = link["lag_seconds"].as_f64().unwrap_or(f64::INFINITY);
                let trip = link["round_trip_seconds"].as_f64().unwrap_or(f64::INFINITY);
                worst = worst.max(lag + trip);
            }
        }
    }
    worst
}

/// Runs `work` while sampling the [`staleness`] of `regions` every 50 ms; its output
/// and the worst.
async fn measuring<T>(regions: &[&Region], work: impl std::future::Future<Output = T>) -> (T, f64) {
    let worst = Mutex::new(0.0f64);
    let sampling = async {
        loop {
            let now = staleness(regions).await;
            {
                let mut worst = worst.lock().expect("worst");
                *worst = worst.max(now);
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    };
    let output = tokio::select! {
        output = work => output,
        () = sampling => unreachable!("sampling never ends"),
    };
    let worst = *worst.lock().expect("worst");
    (output, worst)
}

/// Waits until every region's `/status` says what `ready` asks of its links.
async fn until_links(
    regions: &[Region],
    what: &str,
    ready: impl Fn(&str, &str, &serde_json::Value) -> bool,
) {
    let started = Instant::now();
    loop {
        let mut all = true;
        for region in regions {
            for (peer, link) in links(region).await {
                all &= ready(region.name, &peer, &link);
            }
        }
        if all {
            return;
        }
        assert!(
            started.elapsed() < Duration::from_secs(10),
            "links never {what}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_regions_share_a_global_limit_within_the_stated_bound() {
    let _serial = serial().await;
    let dir = tempfile::tempdir().expect("temp dir");
    write_file(dir.path(), "rules.yaml", RULES);
    let stores: Vec<RedisServer> = REGIONS.iter().map(|_| RedisServer::start()).collect();
    // links[(from, to)]: from's publications into to's store.
    let mut proxies: BTreeMap<(usize, usize), Proxy> = BTreeMap::new();
    for from in 0..REGIONS.len() {
        for (to, store) in stores.iter().enumerate() {
            if from != to {
                let proxy = Proxy::start(addr(store));
                proxy.set(Faults {
                    latency: LINK_LATENCY,
                    ..Faults::default()
                });
                proxies.insert((from, to), proxy);
            }
        }
    }
    let mut regions = Vec::new();
    for (index, (name, redis)) in REGIONS.iter().zip(stores).enumerate() {
        let peers: Vec<String> = (0..REGIONS.len())
            .filter(|&to| to != index)
            .map(|to| format!("{}={}", REGIONS[to], proxies[&(index, to)].url()))
            .collect();
        let url = redis.url();
        let sync = format!("{}ms", SYNC.as_millis());
        let mut flags = vec!["--store", "redis", "--redis-url", &url, "--region", name];
        flags.extend(["--region-sync-interval", &sync]);
        for peer in &peers {
            flags.extend(["--peer-region", peer.as_str()]);
        }
        let (sluice, grpc, http) = SluiceProcess::serve(dir.path(), &flags);
        let client = RateLimitServiceClient::connect(format!("http://{grpc}"))
            .await
            .expect("connect gRPC");
        regions.push(Region {
            name,
            _redis: redis,
            _sluice: sluice,
            client,
            http,
        });
    }
    until_links(&regions, "up", |_, _, link| link["cut"] == false).await;

    // Links up, every region busy: at most the limit plus the bound, and the limit used.
    let everyone: Vec<&Region> = regions.iter().collect();
    for value in ["fixed", "sliding"] {
        let (answers, worst) = measuring(&everyone, async {
            let calls = regions
                .iter()
                .map(|region| traffic(region.client.clone(), value, 100, Duration::from_secs(4)));
            futures::future::join_all(calls).await
        })
        .await;
        // Every region sends 100 per second: the others' rate is 200 per second.
        let bound = 200.0 * worst;
        let windows = per_window(&answers);
        for (region, answers) in REGIONS.iter().zip(&answers) {
            let mut sent: Vec<u64> = answers.iter().map(|a| a.sent).collect();
            sent.sort();
            let burst = (0..sent.len())
                .map(|i| {
                    sent[i..]
                        .iter()
                        .take_while(|&&t| t < sent[i] + 200_000)
                        .count()
                })
                .max();
            let slow = answers.iter().map(|a| a.answered - a.sent).max();
            eprintln!("{value}: {region} admitted {:?}; most sent in 200 ms {burst:?}; slowest {slow:?} us", per_window(std::slice::from_ref(answers)));
        }
        eprintln!(
            "{value}: admitted per window {windows:?}; sync lag + round trip at worst {worst:.3} s; bound {bound:.1}"
        );
        assert!(windows.len() >= 2, "{value}: {windows:?}");
        for (second, admitted) in &windows {
            assert!(
                *admitted as f64 <= LIMIT as f64 + bound,
                "{value}: window {second} admitted {admitted}, over {LIMIT} + {bound:.1}"
            );
        }
        // The limit is used: a fixed window fills each window; a sliding window's
        // previous window weighs on the next, so over the run.
        let used: u64 = windows.values().sum();
        let whole = LIMIT * windows.len() as u64;
        match value {
            "fixed" => assert!(windows.values().all(|&n| n >= 90), "{value}: {windows:?}"),
            _ => assert!(used * 10 >= whole * 8, "{value}: {used} of {whole}"),
        }
        assert!(
            slowest(&answers) < ANSWER_WITHIN,
            "{value}: {:?}",
            slowest(&answers)
        );
    }

    // A quiet region holds no one back: us alone gets the whole limit.
    let alone = traffic(
        regions[2].client.clone(),
        "fixed",
        200,
        Duration::from_secs(3),
    )
    .await;
    let windows = per_window(&[alone]);
    eprintln!("us alone: {windows:?}");
    for (second, admitted) in &windows {
        assert!(
            (95..=LIMIT).contains(admitted),
            "us alone in window {second}: {admitted}"
        );
    }

    // Cut ap off, both ways.
    for ((from, to), proxy) in &proxies {
        if *from == 0 || *to == 0 {
            proxy.set(Faults {
                blackhole: true,
                ..Faults::default()
            });
        }
    }
    until_links(&regions, "cut", |name, peer, link| {
        (name != "ap" && peer != "ap") || (link["cut"] == true && link["stale"] == true)
    })
    .await;
    let (answers, worst) = measuring(&everyone[1..], async {
        let calls = regions
            .iter()
            .map(|region| traffic(region.client.clone(), "fixed", 100, Duration::from_secs(3)));
        futures::future::join_all(calls).await
    })
    .await;
    let ap = per_window(&answers[..1]);
    let all = per_window(&answers);
    // ap within its share; us and eu count it at its share and still see each other,
    // each sending 100 per second.
    let bound = 100.0 * worst;
    eprintln!(
        "ap cut off: ap {ap:?}, all {all:?}; us-eu sync lag + round trip at worst {worst:.3} s"
    );
    for (second, admitted) in &ap {
        assert!(
            (30..=34).contains(admitted),
            "cut off, ap admitted {admitted} in window {second}: its share is 34"
        );
    }
    for (second, admitted) in &all {
        assert!(
            *admitted as f64 <= LIMIT as f64 + bound,
            "window {second}: {admitted}, over {LIMIT} + {bound:.1}"
        );
    }
    assert!(
        slowest(&answers) < ANSWER_WITHIN,
        "cut: {:?}",
        slowest(&answers)
    );
    // Seen from us: ap is cut and stale, in /status and in /metrics.
    let us_links = links(&regions[2]).await;
    assert_eq!(us_links["ap"]["cut"], true);
    assert!(
        us_links["ap"]["failures_in_a_row"].as_u64() > Some(0),
        "{:?}",
        us_links["ap"]
    );
    assert!(us_links["ap"]["last_error"].is_object());
    let metrics = fetch_metrics(&format!("http://{}/metrics", regions[2].http)).await;
    assert_eq!(metrics.get("sluice_region_stale{region=\"ap\"}"), 1.0);
    assert_eq!(metrics.get("sluice_region_link_up{region=\"ap\"}"), 0.0);
    assert_eq!(metrics.get("sluice_region_link_up{region=\"eu\"}"), 1.0);
    assert!(metrics.get("sluice_region_link_lag_seconds{region=\"ap\"}") > 0.5);
    assert!(metrics.get("sluice_region_publish_failures_total{region=\"ap\"}") > 0.0);
    assert!(metrics.get("sluice_region_last_received_age_seconds{region=\"eu\"}") < 1.0);
    let ap_links = links(&regions[0]).await;
    assert!(
        ap_links["us"]["pending_keys"].as_u64() >= Some(1),
        "{:?}",
        ap_links["us"]
    );

    // Healed: the links reconcile, and ap alone gets the whole limit again.
    for proxy in proxies.values() {
        proxy.set(Faults {
            latency: LINK_LATENCY,
            ..Faults::default()
        });
    }
    until_links(&regions, "healed", |_, _, link| link["cut"] == false).await;
    let ap_links = links(&regions[0]).await;
    assert_eq!(ap_links["us"]["pending_keys"], 0, "{:?}", ap_links["us"]);
    let alone = traffic(
        regions[0].client.clone(),
        "fixed",
        200,
        Duration::from_secs(3),
    )
    .await;
    let windows = per_window(&[alone]);
    eprintln!("ap alone after the heal: {windows:?}");
    for (second, admitted) in &windows {
        assert!(
            (95..=LIMIT).contains(admitted),
            "ap alone in window {second}: {admitted}"
        );
    }
}
