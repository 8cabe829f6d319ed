//! Open-loop pacing: each load thread releases its own share of the calls as they fall
//! due, woken by a timer of its own (a timerfd ticking every [`PACER_TICK`], read through
//! the thread's tokio reactor).
//!
//! Call n of the run (n = 0, 1, …) falls due once more than n / rate seconds have passed
//! since the start, and belongs to thread n % threads ([`Pace`]): the threads share the
//! calls in turn without talking to each other. A timerfd costs nothing while its thread
//! is busy (the tick is read with the next poll of the reactor) and one wakeup when it
//! is idle. Before it, a pacer thread released every thread's calls: a wakeup of its own
//! every tick (12 % of a vCPU at 70 000 calls/s) and one cross-thread wakeup per load
//! thread.

use std::io;
use std::os::fd::OwnedFd;
use std::time::{Duration, Instant};

use rustix::time::{
    timerfd_create, timerfd_settime, Itimerspec, TimerfdClockId, TimerfdFlags, TimerfdTimerFlags,
    Timespec,
};
use tokio::io::unix::AsyncFd;
use tokio::sync::Semaphore;

/// How often a load thread releases the calls that have become due (tokio's timer has
/// millisecond granularity: bursts of a millisecond). A tick of 50 µs woke an idle
/// thread 20 000 times a second, which cost more than the calls it paced; at 200 µs,
/// 70 000 calls/s over two threads start seven at a time per thread.
pub(crate) const PACER_TICK: Duration = Duration::from_micros(200);

/// One load thread's share of an open loop's calls.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Pace {
    /// Calls per second, all threads together.
    pub(crate) rate: f64,
    /// Load threads sharing the calls.
    pub(crate) threads: u64,
    /// This thread's number (0-based): its calls are those with n % threads == index.
    pub(crate) index: u64,
}

impl Pace {
    /// This thread's calls due `elapsed` after the start: the n < rate × elapsed with
    /// n % threads == index.
    pub(crate) fn due_after(&self, elapsed: Duration) -> u64 {
        let all = (elapsed.as_secs_f64() * self.rate) as u64;
        (all + self.threads - 1 - self.index) / self.threads
    }

    /// On the load thread: hands this thread's calls, due from `start`, to `workers` (a
    /// permit each) as they fall due, until `end`; then closes `workers` (also when the
    /// timer fails). Calls released but not yet taken when it closes are not made: the
    /// schedule was not kept. Returns the calls released.
    pub(crate) async fn dispatch(
        &self,
        ticker: &Ticker,
        start: Instant,
        end: Instant,
        workers: &Semaphore,
    ) -> io::Result<u64> {
        let mut released = 0u64;
        loop {
            if let Err(error) = ticker.tick().await {
                workers.close();
                return Err(error);
            }
            let now = Instant::now();
            if now >= end {
                workers.close();
                return Ok(released);
            }
            let due = self.due_after(now.saturating_duration_since(start));
            if due > released {
                let room = Semaphore::MAX_PERMITS - workers.available_permits();
                workers.add_permits(usize::try_from(due - released).map_or(room, |n| n.min(room)));
                released = due;
            }
        }
    }
}

/// A periodic timer on the current thread's tokio reactor.
#[derive(Debug)]
pub(crate) struct Ticker {
    timer: AsyncFd<OwnedFd>,
}

impl Ticker {
    /// A timer firing every `every` from now; must be made inside a tokio runtime.
    pub(crate) fn every(every: Duration) -> io::Result<Self> {
        let timer = timerfd_create(
            TimerfdClockId::Monotonic,
            TimerfdFlags::NONBLOCK | TimerfdFlags::CLOEXEC,
        )?;
        let period = Timespec::try_from(every)
            .map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "tick too long"))?;
        timerfd_settime(
            &timer,
            TimerfdTimerFlags::empty(),
            &Itimerspec {
                it_interval: period,
                it_value: period,
            },
        )?;
        // The crate's one unsafe block, in the load generator only: tokio 1.53.3
        // deprecated the safe `AsyncFd::new` (an `AsRawFd` may hand out an fd it does not
        // own) for the unsafe `register`. tokio::time cannot stand in: its wheel counts
        // milliseconds, five of the pacer's ticks; a timer thread would wake this one
        // from another thread on every tick, the cost the timerfd removed.
        #[allow(unsafe_code)]
        // SAFETY: `register` needs the fd to stay open, refer to the same file description
        // and be what `as_raw_fd` returns for as long as the `AsyncFd` holds it. An
        // `OwnedFd` owns its fd, closes it only when dropped (which the `AsyncFd` does
        // last) and always returns that same fd.
        let timer = unsafe { AsyncFd::register(timer) }?;
        Ok(Self { timer })
    }

    /// Waits for the next tick (at once if ticks have passed since the last wait).
    pub(crate) async fn tick(&self) -> io::Result<()> {
        loop {
            let mut ready = self.timer.readable().await?;
            // The number of expirations since the last read; only that there were any
            // matters.
            let mut expirations = [0u8; 8];
            match ready.try_io(|timer| Ok(rustix::io::read(timer.get_ref(), &mut expirations)?)) {
                Ok(read) => return read.map(drop),
                Err(_would_block) => continue,
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn threads_share_the_calls_in_turn() {
        let pace = |index| Pace {
            rate: 1000.0,
            threads: 3,
            index,
        };
        for elapsed_ms in [0u64, 1, 2, 7, 10, 999] {
            let elapsed = Duration::from_millis(elapsed_ms) + Duration::from_micros(1500);
            // 1 000 calls/s: calls 0..=elapsed_ms are due (n < 1 000 × elapsed).
            let due: Vec<_> = (0..3).map(|index| pace(index).due_after(elapsed)).collect();
            assert_eq!(due.iter().sum::<u64>(), elapsed_ms + 1, "{due:?}");
            // Call n goes to thread n % 3: the first threads are ahead by one at most.
            assert!(
                due.windows(2).all(|w| w[0] >= w[1] && w[0] - w[1] <= 1),
                "{due:?}"
            );
        }
    }

    #[test]
    fn the_dispatcher_releases_what_is_due_then_closes() {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("runtime");
        let pace = Pace {
            rate: 50_000.0,
            threads: 1,
            index: 0,
        };
        let workers = Semaphore::new(0);
        let (released, taken) = runtime.block_on(async {
            let ticker = Ticker::every(PACER_TICK).expect("timerfd");
            let take = async {
                let mut taken = 0u64;
                while let Ok(permit) = workers.acquire().await {
                    permit.forget();
                    taken += 1;
                }
                taken
            };
            let start = Instant::now();
            let end = start + Duration::from_millis(40);
            tokio::join!(pace.dispatch(&ticker, start, end, &workers), take)
        });
        let released = released.expect("ticks");
        // 40 ms at 50 000 calls/s: 2 000 calls, less what fell due after the last tick
        // (one tick: 10 calls; a slow machine may miss a few more).
        assert!((1500..=2000).contains(&released), "released {released}");
        // A late tick can release calls and close in one poll, before the worker runs:
        // those stay as permits, never lost or counted twice.
        let left = workers.available_permits() as u64;
        assert_eq!(taken + left, released, "taken {taken}, left {left}");
        assert!(workers.is_closed());
    }
}
