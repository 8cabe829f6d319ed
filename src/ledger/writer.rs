//! The ledger's one task: sums usage per key and window, seals batches, spools them and
//! writes them to PostgreSQL (see the module documentation of [`super`]).

use std::collections::{HashMap, VecDeque};
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio::sync::{mpsc, oneshot};
use tokio_postgres::Client;

use super::{dropped, schema, Counters, LedgerSettings, UsageKey, BATCH_UNITS, QUEUE};
use crate::telemetry::Metrics;

/// Most batches in one `INSERT`.
const WRITE_CHUNK: usize = 1_000;

/// Deadline of one connection attempt or one write; past it the write is retried
/// (idempotent) on a new connection.
const WRITE_TIMEOUT: Duration = Duration::from_secs(5);

/// Longest wait between two connection attempts while PostgreSQL is down.
const RETRY_MAX: Duration = Duration::from_secs(2);

/// What the writer is asked besides usage.
pub(super) enum Control {
    /// Seal every open batch and write the spool (within the duration), then answer.
    Flush(Duration, oneshot::Sender<()>),
}

/// One sealed batch: a sequence number of this instance, a key and its units.
struct Batch {
    seq: i64,
    key: UsageKey,
    units: u64,
    sealed_ms: u64,
}

/// Usage records as the request path queues them.
type Usage = mpsc::Receiver<(UsageKey, u64)>;

/// The writer's state.
struct Writer {
    settings: LedgerSettings,
    instance: Arc<str>,
    counters: Arc<Counters>,
    metrics: Arc<Metrics>,
    /// Units per key not sealed yet.
    open: HashMap<UsageKey, u64>,
    /// Sealed batches not written yet, oldest first; at most `settings.spool`.
    spool: VecDeque<Batch>,
    /// The last sequence number given.
    seq: i64,
    /// The connection, when one is up and its schema is current.
    client: Option<Client>,
    /// When the next connection attempt may be made, and the wait after it.
    retry_at: Instant,
    backoff: Duration,
    /// The last error logged, so an outage is logged once per change.
    last_error: Option<String>,
}

/// Runs until the [`super::Ledger`] is dropped; then seals and writes what it holds
/// (within [`WRITE_TIMEOUT`]).
pub(super) async fn run(
    settings: LedgerSettings,
    instance: Arc<str>,
    mut usage: Usage,
    mut control: mpsc::Receiver<Control>,
    counters: Arc<Counters>,
    metrics: Arc<Metrics>,
) {
    let mut tick = tokio::time::interval(settings.interval);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut writer = Writer {
        settings,
        instance,
        counters,
        metrics,
        open: HashMap::new(),
        spool: VecDeque::new(),
        seq: 0,
        client: None,
        retry_at: Instant::now(),
        backoff: Duration::from_millis(100),
        last_error: None,
    };
    loop {
        tokio::select! {
            item = usage.recv() => match item {
                Some((key, units)) => writer.add(key, units),
                None => break,
            },
            Some(Control::Flush(within, done)) = control.recv() => {
                // Usage recorded before the flush was asked for is in it.
                while let Ok((key, units)) = usage.try_recv() {
                    writer.add(key, units);
                }
                writer.seal_all();
                writer.write_until(Instant::now() + within, &mut usage).await;
                let _ = done.send(());
            }
            _ = tick.tick() => {
                writer.seal_all();
                writer.write(&mut usage).await;
            }
        }
    }
    writer.seal_all();
    writer
        .write_until(Instant::now() + WRITE_TIMEOUT, &mut usage)
        .await;
}

/// Awaits `work` while taking usage off the queue into `arrived` (at most [`QUEUE`]
/// records), so that requests do not find the queue full while PostgreSQL is slow.
async fn draining<T>(
    work: impl std::future::Future<Output = T>,
    usage: &mut Usage,
    arrived: &mut Vec<(UsageKey, u64)>,
) -> T {
    tokio::pin!(work);
    loop {
        tokio::select! {
            biased;
            done = &mut work => return done,
            Some(item) = usage.recv(), if arrived.len() < QUEUE => arrived.push(item),
        }
    }
}

// === impl Writer ===

