//! What the ledger knows of each key's usage in its current window: a lower bound of
//! the units admitted so far, from which a store that lost its counter (Redis restarted
//! empty, failed over to a lagging replica, flushed) is restored.
//!
//! The bound is the sum of the key's rows in PostgreSQL, read once per key and window
//! (and again after each restore), plus the units this instance admitted since that
//! read. The snapshot of this instance's own count is taken *after* the read returns,
//! so a unit is never counted twice (once in the rows, once as admitted since): the
//! bound never exceeds the truth, and a restore never charges a customer for units not
//! served. What it can miss is what no row held yet at the read: the batches not yet
//! written (at most one `--ledger-interval` of each instance's usage).

use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::{Duration, Instant};

use arc_swap::ArcSwapOption;
use tokio_postgres::Client;

use super::{schema, UsageKey};

/// Longest wait for the read of a key's rows (on the request path of the first request
/// of a key in a window in this process, and after a restore).
pub(super) const READ_TIMEOUT: Duration = Duration::from_millis(50);

/// Shortest time between two failed reads of one key's rows.
const RETRY_READ: Duration = Duration::from_millis(200);

/// Most keys tracked; beyond it new keys are bounded by this instance's own count only
/// until windows end and make room.
const MAX_KEYS: usize = 1_000_000;

/// One key's knowledge.
#[derive(Debug, Default)]
struct Entry {
    /// Sum of its rows at the last read.
    rows: u64,
    /// This instance's admitted units when that read returned.
    own_at_read: u64,
    /// This instance's admitted units since start.
    own: u64,
    /// Whether a read has succeeded since the entry was made or last restored.
    read: bool,
    /// When a read last failed (reads are retried at most every [`RETRY_READ`]).
    failed_at: Option<Instant>,
}

impl Entry {
    /// The lower bound of the units admitted so far.
    fn bound(&self) -> u64 {
        self.rows + self.own.saturating_sub(self.own_at_read)
    }
}

/// Every tracked key's knowledge and the connection the rows are read through.
pub(super) struct Known {
    keys: Mutex<HashMap<UsageKey, Entry>>,
    /// Kept connected by [`Known::keep_connected`]; `None` while PostgreSQL is down.
    reader: ArcSwapOption<Client>,
    /// The URL, for a read that finds no connection yet (just after start).
    url: String,
    /// Held by the one read that connects.
    connecting: tokio::sync::Mutex<()>,
}

impl Known {
    /// Nothing known yet; reads go to `url`.
    pub(super) fn new(url: String) -> Self {
        Self {
            keys: Mutex::default(),
            reader: ArcSwapOption::empty(),
            url,
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

    /// The lower bound of the units admitted on `key` before now, reading its rows
    /// first when they have not been read (bounded by [`READ_TIMEOUT`]; unreadable, the
    /// bound is this instance's own count).
    pub(super) async fn bound(&self, key: &UsageKey) -> u64 {
        let needs_read = {
            let keys = self.lock();
            match keys.get(key) {
                Some(entry) if entry.read => return entry.bound(),
                Some(entry) => entry.failed_at.is_none_or(|at| at.elapsed() >= RETRY_READ),
                None => true,
            }
        };
        if needs_read {
            let rows = self.read_rows(key).await;
            let mut keys = self.lock();
            if !keys.contains_key(key) && keys.len() >= MAX_KEYS {
                return rows.unwrap_or(0);
            }
            let entry = keys.entry(key.clone()).or_default();
            match rows {
                Some(rows) => {
                    entry.rows = rows;
                    entry.own_at_read = entry.own;
                    entry.read = true;
                    entry.failed_at = None;
                }
                None => entry.failed_at = Some(Instant::now()),
            }
            return entry.bound();
        }
        self.lock().get(key).map_or(0, Entry::bound)
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

    /// The sum of `key`'s rows, if PostgreSQL answers within [`READ_TIMEOUT`].
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
                    tokio::time::timeout(READ_TIMEOUT, connect)
                        .await
                        .ok()?
                        .ok()?,
                );
                self.reader.store(Some(client.clone()));
                client
            }
        };
        let window = i64::try_from(key.window_start).ok()?;
        let (domain, descriptor, limit): (&str, &str, &str) =
            (&key.domain, &key.descriptor, &key.limit);
        let params: [&(dyn tokio_postgres::types::ToSql + Sync); 4] =
            [&domain, &descriptor, &limit, &window];
        let query = client.query_one(
            "SELECT coalesce(sum(units), 0)::bigint FROM sluice_usage \
             WHERE domain = $1 AND descriptor = $2 AND limit_name = $3 \
               AND window_start = to_timestamp($4::bigint)",
            &params,
        );
        let row = tokio::time::timeout_at(started + READ_TIMEOUT * 2, query)
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
