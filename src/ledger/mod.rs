//! The usage ledger: every unit the store admits for a `ledger: true` limit, recorded in
//! PostgreSQL for billing (issue #45).
//!
//! The request path only calls [`Ledger::record`], which never waits: it hands the
//! usage to a bounded queue (full: the units are counted as dropped and logged, never
//! silently lost). One task ([`writer`]) sums the usage per key and window, seals a
//! batch per key every `--ledger-interval` (or sooner when a key reaches
//! [`BATCH_UNITS`]), numbers each batch with this instance's id and a sequence number,
//! holds sealed batches in a bounded spool, and writes them with
//! `INSERT ... ON CONFLICT DO NOTHING` on `(instance, seq)`: a write retried after a
//! timeout is counted once. While PostgreSQL is down the spool holds the usage and
//! `/status` and `/metrics` say so; when it returns the spool is written in order.
//!
//! What can be lost, and how it shows: the usage not yet sealed when the process dies
//! (at most one interval's), and batches refused by a full queue or spool (counted in
//! `sluice_ledger_dropped_units_total` and logged).

pub mod client;
pub mod export;
mod known;
pub mod schema;
pub(crate) mod tls;
mod writer;

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::mpsc;

use crate::telemetry::Metrics;

/// Units of one key and window that seal its batch before the interval ends.
pub(crate) const BATCH_UNITS: u64 = 10_000;

/// Most usage records waiting for the writer task.
const QUEUE: usize = 65_536;

/// How the ledger reaches PostgreSQL and how much it holds back.
#[derive(Clone)]
pub(crate) struct LedgerSettings {
    /// `postgres://user:password@host:port/database` (tokio-postgres syntax).
    pub(crate) url: String,
    /// Longest time admitted units wait before their batch is sealed and written.
    pub(crate) interval: Duration,
    /// Most sealed batches held while PostgreSQL cannot take them.
    pub(crate) spool: usize,
    /// Create or migrate the schema at start (`--ledger-migrate`).
    pub(crate) migrate: bool,
}

impl std::fmt::Debug for LedgerSettings {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LedgerSettings")
            .field("url", &mask(&self.url))
            .field("interval", &self.interval)
            .field("spool", &self.spool)
            .field("migrate", &self.migrate)
            .finish()
    }
}

/// `url` with its password replaced by `*****` (URL form; a key=value string is masked
/// whole).
pub fn mask(url: &str) -> String {
    match url::Url::parse(url) {
        Ok(mut parsed) if parsed.has_host() => {
            if parsed.password().is_some() {
                let _ = parsed.set_password(Some("*****"));
            }
            parsed.into()
        }
        _ => "*****".into(),
    }
}

/// Units admitted on one key in one window.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub(crate) struct UsageKey {
    /// The rule's domain.
    pub(crate) domain: Arc<str>,
    /// The descriptor, `key=value,key2=value2` (request order).
    pub(crate) descriptor: Box<str>,
    /// The limit's `name`, or its stats key when it has none.
    pub(crate) limit: Arc<str>,
    /// Window start, seconds since the Unix epoch (UTC).
    pub(crate) window_start: u64,
    /// Window length in seconds.
    pub(crate) window_seconds: u64,
}

/// The ledger's counters, read by `/status` and `/metrics`.
#[derive(Debug, Default)]
struct Counters {
    /// Units sealed into batches not yet written.
    spooled_units: AtomicU64,
    /// Batches sealed and not yet written.
    spooled_batches: AtomicU64,
    /// Units written (committed) since start.
    written_units: AtomicU64,
    /// Failed writes (connection or statement) since start.
    failures: AtomicU64,
    /// Units dropped (queue or spool full) since start.
    dropped_units: AtomicU64,
    /// Milliseconds since the epoch at which the oldest unwritten batch was sealed (0:
    /// none).
    oldest_unwritten_ms: AtomicU64,
    /// Units added to store counters that had lost usage, since start.
    restored_units: AtomicU64,
    /// Whether the schema is at the version this build writes.
    schema_ok: AtomicU64,
}

/// The handle the limiter records usage through (see the module documentation).
pub(crate) struct Ledger {
    /// Usage waiting for the writer; bounded, never awaited on.
    queue: mpsc::Sender<(UsageKey, u64)>,
    /// Flush requests for the writer.
    control: mpsc::Sender<writer::Control>,
    /// Shared with the writer.
    counters: Arc<Counters>,
    /// Where the counters are exported.
    metrics: Arc<Metrics>,
    /// This process's id in the ledger (each batch carries it with its sequence number).
    instance: Arc<str>,
    /// Masked URL, for `/status`.
    url: String,
    /// Per key, a lower bound of the units admitted in its window (for restores).
    known: Arc<known::Known>,
    /// Held while a store counter is restored, so two requests never restore one loss
    /// twice.
    restoring: tokio::sync::Mutex<()>,
}

// === impl Ledger ===

impl Ledger {
    /// Starts the writer task (inside a tokio runtime); never waits for PostgreSQL.
    /// `instance` names this process in the ledger; it must differ between processes
    /// and between starts (sequence numbers start again at 1).
    pub(crate) fn start(
        settings: &LedgerSettings,
        instance: Arc<str>,
        metrics: Arc<Metrics>,
    ) -> Self {
        let (queue, receiver) = mpsc::channel(QUEUE);
        let (control, control_receiver) = mpsc::channel(4);
        let counters = Arc::new(Counters::default());
        tokio::spawn(writer::run(
            settings.clone(),
            instance.clone(),
            receiver,
            control_receiver,
            counters.clone(),
            metrics.clone(),
        ));
        let known = Arc::new(known::Known::new(settings.url.clone(), instance.clone()));
        tokio::spawn(known::Known::keep_connected(Arc::downgrade(&known)));
        Self {
            queue,
            control,
            counters,
            metrics,
            instance,
            url: mask(&settings.url),
            known,
            restoring: tokio::sync::Mutex::new(()),
        }
    }

