//! The Lua script against the Rust algorithms: identical seeded random operation
//! sequences (charges, peeks and refunds, on limits that refuse or go into debt) go to the memory store (which runs `src/algorithm/`) on a manual clock and
//! to the script on a real redis-server with the same injected time; every field of
//! every decision must match.

use std::sync::Arc;

use sluice::algorithm::token_bucket::{State, TokenBucket};
use sluice::algorithm::{Algorithm, AlgorithmKind, Decision, Micros, OnOverLimit, Quota};
use sluice::clock::ManualClock;
use sluice::store::memory::MemoryStore;
use sluice::store::redis::RedisMode;
use sluice::store::{CounterKey, LimitCheck, Store, StoreCheck};
use support::redis::{connected_store, RedisServer};
use support::rng::Rng;

const KINDS: [AlgorithmKind; 5] = AlgorithmKind::ALL;

/// `limit` under `on_over_limit: charge` now and then (debt), where its algorithm
/// takes it (not the sliding log).
fn maybe_in_debt(rng: &mut Rng, mut limit: LimitCheck) -> LimitCheck {
    if limit.algorithm != AlgorithmKind::SlidingLog && rng.below(3) == 0 {
        limit.quota.on_over_limit = OnOverLimit::Charge;
    }
    limit
}

fn quota(rng: &mut Rng) -> Quota {
    let period = match rng.below(5) {
        0 => 1 + rng.below(10),
        1 => 10 + rng.below(10_000),
        2 => 1_000_000,
        3 => 3_000_000,
        _ => 60_000_000 + rng.below(7),
    };
    Quota {
        // 0 now and then: the fixed window decides it, the others refuse outright.
        limit: rng.below(21),
        period,
        burst: 1 + rng.below(30),
        on_over_limit: Default::default(),
    }
}

/// The function library (`FCALL`), as sent to a Redis that takes it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lua_mirrors_rust_on_random_sequences() {
    let server = RedisServer::start();
    let redis = connected_store(RedisMode::Standalone, server.url()).await;
    mirror(&redis).await;
    assert!(server.command_calls("fcall") > 0, "no FCALL sent");
    assert_eq!(server.command_calls("evalsha"), 0, "EVALSHA sent");
}

/// The script (`EVALSHA`), as sent to a Redis that refuses functions.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lua_mirrors_rust_through_evalsha() {
    let server = RedisServer::start();
    let redis = connected_store(RedisMode::Standalone, server.url_without_functions()).await;
    mirror(&redis).await;
    assert!(server.command_calls("evalsha") > 0, "no EVALSHA sent");
}

