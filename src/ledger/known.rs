//! What the ledger knows of each key's usage in its current window: a lower bound of
//! the units admitted so far, from which a store that lost its counter (Redis restarted
//! empty, failed over to a lagging replica, flushed) is restored.
//!
//! The bound is the sum of the key's rows written by *other* instances, read once per
//! key and window (and again after each restore), plus every unit this instance
//! admitted (its own rows are a part of those, so they are not read). A unit is never
//! counted twice: the bound never exceeds the truth, and a restore never charges a
//! customer for units not served. What it can miss is what the other instances had not
//! written at the read (at most one `--ledger-interval` of each one's usage) or admitted
//! since.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::{Duration, Instant};

use arc_swap::ArcSwapOption;
use tokio_postgres::Client;

use super::{schema, UsageKey};

/// Longest wait for the read of a key's rows (on the request path of the first request
/// of a key in a window in this process, and after a restore; never past the request's
/// deadline).
pub(super) const READ_TIMEOUT: Duration = Duration::from_millis(100);

/// Deadline of one read in its own task (connection included): requests wait for it
/// [`READ_TIMEOUT`] at most, and a read that lands later serves the next ones.
const READ_DEADLINE: Duration = Duration::from_secs(2);

/// Shortest time between two failed reads of one key's rows.
const RETRY_READ: Duration = Duration::from_millis(200);

/// Most keys tracked; beyond it new keys are bounded by this instance's own count only
/// until windows end and make room.
const MAX_KEYS: usize = 1_000_000;

/// One key's knowledge.
#[derive(Debug, Default)]
struct Entry {
    /// Sum of the other instances' rows at the last read.
    rows: u64,
    /// This instance's admitted units since start (in this window).
    own: u64,
    /// Whether a read has succeeded since the entry was made or last restored.
    read: bool,
    /// Whether a read is in flight.
    reading: bool,
    /// When a read last failed (reads are retried at most every [`RETRY_READ`]).
    failed_at: Option<Instant>,
}

impl Entry {
    /// The lower bound of the units admitted so far.
    fn bound(&self) -> u64 {
        self.rows + self.own
    }
}

/// Every tracked key's knowledge and the connection the rows are read through.
pub(super) struct Known {
    keys: Mutex<HashMap<UsageKey, Entry>>,
    /// Kept connected by [`Known::keep_connected`]; `None` while PostgreSQL is down.
    reader: ArcSwapOption<Client>,
    /// The URL, for a read that finds no connection yet (just after start).
    url: String,
    /// This instance's id in the ledger: its own rows are not read.
    instance: Arc<str>,
    /// Held by the one read that connects.
    connecting: tokio::sync::Mutex<()>,
}

impl Known {
    /// Nothing known yet; reads go to `url`.
    pub(super) fn new(url: String, instance: Arc<str>) -> Self {
        Self {
            keys: Mutex::default(),
            reader: ArcSwapOption::empty(),
            url,
            instance,
            connecting: tokio::sync::Mutex::new(()),
        }
    }

    /// Counts `units` admitted by this instance on `key`.
    pub(super) fn admitted(&self, key: &UsageKey, units: u64) {
        let mut keys = self.lock();
        if let Some(entry) = keys.get_mut(key) {
            entry.own += units;
        } else if keys.len() < MAX_KEYS {
            keys.insert(
                key.clone(),
                Entry {
                    own: units,
                    ..Entry::default()
                },
            );
        }
    }

