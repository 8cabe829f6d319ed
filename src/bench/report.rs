//! Results of one `sluice bench` run: counts per outcome, latency percentiles from an
//! HDR histogram, and their text and JSON forms.

use std::collections::BTreeMap;
use std::time::Duration;

use hdrhistogram::Histogram;

use super::BenchArgs;
use crate::proto::rls::rate_limit_response::Code;
use serde::Serialize;

/// Outcomes and latencies recorded by one worker (merged at the end).
pub struct Tally {
    /// Latency of every answered call (any overall code), in microseconds.
    pub(crate) latency: Histogram<u64>,
    /// Latency of every failed call, in microseconds: kept apart, so that calls failing
    /// fast can neither pass for throughput nor pull the answered calls' latency down.
    pub(crate) error_latency: Histogram<u64>,
    /// Calls answered `overall_code: OK`.
    pub(crate) ok: u64,
    /// Calls answered `overall_code: OVER_LIMIT`.
    pub(crate) over_limit: u64,
    /// Calls answered with another overall code (UNKNOWN): a server bug for Envoy.
    pub(crate) unknown: u64,
    /// Failed calls per gRPC status code name.
    pub(crate) errors: BTreeMap<String, u64>,
}

/// An empty latency histogram: 1 µs to 100 s at 3 significant digits.
fn histogram() -> Histogram<u64> {
    Histogram::new_with_bounds(1, 100_000_000, 3)
        .expect("1 µs .. 100 s at 3 significant digits are valid bounds")
}

/// Records `latency` in `histogram` (saturating at its top).
fn record(histogram: &mut Histogram<u64>, latency: Duration) {
    let micros = (latency.as_micros() as u64).clamp(1, histogram.high());
    histogram.saturating_record(micros);
}

impl Tally {
    /// An empty tally.
    pub(crate) fn new() -> Self {
        Self {
            latency: histogram(),
            error_latency: histogram(),
            ok: 0,
            over_limit: 0,
            unknown: 0,
            errors: BTreeMap::new(),
        }
    }

    /// Counts one call that took `latency`: its overall code, or its gRPC error.
    pub(crate) fn count(&mut self, latency: Duration, result: Result<i32, &tonic::Status>) {
        match result {
            Ok(code) => {
                record(&mut self.latency, latency);
                if code == Code::Ok as i32 {
                    self.ok += 1;
                } else if code == Code::OverLimit as i32 {
                    self.over_limit += 1;
                } else {
                    self.unknown += 1;
                }
            }
            Err(status) => {
                record(&mut self.error_latency, latency);
                *self
                    .errors
                    .entry(format!("{:?}", status.code()))
                    .or_default() += 1;
            }
        }
    }

    /// Adds `other` into `self`.
    pub(crate) fn merge(&mut self, other: &Tally) {
        // Same bounds on both sides: adding cannot fail.
        let _ = self.latency.add(&other.latency);
        let _ = self.error_latency.add(&other.error_latency);
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
    pub(crate) mean: f64,
    /// Median.
    pub(crate) p50: f64,
    /// 90th percentile.
    pub(crate) p90: f64,
    /// 99th percentile.
    pub(crate) p99: f64,
    /// 99.9th percentile.
    pub(crate) p999: f64,
    /// Slowest call.
    pub(crate) max: f64,
}

impl Latency {
    /// The percentiles of `histogram` (microseconds); zeros when it is empty.
    fn of(histogram: &Histogram<u64>) -> Self {
        let ms = |micros: u64| micros as f64 / 1000.0;
        Self {
            mean: histogram.mean() / 1000.0,
            p50: ms(histogram.value_at_quantile(0.50)),
            p90: ms(histogram.value_at_quantile(0.90)),
            p99: ms(histogram.value_at_quantile(0.99)),
            p999: ms(histogram.value_at_quantile(0.999)),
            max: ms(histogram.max()),
        }
    }

