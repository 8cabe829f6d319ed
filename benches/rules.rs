//! Rule lookup cost against the number of rules: the index makes it depend on descriptor
//! depth, not on how many rules there are.
#![allow(missing_docs)] // criterion_group! generates undocumented functions

mod common;

use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion};
use sluice::rules::{Entry, Lookup};
use std::hint::black_box;

fn lookup(c: &mut Criterion) {
    let mut group = c.benchmark_group("lookup");
    for count in common::rule_counts() {
        let rules = common::rules(count);
        let g = format!("g{}", common::middle_group(count));
        let depth1 = [Entry {
            key: "k1",
            value: &g,
        }];
        let depth4 = [
            Entry {
                key: "k1",
                value: &g,
            },
            Entry {
                key: "k2",
                value: "a",
            },
            Entry {
                key: "k3",
                value: "pattern-match",
            },
            Entry {
                key: "k4",
                value: "anything",
            },
        ];
        for (name, entries) in [("depth1", &depth1[..]), ("depth4", &depth4[..])] {
            assert!(matches!(
                rules.lookup("bench", entries, None),
                Lookup::Matched(_)
            ));
            group.bench_with_input(BenchmarkId::new(name, count), &entries, |b, entries| {
                b.iter(|| black_box(rules.lookup(black_box("bench"), entries, None)))
            });
        }
    }
    group.finish();
}

criterion_group!(benches, lookup);
criterion_main!(benches);
