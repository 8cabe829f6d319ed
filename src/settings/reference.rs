//! envoyproxy/ratelimit's environment variables: how their values read (Go's boolean
//! syntax), the flag-or-variable rule, and the variables accepted with no meaning here.

use std::time::Duration;

use super::{invalid, SettingsError};

/// An environment lookup (`std::env::var` in production, a map in tests).
pub(crate) type Env<'a> = &'a dyn Fn(&str) -> Option<String>;

/// Reference variables accepted and ignored: whatever their value, they change neither
/// what is limited nor where counters live here. Each set one is named once at startup
/// with [`why_ignored`].
pub(crate) const IGNORED: &[&str] = &[
    "USE_STATSD",
    "STATSD_HOST",
    "STATSD_PORT",
    "GOSTATS_FLUSH_INTERVAL_SECONDS",
    "STATS_FLUSH_INTERVAL",
    "DISABLE_STATS",
    "USE_DOG_STATSD",
    "USE_DOG_STATSD_MOGRIFIERS",
    "EXTRA_TAGS",
    "PROMETHEUS_MAPPER_YAML",
    "PROTO",
    "EXPIRATION_JITTER_MAX_SECONDS",
    "REDIS_POOL_SIZE",
    "REDIS_PIPELINE_WINDOW",
    "REDIS_PIPELINE_LIMIT",
    "REDIS_PERSECOND_URL",
    "REDIS_PERSECOND_TYPE",
    "REDIS_PERSECOND_SOCKET_TYPE",
    "REDIS_PERSECOND_AUTH",
    "REDIS_PERSECOND_TLS",
    "REDIS_PERSECOND_POOL_SIZE",
    "REDIS_PERSECOND_PIPELINE_WINDOW",
    "REDIS_PERSECOND_PIPELINE_LIMIT",
    "REDIS_HEALTH_CHECK_ACTIVE_CONNECTION",
    "MEMCACHE_HOST_PORT",
    "MEMCACHE_SRV",
    "MEMCACHE_SRV_REFRESH",
    "MEMCACHE_MAX_IDLE_CONNS",
    "MEMCACHE_TLS",
    "MEMCACHE_TLS_CLIENT_CERT",
    "MEMCACHE_TLS_CLIENT_KEY",
    "MEMCACHE_TLS_CACERT",
    "MEMCACHE_TLS_SKIP_HOSTNAME_VERIFICATION",
    "DEBUG_HOST",
    "DEBUG_PORT",
    "RUNTIME_WATCH_ROOT",
    "RUNTIME_IGNOREDOTFILES",
    "HEALTHY_WITH_AT_LEAST_ONE_CONFIG_LOADED",
];

/// Why the ignored variable `name` is harmless, for its startup log line.
pub(crate) fn why_ignored(name: &str) -> &'static str {
    match name {
        "PROMETHEUS_MAPPER_YAML" => {
            "the mapper file is not applied: Sluice's metric names are its own (it renames metrics, it changes no limit)"
        }
        "HEALTHY_WITH_AT_LEAST_ONE_CONFIG_LOADED" => {
            "Sluice is healthy only once rules are loaded, always"
        }
        "RUNTIME_WATCH_ROOT" | "RUNTIME_IGNOREDOTFILES" => {
            "Sluice always skips dotfiles, reads only *.yaml and *.yml files and watches the config directory itself"
        }
        name if name.starts_with("REDIS_PERSECOND_") => {
            "only used with REDIS_PERSECOND=true, which Sluice refuses"
        }
        name if name.starts_with("MEMCACHE_") => {
            "only used with BACKEND_TYPE=memcache, which Sluice refuses"
        }
        "USE_STATSD"
        | "STATSD_HOST"
        | "STATSD_PORT"
        | "GOSTATS_FLUSH_INTERVAL_SECONDS"
        | "STATS_FLUSH_INTERVAL"
        | "DISABLE_STATS"
        | "USE_DOG_STATSD"
        | "USE_DOG_STATSD_MOGRIFIERS"
        | "EXTRA_TAGS" => {
            "Sluice exports Prometheus metrics (the admin port's /metrics), not statsd"
        }
        _ => "no meaning in Sluice",
    }
}

/// A reference variable with values Sluice cannot honour: they would change what is
/// limited or where counters live, so `serve` refuses to start rather than pretend.
pub(crate) struct Refusal {
    /// The variable.
    pub(crate) name: &'static str,
    /// Whether a value is one Sluice honours (the harmless ones).
    accepts: fn(&str) -> bool,
    /// What the operator should do instead.
    pub(crate) advice: &'static str,
}

