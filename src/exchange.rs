//! Publishing usage between regions (`sharing: aggregate`): every sync interval, each
//! link to another region sends it the states of the aggregated keys this instance
//! charged since its last publication, read from this region's store, and leaves its
//! mark there; and this region's store is read for the other regions' marks, which say
//! whose usage is known lately (the others are taken at their fallback share).
//!
//! A publication carries states, not increments: the region keeps, per key, the newest
//! of what it holds and what arrives (`scripts/import.lua`), so one sent twice, late or
//! out of order counts once. Each link runs on its own: a cut or slow link delays only
//! its own publications, whose keys wait (bounded) and go with the next one that
//! succeeds. Nothing here is on the request path.

use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio::task::JoinHandle;
use tokio::time::MissedTickBehavior;

use crate::algorithm::MICROS_PER_SECOND;
use crate::clock::{Clock, SystemClock};
use crate::store::redis::links::{PeerLink, Published, RegionLinks};
use crate::store::redis::{RedisOptions, RedisStore};
use crate::store::StoreError;
use crate::telemetry::{Metrics, RegionLabel};

/// Failed publications in a row between two reconnections of a link's connections.
const RECONNECT_EVERY: u64 = 5;

/// How often and how patiently usage is exchanged.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Timing {
    /// Between two publications to a region (`--region-sync-interval`).
    pub sync_interval: Duration,
    /// A region whose mark is older is taken at its fallback share
    /// (`--region-stale-after`); each mark lives this long.
    pub stale_after: Duration,
}

impl Timing {
    /// Deadline of one exchange call: a round must end before the next is due, and a
    /// link far away still gets a second.
    fn call_timeout(self) -> Duration {
        self.sync_interval.max(Duration::from_secs(1))
    }
}

/// The running exchange: one task per link and one reading the marks; stopped (its
/// tasks aborted) when dropped.
pub struct Exchange {
    /// The tasks.
    tasks: Vec<JoinHandle<()>>,
}

impl Drop for Exchange {
    fn drop(&mut self) {
        for task in &self.tasks {
            task.abort();
        }
    }
}

/// Starts exchanging usage between this region (its store reached with `local`) and
/// each of `peers` (a region's name and its store's options), as `links` records.
pub fn start(
    links: Arc<RegionLinks>,
    local: &RedisOptions,
    peers: &[(Arc<str>, RedisOptions)],
    timing: Timing,
    metrics: Arc<Metrics>,
) -> Result<Exchange, StoreError> {
    let clock: Arc<dyn Clock> = SystemClock::shared();
    // The exchange's calls end by their own deadline, which their errors name.
    let patient = |options: &RedisOptions| RedisOptions {
        timeout: timing.call_timeout(),
        ..options.clone()
    };
    // The exchange's stores count their calls apart: in the served metrics a peer's
    // single node would be `node="redis"`, the local store's breaker.
    let own_metrics = Arc::new(Metrics::new());
    let local = Arc::new(RedisStore::new(&patient(local), own_metrics.clone())?);
    let mut tasks = Vec::new();
    for (index, peer) in links.peers().iter().enumerate() {
        let Some((_, options)) = peers.iter().find(|(name, _)| *name == peer.name) else {
            continue;
        };
        let link = Link {
            links: links.clone(),
            index,
            local: local.clone(),
            remote: RedisStore::new(&patient(options), own_metrics.clone())?,
            timing,
            clock: clock.clone(),
            metrics: metrics.clone(),
            label: region_label(&peer.name),
        };
        tasks.push(tokio::spawn(link.run()));
    }
    tasks.push(tokio::spawn(read_marks(links, local, timing, metrics)));
    Ok(Exchange { tasks })
}

/// One link: publishes this region's charged keys to one other region.
struct Link {
    /// Every link's state.
    links: Arc<RegionLinks>,
    /// This link's place in `links.peers()`.
    index: usize,
    /// This region's store, where the states are read.
    local: Arc<RedisStore>,
    /// The other region's store, where they are kept.
    remote: RedisStore,
    /// How often and how patiently.
    timing: Timing,
    /// The wall clock, for `/status` and `/metrics` (as [`RegionLinks::status`] reads).
    clock: Arc<dyn Clock>,
    /// Where the links' metrics are.
    metrics: Arc<Metrics>,
    /// This link's label.
    label: RegionLabel,
}

impl Link {
    /// The other region.
    fn peer(&self) -> &PeerLink {
        &self.links.peers()[self.index]
    }

    /// Publishes every sync interval, until aborted.
    async fn run(self) {
        let mut tick = tokio::time::interval(self.timing.sync_interval);
        tick.set_missed_tick_behavior(MissedTickBehavior::Delay);
        loop {
            tick.tick().await;
            self.publish_once().await;
        }
    }