    /// One line of text.
    fn text(&self) -> String {
        format!(
            "mean {:.3}  p50 {:.3}  p90 {:.3}  p99 {:.3}  p99.9 {:.3}  max {:.3}",
            self.mean, self.p50, self.p90, self.p99, self.p999, self.max
        )
    }
}

/// The summary `sluice bench` prints.
#[derive(Clone, Debug, Serialize, PartialEq)]
pub struct Report {
    /// Server address.
    pub(crate) target: String,
    /// Load threads.
    pub(crate) threads: usize,
    /// HTTP/2 connections used.
    pub(crate) connections: usize,
    /// Calls in flight at most.
    pub(crate) concurrency: usize,
    /// Requested open-loop rate, if any.
    pub(crate) rate: Option<f64>,
    /// Measured seconds (after warm-up).
    pub(crate) duration_secs: f64,
    /// Calls completed in the measured period, failed ones included.
    pub requests: u64,
    /// Answered calls per second: a failed call is never throughput.
    pub rps: f64,
    /// Failed calls per second.
    pub errors_per_sec: f64,
    /// `overall_code: OK` answers.
    pub ok: u64,
    /// `overall_code: OVER_LIMIT` answers.
    pub over_limit: u64,
    /// Answers with any other overall code.
    pub(crate) unknown: u64,
    /// Failed calls, all codes together.
    pub errors: u64,
    /// Failed calls per gRPC status code name.
    pub errors_by_code: BTreeMap<String, u64>,
    /// Latency of the answered calls, in milliseconds.
    pub(crate) latency_ms: Latency,
    /// Latency of the failed calls, in milliseconds (none when no call failed).
    pub error_latency_ms: Option<Latency>,
}

impl Report {
    /// Summarises `tally`, measured by the load `args` describe.
    pub(crate) fn new(args: &BenchArgs, tally: &Tally) -> Self {
        let errors: u64 = tally.errors.values().sum();
        let answered = tally.ok + tally.over_limit + tally.unknown;
        let secs = args.duration.as_secs_f64();
        let per_sec = |calls: u64| {
            if secs > 0.0 {
                calls as f64 / secs
            } else {
                0.0
            }
        };
        Self {
            target: args.target.to_string(),
            threads: args.threads,
            connections: args.connections,
            concurrency: args.concurrency,
            rate: args.rate,
            duration_secs: secs,
            requests: answered + errors,
            rps: per_sec(answered),
            errors_per_sec: per_sec(errors),
            ok: tally.ok,
            over_limit: tally.over_limit,
            unknown: tally.unknown,
            errors,
            errors_by_code: tally.errors.clone(),
            latency_ms: Latency::of(&tally.latency),
            error_latency_ms: (errors > 0).then(|| Latency::of(&tally.error_latency)),
        }
    }

    /// Human-readable lines.
    pub fn text(&self) -> String {
        let mode = match self.rate {
            Some(rate) => format!("open loop at {rate:.0} req/s"),
            None => "closed loop".to_owned(),
        };
        let mut text = format!(
            "target {}: {} threads, {} connections, {} in flight, {mode}, {:.1} s measured\n\
             requests {}  answered {:.0} req/s  failed {:.0} calls/s\n\
             ok {}  over_limit {}  unknown {}  errors {}",
            self.target,
            self.threads,
            self.connections,
            self.concurrency,
            self.duration_secs,
            self.requests,
            self.rps,
            self.errors_per_sec,
            self.ok,
            self.over_limit,
            self.unknown,
            self.errors,
        );
        if !self.errors_by_code.is_empty() {
            let codes: Vec<String> = self
                .errors_by_code
                .iter()
                .map(|(code, count)| format!("{code}={count}"))
                .collect();
            text.push_str(&format!(" ({})", codes.join(", ")));
        }
        text.push_str(&format!(
            "\nlatency ms, answered calls  {}\n",
            self.latency_ms.text()
        ));
        if let Some(failed) = &self.error_latency_ms {
            text.push_str(&format!("latency ms, failed calls  {}\n", failed.text()));
        }
        text
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    /// `sluice bench`'s flags alone.
    #[derive(Parser)]
    struct Bench {
        #[command(flatten)]
        args: BenchArgs,
    }

    /// The arguments of a 2-second closed-loop run.
    fn args() -> BenchArgs {
        Bench::parse_from(["bench", "--duration", "2s"]).args
    }

    #[test]
    fn failed_calls_are_neither_throughput_nor_answered_latency() {
        let mut tally = Tally::new();
        for _ in 0..10 {
            tally.count(Duration::from_millis(4), Ok(Code::Ok as i32));
        }
        tally.count(Duration::from_millis(4), Ok(Code::OverLimit as i32));
        tally.count(Duration::from_millis(4), Ok(Code::Unknown as i32));
        let refused = tonic::Status::unavailable("down");
        for _ in 0..1000 {
            tally.count(Duration::from_micros(20), Err(&refused));
        }
        let report = Report::new(&args(), &tally);
        assert_eq!((report.ok, report.over_limit, report.unknown), (10, 1, 1));
        assert_eq!(report.requests, 1012);
        assert_eq!(report.rps, 6.0, "12 answered calls in 2 s");
        assert_eq!(report.errors_per_sec, 500.0);
        assert_eq!(report.errors_by_code.get("Unavailable"), Some(&1000));
        assert!(report.latency_ms.p50 >= 3.99, "{report:?}");
        let failed = report.error_latency_ms.as_ref().expect("calls failed");
        assert!(failed.p99 <= 0.021, "{report:?}");
        let text = report.text();
        assert!(
            text.contains("answered 6 req/s  failed 500 calls/s"),
            "{text}"
        );
        assert!(text.contains("Unavailable=1000"), "{text}");
        assert!(text.contains("latency ms, failed calls"), "{text}");
    }

    #[test]
    fn a_run_without_failures_reports_no_failed_latency() {
        let mut tally = Tally::new();
        tally.count(Duration::from_millis(1), Ok(Code::Ok as i32));
        let report = Report::new(&args(), &tally);
        assert_eq!(report.error_latency_ms, None);
        assert!(
            !report.text().contains("failed calls "),
            "{}",
            report.text()
        );
    }
}