impl Writer {
    /// Adds units to the open batch of `key`; seals it at [`BATCH_UNITS`].
    fn add(&mut self, key: UsageKey, units: u64) {
        let total = self.open.entry(key).or_insert(0);
        *total += units;
        if *total >= BATCH_UNITS {
            // Rare: only a key this busy pays for the second lookup.
            let full: Vec<UsageKey> = self
                .open
                .iter()
                .filter(|(_, units)| **units >= BATCH_UNITS)
                .map(|(key, _)| key.clone())
                .collect();
            for key in full {
                if let Some(units) = self.open.remove(&key) {
                    self.seal(key, units);
                }
            }
        }
    }

    /// Seals every open batch.
    fn seal_all(&mut self) {
        let open = std::mem::take(&mut self.open);
        for (key, units) in open {
            self.seal(key, units);
        }
    }

    /// Numbers one batch and spools it; a full spool drops it, counted and logged.
    fn seal(&mut self, key: UsageKey, units: u64) {
        if self.spool.len() >= self.settings.spool {
            dropped(&self.counters, &self.metrics, units, "spool");
            return;
        }
        self.seq += 1;
        self.spool.push_back(Batch {
            seq: self.seq,
            key,
            units,
            sealed_ms: now_ms(),
        });
        self.counters
            .spooled_units
            .fetch_add(units, Ordering::Relaxed);
        self.publish();
    }