/// Seeded random sequences, each on a key of its own, decided by the memory store and by
/// `redis` at the same injected time: every decision must be the same.
async fn mirror(redis: &sluice::store::redis::RedisStore) {
    let t0: Micros = 1_800_000_000_000_000;
    let mut compared = 0usize;
    let mut delayed = 0usize;
    for seed in 1..=400u64 {
        let mut rng = Rng(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1);
        let clock = Arc::new(ManualClock::new(t0 + rng.below(10_000_000)));
        let memory = MemoryStore::new(1_000_000, clock.clone());
        // One to three limits; the first seeds cover each algorithm alone.
        let nlimits = if seed <= 250 {
            1
        } else {
            1 + rng.below(3) as usize
        };
        let limits: Vec<LimitCheck> = (0..nlimits)
            .map(|i| {
                let limit = LimitCheck {
                    algorithm: if seed <= 250 && i == 0 {
                        KINDS[(seed % 5) as usize]
                    } else {
                        KINDS[rng.below(5) as usize]
                    },
                    quota: quota(&mut rng),
                    sharing: sluice::regions::Sharing::Regional,
                };
                maybe_in_debt(&mut rng, limit)
            })
            .collect();
        let key = CounterKey(u128::from(seed) << 64 | u128::from(rng.next()));
        let period = limits[0].quota.period;
        for step in 0..60 {
            // Time moves by a fraction of the first limit's period, sometimes back.
            let permille: i64 = match rng.below(6) {
                0 => 0,
                1 => 1000,
                2 => rng.below(100) as i64,
                3 => rng.below(2500) as i64,
                4 => -(rng.below(1500) as i64),
                _ => rng.below(400) as i64,
            };
            let now = clock.now_value();
            let dt = i128::from(period) * i128::from(permille) / 1000;
            clock.set((i128::from(now) + dt).max(0) as Micros);
            let cost = match rng.below(4) {
                0 => 0,
                1 | 2 => 1,
                _ => rng.below(36),
            };
            let peek = rng.below(8) == 0;
            // A negative hit now and then: every algorithm's refund, Lua against Rust.
            let refund = !peek && rng.below(5) == 0;
            // A delay now and then (max_delay): admitted at the wait instead, Lua
            // against Rust; the script ignores it for several limits, as Rust does.
            let max_wait = match rng.below(2) {
                0 => rng.below(2 * period + 2),
                _ => 0,
            };
            let check = StoreCheck {
                key,
                limits: limits.clone().into(),
                cost,
                refund,
                max_wait,
            };
            let mut expected: Vec<Decision> = Vec::new();
            let mut actual: Vec<Decision> = Vec::new();
            if peek {
                memory.peek(&check, &mut expected).await.expect("memory");
            } else {
                memory
                    .check(std::slice::from_ref(&check), &mut expected)
                    .await
                    .expect("memory");
            }
            redis
                .check_at(
                    std::slice::from_ref(&check),
                    !peek,
                    clock.now_value(),
                    &mut actual,
                )
                .await
                .expect("redis");
            assert_eq!(
                expected, actual,
                "seed {seed} step {step}: limits {limits:?} cost {cost} peek {peek} refund {refund} max_wait {max_wait}"
            );
            compared += 1;
            delayed += expected
                .iter()
                .filter(|d| d.allowed && d.retry_after > 0)
                .count();
        }
    }
    assert_eq!(compared, 400 * 60);
    assert!(delayed > 100, "only {delayed} delayed admissions compared");
}

/// Several descriptors and same-key checks in one script call are decided in arrival
/// order, exactly as the memory store decides them one after the other.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_call_decides_many_checks_in_order() {
    let server = RedisServer::start();
    let redis = connected_store(RedisMode::Standalone, server.url()).await;
    let mut rng = Rng(77);
    for round in 0..50u64 {
        let clock = Arc::new(ManualClock::new(1_800_000_000_000_000 + round * 1_000));
        let memory = MemoryStore::new(1_000_000, clock.clone());
        let keys: Vec<CounterKey> = (0..3)
            .map(|i| CounterKey(u128::from(round * 10 + i) + 99))
            .collect();
        let specs: Vec<Vec<LimitCheck>> = keys
            .iter()
            .map(|_| {
                (0..1 + rng.below(2))
                    .map(|_| {
                        let limit = LimitCheck {
                            algorithm: KINDS[rng.below(5) as usize],
                            quota: quota(&mut rng),
                            sharing: sluice::regions::Sharing::Regional,
                        };
                        maybe_in_debt(&mut rng, limit)
                    })
                    .collect()
            })
            .collect();
        for _ in 0..10 {
            clock.set(clock.now_value() + rng.below(2_000_000));
            let checks: Vec<StoreCheck> = (0..8)
                .map(|_| {
                    let i = rng.below(3) as usize;
                    StoreCheck {
                        key: keys[i],
                        limits: specs[i].clone().into(),
                        cost: rng.below(4),
                        // Refunds among the charges of one call, decided in order, and
                        // delays: admitted later, the next checks of the call seeing it.
                        refund: rng.below(4) == 0,
                        max_wait: if rng.below(2) == 0 { 3_000_000 } else { 0 },
                    }
                })
                .collect();
            let (expected, actual) = in_one_call(&memory, &redis, &checks, &clock).await;
            assert_eq!(expected, actual, "round {round}: {checks:?}");
        }
    }
}

