//! Measurements of this process, one test at a time (each takes [`alone`]): allocations
//! per decision, counted by the global allocator below, on the memory and the Redis
//! store, and the memory store's resident bytes per key.

mod alloc;
mod alloc_redis;
#[cfg(feature = "bench")]
mod memory_per_key;

use stats_alloc::{StatsAlloc, INSTRUMENTED_SYSTEM};

/// Counts every allocation of this process.
#[global_allocator]
static GLOBAL: &StatsAlloc<std::alloc::System> = &INSTRUMENTED_SYSTEM;

/// Holds off the other tests of this binary: allocation counts and the resident set are
/// process-wide.
fn alone() -> std::sync::MutexGuard<'static, ()> {
    static LOCK: std::sync::Mutex<()> = std::sync::Mutex::new(());
    LOCK.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}
