//! The scripts as one Redis Functions library (Redis ≥ 7): a node loads it once
//! (`FUNCTION LOAD`) and runs its two entry points with `FCALL`, so the shared helpers
//! and the algorithms are made once per node, where `EVALSHA` runs a script's whole body,
//! every helper's definition included, on each call. One check per call (redis-benchmark,
//! `INFO commandstats`, three alternating rounds): 20–30 µs of Redis per `EVALSHA`,
//! 15–18 per `FCALL`; batches of 64 checks, where the body is a small share: the same.
//!
//! The library's name, and its functions', carry a digest of its code: instances of
//! different versions sharing a Redis (a rolling upgrade) each call their own code, and
//! one loading never replaces another's. A library of an older version stays until
//! deleted (`FUNCTION DELETE`), as old scripts stay in Redis's script cache.
//!
//! A node that refuses functions (Redis before 7, `FCALL` or `FUNCTION LOAD` renamed or
//! denied by an ACL, a library it does not take) is sent `EVALSHA`, which works on every
//! version, with one warning in the log; the other nodes of a cluster keep `FCALL` (a
//! cluster half way through an upgrade from Redis 6). It is until a client connects to
//! that node again: a node that restarted may be a newer Redis (a rolling upgrade) or
//! have another ACL, so its calls go as `FCALL` again, and a node that still refuses goes
//! back to `EVALSHA` on the first call (that call too, so it costs a round trip, never an
//! answer).

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, LazyLock, Mutex, PoisonError, Weak};

use fred::types::Value;

use super::script::{self, Entry};

/// The library's code and the names its entry points are called by.
pub(crate) struct Library {
    /// What `FUNCTION LOAD` is sent.
    pub(crate) code: Value,
    /// The function that decides checks (`scripts/main.lua`).
    check: Value,
    /// The function that grants leases (`scripts/lease.lua`).
    lease: Value,
    /// The function that decides concurrency limits (`scripts/hold.lua`).
    hold: Value,
    /// The region exchange's functions (`scripts/export.lua`, `import.lua`, `seen.lua`).
    export: Value,
    /// See `export`.
    import: Value,
    /// See `export`.
    seen: Value,
}

/// The library, built on first use.
pub(crate) static LIBRARY: LazyLock<Library> = LazyLock::new(Library::build);

impl Library {
    fn build() -> Self {
        // Redis runs a library's top level while loading it, where nothing but
        // `redis.register_function` may be used (not even `math`): `build` makes the
        // helpers and algorithms on the first call of either function, and they stay.
        let body = format!(
            "local function build()\n{}\n{}\nlocal check = function(KEYS, ARGV)\n{}\nend\n\
             local lease = function(KEYS, ARGV)\n{}\nend\n\
             local hold = function(KEYS, ARGV)\n{}\nend\n\
             local export = function(KEYS, ARGV)\n{}\nend\n\
             local import = function(KEYS, ARGV)\n{}\nend\n\
             local seen = function(KEYS, ARGV)\n{}\nend\n\
             return {{ check, lease, hold, export, import, seen }}\nend\n",
            script::ALGORITHMS,
            script::CHECK_STATE,
            script::ENTRY,
            script::LEASE_ENTRY,
            script::HOLD_ENTRY,
            script::EXPORT_ENTRY,
            script::IMPORT_ENTRY,
            script::SEEN_ENTRY,
        );
        let digest = fred::util::sha1_hash(&body);
        let name = format!("sluice_{}", &digest[..16]);
        let code = format!(
            "#!lua name={name}\n{body}\
             local entries\n\
             local function run(entry, keys, args)\n\
             \x20 if entries == nil then entries = build() end\n\
             \x20 return entries[entry](keys, args)\n\
             end\n\
             redis.register_function('{name}_check', function(keys, args) return run(1, keys, args) end)\n\
             redis.register_function('{name}_lease', function(keys, args) return run(2, keys, args) end)\n\
             redis.register_function('{name}_hold', function(keys, args) return run(3, keys, args) end)\n\
             redis.register_function('{name}_export', function(keys, args) return run(4, keys, args) end)\n\
             redis.register_function('{name}_import', function(keys, args) return run(5, keys, args) end)\n\
             redis.register_function('{name}_seen', function(keys, args) return run(6, keys, args) end)\n"
        );
        Self {
            code: Value::from(code),
            check: Value::from(format!("{name}_check")),
            lease: Value::from(format!("{name}_lease")),
            hold: Value::from(format!("{name}_hold")),
            export: Value::from(format!("{name}_export")),
            import: Value::from(format!("{name}_import")),
            seen: Value::from(format!("{name}_seen")),
        }
    }

    /// The function that runs `entry`.
    pub(crate) fn function(&self, entry: Entry) -> &Value {
        match entry {
            Entry::Check => &self.check,
            Entry::Lease => &self.lease,
            Entry::Hold => &self.hold,
            Entry::Export => &self.export,
            Entry::Import => &self.import,
            Entry::Seen => &self.seen,
        }
    }
}