/// `checks` decided by the memory store one after the other and by the script in one
/// call at the clock's time: the decisions of each, in order.
async fn in_one_call(
    memory: &MemoryStore,
    redis: &sluice::store::redis::RedisStore,
    checks: &[StoreCheck],
    clock: &ManualClock,
) -> (Vec<Decision>, Vec<Decision>) {
    let mut expected = Vec::new();
    let mut actual = Vec::new();
    memory.check(checks, &mut expected).await.expect("memory");
    redis
        .check_at(checks, true, clock.now_value(), &mut actual)
        .await
        .expect("redis");
    (expected, actual)
}

/// A call with more keys than one MGET reads (the script reads them in runs of 1 000):
/// every key's stored state is read, the repeated ones in order, as the memory store
/// decides them one after the other.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_call_of_thousands_of_keys_reads_every_state() {
    let server = RedisServer::start();
    let redis = connected_store(RedisMode::Standalone, server.url()).await;
    let mut rng = Rng(4242);
    let now: Micros = 1_800_000_000_000_000;
    let memory = MemoryStore::new(1_000_000, Arc::new(ManualClock::new(now)));
    let quota = Quota {
        limit: 3,
        period: 60_000_000,
        burst: 3,
        on_over_limit: Default::default(),
    };
    let check = |key: u128, algorithm| StoreCheck {
        key: CounterKey(50_000 + key),
        limits: vec![LimitCheck {
            algorithm,
            quota,
            sharing: sluice::regions::Sharing::Regional,
        }]
        .into(),
        cost: 1,
        refund: false,
        max_wait: 0,
    };
    let algorithm_of = |key: u128| KINDS[(key % 5) as usize];
    // Round 1 stores a state under each of 1 200 keys; round 2 reads them back in an
    // order of 2 500 checks, keys repeated, so over the limit of 3 for some.
    let first: Vec<StoreCheck> = (0..1_200).map(|k| check(k, algorithm_of(k))).collect();
    let second: Vec<StoreCheck> = (0..2_500)
        .map(|_| {
            let k = u128::from(rng.below(1_200));
            check(k, algorithm_of(k))
        })
        .collect();
    for (round, checks) in [(1, &first), (2, &second)] {
        let (mut expected, mut actual) = (Vec::new(), Vec::new());
        memory.check(checks, &mut expected).await.expect("memory");
        redis
            .check_at(checks, true, now, &mut actual)
            .await
            .unwrap_or_else(|e| panic!("round {round}: {e}"));
        assert_eq!(expected, actual, "round {round}");
        if round == 2 {
            assert!(actual.iter().any(|d| !d.allowed), "some keys went over");
        }
    }
}

