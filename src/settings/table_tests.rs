//! The migration table (`docs/src/migrating.md`) and the code agree: every variable of
//! envoyproxy/ratelimit's `settings.go` is in it, and each row's status is the one the
//! code gives its variable (ignored: in [`IGNORED`]; refused: in [`REFUSED`]; honoured:
//! read by a module of `src/settings/`), one status per variable.

use std::collections::{BTreeMap, BTreeSet};

use super::reference::{IGNORED, REFUSED};

/// Every `envconfig` name of envoyproxy/ratelimit's `src/settings/settings.go`.
const SETTINGS_GO: &[&str] = &[
    "PROTO",
    "HOST",
    "PORT",
    "DEBUG_HOST",
    "DEBUG_PORT",
    "GRPC_UDS",
    "GRPC_HOST",
    "GRPC_PORT",
    "GRPC_MAX_CONNECTION_AGE",
    "GRPC_MAX_CONNECTION_AGE_GRACE",
    "GRPC_SERVER_USE_TLS",
    "GRPC_SERVER_TLS_CERT",
    "GRPC_SERVER_TLS_KEY",
    "GRPC_CLIENT_TLS_CACERT",
    "GRPC_CLIENT_TLS_SAN",
    "LOG_LEVEL",
    "LOG_FORMAT",
    "CONFIG_TYPE",
    "FORCE_START_WITHOUT_INITIAL_CONFIG",
    "CONFIG_GRPC_XDS_NODE_ID",
    "CONFIG_GRPC_XDS_NODE_METADATA",
    "CONFIG_GRPC_XDS_SERVER_URL",
    "CONFIG_GRPC_XDS_SERVER_CONNECT_RETRY_INTERVAL",
    "CONFIG_GRPC_XDS_CLIENT_ADDITIONAL_HEADERS",
    "CONFIG_GRPC_XDS_SERVER_USE_TLS",
    "CONFIG_GRPC_XDS_CLIENT_TLS_CERT",
    "CONFIG_GRPC_XDS_CLIENT_TLS_KEY",
    "CONFIG_GRPC_XDS_SERVER_TLS_CACERT",
    "CONFIG_GRPC_XDS_SERVER_TLS_SAN",
    "XDS_CLIENT_BACKOFF_INITIAL_INTERVAL",
    "XDS_CLIENT_BACKOFF_MAX_INTERVAL",
    "XDS_CLIENT_BACKOFF_RANDOM_FACTOR",
    "XDS_CLIENT_BACKOFF_JITTER",
    "USE_DOG_STATSD",
    "USE_DOG_STATSD_MOGRIFIERS",
    "USE_STATSD",
    "STATSD_HOST",
    "STATSD_PORT",
    "EXTRA_TAGS",
    "STATS_FLUSH_INTERVAL",
    "DISABLE_STATS",
    "USE_PROMETHEUS",
    "PROMETHEUS_ADDR",
    "PROMETHEUS_PATH",
    "PROMETHEUS_MAPPER_YAML",
    "RUNTIME_ROOT",
    "RUNTIME_SUBDIRECTORY",
    "RUNTIME_APPDIRECTORY",
    "RUNTIME_IGNOREDOTFILES",
    "RUNTIME_WATCH_ROOT",
    "EXPIRATION_JITTER_MAX_SECONDS",
    "LOCAL_CACHE_SIZE_IN_BYTES",
    "NEAR_LIMIT_RATIO",
    "CACHE_KEY_PREFIX",
    "BACKEND_TYPE",
    "STOP_CACHE_KEY_INCREMENT_WHEN_OVERLIMIT",
    "LIMIT_RESPONSE_HEADERS_ENABLED",
    "LIMIT_LIMIT_HEADER",
    "LIMIT_REMAINING_HEADER",
    "LIMIT_RESET_HEADER",
    "HEALTHY_WITH_AT_LEAST_ONE_CONFIG_LOADED",
    "REDIS_SOCKET_TYPE",
    "REDIS_TYPE",
    "REDIS_URL",
    "REDIS_POOL_SIZE",
    "REDIS_AUTH",
    "REDIS_TLS",
    "REDIS_TLS_CLIENT_CERT",
    "REDIS_TLS_CLIENT_KEY",
    "REDIS_TLS_CACERT",
    "REDIS_TLS_SKIP_HOSTNAME_VERIFICATION",
    "REDIS_PIPELINE_WINDOW",
    "REDIS_PIPELINE_LIMIT",
    "REDIS_PERSECOND",
    "REDIS_PERSECOND_SOCKET_TYPE",
    "REDIS_PERSECOND_TYPE",
    "REDIS_PERSECOND_URL",
    "REDIS_PERSECOND_POOL_SIZE",
    "REDIS_PERSECOND_AUTH",
    "REDIS_PERSECOND_TLS",
    "REDIS_PERSECOND_PIPELINE_WINDOW",
    "REDIS_PERSECOND_PIPELINE_LIMIT",
    "REDIS_HEALTH_CHECK_ACTIVE_CONNECTION",
    "MEMCACHE_HOST_PORT",
    "MEMCACHE_MAX_IDLE_CONNS",
    "MEMCACHE_SRV",
    "MEMCACHE_SRV_REFRESH",
    "MEMCACHE_TLS",
    "MEMCACHE_TLS_CLIENT_CERT",
    "MEMCACHE_TLS_CLIENT_KEY",
    "MEMCACHE_TLS_CACERT",
    "MEMCACHE_TLS_SKIP_HOSTNAME_VERIFICATION",
    "SHADOW_MODE",
    "MERGE_DOMAIN_CONFIG",
    "TRACING_ENABLED",
    "TRACING_SERVICE_NAME",
    "TRACING_SERVICE_NAMESPACE",
    "TRACING_SERVICE_INSTANCE_ID",
    "TRACING_EXPORTER_PROTOCOL",
    "TRACING_SAMPLING_RATE",
];

