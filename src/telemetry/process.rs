//! The process's own resources (memory, CPU time, file descriptors, start time), read
//! from Linux's `/proc/self` when `/metrics` is scraped: a few small reads per scrape,
//! nothing on the request path. Elsewhere (or when `/proc` is not mounted) nothing is
//! read and the gauges keep their last values.

use std::path::Path;

/// Clock ticks per second in `/proc`'s CPU and start times: the kernel's `USER_HZ`, fixed
/// at 100 by its user-space ABI on the architectures Sluice ships for (x86_64, arm64).
const TICKS_PER_SECOND: f64 = 100.0;

/// One reading of the process's resources.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub(crate) struct Sample {
    /// Resident memory in bytes (`VmRSS`).
    pub(crate) resident_bytes: i64,
    /// User plus system CPU time, in seconds.
    pub(crate) cpu_seconds: f64,
    /// Open file descriptors.
    pub(crate) open_fds: i64,
    /// The soft limit on open file descriptors.
    pub(crate) max_fds: i64,
    /// When the process started, in seconds since the Unix epoch.
    pub(crate) start_time_seconds: f64,
}

/// Reads `/proc/self`; `None` when it cannot be read (not Linux, no `/proc`).
pub(crate) fn sample() -> Option<Sample> {
    let proc_root = Path::new("/proc");
    let stat = std::fs::read_to_string(proc_root.join("self/stat")).ok()?;
    let status = std::fs::read_to_string(proc_root.join("self/status")).ok()?;
    let boot = std::fs::read_to_string(proc_root.join("stat")).ok()?;
    let open_fds = std::fs::read_dir(proc_root.join("self/fd")).ok()?.count();
    let max_fds = rlimit::getrlimit(rlimit::Resource::NOFILE)
        .map(|(soft, _)| soft)
        .unwrap_or(0);
    parse(&stat, &status, &boot, open_fds, max_fds)
}

/// The sample from the texts of `/proc/self/stat`, `/proc/self/status` and `/proc/stat`
/// (the read directory entries of `/proc/self/fd` include the one `read_dir` opened).
fn parse(stat: &str, status: &str, boot: &str, fd_entries: usize, max_fds: u64) -> Option<Sample> {
    // The command name (field 2) may hold spaces and parentheses: fields resume after
    // the last ')'. Counted from there, field 3 (state) is index 0.
    let fields: Vec<&str> = stat
        .get(stat.rfind(')')? + 1..)?
        .split_whitespace()
        .collect();
    let ticks = |field: usize| fields.get(field - 3)?.parse::<f64>().ok();
    let cpu_ticks = ticks(14)? + ticks(15)?;
    let start_ticks = ticks(22)?;
    let resident_kib: i64 = status
        .lines()
        .find_map(|line| line.strip_prefix("VmRSS:"))?
        .trim()
        .trim_end_matches("kB")
        .trim()
        .parse()
        .ok()?;
    let boot_time: f64 = boot
        .lines()
        .find_map(|line| line.strip_prefix("btime "))?
        .trim()
        .parse()
        .ok()?;
    Some(Sample {
        resident_bytes: resident_kib.saturating_mul(1024),
        cpu_seconds: cpu_ticks / TICKS_PER_SECOND,
        open_fds: fd_entries.saturating_sub(1) as i64,
        max_fds: i64::try_from(max_fds).unwrap_or(i64::MAX),
        start_time_seconds: boot_time + start_ticks / TICKS_PER_SECOND,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_proc_texts() {
        // A command name with a space and a ')' must not shift the fields.
        let stat = "4242 (sl uice) x) S 1 4242 4242 0 -1 4194560 900 0 0 0 250 50 0 0 20 0 \
                    9 0 123400 200000000 5000 18446744073709551615";
        let status = "Name:\tsluice\nVmPeak:\t  300000 kB\nVmRSS:\t   20480 kB\nThreads:\t9\n";
        let boot = "cpu  1 2 3\nbtime 1700000000\nprocesses 10\n";
        let sample = parse(stat, status, boot, 8, 1024).expect("parsed");
        assert_eq!(
            sample,
            Sample {
                resident_bytes: 20480 * 1024,
                cpu_seconds: 3.0,
                open_fds: 7,
                max_fds: 1024,
                start_time_seconds: 1_700_000_000.0 + 1234.0,
            }
        );
        assert_eq!(parse("garbage", status, boot, 1, 1), None);
    }

    #[test]
    fn reads_this_process() {
        let sample = sample().expect("/proc/self is readable on Linux");
        assert!(sample.resident_bytes > 0, "{sample:?}");
        assert!(sample.open_fds >= 3, "stdin, stdout, stderr: {sample:?}");
        assert!(sample.max_fds >= sample.open_fds, "{sample:?}");
        assert!(sample.start_time_seconds > 1_600_000_000.0, "{sample:?}");
    }
}