/// The function library keeps the script's working tables from call to call; each call
/// still reads every state from Redis, never one an earlier call left in them. Between
/// calls a state is deleted, keys come in another order (so each gets another slot), and
/// one call has more keys than the tables are kept for. Every decision matches the memory
/// store, where a deleted key is a key never seen. Through `FCALL` and `EVALSHA` alike.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_call_reads_its_states_from_redis_not_from_an_earlier_call() {
    let server = RedisServer::start();
    let functions = connected_store(RedisMode::Standalone, server.url()).await;
    let scripts = connected_store(RedisMode::Standalone, server.url_without_functions()).await;
    let now: Micros = 1_800_000_000_000_000;
    let quota = Quota {
        limit: 10,
        period: 60_000_000,
        burst: 10,
        on_over_limit: Default::default(),
    };
    for (store, base) in [(&functions, 0u128), (&scripts, 1_000_000u128)] {
        for (k, algorithm) in KINDS.into_iter().enumerate() {
            let base = base + 100_000 * k as u128;
            let memory = MemoryStore::new(1_000_000, Arc::new(ManualClock::new(now)));
            let check = |key: u128| StoreCheck {
                key: CounterKey(base + key),
                limits: vec![LimitCheck {
                    algorithm,
                    quota,
                    sharing: sluice::regions::Sharing::Regional,
                }]
                .into(),
                cost: 1,
                refund: false,
                max_wait: 0,
            };
            let delete = |key: u128| store_raw(&server, CounterKey(base + key), &["DEL"]);
            // Each call: (the keys Redis sees, the keys the memory store sees).
            let calls: Vec<(Vec<u128>, Vec<u128>)> = vec![
                (vec![1, 1, 1, 2, 2, 2], vec![1, 1, 1, 2, 2, 2]),
                // Key 1 deleted: a key the memory store has not seen (90 001) stands for it.
                (vec![2, 1], vec![2, 90_001]),
                (vec![1, 2, 1], vec![90_001, 2, 90_001]),
                // More keys than the script keeps its tables for.
                (
                    (3..1_300).chain([2]).collect(),
                    (3..1_300).chain([2]).collect(),
                ),
                // Key 2 deleted (90 002 stands for it).
                (vec![2, 1], vec![90_002, 90_001]),
            ];
            for (round, (in_redis, in_memory)) in calls.iter().enumerate() {
                match round {
                    1 => delete(1),
                    4 => delete(2),
                    _ => {}
                }
                let redis_checks: Vec<StoreCheck> =
                    in_redis.iter().map(|&key| check(key)).collect();
                let memory_checks: Vec<StoreCheck> =
                    in_memory.iter().map(|&key| check(key)).collect();
                let (mut expected, mut actual) = (Vec::new(), Vec::new());
                memory
                    .check(&memory_checks, &mut expected)
                    .await
                    .expect("memory");
                store
                    .check_at(&redis_checks, true, now, &mut actual)
                    .await
                    .unwrap_or_else(|e| panic!("{algorithm:?} call {round}: {e}"));
                assert_eq!(expected, actual, "{algorithm:?} call {round}");
            }
        }
    }
    assert!(server.command_calls("fcall") > 0, "no FCALL sent");
    assert!(server.command_calls("evalsha") > 0, "no EVALSHA sent");
}

/// A key holding what its algorithm cannot read (another algorithm's state, a malformed
/// or non-numeric string, another Redis type) is decided as a fresh state, never as a
/// script error, and the check's charge replaces it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unreadable_stored_values_read_as_fresh_states() {
    let server = RedisServer::start();
    let redis = connected_store(RedisMode::Standalone, server.url()).await;
    let now: Micros = 1_800_000_000_000_000;
    let stored: [&[&str]; 14] = [
        // Another algorithm's valid state (each is read by one algorithm only).
        &["SET", "f 1800000000000000 3"],
        &["SET", "t 4.5 1800000000000000"],
        &["SET", "t 0.5"],
        &["SET", "w 1 2 x"],
        &["SET", "g nan-ish 1"],
        &["SET", "t 1 2 3"],
        &["SET", "12"],
        &["RPUSH", "a", "b"],
        // Numbers no state holds (each in an algorithm's own form): not a number at
        // all, infinite, negative; sliding-log members that are not "at:units".
        &["SET", "t nan 5"],
        &["SET", "f inf 3"],
        &["SET", "g -5 0"],
        &["SET", "w 1 -2 3"],
        &["ZADD", "1", "garbage"],
        &["ZADD", "1", "5:-1"],
    ];
    let mut case = 0u128;
    for algorithm in KINDS {
        for command in stored {
            let own_state = match algorithm {
                AlgorithmKind::FixedWindow => "f 1800000000000000 3",
                AlgorithmKind::TokenBucket => "t 4.5 1800000000000000",
                _ => "",
            };
            if command[1] == own_state {
                continue; // its own algorithm's valid state, not an unreadable one
            }
            case += 1;
            let key = CounterKey(case);
            let check = StoreCheck {
                key,
                limits: vec![LimitCheck {
                    algorithm,
                    quota: Quota {
                        limit: 5,
                        period: 1_000_000,
                        burst: 5,
                        on_over_limit: Default::default(),
                    },
                    sharing: sluice::regions::Sharing::Regional,
                }]
                .into(),
                cost: 2,
                refund: false,
                max_wait: 0,
            };
            store_raw(&server, key, command);
            let fresh = MemoryStore::new(1_000, Arc::new(ManualClock::new(now)));
            // The first check reads the value as fresh; the second sees the first's charge.
            for round in ["first", "second"] {
                let (mut expected, mut actual) = (Vec::new(), Vec::new());
                fresh
                    .check(std::slice::from_ref(&check), &mut expected)
                    .await
                    .expect("memory");
                redis
                    .check_at(std::slice::from_ref(&check), true, now, &mut actual)
                    .await
                    .unwrap_or_else(|e| panic!("{algorithm:?} over {command:?}, {round}: {e}"));
                assert_eq!(
                    expected, actual,
                    "{algorithm:?} over {command:?}, {round} check"
                );
            }
        }
    }
}