/// The migration page.
const MIGRATING: &str = include_str!("../../docs/src/migrating.md");

/// Variable → status word (`honoured`, `refused`, `ignored`) of the table's rows.
fn table() -> BTreeMap<String, String> {
    let start = MIGRATING
        .find("<!-- check-docs: reference-env -->")
        .expect("the table's opening marker");
    let end = MIGRATING[start..]
        .find("<!-- /check-docs -->")
        .expect("the table's closing marker");
    let mut rows = BTreeMap::new();
    for line in MIGRATING[start..start + end].lines().skip(3) {
        let cells: Vec<&str> = line.trim_matches('|').split('|').map(str::trim).collect();
        let (Some(name), Some(status)) = (cells.first(), cells.get(1)) else {
            continue;
        };
        let name = name.trim_matches('`').to_owned();
        let status = status
            .split([';', ' '])
            .next()
            .unwrap_or_default()
            .to_owned();
        assert!(
            rows.insert(name.clone(), status).is_none(),
            "migrating.md: {name} has two rows"
        );
    }
    rows
}

/// The reference variable names the modules of `src/settings/` read: each upper-case
/// string literal passed as an argument (`env.get("REDIS_URL")`, `pick(x, "NAME")`),
/// outside the [`IGNORED`] and [`REFUSED`] lists and the tests; clap's own `SLUICE_*`
/// variables are not the reference's.
fn read_by_code() -> BTreeSet<String> {
    let dir = concat!(env!("CARGO_MANIFEST_DIR"), "/src/settings");
    let mut names = BTreeSet::new();
    for entry in std::fs::read_dir(dir).expect("src/settings/") {
        let path = entry.expect("a directory entry").path();
        let file = path
            .file_name()
            .and_then(|n| n.to_str())
            .unwrap_or_default();
        if !file.ends_with(".rs") || file.contains("tests") {
            continue;
        }
        let mut source = std::fs::read_to_string(&path).expect("a source file");
        for list in ["pub(crate) const IGNORED", "pub(crate) const REFUSED"] {
            if let Some(at) = source.find(list) {
                let end = at + source[at..].find("];").expect("the list's end");
                source.replace_range(at..end, "");
            }
        }
        let mut rest = source.as_str();
        while let Some(open) = rest.find('"') {
            let before = rest[..open].trim_end();
            let Some(close) = rest[open + 1..].find('"') else {
                break;
            };
            let literal = &rest[open + 1..open + 1 + close];
            let argument = before.ends_with('(') || before.ends_with(',');
            // A prefix (`starts_with("MEMCACHE_")`) is no name.
            let name_like = literal.starts_with(|c: char| c.is_ascii_uppercase())
                && !literal.ends_with('_')
                && literal
                    .chars()
                    .all(|c| c.is_ascii_uppercase() || c.is_ascii_digit() || c == '_');
            if argument && name_like && !literal.starts_with("SLUICE_") {
                names.insert(literal.to_owned());
            }
            rest = &rest[open + close + 2..];
        }
    }
    names
}

#[test]
fn migration_table_lists_every_reference_variable_with_the_codes_status() {
    let table = table();
    let ignored: BTreeSet<String> = IGNORED.iter().map(|n| (*n).to_owned()).collect();
    let refused: BTreeSet<String> = REFUSED.iter().map(|r| r.name.to_owned()).collect();
    let read = read_by_code();
    let mut problems = Vec::new();
    for name in SETTINGS_GO {
        if !table.contains_key(*name) {
            problems.push(format!("{name} (settings.go) is not in the table"));
        }
    }
    for name in read.intersection(&ignored) {
        problems.push(format!("{name} is both read and in IGNORED"));
    }
    for name in read
        .intersection(&refused)
        .chain(ignored.intersection(&refused))
    {
        problems.push(format!("{name} is refused and also read or ignored"));
    }
    let known: BTreeSet<&String> = read.iter().chain(&ignored).chain(&refused).collect();
    for name in &known {
        if !table.contains_key(name.as_str()) {
            problems.push(format!(
                "{name} (known to src/settings/) is not in the table"
            ));
        }
    }
    for (name, status) in &table {
        let expected = if ignored.contains(name) {
            "ignored"
        } else if refused.contains(name) {
            "refused"
        } else if read.contains(name) {
            "honoured"
        } else {
            problems.push(format!(
                "{name} is in the table, but the code does not know it"
            ));
            continue;
        };
        if status != expected {
            problems.push(format!(
                "{name}: the table says {status}, the code {expected}"
            ));
        }
    }
    assert!(
        problems.is_empty(),
        "docs/src/migrating.md and src/settings/ disagree:\n{}",
        problems.join("\n")
    );
}
