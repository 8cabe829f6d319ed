//! The in-memory store: one instance's counters in a sharded, bounded map.
//!
//! Each shard is a `Mutex<HashMap>` held only for the synchronous decision (never across
//! an await). Entries whose state is back to fresh are dropped lazily and by
//! [`MemoryStore::sweep_expired`]; when a shard is full of live entries, one is evicted
//! per insert and counted: a bounded map forgets rather than grows.

use std::collections::HashMap;
use std::hash::{BuildHasherDefault, Hash, Hasher};
use std::sync::{Arc, Mutex, MutexGuard};

use prometheus_client::metrics::counter::Counter;

use crate::algorithm::concurrency::{self, SlotOp};
use crate::algorithm::{self, Decision, Micros, State};
use crate::clock::Clock;
use crate::store::{CounterKey, HoldCall, LimitCheck, LimitKey, Store, StoreCheck, StoreError};

/// Number of shards; a power of two so the shard index is a mask.
const SHARDS: usize = 64;

/// How often a full shard may be swept for expired entries before evicting live ones.
const SWEEP_INTERVAL_MICROS: Micros = 100_000;

/// Counters of one Sluice instance, in memory.
pub struct MemoryStore {
    /// The shards; a key's shard comes from high bits of its digest.
    shards: Box<[Mutex<Shard>]>,
    /// Source of `now` for every decision.
    clock: Arc<dyn Clock>,
    /// Most entries one shard may hold (`--memory-max-keys` / shards, at least 1).
    shard_capacity: usize,
    /// Live entries dropped because a shard was full: a metric's counter when one is
    /// given ([`MemoryStore::counting_evictions_in`]), else the store's own.
    evictions: Counter,
}

/// One shard of the map.
#[derive(Default)]
struct Shard {
    /// First limit of each descriptor (nearly every key): state and expiry. Split from
    /// `more` so the common entry is 56 bytes (key 16 + slot 40), not 80: a `u128` key
    /// with a `u32` index is 32 bytes at 16-byte alignment.
    first: HashMap<Digest, Slot, BuildHasherDefault<DigestHasher>>,
    /// Limits after the first of multi-limit rules.
    more: HashMap<(Digest, u32), Slot, BuildHasherDefault<DigestHasher>>,
    /// Earliest time the next sweep of this shard may run.
    next_sweep: Micros,
}

/// A 128-bit counter digest stored as two words (8-byte alignment, no padding).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Digest([u64; 2]);

impl Digest {
    fn of(key: LimitKey) -> Self {
        Self([(key.counter.0 >> 64) as u64, key.counter.0 as u64])
    }
}

impl Hash for Digest {
    fn hash<H: Hasher>(&self, state: &mut H) {
        // The words are uniform digest bits already.
        state.write_u64(self.0[0] ^ self.0[1]);
    }
}

/// A stored state with its expiry.
struct Slot {
    /// Algorithm state.
    state: State,
    /// From this instant the state answers as a fresh one would.
    expires_at: Micros,
}

// === impl MemoryStore ===

impl MemoryStore {
    /// A store holding at most `max_keys` limit states, reading time from `clock`.
    pub fn new(max_keys: usize, clock: Arc<dyn Clock>) -> Self {
        let shards = (0..SHARDS).map(|_| Mutex::new(Shard::default())).collect();
        Self {
            shards,
            clock,
            shard_capacity: (max_keys / SHARDS).max(1),
            evictions: Counter::default(),
        }
    }

    /// Counts evictions in `counter` (the `sluice_memory_evictions_total` metric), as
    /// they happen.
    pub(crate) fn counting_evictions_in(mut self, counter: Counter) -> Self {
        self.evictions = counter;
        self
    }

    /// Number of limit states held now (expired ones included until swept).
    #[cfg(feature = "bench")]
    pub(crate) fn len(&self) -> usize {
        self.shards.iter().map(|shard| lock(shard).len()).sum()
    }

    /// Drops every entry whose state is back to fresh. Called periodically by the server.
    pub(crate) fn sweep_expired(&self) {
        let now = self.clock.now();
        for shard in self.shards.iter() {
            lock(shard).retain_live(now);
        }
    }

    /// Runs a concurrency limit's call under its shard's lock (a probe changes
    /// nothing).
    fn hold_now(&self, call: &HoldCall) -> Decision {
        let now = self.clock.now();
        let key = call.key.for_limit(0);
        let mut shard = lock(&self.shards[shard_of(call.key)]);
        let (decision, next) = match shard.get(key) {
            Some(Slot {
                state: State::Concurrency(state),
                expires_at,
            }) if *expires_at > now => {
                concurrency::hold(state, now, call.op, call.slot, &call.quota)
            }
            _ => concurrency::hold(&Default::default(), now, call.op, call.slot, &call.quota),
        };
        if call.op != SlotOp::Probe {
            let expires_at = concurrency::expires_at(&next, &call.quota);
            let state = State::Concurrency(Box::new(next));
            if shard.insert(key, state, expires_at, now, self.shard_capacity) {
                self.evictions.inc();
            }
        }
        decision
    }

    /// Decides one check under its shard's lock; commits when `commit` says so.
    fn decide(&self, check: &StoreCheck, commit: bool, decisions: &mut Vec<Decision>) {
        let now = self.clock.now();
        let mut shard = lock(&self.shards[shard_of(check.key)]);
        let first = decisions.len();
        for (index, limit) in check.limits.iter().enumerate() {
            let key = check.key.for_limit(index);
            let (decision, _) = shard.decide(key, limit, check, commit, now);
            decisions.push(decision);
        }
        if !commit {
            return;
        }
        let all_allowed = decisions[first..].iter().all(|d| d.allowed);
        // A refused single limit still commits: fixed window counts refused hits, and
        // the other algorithms return their state unchanged. Of several limits, a
        // refusal commits only those whose every charge counts (`on_over_limit: charge`).
        let each = all_allowed || check.limits.len() == 1;
        for (index, limit) in check.limits.iter().enumerate() {
            if !each && !limit.quota.charges_always() {
                continue;
            }
            let key = check.key.for_limit(index);
            let (_, next) = shard.decide(key, limit, check, true, now);
            let expires_at = algorithm::expires_at(&next, &limit.quota);
            let evicted = shard.insert(key, next, expires_at, now, self.shard_capacity);
            if evicted {
                self.evictions.inc();
            }
        }
    }
}