    /// The lower bound of the units admitted on `key` before now. When its rows have
    /// not been read, a read starts (in a task of its own, one per key at a time), and
    /// every request on the key waits for it until its `wait_until` at most; one that
    /// takes longer lands for the next requests. Unread, the bound is this instance's own count.
    pub(super) async fn bound(
        self: &Arc<Self>,
        key: &UsageKey,
        wait_until: tokio::time::Instant,
    ) -> u64 {
        let start_read = {
            let mut keys = self.lock();
            if !keys.contains_key(key) {
                if keys.len() >= MAX_KEYS {
                    return 0;
                }
                keys.insert(key.clone(), Entry::default());
            }
            // Present now: a known key is not cloned (its descriptor is an allocation).
            let Some(entry) = keys.get_mut(key) else {
                return 0;
            };
            if entry.read {
                return entry.bound();
            }
            let due = entry.failed_at.is_none_or(|at| at.elapsed() >= RETRY_READ);
            let start = due && !entry.reading;
            entry.reading |= start;
            start
        };
        if start_read {
            let known = self.clone();
            let key = key.clone();
            tokio::spawn(async move {
                let rows = known.read_rows(&key).await;
                known.store_rows(&key, rows);
            });
        }
        // Every request on the key waits for a read in flight (until `wait_until`): a
        // rare path, polled.
        loop {
            let reading = self.lock().get(key).is_some_and(|entry| entry.reading);
            if !reading || tokio::time::Instant::now() >= wait_until {
                break;
            }
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
        self.lock().get(key).map_or(0, Entry::bound)
    }

    /// Records the outcome of a read of `key`'s rows.
    fn store_rows(&self, key: &UsageKey, rows: Option<u64>) {
        let mut keys = self.lock();
        let Some(entry) = keys.get_mut(key) else {
            return;
        };
        entry.reading = false;
        match rows {
            Some(rows) => {
                entry.rows = rows;
                entry.read = true;
                entry.failed_at = None;
            }
            None => entry.failed_at = Some(Instant::now()),
        }
    }

    /// After a restore: the rows are read again at the next request (other instances'
    /// usage written since the last read counts then).
    pub(super) fn forget_rows(&self, key: &UsageKey) {
        if let Some(entry) = self.lock().get_mut(key) {
            entry.read = false;
            entry.failed_at = None;
        }
    }

    /// Drops the keys whose window ended before `now_seconds`.
    pub(super) fn prune(&self, now_seconds: u64) {
        self.lock()
            .retain(|key, _| key.window_start + key.window_seconds > now_seconds);
    }

    /// The sum of `key`'s rows, if PostgreSQL answers within [`READ_DEADLINE`].
    async fn read_rows(&self, key: &UsageKey) -> Option<u64> {
        let started = tokio::time::Instant::now();
        let client = match self.reader.load_full() {
            Some(client) if !client.is_closed() => client,
            // Just started, or PostgreSQL just came back: one read connects, within
            // the read's time.
            _ => {
                let _connecting = self.connecting.try_lock().ok()?;
                let connect = schema::connect(&self.url);
                let client = Arc::new(
                    tokio::time::timeout(READ_DEADLINE, connect)
                        .await
                        .ok()?
                        .ok()?,
                );
                self.reader.store(Some(client.clone()));
                client
            }
        };
        let window = i64::try_from(key.window_start).ok()?;
        let (domain, descriptor, limit, instance): (&str, &str, &str, &str) =
            (&key.domain, &key.descriptor, &key.limit, &self.instance);
        let params: [&(dyn tokio_postgres::types::ToSql + Sync); 5] =
            [&domain, &descriptor, &limit, &window, &instance];
        let query = client.query_one(
            "SELECT coalesce(sum(units), 0)::bigint FROM sluice_usage \
             WHERE domain = $1 AND descriptor = $2 AND limit_name = $3 \
               AND window_start = to_timestamp($4::bigint) AND instance <> $5",
            &params,
        );
        let row = tokio::time::timeout_at(started + READ_DEADLINE, query)
            .await
            .ok()?
            .ok()?;
        u64::try_from(row.get::<_, i64>(0)).ok()
    }

    /// Keeps the reading connection up while `known` lives (reconnecting every second
    /// while PostgreSQL is down).
    pub(super) async fn keep_connected(known: std::sync::Weak<Known>) {
        loop {
            let Some(strong) = known.upgrade() else {
                return;
            };
            let up = strong
                .reader
                .load()
                .as_ref()
                .is_some_and(|client| !client.is_closed());
            if !up {
                let client =
                    tokio::time::timeout(Duration::from_secs(2), schema::connect(&strong.url))
                        .await
                        .ok()
                        .and_then(Result::ok);
                strong.reader.store(client.map(Arc::new));
            }
            strong.prune(super::writer::now_ms() / 1000);
            drop(strong);
            tokio::time::sleep(Duration::from_secs(1)).await;
        }
    }

    fn lock(&self) -> MutexGuard<'_, HashMap<UsageKey, Entry>> {
        self.keys.lock().unwrap_or_else(PoisonError::into_inner)
    }
}