    /// Records `units` admitted on `key`. Never waits; a full queue drops them, counted.
    pub(crate) fn record(&self, key: UsageKey, units: u64) {
        if units == 0 {
            return;
        }
        self.known.admitted(&key, units);
        if self.queue.try_send((key, units)).is_err() {
            self.dropped(units, "queue");
        }
    }

    /// A lower bound of the units admitted on `key` in its window before now: the other
    /// instances' rows in the ledger (read on the first call for a key and window) plus
    /// every unit this instance admitted. A store counter below it lost
    /// usage.
    /// Waits for the rows until `deadline` at most (and never more than 100 ms).
    pub(crate) async fn admitted_before(
        &self,
        key: &UsageKey,
        deadline: Option<tokio::time::Instant>,
    ) -> u64 {
        let longest = tokio::time::Instant::now() + known::READ_TIMEOUT;
        let wait_until = deadline.map_or(longest, |deadline| deadline.min(longest));
        self.known.bound(key, wait_until).await
    }

    /// Held while a store counter is restored (see [`Ledger::admitted_before`]); `None`
    /// when another restore holds it past `deadline`.
    pub(crate) async fn restoring(
        &self,
        deadline: Option<tokio::time::Instant>,
    ) -> Option<tokio::sync::MutexGuard<'_, ()>> {
        match deadline {
            Some(deadline) => tokio::time::timeout_at(deadline, self.restoring.lock())
                .await
                .ok(),
            None => Some(self.restoring.lock().await),
        }
    }

    /// A store counter of `key` was raised by `units` to the ledger's bound: counted,
    /// logged, and the key's rows are read again at its next request.
    pub(crate) fn restored(&self, key: &UsageKey, units: u64) {
        self.metrics.ledger_restored_units.inc_by(units);
        self.counters
            .restored_units
            .fetch_add(units, Ordering::Relaxed);
        self.known.forget_rows(key);
        tracing::warn!(
            domain = %key.domain,
            limit = %key.limit,
            units,
            "store counter lower than the ledger (redis restarted, flushed or failed over?): restored"
        );
    }

    /// Seals every open batch and writes the spool, waiting at most `within` (at
    /// shutdown, and in tests). Usage recorded before the call is included.
    pub(crate) async fn flush(&self, within: Duration) {
        let (done, answer) = tokio::sync::oneshot::channel();
        if self
            .control
            .send_timeout(writer::Control::Flush(within, done), within)
            .await
            .is_ok()
        {
            let _ = tokio::time::timeout(within + Duration::from_millis(100), answer).await;
        }
    }

    /// Units not written yet (sealed or open batches are not counted until sealed).
    pub(crate) fn spooled_units(&self) -> u64 {
        self.counters.spooled_units.load(Ordering::Relaxed)
    }

    /// Counts and logs usage that will never be written.
    fn dropped(&self, units: u64, why: &'static str) {
        dropped(&self.counters, &self.metrics, units, why);
    }

    /// `/status` view.
    pub(crate) fn status(&self) -> serde_json::Value {
        let c = &self.counters;
        let oldest = c.oldest_unwritten_ms.load(Ordering::Relaxed);
        let lag = (oldest > 0).then(|| writer::now_ms().saturating_sub(oldest) as f64 / 1000.0);
        serde_json::json!({
            "url": self.url,
            "instance": self.instance.as_ref(),
            "schema_ok": c.schema_ok.load(Ordering::Relaxed) == 1,
            "lag_seconds": lag,
            "spooled_batches": c.spooled_batches.load(Ordering::Relaxed),
            "spooled_units": c.spooled_units.load(Ordering::Relaxed),
            "written_units": c.written_units.load(Ordering::Relaxed),
            "write_failures": c.failures.load(Ordering::Relaxed),
            "dropped_units": c.dropped_units.load(Ordering::Relaxed),
            "restored_units": c.restored_units.load(Ordering::Relaxed),
        })
    }
}

/// Counts and logs `units` that will never be written (`why`: which bound was full).
fn dropped(counters: &Counters, metrics: &Metrics, units: u64, why: &'static str) {
    let before = counters.dropped_units.fetch_add(units, Ordering::Relaxed);
    metrics.ledger_dropped_units.inc_by(units);
    // Once per power of two of the total: visible at once, never a flood.
    if (before + units).ilog2() != before.checked_ilog2().unwrap_or(u32::MAX) {
        tracing::error!(
            units,
            total = before + units,
            why,
            "ledger usage dropped: the {why} is full (PostgreSQL down for long?)"
        );
    }
}

/// A fresh instance id: the host name, the process id and the start time, so two
/// processes (or two starts) never share one.
pub(crate) fn instance_id(start_ms: u64) -> Arc<str> {
    let host = std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|name| name.trim().to_owned())
        .unwrap_or_else(|_| "sluice".into());
    Arc::from(format!("{host}/{}/{start_ms}", std::process::id()))
}