    /// Writes the spool until it is empty or `deadline` passes.
    async fn write_until(&mut self, deadline: Instant, usage: &mut Usage) {
        while !self.spool.is_empty() && Instant::now() < deadline {
            self.retry_at = self.retry_at.min(Instant::now());
            if !self.write(usage).await {
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        }
    }

    /// One attempt at writing the spool (connecting first if need be), taking usage
    /// off the queue meanwhile. Whether the spool is empty now.
    async fn write(&mut self, usage: &mut Usage) -> bool {
        if self.spool.is_empty() {
            return true;
        }
        let mut arrived = Vec::new();
        let written = self.write_spool(usage, &mut arrived).await;
        for (key, units) in arrived {
            self.add(key, units);
        }
        written
    }

    /// [`Writer::write`] but for the usage that arrives meanwhile, left in `arrived`.
    async fn write_spool(&mut self, usage: &mut Usage, arrived: &mut Vec<(UsageKey, u64)>) -> bool {
        if self.client.is_none() {
            if Instant::now() < self.retry_at {
                return false;
            }
            let connect = tokio::time::timeout(WRITE_TIMEOUT, self.connect());
            match draining(connect, usage, arrived).await {
                Ok(Ok(client)) => {
                    self.client = Some(client);
                    self.backoff = Duration::from_millis(100);
                    if self.last_error.take().is_some() {
                        tracing::info!("ledger: postgresql reachable again, writing the spool");
                    }
                }
                Ok(Err(error)) => return self.failed(error),
                Err(_) => return self.failed("connection timed out".into()),
            }
        }
        while !self.spool.is_empty() {
            let count = self.spool.len().min(WRITE_CHUNK);
            let result = match &self.client {
                Some(client) => {
                    let insert = tokio::time::timeout(
                        WRITE_TIMEOUT,
                        insert(client, &self.instance, &self.spool, count),
                    );
                    draining(insert, usage, arrived)
                        .await
                        .map_err(|_| "write timed out".to_owned())
                        .and_then(|result| result.map_err(|error| error.to_string()))
                }
                None => return false,
            };
            if let Err(error) = result {
                // The batches stay spooled; written again with the same sequence
                // numbers, they count once.
                self.client = None;
                return self.failed(error);
            }
            let mut units = 0;
            for batch in self.spool.drain(..count) {
                units += batch.units;
            }
            self.counters
                .spooled_units
                .fetch_sub(units, Ordering::Relaxed);
            self.counters
                .written_units
                .fetch_add(units, Ordering::Relaxed);
            self.metrics.ledger_written_units.inc_by(units);
            self.publish();
        }
        true
    }

    /// A connection whose schema is current (migrated first with `--ledger-migrate`).
    async fn connect(&self) -> Result<Client, String> {
        let mut client = schema::connect(&self.settings.url)
            .await
            .map_err(|error| error.to_string())?;
        if self.settings.migrate {
            let applied = schema::migrate(&mut client)
                .await
                .map_err(|error| error.to_string())?;
            if !applied.is_empty() {
                tracing::info!(?applied, "ledger schema migrated");
            }
        }
        let version = schema::version(&client)
            .await
            .map_err(|error| error.to_string())?;
        let ok = version == schema::VERSION;
        self.counters
            .schema_ok
            .store(u64::from(ok), Ordering::Relaxed);
        if !ok {
            return Err(format!(
                "the ledger schema is at version {version}, this build writes version {}: \
                 run `sluice ledger migrate` (or serve with --ledger-migrate)",
                schema::VERSION
            ));
        }
        Ok(client)
    }

    /// Counts a failed attempt, logs it when it differs from the last, and waits longer
    /// before the next. Returns false (the spool is not empty).
    fn failed(&mut self, error: String) -> bool {
        self.counters.failures.fetch_add(1, Ordering::Relaxed);
        self.metrics.ledger_write_failures.inc();
        if self.last_error.as_deref() != Some(error.as_str()) {
            tracing::warn!(
                %error,
                spooled_batches = self.spool.len(),
                "ledger: cannot write to postgresql; usage is spooled"
            );
            self.last_error = Some(error);
        }
        self.retry_at = Instant::now() + self.backoff;
        self.backoff = (self.backoff * 2).min(RETRY_MAX);
        false
    }

    /// Publishes the spool's size and age.
    fn publish(&self) {
        let oldest = self.spool.front().map_or(0, |batch| batch.sealed_ms);
        self.counters
            .oldest_unwritten_ms
            .store(oldest, Ordering::Relaxed);
        self.metrics
            .ledger_oldest_unwritten
            .set((oldest / 1000) as i64);
        self.counters
            .spooled_batches
            .store(self.spool.len() as u64, Ordering::Relaxed);
        self.metrics
            .ledger_spooled_units
            .set(self.counters.spooled_units.load(Ordering::Relaxed) as i64);
    }
}

/// Writes the first `count` batches of `spool` in one statement; batches already
/// written (a retry after a timeout) are skipped by their `(instance, seq)`.
async fn insert(
    client: &Client,
    instance: &str,
    spool: &VecDeque<Batch>,
    count: usize,
) -> Result<u64, tokio_postgres::Error> {
    let batches = || spool.iter().take(count);
    let seq: Vec<i64> = batches().map(|b| b.seq).collect();
    let domain: Vec<&str> = batches().map(|b| &*b.key.domain).collect();
    let descriptor: Vec<&str> = batches().map(|b| &*b.key.descriptor).collect();
    let limit: Vec<&str> = batches().map(|b| &*b.key.limit).collect();
    let int = |value: u64| i64::try_from(value).unwrap_or(i64::MAX);
    let window: Vec<i64> = batches().map(|b| int(b.key.window_start)).collect();
    let seconds: Vec<i64> = batches().map(|b| int(b.key.window_seconds)).collect();
    let units: Vec<i64> = batches().map(|b| int(b.units)).collect();
    let sealed: Vec<i64> = batches().map(|b| int(b.sealed_ms)).collect();
    client
        .execute(
            "INSERT INTO sluice_usage (instance, seq, domain, descriptor, limit_name, \
                 window_start, window_seconds, units, sealed_at) \
             SELECT $1, s, d, k, l, to_timestamp(w), ws, u, to_timestamp(sa / 1000.0) \
             FROM unnest($2::bigint[], $3::text[], $4::text[], $5::text[], $6::bigint[], \
                 $7::bigint[], $8::bigint[], $9::bigint[]) AS t(s, d, k, l, w, ws, u, sa) \
             ON CONFLICT (instance, seq) DO NOTHING",
            &[
                &instance,
                &seq,
                &domain,
                &descriptor,
                &limit,
                &window,
                &seconds,
                &units,
                &sealed,
            ],
        )
        .await
}

/// Milliseconds since the Unix epoch: when a batch was sealed, for the ledger's rows
/// and the lag; never part of a decision (windows come from the limiter's clock).
#[allow(clippy::disallowed_methods)]
pub(super) fn now_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |elapsed| elapsed.as_millis() as u64)
}
