//! The whole in-process decision (`Service::should_rate_limit`, memory store) and
//! response building alone.
#![allow(missing_docs)] // criterion_group! generates undocumented functions

mod common;

use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion};
use sluice::limiter::{CheckRequest, Descriptor, Limited, Verdict};
use sluice::proto::common::{rate_limit_descriptor::Entry as WireEntry, RateLimitDescriptor};
use sluice::proto::rls::RateLimitRequest;
use sluice::rules::Entry;
use sluice::service::response;
use std::hint::black_box;

fn request(entries: &[(&str, &str)]) -> RateLimitRequest {
    RateLimitRequest {
        domain: "bench".into(),
        descriptors: vec![RateLimitDescriptor {
            entries: entries
                .iter()
                .map(|(key, value)| WireEntry {
                    key: (*key).into(),
                    value: (*value).into(),
                })
                .collect(),
            ..RateLimitDescriptor::default()
        }],
        hits_addend: 0,
    }
}

fn should_rate_limit(c: &mut Criterion) {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .build()
        .expect("runtime");
    let mut group = c.benchmark_group("service");
    for count in common::rule_counts() {
        let fixture = common::Fixture::new(&common::rules_yaml(count));
        let g = format!("g{}", common::middle_group(count));
        let one_key = request(&[("k1", &g), ("k2", "a")]);
        group.bench_with_input(BenchmarkId::new("one_key", count), &one_key, |b, req| {
            b.iter(|| runtime.block_on(fixture.service.should_rate_limit(black_box(req))))
        });
    }
    // Many distinct keys: a token-bucket rule on `user`, 100 000 users in turn.
    let fixture = common::Fixture::new(
        "domain: bench\ndescriptors:\n  - key: user\n    rate_limit: {unit: second, requests_per_unit: 1000000, algorithm: token_bucket}\n",
    );
    let requests: Vec<RateLimitRequest> = (0..100_000)
        .map(|user| request(&[("user", &user.to_string())]))
        .collect();
    let mut next = 0;
    group.bench_function("many_keys_100000", |b| {
        b.iter(|| {
            next = (next + 1) % requests.len();
            runtime.block_on(fixture.service.should_rate_limit(&requests[next]))
        })
    });
    group.finish();
}

fn build_response(c: &mut Criterion) {
    let fixture = common::Fixture::new(&common::rules_yaml(10));
    let runtime = tokio::runtime::Builder::new_current_thread()
        .build()
        .expect("runtime");
    // Decide once to get a real verdict, then bench only the assembly.
    let set = fixture.service.rules().current().expect("rules");
    let check = CheckRequest {
        domain: "bench",
        descriptors: vec![Descriptor {
            entries: vec![
                Entry {
                    key: "k1",
                    value: "g0",
                },
                Entry {
                    key: "k2",
                    value: "a",
                },
            ],
            ..Descriptor::default()
        }],
        hits_addend: 0,
    };
    let verdicts = runtime
        .block_on(fixture.service.limiter().check(&set.rules, &check))
        .expect("decided");
    assert!(matches!(verdicts[0], Verdict::Limited(Limited { .. })));
    let options = sluice::service::ResponseOptions::default();
    let mut group = c.benchmark_group("response");
    group.bench_function("build_1_descriptor", |b| {
        b.iter(|| black_box(response::build(black_box(&check), &verdicts, &options)))
    });
    let headers = sluice::service::ResponseOptions {
        header_mode: sluice::service::HeaderMode::All,
        ..options.clone()
    };
    group.bench_function("build_1_descriptor_all_headers", |b| {
        b.iter(|| black_box(response::build(black_box(&check), &verdicts, &headers)))
    });
    group.finish();
}

criterion_group!(benches, should_rate_limit, build_response);
criterion_main!(benches);