/// States whose numbers pass 2^53 (costs near `u64::MAX` come from `hits_addend`) are
/// written in a form that reads back as the same large numbers: never as a wrapped,
/// negative count that would admit what the limit refuses. A decision's numbers past
/// 2^62 in the memory store are past 2^62 from the script too (its reply carries
/// doubles): never 0.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn states_with_numbers_past_2_pow_53_read_back_large() {
    let server = RedisServer::start();
    let redis = connected_store(RedisMode::Standalone, server.url()).await;
    let now: Micros = 1_800_000_000_000_000;
    let memory = MemoryStore::new(1_000, Arc::new(ManualClock::new(now)));
    // Past 2^63 too, where a C long (what Lua's '%d' formats) would overflow.
    let big = u64::MAX;
    let mut case = 1_000u128;
    for algorithm in [
        AlgorithmKind::FixedWindow,
        AlgorithmKind::SlidingWindow,
        AlgorithmKind::TokenBucket,
        AlgorithmKind::Gcra,
    ] {
        case += 1;
        let key = CounterKey(case);
        let check = |cost: u64| StoreCheck {
            key,
            limits: vec![LimitCheck {
                algorithm,
                quota: Quota {
                    limit: big,
                    period: 1_000_000,
                    burst: big,
                    on_over_limit: Default::default(),
                },
                sharing: sluice::regions::Sharing::Regional,
            }]
            .into(),
            cost,
            refund: false,
            max_wait: 0,
        };
        let decide = |cost: u64| {
            let (redis, memory) = (&redis, &memory);
            async move {
                let (mut decisions, mut expected) = (Vec::new(), Vec::new());
                redis
                    .check_at(&[check(cost)], true, now, &mut decisions)
                    .await
                    .unwrap_or_else(|e| panic!("{algorithm:?}, cost {cost}: {e}"));
                memory
                    .check(&[check(cost)], &mut expected)
                    .await
                    .expect("memory");
                let (got, want) = (decisions[0], expected[0]);
                let large = 1u64 << 62;
                for (field, got, want) in [
                    ("remaining", got.remaining, want.remaining),
                    ("reset_after", got.reset_after, want.reset_after),
                    ("retry_after", got.retry_after, want.retry_after),
                    ("used", got.used, want.used),
                ] {
                    assert!(
                        want < large || got >= large,
                        "{algorithm:?}, cost {cost}: {field} {got} from the script, \
                         {want} from the memory store"
                    );
                }
                got
            }
        };
        assert!(
            decide(big / 2).await.allowed,
            "{algorithm:?}: half the limit"
        );
        let stored = stored_state(&server, key);
        assert!(
            !stored.contains('-'),
            "{algorithm:?}: stored state {stored:?} has a negative number"
        );
        let over = decide(big / 2 + big / 4).await;
        assert!(
            !over.allowed,
            "{algorithm:?}: three quarters more: {over:?}"
        );
    }
}