/// How one node's calls are sent: `FCALL` until the node refuses functions, then
/// `EVALSHA` until one of its clients connects again (shared by every lane's client of
/// the node, through [`Scripting`]).
#[derive(Debug, Default)]
pub(crate) struct NodeLua {
    /// Set while calls go as `EVALSHA`.
    evalsha: AtomicBool,
    /// Set once the fallback was logged as a warning (later ones are logged at debug).
    warned: AtomicBool,
}

/// The way calls go at one moment (read once per step, so that what is sent and how its
/// answer is read agree).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Lua {
    /// The function library, by `FCALL`.
    Functions,
    /// The scripts, by `EVALSHA`.
    Scripts,
}

impl Lua {
    /// The command and its first argument (function name or SHA) for a call of `entry`.
    pub(crate) fn command(self, entry: Entry) -> (&'static str, &'static Value) {
        match self {
            Lua::Functions => ("FCALL", LIBRARY.function(entry)),
            Lua::Scripts => ("EVALSHA", entry.sha()),
        }
    }
}

impl NodeLua {
    /// How this node's calls go now.
    pub(crate) fn current(&self) -> Lua {
        if self.evalsha.load(Ordering::Relaxed) {
            Lua::Scripts
        } else {
            Lua::Functions
        }
    }

    /// Sends `node` `EVALSHA` from now on: it refused functions with `reason` (a warning
    /// the first time, debug after).
    pub(crate) fn fall_back(&self, node: &str, reason: &str) {
        if self.evalsha.swap(true, Ordering::Relaxed) {
            return;
        }
        if self.warned.swap(true, Ordering::Relaxed) {
            tracing::debug!(
                node,
                reason,
                "redis still refuses functions: sending EVALSHA"
            );
        } else {
            tracing::warn!(
                node,
                reason,
                "redis does not take Sluice's function library: sending EVALSHA until the node reconnects"
            );
        }
    }

    /// A client connected to `node` (at start or again): its calls try `FCALL` again.
    pub(crate) fn connected(&self, node: &str) {
        if self.evalsha.swap(false, Ordering::Relaxed) {
            tracing::info!(node, "redis connection made again: trying FCALL again");
        }
    }
}

/// Every node's [`NodeLua`], by node name: each lane has its own client of a node, and
/// all of them share the node's one. Holds only the nodes some client still has.
#[derive(Debug, Default)]
pub(crate) struct Scripting {
    /// Node name → its state, while a client holds it.
    nodes: Mutex<HashMap<Arc<str>, Weak<NodeLua>>>,
}

impl Scripting {
    /// No node yet.
    pub(crate) fn new() -> Self {
        Self::default()
    }

    /// The state of the node named `name`, shared with every other client of it; a node
    /// no client holds starts on `FCALL`, as a node connected again does.
    pub(crate) fn node(&self, name: &Arc<str>) -> Arc<NodeLua> {
        let mut nodes = self.nodes.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some(state) = nodes.get(name).and_then(Weak::upgrade) {
            return state;
        }
        // Bounded by the nodes clients hold: the gone ones leave as a new one comes.
        nodes.retain(|_, state| state.strong_count() > 0);
        let state = Arc::new(NodeLua::default());
        nodes.insert(name.clone(), Arc::downgrade(&state));
        state
    }

    /// How calls go, as `/status` reports it: `functions` while every node is sent
    /// `FCALL`, `scripts` while every node is sent `EVALSHA`, `mixed` between.
    pub(crate) fn name(&self) -> &'static str {
        let nodes = self.nodes.lock().unwrap_or_else(PoisonError::into_inner);
        let (mut functions, mut scripts) = (0, 0);
        for state in nodes.values().filter_map(Weak::upgrade) {
            match state.current() {
                Lua::Functions => functions += 1,
                Lua::Scripts => scripts += 1,
            }
        }
        match (functions, scripts) {
            (_, 0) => "functions",
            (0, _) => "scripts",
            _ => "mixed",
        }
    }
}

/// Whether an error reply to `FCALL` or `FUNCTION LOAD` says the node takes no functions
/// from us at all (an unknown command, or an ACL that denies it), rather than this call.
pub(crate) fn refuses_functions(details: &str) -> bool {
    let denied = details.starts_with("NOPERM")
        && (details.contains("'fcall'") || details.contains("'function"));
    denied
        || details.starts_with("ERR unknown command")
        || details.starts_with("ERR unknown subcommand")
}

/// Whether an error reply to `FUNCTION LOAD` says the library cannot be loaded there: a
/// refusal, or Redis not taking its code (`ERR Error registering functions`, ...).
pub(crate) fn refuses_library(details: &str) -> bool {
    refuses_functions(details) || details.starts_with("ERR Error")
}

