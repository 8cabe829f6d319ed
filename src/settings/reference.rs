//! envoyproxy/ratelimit's environment variables: how their values read (Go's boolean
//! syntax), the flag-or-variable rule, and the variables accepted with no meaning here.

use std::time::Duration;

use super::{invalid, SettingsError};

/// An environment lookup (`std::env::var` in production, a map in tests).
pub(crate) type Env<'a> = &'a dyn Fn(&str) -> Option<String>;

/// Reference variables accepted and ignored (no meaning for Sluice).
pub(crate) const IGNORED: &[&str] = &[
    "USE_STATSD",
    "STATSD_HOST",
    "STATSD_PORT",
    "GOSTATS_FLUSH_INTERVAL_SECONDS",
    "EXTRA_TAGS",
    "BACKEND_TYPE",
    "CACHE_KEY_PREFIX",
    "LOCAL_CACHE_SIZE_IN_BYTES",
    "EXPIRATION_JITTER_MAX_SECONDS",
    "REDIS_POOL_SIZE",
    "REDIS_PIPELINE_WINDOW",
    "REDIS_PIPELINE_LIMIT",
    "REDIS_PERSECOND",
    "REDIS_PERSECOND_URL",
    "REDIS_PERSECOND_TYPE",
    "REDIS_PERSECOND_AUTH",
    "REDIS_PERSECOND_TLS",
    "REDIS_PERSECOND_POOL_SIZE",
    "REDIS_HEALTH_CHECK_ACTIVE_CONNECTION",
    "MEMCACHE_HOST_PORT",
    "MEMCACHE_SRV",
    "DEBUG_HOST",
    "DEBUG_PORT",
    "RUNTIME_WATCH_ROOT",
    "RUNTIME_IGNOREDOTFILES",
    "USE_PROMETHEUS",
    "PROMETHEUS_ADDR",
    "PROMETHEUS_PATH",
    "TRACING_ENABLED",
    "HEALTHY_WITH_AT_LEAST_ONE_CONFIG_LOADED",
];

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
    pub fn go_duration(&self, name: &str) -> Result<Option<Duration>, SettingsError> {
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
pub(crate) fn parse_go_bool(name: &str, value: &str) -> Result<bool, SettingsError> {
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
