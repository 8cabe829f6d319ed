//! Each algorithm's pure decision, and counter key encoding.
#![allow(missing_docs)] // criterion_group! generates undocumented functions

use criterion::{criterion_group, criterion_main, Criterion};
use sluice::algorithm::{self, AlgorithmKind, Quota, State, MICROS_PER_SECOND};
use sluice::rules::Entry;
use sluice::store::CounterKey;
use std::hint::black_box;

const KINDS: [AlgorithmKind; 5] = [
    AlgorithmKind::FixedWindow,
    AlgorithmKind::SlidingWindow,
    AlgorithmKind::SlidingLog,
    AlgorithmKind::TokenBucket,
    AlgorithmKind::Gcra,
];

fn decide(c: &mut Criterion) {
    let mut group = c.benchmark_group("decide");
    let quota = Quota {
        limit: 1_000,
        period: MICROS_PER_SECOND,
        burst: 1_000,
        on_over_limit: Default::default(),
    };
    let now = 1_700_000_000 * MICROS_PER_SECOND;
    for kind in KINDS {
        // A state that has seen some traffic, so the decision is not the fresh path.
        let mut state = State::fresh(kind);
        for step in 0..100 {
            let (_, next) = algorithm::decide(kind, &state, now + step * 1_000, 1, &quota);
            state = next;
        }
        group.bench_function(kind.as_str(), |b| {
            b.iter(|| {
                black_box(algorithm::decide(
                    kind,
                    black_box(&state),
                    now + 100_000,
                    1,
                    &quota,
                ))
            })
        });
    }
    group.finish();
}

fn key_encoding(c: &mut Criterion) {
    let mut group = c.benchmark_group("key");
    let one = [Entry {
        key: "user",
        value: "alice-0123456789",
    }];
    let four = [
        Entry {
            key: "tenant",
            value: "acme",
        },
        Entry {
            key: "user",
            value: "alice-0123456789",
        },
        Entry {
            key: "path",
            value: "/api/v1/orders",
        },
        Entry {
            key: "method",
            value: "POST",
        },
    ];
    group.bench_function("encode_1_entry", |b| {
        b.iter(|| {
            black_box(CounterKey::new(
                black_box("bench"),
                &one,
                &[],
                [(AlgorithmKind::FixedWindow, 60_000_000)],
            ))
        })
    });
    group.bench_function("encode_4_entries", |b| {
        b.iter(|| {
            black_box(CounterKey::new(
                black_box("bench"),
                &four,
                &[],
                [(AlgorithmKind::FixedWindow, 60_000_000)],
            ))
        })
    });
    group.finish();
}

criterion_group!(benches, decide, key_encoding);
criterion_main!(benches);
