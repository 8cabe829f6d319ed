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
//! denied by an ACL, a library it does not take) makes the store send `EVALSHA`, which
//! works on every version, with one warning in the log. It does until a client of the
//! store connects to a node again: a node that restarted may be a newer Redis (a rolling
//! upgrade) or have another ACL, so calls go as `FCALL` again, and a node that still
//! refuses sends the store back to `EVALSHA` on the first call (that call too, so it
//! costs a round trip, never an answer).

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::LazyLock;

use fred::types::Value;

use super::script::{self, Entry};

/// The library's code and the names its entry points are called by.
pub struct Library {
    /// What `FUNCTION LOAD` is sent.
    pub code: Value,
    /// The function that decides checks (`scripts/main.lua`).
    check: Value,
    /// The function that grants leases (`scripts/lease.lua`).
    lease: Value,
}

/// The library, built on first use.
pub static LIBRARY: LazyLock<Library> = LazyLock::new(Library::build);

impl Library {
    fn build() -> Self {
        // Redis runs a library's top level while loading it, where nothing but
        // `redis.register_function` may be used (not even `math`): `build` makes the
        // helpers and algorithms on the first call of either function, and they stay.
        let body = format!(
            "local function build()\n{}\n{}\nlocal check = function(KEYS, ARGV)\n{}\nend\n\
             local lease = function(KEYS, ARGV)\n{}\nend\nreturn {{ check, lease }}\nend\n",
            script::ALGORITHMS,
            script::CHECK_STATE,
            script::ENTRY,
            super::lease::ENTRY,
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
             redis.register_function('{name}_lease', function(keys, args) return run(2, keys, args) end)\n"
        );
        Self {
            code: Value::from(code),
            check: Value::from(format!("{name}_check")),
            lease: Value::from(format!("{name}_lease")),
        }
    }

    /// The function that runs `entry`.
    pub fn function(&self, entry: Entry) -> &Value {
        match entry {
            Entry::Check => &self.check,
            Entry::Lease => &self.lease,
        }
    }
}

/// How a store's calls are sent: `FCALL` until a node refuses functions, then
/// `EVALSHA` until a client connects again (shared by every lane's batcher and every
/// node's client).
#[derive(Debug, Default)]
pub struct Scripting {
    /// Set while calls go as `EVALSHA`.
    evalsha: AtomicBool,
    /// Set once the fallback was logged as a warning (later ones are logged at debug).
    warned: AtomicBool,
}

/// The way calls go at one moment (read once per step, so that what is sent and how its
/// answer is read agree).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Lua {
    /// The function library, by `FCALL`.
    Functions,
    /// The scripts, by `EVALSHA`.
    Scripts,
}

impl Lua {
    /// `functions` or `scripts`, as `/status` reports it.
    pub fn name(self) -> &'static str {
        match self {
            Lua::Functions => "functions",
            Lua::Scripts => "scripts",
        }
    }

    /// The command and its first argument (function name or SHA) for a call of `entry`.
    pub fn command(self, entry: Entry) -> (&'static str, &'static Value) {
        match self {
            Lua::Functions => ("FCALL", LIBRARY.function(entry)),
            Lua::Scripts => ("EVALSHA", entry.sha()),
        }
    }
}

impl Scripting {
    /// Calls go as `FCALL` until a node refuses.
    pub fn new() -> Self {
        Self::default()
    }

    /// How calls go now.
    pub fn current(&self) -> Lua {
        if self.evalsha.load(Ordering::Relaxed) {
            Lua::Scripts
        } else {
            Lua::Functions
        }
    }

    /// Sends `EVALSHA` from now on: `node` refused functions with `reason` (a warning
    /// the first time, debug after).
    pub fn fall_back(&self, node: &str, reason: &str) {
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
                "redis does not take Sluice's function library: sending EVALSHA until a node reconnects"
            );
        }
    }

    /// A client connected to `node` (at start or again): calls try `FCALL` again.
    pub fn connected(&self, node: &str) {
        if self.evalsha.swap(false, Ordering::Relaxed) {
            tracing::info!(node, "redis connection made again: trying FCALL again");
        }
    }
}

/// Whether an error reply to `FCALL` or `FUNCTION LOAD` says the node takes no functions
/// from us at all (an unknown command, or an ACL that denies it), rather than this call.
pub fn refuses_functions(details: &str) -> bool {
    let denied = details.starts_with("NOPERM")
        && (details.contains("'fcall'") || details.contains("'function"));
    denied
        || details.starts_with("ERR unknown command")
        || details.starts_with("ERR unknown subcommand")
}

/// Whether an error reply to `FUNCTION LOAD` says the library cannot be loaded there: a
/// refusal, or Redis not taking its code (`ERR Error registering functions`, ...).
pub fn refuses_library(details: &str) -> bool {
    refuses_functions(details) || details.starts_with("ERR Error")
}

/// Whether an error reply to `FUNCTION LOAD` says the library is loaded already (by
/// another lane or instance: its name is its code's digest, so it is the same code).
pub fn already_loaded(details: &str) -> bool {
    details.starts_with("ERR Library") && details.contains("already exists")
}

/// Whether an error reply to `FCALL` says the node has no such function (a restart
/// without persistence, a new primary, `FUNCTION FLUSH`): load the library, call again.
pub fn is_function_missing(details: &str) -> bool {
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
        for entry in [Entry::Check, Entry::Lease] {
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
        let scripting = Scripting::new();
        assert_eq!(scripting.current().command(Entry::Check).0, "FCALL");
        assert_eq!(scripting.current().name(), "functions");
        scripting.connected("node");
        assert_eq!(scripting.current(), Lua::Functions);
        scripting.fall_back("node", "ERR unknown command 'FCALL'");
        scripting.fall_back("node", "again");
        let (command, sha) = scripting.current().command(Entry::Lease);
        assert_eq!(command, "EVALSHA");
        assert_eq!(scripting.current().name(), "scripts");
        assert_eq!(sha, Entry::Lease.sha());
        scripting.connected("node");
        assert_eq!(scripting.current(), Lua::Functions);
        scripting.fall_back("node", "still refused");
        assert_eq!(scripting.current(), Lua::Scripts);
    }
}
