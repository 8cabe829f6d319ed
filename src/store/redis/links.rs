//! The links of an instance to the other regions, as the request path and `/status` see
//! them: which regions a check counts, which of them are cut (taken at their fallback
//! share), the keys charged since the last publication, and each link's figures.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, SystemTime};

use crate::clock::Clock;

use bytes::Bytes;

use crate::algorithm::{AlgorithmKind, Micros};
use crate::regions::RegionPlan;
use crate::store::LimitKey;

/// Most keys charged since the last publication that are kept to publish; past it a key
/// is not published (counted in `sluice_region_dropped_keys_total`), and the other
/// regions see its usage only once it is charged again.
pub const MAX_DIRTY_KEYS: usize = 100_000;

/// One aggregated limit's key to publish: where its state is, and how to read it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub(crate) struct Published {
    /// The limit's key.
    pub(crate) key: LimitKey,
    /// Its algorithm (a window algorithm).
    pub(crate) algorithm: AlgorithmKind,
    /// Its window (the published state's TTL follows it).
    pub(crate) period: Micros,
}

/// What is known of one link, for `/status` and `/metrics`.
#[derive(Clone, Debug, Default)]
pub(crate) struct LinkFigures {
    /// When a publication to the region last succeeded (wall clock, µs).
    pub(crate) last_sent_at: Option<Micros>,
    /// Keys in that publication.
    pub(crate) last_sent_keys: u64,
    /// Round trip of that publication.
    pub(crate) last_round_trip: Option<Duration>,
    /// When a publication to the region last failed, and why.
    pub(crate) last_error: Option<(Micros, String)>,
    /// Failed publications in a row.
    pub(crate) failures_in_a_row: u64,
    /// Age of the region's last publication to this one, as read from this region's
    /// store (`None`: none within the stale time).
    pub(crate) last_received_age: Option<Duration>,
    /// Keys in that publication.
    pub(crate) last_received_keys: u64,
}

/// One other region, as seen from this one.
#[derive(Debug)]
pub struct PeerLink {
    /// Its index in the plan (its weight's place).
    pub(crate) index: usize,
    /// Its name.
    pub(crate) name: Arc<str>,
    /// `:from:<name>`: its states in this region's store are at a limit's key and this.
    pub(crate) suffix: Bytes,
    /// Its usage is not known lately: it is taken at its fallback share.
    stale: AtomicBool,
    /// What is known of the link.
    figures: Mutex<LinkFigures>,
    /// Aggregated keys charged and not yet published to it (bounded by
    /// [`MAX_DIRTY_KEYS`]; kept while its link is down).
    pending: Mutex<HashMap<LimitKey, Published>>,
    /// Keys taken for the publication under way (pending still, until it succeeds).
    in_flight: AtomicUsize,
}

impl PeerLink {
    /// Whether its usage is not known lately (no publication from it within the stale
    /// time): checks take it at its fallback share.
    pub(crate) fn is_stale(&self) -> bool {
        self.stale.load(Ordering::Relaxed)
    }

    /// Marks whether its usage is known lately.
    pub(crate) fn set_stale(&self, stale: bool) {
        self.stale.store(stale, Ordering::Relaxed);
    }

    /// Changes what is known of the link.
    pub(crate) fn update(&self, change: impl FnOnce(&mut LinkFigures)) {
        change(&mut self.figures.lock().unwrap_or_else(PoisonError::into_inner));
    }

    /// What is known of the link now.
    pub(crate) fn figures(&self) -> LinkFigures {
        self.figures
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }

    /// Adds `keys` to publish to it; the number that did not fit.
    fn add_pending(&self, keys: impl IntoIterator<Item = Published>) -> u64 {
        let mut pending = self.pending.lock().unwrap_or_else(PoisonError::into_inner);
        let mut dropped = 0;
        for published in keys {
            if pending.len() >= MAX_DIRTY_KEYS && !pending.contains_key(&published.key) {
                dropped += 1;
                continue;
            }
            pending.insert(published.key, published);
        }
        dropped
    }

    /// The keys to publish to it, taken (give them back with
    /// [`RegionLinks::give_back`] if the publication fails).
    pub(crate) fn take_pending(&self) -> Vec<Published> {
        let mut pending = self.pending.lock().unwrap_or_else(PoisonError::into_inner);
        let taken: Vec<Published> = pending.drain().map(|(_, published)| published).collect();
        self.in_flight.store(taken.len(), Ordering::Relaxed);
        taken
    }

    /// The publication under way succeeded: its keys are no longer pending.
    pub(crate) fn published(&self) {
        self.in_flight.store(0, Ordering::Relaxed);
    }