    /// One publication: the pending keys' states, then this region's mark.
    async fn publish_once(&self) {
        let keys = self.peer().take_pending();
        let started = Instant::now();
        match self.send(&keys).await {
            Ok(sent) => {
                self.peer().published();
                let round_trip = started.elapsed();
                let now = self.clock.now();
                self.peer().update(|figures| {
                    figures.last_sent_at = Some(now);
                    figures.last_sent_keys = sent;
                    figures.last_round_trip = Some(round_trip);
                    figures.failures_in_a_row = 0;
                });
                self.metrics
                    .region_sent_keys
                    .get_or_create(&self.label)
                    .inc_by(sent);
                self.metrics
                    .region_round_trip
                    .get_or_create(&self.label)
                    .set(round_trip.as_secs_f64());
                self.metrics
                    .region_last_sent
                    .get_or_create(&self.label)
                    .set(now as f64 / MICROS_PER_SECOND as f64);
            }
            Err(error) => {
                self.links.give_back(self.peer(), keys);
                self.metrics
                    .region_failures
                    .get_or_create(&self.label)
                    .inc();
                let failures = self.peer().figures().failures_in_a_row + 1;
                let first = failures == 1;
                self.peer().update(|figures| {
                    figures.failures_in_a_row = failures;
                    figures.last_error = Some((self.clock.now(), error.to_string()));
                });
                // A call that timed out may be on a connection that swallows every byte:
                // made again at the first and then every RECONNECT_EVERY-th failure.
                if matches!(error, StoreError::Timeout(_)) && failures % RECONNECT_EVERY == 1 {
                    self.remote.reconnect();
                    self.local.reconnect();
                }
                if first {
                    tracing::warn!(region = %self.peer().name, %error, "publishing usage to region failed");
                }
            }
        }
        let figures = self.peer().figures();
        let lag = figures.last_sent_at.map_or(f64::INFINITY, |at| {
            self.clock.now().saturating_sub(at) as f64 / MICROS_PER_SECOND as f64
        });
        self.metrics.region_lag.get_or_create(&self.label).set(lag);
        let up = figures.failures_in_a_row == 0 && !self.peer().is_stale();
        self.metrics
            .region_link_up
            .get_or_create(&self.label)
            .set(i64::from(up));
        self.metrics
            .region_dropped_keys
            .inner()
            .store(self.links.dropped(), std::sync::atomic::Ordering::Relaxed);
    }

    /// Sends the states of `keys` and the mark; the number of states sent.
    async fn send(&self, keys: &[Published]) -> Result<u64, StoreError> {
        let timeout = self.timing.call_timeout();
        let mut states = Vec::new();
        if !keys.is_empty() {
            let read = self.local.export_states(keys, timeout).await?;
            states = keys
                .iter()
                .zip(read)
                .filter_map(|(key, state)| state.map(|state| (*key, state)))
                .collect();
        }
        let local_name = self.links.plan().local_name();
        if !states.is_empty() {
            let suffix = format!(":from:{local_name}");
            self.remote
                .import_states(suffix.as_bytes(), &states, None, timeout)
                .await?;
        }
        let sent = states.len() as u64;
        self.remote
            .mark_seen(local_name, sent, self.timing.stale_after, timeout)
            .await?;
        Ok(sent)
    }
}

/// Reads the other regions' marks in this region's store every sync interval: a region
/// with no mark (none within the stale time) is stale, taken at its fallback share.
async fn read_marks(
    links: Arc<RegionLinks>,
    local: Arc<RedisStore>,
    timing: Timing,
    metrics: Arc<Metrics>,
) {
    let mut tick = tokio::time::interval(timing.sync_interval);
    tick.set_missed_tick_behavior(MissedTickBehavior::Delay);
    loop {
        tick.tick().await;
        for peer in links.peers() {
            let label = region_label(&peer.name);
            // A store that cannot be read says nothing new: the checks fail over anyway.
            let Ok(mark) = local.read_seen(&peer.name, timing.call_timeout()).await else {
                continue;
            };
            let received = mark.map(|(keys, left)| (keys, timing.stale_after.saturating_sub(left)));
            peer.set_stale(received.is_none());
            peer.update(|figures| {
                figures.last_received_age = received.map(|(_, age)| age);
                if let Some((keys, _)) = received {
                    figures.last_received_keys = keys;
                }
            });
            metrics
                .region_stale
                .get_or_create(&label)
                .set(i64::from(received.is_none()));
            if let Some((keys, age)) = received {
                metrics
                    .region_received_age
                    .get_or_create(&label)
                    .set(age.as_secs_f64());
                metrics
                    .region_received_keys
                    .get_or_create(&label)
                    .set(i64::try_from(keys).unwrap_or(i64::MAX));
            }
        }
    }
}

/// The metric label of region `name`.
fn region_label(name: &str) -> RegionLabel {
    RegionLabel {
        region: name.to_owned(),
    }
}
