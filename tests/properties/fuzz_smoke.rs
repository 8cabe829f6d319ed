//! The fuzz targets (`fuzz/`) on stable Rust: every committed corpus file is replayed
//! (a crash once found is kept there as a regression input), then each target is fed
//! mutated corpus files and random bytes for a stated time, `SLUICE_FUZZ_SECONDS` per
//! target (2 s in the test suite; `scripts/fuzz --stable DURATION` runs it longer). The
//! coverage-guided runs use cargo-fuzz on nightly (`scripts/fuzz DURATION`).

use std::path::PathBuf;
use std::time::{Duration, Instant};

/// A target's harness: bytes in, never a panic.
type Harness = fn(&[u8]);

/// Each target's name (its corpus directory) and harness.
const TARGETS: [(&str, Harness); 5] = [
    ("config", support::fuzz::config),
    ("request", |data| {
        support::fuzz::request(data);
    }),
    ("redis_reply", support::fuzz::redis_reply),
    ("xds", |data| {
        let _ = support::fuzz::xds(data);
    }),
    ("json", |data| {
        support::fuzz::json(data);
    }),
];

/// Seconds per target of the time-bounded run when `SLUICE_FUZZ_SECONDS` is not set.
const DEFAULT_SECONDS: u64 = 2;

fn corpus(target: &str) -> Vec<(String, Vec<u8>)> {
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("fuzz/corpus")
        .join(target);
    let mut entries: Vec<_> = std::fs::read_dir(&dir)
        .unwrap_or_else(|e| panic!("read {}: {e}", dir.display()))
        .map(|entry| entry.expect("corpus entry").path())
        .collect();
    entries.sort();
    let seeds: Vec<(String, Vec<u8>)> = entries
        .iter()
        .map(|path| {
            let name = path.file_name().map(|n| n.to_string_lossy().into_owned());
            (
                name.unwrap_or_default(),
                std::fs::read(path).expect("read seed"),
            )
        })
        .collect();
    assert!(!seeds.is_empty(), "no seeds in {}", dir.display());
    seeds
}

fn seed(target: &str, name: &str) -> Vec<u8> {
    corpus(target)
        .into_iter()
        .find(|(seed, _)| seed == name)
        .unwrap_or_else(|| panic!("no seed {name} for {target}"))
        .1
}

#[test]
fn every_corpus_file_replays() {
    for (target, harness) in TARGETS {
        for (_, input) in corpus(target) {
            harness(&input);
        }
    }
}

#[test]
fn seeds_mean_what_they_say() {
    let answered = corpus("request")
        .iter()
        .filter(|(_, seed)| support::fuzz::request(seed))
        .count();
    // Every seed but the unknown-domain one is a valid request the rules answer.
    assert!(answered >= 6, "only {answered} request seeds answered");
    for name in ["seed-simple", "seed-nested", "seed-flags"] {
        let rules = support::fuzz::xds(&seed("xds", name));
        assert!(rules.as_ref().is_ok_and(|&n| n > 0), "{name}: {rules:?}");
    }
    // Units 0 to 7: UNKNOWN (0) is refused, as the reference refuses it.
    for name in ["seed-every-unit", "seed-wrong-type"] {
        assert!(support::fuzz::xds(&seed("xds", name)).is_err(), "{name}");
    }
    for name in [
        "seed-request.json",
        "seed-snake.json",
        "seed-every-rule.json",
    ] {
        assert!(
            support::fuzz::json(&seed("json", name)),
            "{name} not answered"
        );
    }
    assert!(!support::fuzz::json(&seed("json", "seed-bad.json")));
}

/// A small xorshift generator: the run is random, and the seed is printed to replay it.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }

    fn below(&mut self, n: usize) -> usize {
        (self.next() % n.max(1) as u64) as usize
    }
}

/// A corpus file flipped, cut, spliced with another or grown with random bytes; or
/// random bytes alone.
fn mutant(rng: &mut Rng, corpus: &[(String, Vec<u8>)]) -> Vec<u8> {
    if rng.below(8) == 0 {
        return (0..rng.below(512)).map(|_| rng.next() as u8).collect();
    }
    let mut bytes = corpus[rng.below(corpus.len())].1.clone();
    for _ in 0..=rng.below(4) {
        match rng.below(5) {
            0 | 1 if !bytes.is_empty() => {
                let at = rng.below(bytes.len());
                bytes[at] ^= 1 << rng.below(8);
            }
            2 if !bytes.is_empty() => bytes.truncate(rng.below(bytes.len())),
            3 => {
                let other = &corpus[rng.below(corpus.len())].1;
                let from = rng.below(other.len());
                let at = rng.below(bytes.len() + 1);
                bytes.splice(at..at, other[from..].iter().copied());
            }
            _ => {
                let at = rng.below(bytes.len() + 1);
                let byte = rng.next() as u8;
                bytes.insert(at, byte);
            }
        }
    }
    bytes
}

/// Feeds each target mutants for `SLUICE_FUZZ_SECONDS`; a panicking input is written
/// to `$CARGO_TARGET_TMPDIR/fuzz-crash-<target>` (to commit as
/// `fuzz/corpus/<target>/seed-regression-NAME`).
#[test]
fn fuzz_for_a_while() {
    let seconds = std::env::var("SLUICE_FUZZ_SECONDS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(DEFAULT_SECONDS);
    let start = std::collections::hash_map::RandomState::new();
    let seed = {
        use std::hash::{BuildHasher, Hasher};
        start.build_hasher().finish() | 1
    };
    let mut rng = Rng(seed);
    for (target, harness) in TARGETS {
        let corpus = corpus(target);
        let until = Instant::now() + Duration::from_secs(seconds);
        let mut runs = 0u64;
        while Instant::now() < until {
            let input = mutant(&mut rng, &corpus);
            if std::panic::catch_unwind(|| harness(&input)).is_err() {
                let path =
                    PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join(format!("fuzz-crash-{target}"));
                std::fs::write(&path, &input).expect("write crash input");
                panic!(
                    "{target} panicked (rng seed {seed}); input in {}",
                    path.display()
                );
            }
            runs += 1;
        }
        eprintln!("fuzz {target}: {runs} inputs in {seconds} s");
    }
}
