//! Tests against real `redis-server` processes that tolerate running next to each
//! other: store semantics, the Lua scripts, deadlines, leases, Redis memory per key, and
//! the hand-run hot-key load measurement, batching counted by Redis.

mod batching;
mod hotkeys_load;
mod key_prefix;
mod redis_deadlines;
mod redis_hold;
mod redis_lease;
mod redis_memory;
mod redis_regions;
mod redis_scripts;
mod store_behaviour;
