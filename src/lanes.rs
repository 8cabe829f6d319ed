//! Serving threads ("lanes"): each runs its own single-threaded tokio runtime, so work
//! handed to a lane is read, decided and answered on one thread. The gRPC listener deals
//! connections to them ([`crate::listener::lanes`]); the Redis store gives each lane its
//! own batcher and clients, made on the lane's runtime ([`Lanes::handles`]) before
//! serving starts, and picks them by [`current`].
//!
//! On tokio's multi-threaded runtime every new task (hyper spawns one per HTTP/2 stream)
//! may wake an idle sibling worker to steal it. At moderate load those wakeups cost more
//! CPU than the call itself and put queues between threads; at saturation they vanish.
//! A task woken by another on the same worker also runs next (tokio's LIFO slot): when a
//! Redis batch answered its calls, each call's stream task woke its connection, which
//! ran next and wrote that one answer, one `writev` per call instead of one per batch. A
//! lane runs woken tasks in turn, so the answers of a batch leave in one write.

use std::cell::Cell;
use std::future::Future;
use std::pin::Pin;

use tokio::runtime::Handle;
use tokio::sync::oneshot;

thread_local! {
    /// The index of the lane this thread serves; `None` off the serving threads.
    static CURRENT: Cell<Option<usize>> = const { Cell::new(None) };
}

/// The index of the lane whose serving thread this is (`None` on any other thread).
pub(crate) fn current() -> Option<usize> {
    CURRENT.get()
}

/// Serving threads for a `--workers` setting (`None`: one per core).
pub(crate) fn count_for(workers: Option<usize>) -> usize {
    workers
        .or_else(|| std::thread::available_parallelism().ok().map(usize::from))
        .unwrap_or(1)
        .max(1)
}

/// What a lane thread runs once it is handed its work (made on the thread: need not be
/// `Send`).
pub(crate) type Work = Box<dyn FnOnce() -> Pin<Box<dyn Future<Output = ()>>> + Send>;

/// Serving threads started but not handed their work yet: their runtimes already run
/// tasks spawned through [`Lanes::handles`]. Dropped unused, the threads end.
pub(crate) struct Lanes {
    idle: Vec<IdleLane>,
}

struct IdleLane {
    /// Spawns onto the lane's runtime.
    handle: Handle,
    /// Hands the lane its work.
    work: oneshot::Sender<Work>,
}

/// A serving thread or its runtime that could not start.
#[derive(Debug, thiserror::Error)]
#[error("starting gRPC serving thread {index}: {source}")]
pub struct StartError {
    /// Which lane.
    pub(crate) index: usize,
    /// What failed.
    pub(crate) source: std::io::Error,
}

impl Lanes {
    /// Starts `count` (at least one) serving threads, named `sluice-grpc-<index>`, each
    /// running its own single-threaded runtime, which lives and ends on that thread.
    pub(crate) fn spawn(count: usize) -> Result<Self, StartError> {
        let mut idle = Vec::with_capacity(count.max(1));
        for index in 0..count.max(1) {
            let runtime = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .map_err(|source| StartError { index, source })?;
            let handle = runtime.handle().clone();
            let (work, take_work) = oneshot::channel::<Work>();
            std::thread::Builder::new()
                .name(format!("sluice-grpc-{index}"))
                .spawn(move || {
                    CURRENT.set(Some(index));
                    runtime.block_on(async move {
                        if let Ok(work) = take_work.await {
                            work().await;
                        }
                    });
                })
                .map_err(|source| StartError { index, source })?;
            idle.push(IdleLane { handle, work });
        }
        Ok(Self { idle })
    }

    /// The lanes' runtimes, in lane order (lane `i` is the thread where [`current`] is
    /// `Some(i)`).
    pub(crate) fn handles(&self) -> Vec<Handle> {
        self.idle.iter().map(|lane| lane.handle.clone()).collect()
    }

    /// Hands lane `i` the work `work(i)`, in lane order. A lane whose thread has already
    /// ended drops its work unrun.
    pub(crate) fn run(self, mut work: impl FnMut(usize) -> Work) {
        for (index, lane) in self.idle.into_iter().enumerate() {
            let _ = lane.work.send(work(index));
        }
    }
}
