//! End-to-end: a real Envoy (`deploy/envoy/envoy.yaml`) in front of a stand-in API, with
//! the `sluice` binary serving `deploy/envoy/rules/` as its rate limit service. Every
//! check is what an HTTP client of Envoy sees. One Envoy and one Sluice per store; each
//! scenario uses its own users so that they do not share counters.

use std::net::{IpAddr, Ipv4Addr};
use std::time::{Duration, Instant};

use reqwest::{Response, StatusCode};
use support::e2e::envoy::Envoy;
use support::e2e::sluice::{Sluice, Store};
use support::repo_root;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn envoy_end_to_end_memory_store() {
    suite(Store::Memory).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn envoy_end_to_end_redis_store() {
    let redis = support::redis::RedisServer::start();
    suite(Store::Redis(redis.url())).await;
}

/// Every scenario against one store.
async fn suite(store: Store) {
    let rules = repo_root().join("deploy/envoy/rules");
    let mut sluice = Sluice::start(&rules, store).await;
    let envoy = Envoy::start(sluice.grpc_port).await;
    let stack = Stack {
        envoy,
        client: reqwest::Client::new(),
    };
    stack.per_user_header_rule().await;
    stack.ip_rule().await;
    stack.two_descriptors_on_one_route().await;
    stack.per_route_rules().await;
    stack.shadow_rule(&sluice).await;
    stack.rule_edited_on_disk(&sluice).await;
    stack.failure_modes(&mut sluice).await;
    let over_limit = stack
        .envoy
        .stat("cluster.backend.ratelimit.over_limit")
        .await;
    assert!(
        over_limit >= 5,
        "Envoy counted {over_limit} over-limit answers"
    );
}

struct Stack {
    envoy: Envoy,
    client: reqwest::Client,
}

impl Stack {
    async fn get(&self, url: &str, headers: &[(&str, &str)]) -> Response {
        let mut request = self.client.get(url);
        for (name, value) in headers {
            request = request.header(*name, *value);
        }
        request.send().await.expect("request through Envoy")
    }

    /// `n` requests to `path` on the fail-closed listener; their statuses.
    async fn statuses(&self, n: usize, path: &str, headers: &[(&str, &str)]) -> Vec<u16> {
        let mut out = Vec::new();
        for _ in 0..n {
            out.push(
                self.get(&self.envoy.url(path), headers)
                    .await
                    .status()
                    .as_u16(),
            );
        }
        out
    }

    /// `x-user` rule (5 per hour): OK answers count down the quota in the RateLimit
    /// headers; the 6th is a 429 with `x-envoy-ratelimited` and `Retry-After`.
    async fn per_user_header_rule(&self) {
        let user = [("x-user", "alice")];
        for remaining in (0..5).rev() {
            let response = self.get(&self.envoy.url("/api/items"), &user).await;
            assert_eq!(response.status(), StatusCode::OK);
            assert_eq!(header(&response, "ratelimit-limit"), "5");
            assert_eq!(
                header(&response, "ratelimit-remaining"),
                remaining.to_string()
            );
            assert_eq!(
                header(&response, "ratelimit-policy"),
                "\"api_per_user\";q=5;w=3600"
            );
            assert!(
                header(&response, "ratelimit")
                    .starts_with(&format!("\"api_per_user\";r={remaining};t=")),
                "RateLimit: {}",
                header(&response, "ratelimit")
            );
            let reset: u64 = header(&response, "ratelimit-reset")
                .parse()
                .expect("RateLimit-Reset is whole seconds");
            assert!((1..=3600).contains(&reset), "RateLimit-Reset {reset}");
            assert!(
                response.headers().get("retry-after").is_none(),
                "no Retry-After on an OK answer"
            );
            assert_eq!(response.text().await.expect("body"), "backend ok\n");
        }
        let response = self.get(&self.envoy.url("/api/items"), &user).await;
        assert_eq!(response.status(), StatusCode::TOO_MANY_REQUESTS);
        assert_eq!(header(&response, "x-envoy-ratelimited"), "true");
        assert_eq!(header(&response, "ratelimit-remaining"), "0");
        let retry: u64 = header(&response, "retry-after")
            .parse()
            .expect("Retry-After is whole seconds");
        assert!((1..=3600).contains(&retry), "Retry-After {retry}");
        // Another user has a budget of their own; a request without the header sends
        // no descriptor and is never limited.
        assert_eq!(
            self.statuses(1, "/api/items", &[("x-user", "bob")]).await,
            [200]
        );
        assert_eq!(self.statuses(7, "/api/items", &[]).await, [200; 7]);
        eprintln!("ok: per-user header rule");
    }

    /// `remote_address` rule on /login (3 per hour per client IP): the 4th request from
    /// 127.0.0.1 is refused, while 127.0.0.2 still passes.
    async fn ip_rule(&self) {
        assert_eq!(
            self.statuses(5, "/login", &[]).await,
            [200, 200, 200, 429, 429]
        );
        let other_ip = reqwest::Client::builder()
            .local_address(IpAddr::V4(Ipv4Addr::new(127, 0, 0, 2)))
            .build()
            .expect("client bound to 127.0.0.2");
        let response = other_ip
            .get(self.envoy.url("/login"))
            .send()
            .await
            .expect("request from 127.0.0.2");
        assert_eq!(response.status(), StatusCode::OK);
        assert_eq!(
            header(&response, "ratelimit-policy"),
            "\"login_per_ip\";q=3;w=3600"
        );
        eprintln!("ok: IP rule");
    }

    /// /api/ sends [user] and [api_key]: the key's limit (3) refuses first; with a fresh
    /// key the user's limit (5) refuses while the key still has quota.
    async fn two_descriptors_on_one_route(&self) {
        let first = [("x-user", "carol"), ("x-api-key", "key-1")];
        assert_eq!(
            self.statuses(4, "/api/items", &first).await,
            [200, 200, 200, 429]
        );
        let refused = self.get(&self.envoy.url("/api/items"), &first).await;
        assert_eq!(refused.status(), StatusCode::TOO_MANY_REQUESTS);
        assert!(header(&refused, "ratelimit-policy").contains("api_per_key"));
        // carol has spent 5 of her 5 (refused hits count, as in the reference); key-2
        // is fresh, so only her user limit can refuse.
        let second = [("x-user", "carol"), ("x-api-key", "key-2")];
        let refused = self.get(&self.envoy.url("/api/items"), &second).await;
        assert_eq!(refused.status(), StatusCode::TOO_MANY_REQUESTS);
        assert!(header(&refused, "ratelimit-policy").contains("api_per_user"));
        eprintln!("ok: two descriptors on one route");
    }

    /// /search has its own per-user limit: a user refused on /api/ still searches, and
    /// the headers show the search rule.
    async fn per_route_rules(&self) {
        let user = [("x-user", "dave")];
        assert_eq!(
            self.statuses(6, "/api/items", &user).await,
            [200, 200, 200, 200, 200, 429]
        );
        let response = self.get(&self.envoy.url("/search?q=x"), &user).await;
        assert_eq!(response.status(), StatusCode::OK);
        assert_eq!(header(&response, "ratelimit-limit"), "10");
        assert_eq!(header(&response, "ratelimit-remaining"), "9");
        assert_eq!(
            self.statuses(10, "/search", &user).await,
            [200, 200, 200, 200, 200, 200, 200, 200, 200, 429]
        );
        eprintln!("ok: per-route rules");
    }

    /// /beta's rule is in shadow mode (limit 1): every request passes, and Sluice counts
    /// the ones it would have refused.
    async fn shadow_rule(&self, sluice: &Sluice) {
        let before = shadow_hits(sluice).await;
        assert_eq!(
            self.statuses(5, "/beta", &[("x-user", "erin")]).await,
            [200; 5]
        );
        let counted = shadow_hits(sluice).await - before;
        assert_eq!(counted, 4.0, "shadow hits counted by Sluice");
        eprintln!("ok: shadow rule");
    }

    /// Lowering /search's limit on disk takes effect for clients within a second.
    async fn rule_edited_on_disk(&self, sluice: &Sluice) {
        let user = [("x-user", "frank")];
        assert_eq!(self.statuses(2, "/search", &user).await, [200, 200]);
        let path = sluice.config_dir.path().join("edge.yaml");
        let text = std::fs::read_to_string(&path).expect("read served rules");
        let needle = "name: search_per_user\n          unit: hour\n          requests_per_unit: 10";
        assert_eq!(text.matches(needle).count(), 1, "search rule in edge.yaml");
        let edited = text.replace(needle, &needle.replace("unit: 10", "unit: 1"));
        let written = Instant::now();
        sluice.write_rules("edge.yaml", &edited);
        loop {
            let response = self.get(&self.envoy.url("/search"), &user).await;
            if response.status() == StatusCode::TOO_MANY_REQUESTS {
                assert_eq!(header(&response, "ratelimit-limit"), "1");
                break;
            }
            assert!(
                written.elapsed() < Duration::from_secs(1),
                "edited rule not in force after 1 s; sluice log:\n{}",
                sluice.log_excerpt()
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        eprintln!(
            "ok: rule edited on disk (in force after {:?})",
            written.elapsed()
        );
    }

    /// Sluice down: the fail-closed listener answers 500, the fail-open one lets the
    /// request through; routes without a descriptor never notice. Sluice back: limits
    /// apply again.
    async fn failure_modes(&self, sluice: &mut Sluice) {
        let user = [("x-user", "grace")];
        assert_eq!(self.statuses(1, "/api/items", &user).await, [200]);
        sluice.stop();
        assert_eq!(self.statuses(3, "/api/items", &user).await, [500; 3]);
        assert_eq!(self.statuses(1, "/", &[]).await, [200]);
        for _ in 0..3 {
            let response = self.get(&self.envoy.fail_open_url("/"), &user).await;
            assert_eq!(response.status(), StatusCode::OK);
        }
        assert!(
            self.envoy
                .stat("cluster.backend.ratelimit.failure_mode_allowed")
                .await
                >= 3
        );
        sluice.restart().await;
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            let status = self
                .get(&self.envoy.url("/api/items"), &user)
                .await
                .status();
            if status == StatusCode::OK {
                break;
            }
            assert_eq!(status, StatusCode::INTERNAL_SERVER_ERROR);
            assert!(
                Instant::now() < deadline,
                "Envoy did not recover after Sluice restarted; envoy log:\n{}",
                self.envoy.log_excerpt()
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        // Limits apply again (whatever the store kept of grace's count).
        assert_eq!(
            self.statuses(6, "/api/items", &[("x-user", "heidi")]).await,
            [200, 200, 200, 200, 200, 429]
        );
        eprintln!("ok: failure modes and recovery");
    }
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

/// Sluice's count of hits the /beta shadow rule would have refused.
async fn shadow_hits(sluice: &Sluice) -> f64 {
    sluice
        .metrics()
        .await
        .reference_stat("ratelimit.service.rate_limit.edge.generic_key_beta.user.shadow_mode")
}
