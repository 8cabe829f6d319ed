//! Short smoke run of the fuzz targets (`fuzz/`), so the normal test command exercises
//! them on stable Rust: every committed seed is replayed, then mutated seeds and random
//! bytes are fed for a bounded number of cases. The long coverage-guided runs use
//! `cargo fuzz` (see the README's Security section).

use std::path::PathBuf;

use proptest::prelude::*;

fn seeds(target: &str) -> Vec<Vec<u8>> {
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("fuzz/corpus")
        .join(target);
    let mut entries: Vec<_> = std::fs::read_dir(&dir)
        .unwrap_or_else(|e| panic!("read {}: {e}", dir.display()))
        .map(|entry| entry.expect("corpus entry").path())
        .collect();
    entries.sort();
    let seeds: Vec<Vec<u8>> = entries
        .iter()
        .map(|path| std::fs::read(path).expect("read seed"))
        .collect();
    assert!(!seeds.is_empty(), "no seeds in {}", dir.display());
    seeds
}

/// A seed with bytes flipped, truncated or spliced: cheap structure-aware mutations.
fn mutated(target: &'static str) -> impl Strategy<Value = Vec<u8>> {
    let seeds = seeds(target);
    (
        0..seeds.len(),
        prop::collection::vec((any::<prop::sample::Index>(), any::<u8>()), 0..8),
        any::<prop::sample::Index>(),
        any::<bool>(),
    )
        .prop_map(move |(seed, flips, cut, truncate)| {
            let mut bytes = seeds[seed].clone();
            if bytes.is_empty() {
                return bytes;
            }
            for (at, value) in flips {
                let at = at.index(bytes.len());
                bytes[at] ^= value;
            }
            if truncate {
                bytes.truncate(cut.index(bytes.len()));
            }
            bytes
        })
}

#[test]
fn config_seeds_replay() {
    for seed in seeds("config") {
        support::fuzz::config(&seed);
    }
}

#[test]
fn request_seeds_replay() {
    let answered = seeds("request")
        .iter()
        .filter(|seed| support::fuzz::request(seed))
        .count();
    // Every seed but the unknown-domain one is a valid request the rules answer.
    assert!(answered >= 6, "only {answered} seeds answered");
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 1500, failure_persistence: None, ..ProptestConfig::default() })]

    #[test]
    fn config_survives_mutated_seeds(bytes in mutated("config")) {
        support::fuzz::config(&bytes);
    }

    #[test]
    fn config_survives_random_bytes(bytes in prop::collection::vec(any::<u8>(), 0..512)) {
        support::fuzz::config(&bytes);
    }

    #[test]
    fn request_survives_mutated_seeds(bytes in mutated("request")) {
        support::fuzz::request(&bytes);
    }

    #[test]
    fn request_survives_random_bytes(bytes in prop::collection::vec(any::<u8>(), 0..512)) {
        support::fuzz::request(&bytes);
    }
}