/// Whether an error reply to `FUNCTION LOAD` says the library is loaded already (by
/// another lane or instance: its name is its code's digest, so it is the same code).
pub(crate) fn already_loaded(details: &str) -> bool {
    details.starts_with("ERR Library") && details.contains("already exists")
}

/// Whether an error reply to `FCALL` says the node has no such function (a restart
/// without persistence, a new primary, `FUNCTION FLUSH`): load the library, call again.
pub(crate) fn is_function_missing(details: &str) -> bool {
    details.starts_with("ERR Function not found")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_carry_the_code_digest() {
        let library = &*LIBRARY;
        let code = library.code.as_str().expect("text");
        let name = code
            .lines()
            .next()
            .and_then(|line| line.strip_prefix("#!lua name="))
            .expect("library header");
        assert!(name.starts_with("sluice_"), "{name}");
        assert_eq!(name.len(), "sluice_".len() + 16);
        for entry in [Entry::Check, Entry::Lease, Entry::Hold] {
            let function = library.function(entry).as_str().expect("text").into_owned();
            assert!(function.starts_with(name), "{function}");
            assert!(
                code.contains(&format!("'{function}'")),
                "{function} registered"
            );
        }
    }

    #[test]
    fn refusals_are_told_from_other_errors() {
        for refusal in [
            "ERR unknown command 'FCALL', with args beginning with: 'sluice_x_check' '1' ",
            "ERR unknown command `FUNCTION`, with args beginning with: `LOAD` ",
            "NOPERM this user has no permissions to run the 'fcall' command",
            "NOPERM User lim has no permissions to run the 'function|load' command",
        ] {
            assert!(refuses_functions(refusal), "{refusal}");
            assert!(refuses_library(refusal), "{refusal}");
        }
        for other in [
            "NOPERM No permissions to access a key",
            "OOM command not allowed when used memory > 'maxmemory'.",
            "ERR Function not found",
            "BUSY Redis is busy running a script.",
            "LOADING Redis is loading the dataset in memory",
        ] {
            assert!(!refuses_functions(other), "{other}");
            assert!(!refuses_library(other), "{other}");
        }
        assert!(refuses_library(
            "ERR Error registering functions: user_function:5: Script attempted to access nonexistent global variable 'math'"
        ));
        assert!(already_loaded("ERR Library 'sluice_0123' already exists"));
        assert!(!already_loaded("ERR Function not found"));
        assert!(is_function_missing("ERR Function not found"));
    }

    #[test]
    fn falling_back_lasts_until_a_connection() {
        let node = NodeLua::default();
        assert_eq!(node.current().command(Entry::Check).0, "FCALL");
        node.connected("node");
        assert_eq!(node.current(), Lua::Functions);
        node.fall_back("node", "ERR unknown command 'FCALL'");
        node.fall_back("node", "again");
        let (command, sha) = node.current().command(Entry::Lease);
        assert_eq!(command, "EVALSHA");
        assert_eq!(sha, Entry::Lease.sha());
        node.connected("node");
        assert_eq!(node.current(), Lua::Functions);
        node.fall_back("node", "still refused");
        assert_eq!(node.current(), Lua::Scripts);
    }

    #[test]
    fn each_node_falls_back_alone() {
        let scripting = Scripting::new();
        assert_eq!(scripting.name(), "functions");
        let (a, b): (Arc<str>, Arc<str>) = (Arc::from("10.0.0.1:6379"), Arc::from("10.0.0.2:6379"));
        let a_lane_0 = scripting.node(&a);
        let a_lane_1 = scripting.node(&a);
        let b_lane_0 = scripting.node(&b);
        a_lane_0.fall_back(&a, "ERR unknown command 'FCALL'");
        // Every client of the refusing node sees it; the other node keeps FCALL.
        assert_eq!(a_lane_1.current(), Lua::Scripts);
        assert_eq!(b_lane_0.current(), Lua::Functions);
        assert_eq!(scripting.name(), "mixed");
        b_lane_0.fall_back(&b, "ERR unknown command 'FCALL'");
        assert_eq!(scripting.name(), "scripts");
        a_lane_1.connected(&a);
        assert_eq!(a_lane_0.current(), Lua::Functions);
        assert_eq!(scripting.name(), "mixed");
    }

    #[test]
    fn gone_nodes_are_forgotten() {
        let scripting = Scripting::new();
        let gone: Arc<str> = Arc::from("10.0.0.9:6379");
        scripting.node(&gone).fall_back(&gone, "refused");
        // No client holds it: it neither counts nor stays, and comes back on FCALL.
        assert_eq!(scripting.name(), "functions");
        let held: Vec<_> = (0..100)
            .map(|i| scripting.node(&Arc::from(format!("10.0.1.{i}:6379"))))
            .collect();
        assert_eq!(scripting.node(&gone).current(), Lua::Functions);
        drop(held);
        let _last = scripting.node(&Arc::from("10.0.2.1:6379"));
        let kept = scripting.nodes.lock().expect("lock").len();
        assert!(kept <= 2, "{kept} entries kept");
    }
}