/// Numbers past u64::MAX in a stored state (damaged, or a time a huge cost pushed past
/// it) read as u64::MAX, where the memory store's u64 fields saturate, and no write asks
/// Redis for a TTL it refuses: before, `f 1e300 3` failed the whole script call, and with
/// it every check batched beside it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stored_numbers_past_u64_max_fail_no_call() {
    let server = RedisServer::start();
    let redis = connected_store(RedisMode::Standalone, server.url()).await;
    let now: Micros = 1_800_000_000_000_000;
    let quota = Quota {
        limit: 5,
        period: 1_000_000,
        burst: 5,
        on_over_limit: Default::default(),
    };
    let huge_member = "99999999999999999999999999999999999999999999:1";
    let cases: [(AlgorithmKind, &[&str]); 6] = [
        (AlgorithmKind::FixedWindow, &["SET", "f 1e300 3"]),
        (AlgorithmKind::SlidingWindow, &["SET", "w 1e300 1 1"]),
        (AlgorithmKind::TokenBucket, &["SET", "t 1 1e300"]),
        // The binary form: a deficit of ~4.7e-38, a last refill at ~1e194 µs.
        (AlgorithmKind::TokenBucket, &["SET", "T12345678abcdefgh"]),
        (AlgorithmKind::Gcra, &["SET", "g 1e300 0"]),
        (AlgorithmKind::SlidingLog, &["ZADD", "1", huge_member]),
    ];
    for (case, (algorithm, command)) in cases.into_iter().enumerate() {
        let damaged = CounterKey(20_000 + 2 * case as u128);
        let clean = CounterKey(20_001 + 2 * case as u128);
        let check = |key| StoreCheck {
            key,
            limits: vec![LimitCheck {
                algorithm,
                quota,
                sharing: sluice::regions::Sharing::Regional,
            }]
            .into(),
            cost: 2,
            refund: false,
            max_wait: 0,
        };
        store_raw(&server, damaged, command);
        let memory = MemoryStore::new(1_000, Arc::new(ManualClock::new(now)));
        for round in ["first", "second"] {
            let (mut expected, mut actual) = (Vec::new(), Vec::new());
            memory
                .check(&[check(clean)], &mut expected)
                .await
                .expect("memory");
            // One call: the damaged key's check and a clean key's.
            redis
                .check_at(&[check(damaged), check(clean)], true, now, &mut actual)
                .await
                .unwrap_or_else(|e| panic!("{algorithm:?} over {command:?}, {round}: {e}"));
            assert_eq!(
                actual[1], expected[0],
                "{algorithm:?} over {command:?}, {round}: the clean key's decision"
            );
            // Read as saturated, not as fresh: the refill is as far off as u64::MAX is.
            if command[1] == "t 1 1e300" {
                assert!(
                    actual[0].reset_after >= 1 << 62,
                    "t 1 1e300, {round}: {:?}",
                    actual[0]
                );
            }
        }
    }
}

/// Runs `command` (a Redis command and its arguments, the key left out) on limit 0 of
/// `key`: a value of our own choosing where the script will look.
fn store_raw(server: &RedisServer, key: CounterKey, command: &[&str]) {
    let name = sluice::store::redis::script::limit_key(&Default::default(), key, 0);
    let mut args = vec![command[0], name.as_str()];
    args.extend_from_slice(&command[1..]);
    server.cli(&args);
}

trait NowValue {
    fn now_value(&self) -> Micros;
}

impl NowValue for ManualClock {
    fn now_value(&self) -> Micros {
        sluice::clock::Clock::now(self)
    }
}