/// The refused variables (each value [`Refusal::accepts`] is honoured or harmless).
pub(crate) const REFUSED: &[Refusal] = &[
    Refusal {
        name: "BACKEND_TYPE",
        accepts: |value| value.is_empty() || value.eq_ignore_ascii_case("redis"),
        advice: "Sluice keeps counters in memory or in Redis (chosen by --store or REDIS_URL) and has no memcache store: unset BACKEND_TYPE or set it to redis",
    },
    Refusal {
        name: "REDIS_PERSECOND",
        accepts: |value| value.is_empty() || parse_go_bool("", value).is_ok_and(|on| !on),
        advice: "Sluice has no second Redis for per-second limits and would count them in REDIS_URL's Redis: unset REDIS_PERSECOND (and REDIS_PERSECOND_URL) to count every limit there",
    },
    Refusal {
        name: "GRPC_UDS",
        accepts: str::is_empty,
        advice: "Sluice serves gRPC on TCP only: unset GRPC_UDS and point Envoy at GRPC_HOST:GRPC_PORT (or --grpc-addr)",
    },
];

/// Fails on the first refused variable `env` sets to a value Sluice cannot honour.
pub(crate) fn refuse(env: Reference<'_>) -> Result<(), SettingsError> {
    for refusal in REFUSED {
        if let Some(value) = env.get(refusal.name) {
            if !(refusal.accepts)(value.trim()) {
                return Err(invalid(refusal.name, &value, refusal.advice));
            }
        }
    }
    Ok(())
}

/// The ignored variables that `env` sets, in [`IGNORED`] order.
pub(crate) fn ignored_set(env: Env<'_>) -> Vec<String> {
    IGNORED
        .iter()
        .filter(|name| env(name).is_some())
        .map(|name| (*name).to_owned())
        .collect()
}

/// Reads reference variables from an environment.
#[derive(Clone, Copy)]
pub(crate) struct Reference<'a> {
    env: Env<'a>,
}

impl<'a> Reference<'a> {
    /// Reads from `env`.
    pub(crate) fn new(env: Env<'a>) -> Self {
        Self { env }
    }

    /// The variable `name`, if set.
    pub(crate) fn get(&self, name: &str) -> Option<String> {
        (self.env)(name)
    }

    /// The boolean variable `name`, if set.
    pub(crate) fn bool(&self, name: &str) -> Result<Option<bool>, SettingsError> {
        self.get(name)
            .map(|value| parse_go_bool(name, &value))
            .transpose()
    }

    /// The Go duration variable `name` (`10s`, `1m30s`, `500ms`), if set.
    pub(crate) fn go_duration(&self, name: &str) -> Result<Option<Duration>, SettingsError> {
        self.get(name)
            .map(|text| {
                parse_go_duration(&text).ok_or_else(|| {
                    invalid(
                        name,
                        &text,
                        "expected a duration such as 10s, 1m30s or 500ms",
                    )
                })
            })
            .transpose()
    }

    /// A flag's value when given, else the boolean variable `name`, else false.
    pub(crate) fn pick(&self, flag: Option<bool>, name: &str) -> Result<bool, SettingsError> {
        match flag {
            Some(value) => Ok(value),
            None => Ok(self.bool(name)?.unwrap_or(false)),
        }
    }
}

/// Parses a boolean as Go's `strconv.ParseBool` does (the reference's env syntax).
fn parse_go_bool(name: &str, value: &str) -> Result<bool, SettingsError> {
    match value {
        "1" | "t" | "T" | "true" | "TRUE" | "True" => Ok(true),
        "0" | "f" | "F" | "false" | "FALSE" | "False" => Ok(false),
        other => Err(invalid(name, other, "expected true or false")),
    }
}

/// Parses Go's `time.ParseDuration` syntax for non-negative durations.
pub(crate) fn parse_go_duration(text: &str) -> Option<Duration> {
    if text == "0" {
        return Some(Duration::ZERO);
    }
    let mut rest = text;
    let mut total = 0f64;
    if rest.is_empty() {
        return None;
    }
    while !rest.is_empty() {
        let number_end = rest
            .find(|c: char| !(c.is_ascii_digit() || c == '.'))
            .unwrap_or(rest.len());
        let number: f64 = rest[..number_end].parse().ok()?;
        rest = &rest[number_end..];
        let unit_end = rest
            .find(|c: char| c.is_ascii_digit() || c == '.')
            .unwrap_or(rest.len());
        let seconds = match &rest[..unit_end] {
            "ns" => 1e-9,
            "us" | "µs" | "μs" => 1e-6,
            "ms" => 1e-3,
            "s" => 1.0,
            "m" => 60.0,
            "h" => 3600.0,
            _ => return None,
        };
        rest = &rest[unit_end..];
        total += number * seconds;
    }
    Duration::try_from_secs_f64(total).ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn go_durations() {
        let ms = Duration::from_millis;
        assert_eq!(parse_go_duration("10s"), Some(ms(10_000)));
        assert_eq!(parse_go_duration("1m30s"), Some(ms(90_000)));
        assert_eq!(parse_go_duration("1.5h"), Some(ms(5_400_000)));
        assert_eq!(parse_go_duration("250ms"), Some(ms(250)));
        assert_eq!(parse_go_duration("0"), Some(Duration::ZERO));
        for bad in ["", "10", "s", "1x", "-1s", "1s2"] {
            assert_eq!(parse_go_duration(bad), None, "{bad}");
        }
    }
}