impl Store for MemoryStore {
    async fn check(
        &self,
        checks: &[StoreCheck],
        decisions: &mut Vec<Decision>,
    ) -> Result<(), StoreError> {
        for check in checks {
            self.decide(check, true, decisions);
        }
        Ok(())
    }

    async fn peek(
        &self,
        check: &StoreCheck,
        decisions: &mut Vec<Decision>,
    ) -> Result<(), StoreError> {
        self.decide(check, false, decisions);
        Ok(())
    }

    async fn hold(&self, call: &HoldCall) -> Result<Decision, StoreError> {
        Ok(self.hold_now(call))
    }

    fn kind(&self) -> &'static str {
        "memory"
    }
}

// === impl Shard ===

impl Shard {
    /// Decides `limit` of `check` for `key` (its charge or its refund) from its stored
    /// state, or a fresh one when the key is absent or expired. A peek (`commit` false)
    /// never delays: a delay is a reservation.
    fn decide(
        &self,
        key: LimitKey,
        limit: &LimitCheck,
        check: &StoreCheck,
        commit: bool,
        now: Micros,
    ) -> (Decision, State) {
        let fresh;
        let state = match self.get(key) {
            Some(slot) if slot.expires_at > now => &slot.state,
            _ => {
                fresh = State::fresh(limit.algorithm);
                &fresh
            }
        };
        // A refund of nothing is a check of cost 0, as Redis decides it. Two direct
        // calls rather than a function pointer: the charge stays inlined.
        if check.refund && check.cost > 0 {
            algorithm::refund(limit.algorithm, state, now, check.cost, &limit.quota)
        } else if commit && check.max_wait > 0 && check.limits.len() == 1 {
            algorithm::decide_delayed(
                limit.algorithm,
                state,
                now,
                check.cost,
                &limit.quota,
                check.max_wait,
            )
        } else {
            algorithm::decide(limit.algorithm, state, now, check.cost, &limit.quota)
        }
    }

    /// Stores `state`; returns whether a live entry had to be evicted to make room.
    fn insert(
        &mut self,
        key: LimitKey,
        state: State,
        expires_at: Micros,
        now: Micros,
        capacity: usize,
    ) -> bool {
        if expires_at <= now {
            self.remove(key);
            return false;
        }
        let mut evicted = false;
        if self.len() >= capacity && self.get(key).is_none() {
            if now >= self.next_sweep {
                self.next_sweep = now.saturating_add(SWEEP_INTERVAL_MICROS);
                self.retain_live(now);
            }
            if self.len() >= capacity {
                evicted = self.evict_one();
            }
        }
        let slot = Slot { state, expires_at };
        match key.index {
            0 => self.first.insert(Digest::of(key), slot),
            index => self.more.insert((Digest::of(key), index), slot),
        };
        evicted
    }

    /// The stored slot of `key`, expired or not.
    fn get(&self, key: LimitKey) -> Option<&Slot> {
        match key.index {
            0 => self.first.get(&Digest::of(key)),
            index => self.more.get(&(Digest::of(key), index)),
        }
    }

    fn remove(&mut self, key: LimitKey) {
        match key.index {
            0 => self.first.remove(&Digest::of(key)),
            index => self.more.remove(&(Digest::of(key), index)),
        };
    }

    /// Entries held.
    fn len(&self) -> usize {
        self.first.len() + self.more.len()
    }

    /// Drops every entry back to fresh at `now`.
    fn retain_live(&mut self, now: Micros) {
        self.first.retain(|_, slot| slot.expires_at > now);
        self.more.retain(|_, slot| slot.expires_at > now);
    }

    /// Evicts one arbitrary live entry; returns whether there was one.
    fn evict_one(&mut self) -> bool {
        if let Some(victim) = self.more.keys().next().copied() {
            self.more.remove(&victim);
            return true;
        }
        if let Some(victim) = self.first.keys().next().copied() {
            self.first.remove(&victim);
            return true;
        }
        false
    }
}

/// Shard of a descriptor's counters: all its limits live in one shard.
fn shard_of(key: CounterKey) -> usize {
    (key.0 >> 100) as usize & (SHARDS - 1)
}

/// Locks a shard; a poisoned lock (a panic elsewhere) still yields the data, since a
/// shard's map is valid after any panic-free mutation sequence we perform.
fn lock(shard: &Mutex<Shard>) -> MutexGuard<'_, Shard> {
    shard
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// Keys are already uniform digests: fold them instead of hashing them again.
#[derive(Default)]
struct DigestHasher(u64);

impl Hasher for DigestHasher {
    fn finish(&self) -> u64 {
        self.0
    }

    fn write(&mut self, bytes: &[u8]) {
        for &byte in bytes {
            self.0 = (self.0 ^ u64::from(byte)).wrapping_mul(0x0100_0000_01b3);
        }
    }

    fn write_u64(&mut self, value: u64) {
        self.0 ^= value;
    }

    fn write_u32(&mut self, value: u32) {
        self.0 = self
            .0
            .wrapping_add(u64::from(value).wrapping_mul(0x9E37_79B9_7F4A_7C15));
    }
}