    /// Keys waiting to be published to it, the publication under way's included.
    pub(crate) fn pending_keys(&self) -> usize {
        self.pending
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .len()
            + self.in_flight.load(Ordering::Relaxed)
    }
}

/// The links of an instance to the other regions (see the module documentation).
#[derive(Debug)]
pub struct RegionLinks {
    /// The regions.
    plan: Arc<RegionPlan>,
    /// Every other region, in plan order.
    peers: Vec<PeerLink>,
    /// Keys not kept because a link's pending keys were full.
    dropped: AtomicU64,
}

impl RegionLinks {
    /// The links of an instance of `plan`'s local region: every other region starts
    /// stale (taken at its fallback share) until its first publication is read.
    pub fn new(plan: Arc<RegionPlan>) -> Self {
        let peers = plan
            .names()
            .iter()
            .enumerate()
            .filter(|&(index, _)| index != plan.local())
            .map(|(index, name)| PeerLink {
                index,
                name: name.clone(),
                suffix: Bytes::from(format!(":from:{name}")),
                stale: AtomicBool::new(true),
                figures: Mutex::new(LinkFigures::default()),
                pending: Mutex::new(HashMap::new()),
                in_flight: AtomicUsize::new(0),
            })
            .collect();
        Self {
            plan,
            peers,
            dropped: AtomicU64::new(0),
        }
    }

    /// The regions.
    pub fn plan(&self) -> &RegionPlan {
        &self.plan
    }

    /// Every other region, in plan order.
    pub(crate) fn peers(&self) -> &[PeerLink] {
        &self.peers
    }

    /// Records keys charged, to be published to every other region (past
    /// [`MAX_DIRTY_KEYS`] waiting for a region they are dropped and counted).
    pub(crate) fn mark_charged(&self, keys: Vec<Published>) {
        for peer in &self.peers {
            let dropped = peer.add_pending(keys.iter().copied());
            if dropped > 0 {
                self.dropped.fetch_add(dropped, Ordering::Relaxed);
            }
        }
    }

    /// Gives `keys` back to `peer` after a publication that failed: sent again next time.
    pub(crate) fn give_back(&self, peer: &PeerLink, keys: Vec<Published>) {
        let dropped = peer.add_pending(keys);
        peer.published();
        if dropped > 0 {
            self.dropped.fetch_add(dropped, Ordering::Relaxed);
        }
    }

    #[cfg(feature = "test-hooks")]
    /// Marks region `name` stale (taken at its fallback share) or not, as reading its
    /// mark would (tests).
    pub fn set_stale(&self, name: &str, stale: bool) {
        for peer in self.peers.iter().filter(|peer| &*peer.name == name) {
            peer.set_stale(stale);
        }
    }

    /// Keys dropped so far because too many waited.
    pub(crate) fn dropped(&self) -> u64 {
        self.dropped.load(Ordering::Relaxed)
    }

    /// `/status`: this region, and each link's figures, at `clock`'s time.
    pub(crate) fn status(&self, clock: &dyn Clock) -> serde_json::Value {
        let now = clock.now();
        let time = |at: Micros| {
            humantime::format_rfc3339_millis(SystemTime::UNIX_EPOCH + Duration::from_micros(at))
                .to_string()
        };
        let links: Vec<serde_json::Value> = self
            .peers
            .iter()
            .map(|peer| {
                let figures = peer.figures();
                let lag = figures
                    .last_sent_at
                    .map(|at| Duration::from_micros(now.saturating_sub(at)).as_secs_f64());
                serde_json::json!({
                    "region": &*peer.name,
                    "cut": peer.is_stale() || figures.failures_in_a_row > 0,
                    "stale": peer.is_stale(),
                    "lag_seconds": lag,
                    "round_trip_seconds": figures.last_round_trip.map(|d| d.as_secs_f64()),
                    "last_sent": {
                        "at": figures.last_sent_at.map(time),
                        "keys": figures.last_sent_keys,
                    },
                    "last_received": {
                        "age_seconds": figures.last_received_age.map(|d| d.as_secs_f64()),
                        "keys": figures.last_received_keys,
                    },
                    "pending_keys": peer.pending_keys(),
                    "failures_in_a_row": figures.failures_in_a_row,
                    "last_error": figures.last_error.as_ref().map(|(at, error)| {
                        serde_json::json!({ "at": time(*at), "error": error })
                    }),
                })
            })
            .collect();
        serde_json::json!({
            "region": self.plan.local_name(),
            "links": links,
            "dropped_keys": self.dropped(),
        })
    }
}
