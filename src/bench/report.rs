//! Results of one `sluice bench` run: counts per outcome, latency percentiles from an
//! HDR histogram, and their text and JSON forms.

use std::collections::BTreeMap;
use std::time::Duration;

use hdrhistogram::Histogram;

use super::BenchArgs;
use serde::Serialize;

/// Outcomes and latencies recorded by one worker (merged at the end).
pub struct Tally {
    /// Latency of every measured call, in microseconds.
    pub latency: Histogram<u64>,
    /// Calls answered `overall_code: OK`.
    pub ok: u64,
    /// Calls answered `overall_code: OVER_LIMIT`.
    pub over_limit: u64,
    /// Calls answered with another overall code (UNKNOWN): a server bug for Envoy.
    pub unknown: u64,
    /// Failed calls per gRPC status code name.
    pub errors: BTreeMap<String, u64>,
}

impl Tally {
    /// An empty tally.
    pub fn new() -> Self {
        Self {
            latency: Histogram::new_with_bounds(1, 100_000_000, 3)
                .expect("1 µs .. 100 s at 3 significant digits are valid bounds"),
            ok: 0,
            over_limit: 0,
            unknown: 0,
            errors: BTreeMap::new(),
        }
    }

    /// Records one call's latency (saturating at the histogram's top).
    pub fn record(&mut self, latency: Duration) {
        let micros = (latency.as_micros() as u64).clamp(1, self.latency.high());
        self.latency.saturating_record(micros);
    }

    /// Adds `other` into `self`.
    pub fn merge(&mut self, other: &Tally) {
        // Same bounds on both sides: adding cannot fail.
        let _ = self.latency.add(&other.latency);
        self.ok += other.ok;
        self.over_limit += other.over_limit;
        self.unknown += other.unknown;
        for (code, count) in &other.errors {
            *self.errors.entry(code.clone()).or_default() += count;
        }
    }
}

impl Default for Tally {
    fn default() -> Self {
        Self::new()
    }
}

/// Latency percentiles in milliseconds.
#[derive(Clone, Debug, Serialize, PartialEq)]
pub struct Latency {
    /// Mean.
    pub mean: f64,
    /// Median.
    pub p50: f64,
    /// 90th percentile.
    pub p90: f64,
    /// 99th percentile.
    pub p99: f64,
    /// 99.9th percentile.
    pub p999: f64,
    /// Slowest call.
    pub max: f64,
}

/// The summary `sluice bench` prints.
#[derive(Clone, Debug, Serialize, PartialEq)]
pub struct Report {
    /// Server address.
    pub target: String,
    /// Load threads.
    pub threads: usize,
    /// HTTP/2 connections used.
    pub connections: usize,
    /// Calls in flight at most.
    pub concurrency: usize,
    /// Requested open-loop rate, if any.
    pub rate: Option<f64>,
    /// Measured seconds (after warm-up).
    pub duration_secs: f64,
    /// Calls completed in the measured period, failed ones included.
    pub requests: u64,
    /// Completed calls per second.
    pub rps: f64,
    /// `overall_code: OK` answers.
    pub ok: u64,
    /// `overall_code: OVER_LIMIT` answers.
    pub over_limit: u64,
    /// Answers with any other overall code.
    pub unknown: u64,
    /// Failed calls, all codes together.
    pub errors: u64,
    /// Failed calls per gRPC status code.
    pub errors_by_code: BTreeMap<String, u64>,
    /// Latency in milliseconds (all completed calls, failed ones included).
    pub latency_ms: Latency,
}

impl Report {
    /// Summarises `tally`, measured by the load `args` describe.
    pub fn new(args: &BenchArgs, tally: &Tally) -> Self {
        let errors: u64 = tally.errors.values().sum();
        let requests = tally.ok + tally.over_limit + tally.unknown + errors;
        let secs = args.duration.as_secs_f64();
        let h = &tally.latency;
        let ms = |micros: u64| micros as f64 / 1000.0;
        Self {
            target: args.target.to_string(),
            threads: args.threads,
            connections: args.connections,
            concurrency: args.concurrency,
            rate: args.rate,
            duration_secs: secs,
            requests,
            rps: if secs > 0.0 {
                requests as f64 / secs
            } else {
                0.0
            },
            ok: tally.ok,
            over_limit: tally.over_limit,
            unknown: tally.unknown,
            errors,
            errors_by_code: tally.errors.clone(),
            latency_ms: Latency {
                mean: h.mean() / 1000.0,
                p50: ms(h.value_at_quantile(0.50)),
                p90: ms(h.value_at_quantile(0.90)),
                p99: ms(h.value_at_quantile(0.99)),
                p999: ms(h.value_at_quantile(0.999)),
                max: ms(h.max()),
            },
        }
    }

    /// Human-readable lines.
    pub fn text(&self) -> String {
        let mode = match self.rate {
            Some(rate) => format!("open loop at {rate:.0} req/s"),
            None => "closed loop".to_owned(),
        };
        let errors = if self.errors_by_code.is_empty() {
            String::new()
        } else {
            let codes: Vec<String> = self
                .errors_by_code
                .iter()
                .map(|(code, count)| format!("{code}={count}"))
                .collect();
            format!(" ({})", codes.join(", "))
        };
        let l = &self.latency_ms;
        format!(
            "target {}: {} threads, {} connections, {} in flight, {mode}, {:.1} s measured\n\
             requests {}  {:.0} req/s\n\
             ok {}  over_limit {}  unknown {}  errors {}{errors}\n\
             latency ms  mean {:.3}  p50 {:.3}  p90 {:.3}  p99 {:.3}  p99.9 {:.3}  max {:.3}\n",
            self.target,
            self.threads,
            self.connections,
            self.concurrency,
            self.duration_secs,
            self.requests,
            self.rps,
            self.ok,
            self.over_limit,
            self.unknown,
            self.errors,
            l.mean,
            l.p50,
            l.p90,
            l.p99,
            l.p999,
            l.max
        )
    }
}