/// The state stored under limit 0 of `key`, as text: the token bucket's binary state
/// ('T' and two little-endian doubles) is decoded by Redis and printed exactly.
fn stored_state(server: &RedisServer, key: CounterKey) -> String {
    let name = sluice::store::redis::script::limit_key(&Default::default(), key, 0);
    const TEXT: &str = "local raw = redis.call('GET', KEYS[1]) \
        if #raw == 17 and string.byte(raw, 1) == 84 then \
          local _, deficit, last = struct.unpack('<c1dd', raw) \
          return string.format('T %.17g %.17g', deficit, last) \
        end \
        return raw";
    server.cli(&["EVAL", TEXT, "1", &name])
}

/// A token-bucket state written as text by an earlier version ('t <deficit> <last>')
/// is read as that state, not as a fresh one, and the charge writes the binary form,
/// which reads back as the state the Rust algorithm returned.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn token_bucket_reads_the_text_states_of_earlier_versions() {
    let server = RedisServer::start();
    let redis = connected_store(RedisMode::Standalone, server.url()).await;
    let last: Micros = 1_800_000_000_000_000;
    let quota = Quota {
        limit: 10,
        period: 1_000_000,
        burst: 10,
        on_over_limit: Default::default(),
    };
    let key = CounterKey(7);
    let check = StoreCheck {
        key,
        limits: vec![LimitCheck {
            algorithm: AlgorithmKind::TokenBucket,
            quota,
            sharing: sluice::regions::Sharing::Regional,
        }]
        .into(),
        cost: 1,
        refund: false,
        max_wait: 0,
    };
    let name = sluice::store::redis::script::limit_key(&Default::default(), key, 0);
    server.cli(&["SET", &name, "t 9.25 1800000000000000"]);
    let mut state = State {
        deficit: 9.25,
        last,
    };
    // 30 ms later 0.3 tokens are back: 9.95 after a charge, within the burst of 10; then
    // 20 ms later a charge would make 10.75, more than the burst: refused.
    for (round, now) in [(1, last + 30_000), (2, last + 50_000)] {
        let (expected, next) = TokenBucket::decide(&state, now, 1, &quota);
        let mut actual = Vec::new();
        redis
            .check_at(std::slice::from_ref(&check), true, now, &mut actual)
            .await
            .unwrap_or_else(|e| panic!("round {round}: {e}"));
        assert_eq!(actual, [expected], "round {round}");
        state = next;
        assert_eq!(actual[0].allowed, round == 1, "round {round}");
        let stored = stored_state(&server, key);
        let fields: Vec<&str> = stored.split_whitespace().collect();
        assert!(
            fields.len() == 3
                && fields[0] == "T"
                && fields[1].parse::<f64>() == Ok(state.deficit)
                && fields[2].parse::<f64>() == Ok(state.last as f64),
            "round {round}: stored {stored:?}, expected {state:?}"
        );
    }
}

/// Microseconds Redis spent in `FCALL` so far (`INFO commandstats`).
fn fcall_micros(server: &RedisServer) -> u64 {
    let stats = server.cli(&["info", "commandstats"]);
    stats
        .lines()
        .find_map(|line| line.strip_prefix("cmdstat_fcall:"))
        .and_then(|fields| fields.split(',').find_map(|f| f.strip_prefix("usec=")))
        .and_then(|usec| usec.trim().parse().ok())
        .unwrap_or(0)
}

/// A sliding log's check costs Redis about the same whatever the log holds: one full at
/// its limit of 1 000 units, each admitted at its own instant, against one of 10. A log
/// read and rewritten whole on every call once cost ~1.5 ms of Redis per call when full
/// (50 times a short log's), enough for a few instances' calls queued behind each other
/// to miss the 20 ms store deadline and be admitted by the failure mode.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sliding_log_check_costs_redis_the_same_whatever_its_length() {
    let server = RedisServer::start();
    let redis = connected_store(RedisMode::Standalone, server.url()).await;
    let check = |key: u128| StoreCheck {
        key: CounterKey(0x51_0000 + key),
        limits: vec![LimitCheck {
            algorithm: AlgorithmKind::SlidingLog,
            quota: Quota {
                limit: 1_000,
                period: 3_600_000_000,
                burst: 1_000,
                on_over_limit: Default::default(),
            },
            sharing: sluice::regions::Sharing::Regional,
        }]
        .into(),
        cost: 1,
        refund: false,
        max_wait: 0,
    };
    let start: Micros = 1_800_000_000_000_000;
    let (full, short) = (check(1), check(2));
    for (log, units) in [(&full, 1_000), (&short, 10)] {
        for i in 0..units {
            let mut out = Vec::new();
            redis
                .check_at(std::slice::from_ref(log), true, start + i, &mut out)
                .await
                .expect("fill");
            assert!(out[0].allowed, "unit {i} admitted");
        }
    }
    // Each measured the same way: 200 calls, one check each; the full log refuses (and
    // finds when its oldest unit leaves), the short one admits.
    let mut cost = Vec::new();
    for (log, allowed) in [(&full, false), (&short, true)] {
        let before = fcall_micros(&server);
        for i in 0..200 {
            let mut out = Vec::new();
            redis
                .check_at(std::slice::from_ref(log), true, start + 2_000 + i, &mut out)
                .await
                .expect("check");
            assert_eq!(out[0].allowed, allowed);
        }
        cost.push((fcall_micros(&server) - before) as f64 / 200.0);
    }
    println!(
        "µs of Redis per check: full log {:.1}, short log {:.1}",
        cost[0], cost[1]
    );
    assert!(
        cost[0] < 3.0 * cost[1].max(10.0),
        "a full log's check costs {:.1} µs of Redis, a short one's {:.1}",
        cost[0],
        cost[1]
    );
}

/// Delayed admissions of a sliding log (`max_delay`) in batches on one key: reservations
/// ahead of `now`, admissions dated behind them, refunds and peeks among them, decided in
/// one call each, exactly as the memory store decides them one after the other.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sliding_log_delays_in_batches_mirror_rust() {
    let server = RedisServer::start();
    let redis = connected_store(RedisMode::Standalone, server.url()).await;
    let mut delayed = 0usize;
    for seed in 1..=2_000u64 {
        let mut rng = Rng(seed.wrapping_mul(7919) | 1);
        let clock = Arc::new(ManualClock::new(1_800_000_000_000_000));
        let memory = MemoryStore::new(1_000, clock.clone());
        let key = CounterKey(u128::from(seed) + 1_000_000);
        let limit = LimitCheck {
            algorithm: AlgorithmKind::SlidingLog,
            quota: Quota {
                limit: 1 + rng.below(6),
                period: 1_000,
                burst: 1,
                on_over_limit: Default::default(),
            },
            sharing: sluice::regions::Sharing::Regional,
        };
        for call in 0..6 {
            clock.set(clock.now_value() + rng.below(1_500));
            let checks: Vec<StoreCheck> = (0..1 + rng.below(6))
                .map(|_| StoreCheck {
                    key,
                    limits: vec![limit].into(),
                    cost: rng.below(3),
                    refund: rng.below(5) == 0,
                    max_wait: if rng.below(2) == 0 {
                        1 + rng.below(1_800)
                    } else {
                        0
                    },
                })
                .collect();
            let (expected, actual) = in_one_call(&memory, &redis, &checks, &clock).await;
            assert_eq!(expected, actual, "seed {seed} call {call}: {checks:?}");
            delayed += expected
                .iter()
                .filter(|d| d.allowed && d.retry_after > 0)
                .count();
        }
    }
    assert!(delayed > 300, "only {delayed} delayed admissions compared");
}
