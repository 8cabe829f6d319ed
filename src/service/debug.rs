//! The debug reports behind `serve --debug-endpoints`: which keys shadow rules would
//! have refused (`/debug/shadow`), and which keys are hot (`/debug/hotkeys`).
//!
//! Both show descriptor values, so they exist only when enabled, and both are bounded
//! sketches ([`TopK`]), never metric labels: at most [`MAX_SHADOW_RULES`] rules ×
//! [`SHADOW_KEYS_PER_RULE`] keys, and [`HOT_KEYS`] hot keys. Recording is off the common
//! path: a shadow refusal takes one lock; hot keys sample one descriptor in
//! [`HOT_SAMPLE`].

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant, SystemTime};

use super::sketch::{TopEntry, TopK};
use crate::limiter::{CheckRequest, Verdict};
use crate::store::CounterKey;

/// Most shadow rules tracked; refusals of further rules are only counted.
pub(crate) const MAX_SHADOW_RULES: usize = 256;
/// Keys kept per shadow rule.
pub(crate) const SHADOW_KEYS_PER_RULE: usize = 20;
/// Hot keys kept.
pub(crate) const HOT_KEYS: usize = 64;
/// One descriptor in this many is counted for hot keys.
pub(crate) const HOT_SAMPLE: u64 = 8;
/// Hot-key rates are measured over windows this long.
pub(crate) const HOT_WINDOW: Duration = Duration::from_secs(10);
/// Longest key label kept (descriptor values can be long).
const MAX_LABEL: usize = 256;

/// Why a refusal was only reported.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub(crate) enum ShadowCause {
    /// The rule has `shadow_mode: true`.
    Rule,
    /// Global `SHADOW_MODE` turned the answer into OK.
    Global,
}

/// One shadow rule's would-be refusals.
#[derive(Debug)]
struct ShadowRule {
    domain: Arc<str>,
    cause: ShadowCause,
    keys: TopK,
}

/// Hot-key windows.
#[derive(Debug)]
struct HotWindows {
    /// The window being filled.
    current: TopK,
    /// When `current` began.
    started: Instant,
    /// The last complete window, if any, and its length.
    previous: Option<(Vec<TopEntry>, Duration)>,
}

/// The debug reports, shared by the service (which records) and the admin port.
#[derive(Debug)]
pub(crate) struct DebugReports {
    /// Shadow rule → its top refused keys.
    shadow: Mutex<HashMap<Arc<str>, ShadowRule>>,
    /// Refusals of rules beyond [`MAX_SHADOW_RULES`].
    shadow_dropped: AtomicU64,
    /// Sampling counter for hot keys.
    hot_ticks: AtomicU64,
    /// Hot-key windows.
    hot: Mutex<HotWindows>,
}

// === impl DebugReports ===

impl DebugReports {
    /// Empty reports.
    pub(crate) fn new() -> Self {
        Self {
            shadow: Mutex::new(HashMap::new()),
            shadow_dropped: AtomicU64::new(0),
            hot_ticks: AtomicU64::new(0),
            hot: Mutex::new(HotWindows {
                current: TopK::new(HOT_KEYS),
                started: Instant::now(),
                previous: None,
            }),
        }
    }

    /// Records one decided request: refusals that shadow mode let through, and a sample
    /// of keys for the hot-key report.
    pub(crate) fn observe(
        &self,
        request: &CheckRequest<'_>,
        verdicts: &[Verdict<'_>],
        global_shadow: bool,
    ) {
        for (descriptor, verdict) in request.descriptors.iter().zip(verdicts) {
            let Verdict::Limited(limited) = verdict else {
                continue;
            };
            let hits = descriptor.hits_addend.unwrap_or(request.hits_addend.max(1));
            // The descriptor's identity: its limits' windows apart, one key of the report.
            let id = || CounterKey::new(request.domain, &descriptor.entries, &[], []).0;
            let label = || describe(request.domain, descriptor);
            if self.hot_ticks.fetch_add(1, Ordering::Relaxed) % HOT_SAMPLE == 0 {
                self.record_hot(id(), hits, label);
            }
            if limited.decision.allowed {
                continue;
            }
            let cause = if limited.rule.shadow_mode {
                ShadowCause::Rule
            } else if global_shadow && limited.over_limit {
                ShadowCause::Global
            } else {
                continue;
            };
            let mut shadow = lock(&self.shadow);
            let rules = shadow.len();
            let rule = match shadow.get_mut(&limited.rule.stats_key) {
                Some(rule) => rule,
                None if rules >= MAX_SHADOW_RULES => {
                    self.shadow_dropped.fetch_add(hits, Ordering::Relaxed);
                    continue;
                }
                None => shadow
                    .entry(limited.rule.stats_key.clone())
                    .or_insert_with(|| ShadowRule {
                        domain: limited.rule.domain.clone(),
                        cause,
                        keys: TopK::new(SHADOW_KEYS_PER_RULE),
                    }),
            };
            rule.keys.record(id(), hits, wall_now(), label);
        }
    }

    fn record_hot(&self, id: u128, hits: u64, label: impl FnOnce() -> String) {
        let mut hot = lock(&self.hot);
        roll(&mut hot);
        hot.current.record(id, hits, wall_now(), label);
    }

    /// `/debug/shadow` as JSON: per shadow rule, its top refused keys.
    pub(crate) fn shadow_json(&self) -> serde_json::Value {
        let shadow = lock(&self.shadow);
        let mut rules: Vec<_> = shadow.iter().collect();
        rules.sort_by(|a, b| b.1.keys.total().cmp(&a.1.keys.total()).then(a.0.cmp(b.0)));
        let rules: Vec<_> = rules
            .into_iter()
            .map(|(name, rule)| {
                serde_json::json!({
                    "rule": &**name,
                    "domain": &*rule.domain,
                    "cause": rule.cause,
                    "would_refuse_hits": rule.keys.total(),
                    "top_keys": rule.keys.top().iter().map(entry_json).collect::<Vec<_>>(),
                })
            })
            .collect();
        serde_json::json!({
            "max_rules": MAX_SHADOW_RULES,
            "keys_per_rule": SHADOW_KEYS_PER_RULE,
            "dropped_hits": self.shadow_dropped.load(Ordering::Relaxed),
            "rules": rules,
        })
    }

    /// `/debug/hotkeys` as JSON: the top keys by estimated rate.
    pub(crate) fn hotkeys_json(&self) -> serde_json::Value {
        let mut hot = lock(&self.hot);
        roll(&mut hot);
        let window = |entries: &[TopEntry], length: Duration| {
            let seconds = length.as_secs_f64().max(0.001);
            entries
                .iter()
                .map(|entry| {
                    let mut json = entry_json(entry);
                    json["estimated_per_second"] =
                        ((entry.count * HOT_SAMPLE) as f64 / seconds).into();
                    json
                })
                .collect::<Vec<_>>()
        };
        let current = window(&hot.current.top(), hot.started.elapsed());
        let previous = hot
            .previous
            .as_ref()
            .map(|(entries, length)| window(entries, *length));
        serde_json::json!({
            "sample_one_in": HOT_SAMPLE,
            "window_seconds": HOT_WINDOW.as_secs(),
            "previous_window": previous,
            "current_window": current,
        })
    }
}

impl Default for DebugReports {
    fn default() -> Self {
        Self::new()
    }
}

/// Starts a new hot-key window when the current one is complete.
fn roll(hot: &mut MutexGuard<'_, HotWindows>) {
    let elapsed = hot.started.elapsed();
    if elapsed < HOT_WINDOW {
        return;
    }
    let done = std::mem::replace(&mut hot.current, TopK::new(HOT_KEYS));
    hot.previous = Some((done.top(), elapsed));
    hot.started = Instant::now();
}

fn entry_json(entry: &TopEntry) -> serde_json::Value {
    serde_json::json!({
        "key": entry.label,
        "count": entry.count,
        "count_error": entry.error,
        "first_seen": humantime::format_rfc3339_millis(entry.first_seen).to_string(),
        "last_seen": humantime::format_rfc3339_millis(entry.last_seen).to_string(),
    })
}

/// `domain: k=v, k2=v2`, truncated to [`MAX_LABEL`] bytes.
fn describe(domain: &str, descriptor: &crate::limiter::Descriptor<'_>) -> String {
    let mut label = format!("{domain}:");
    for (i, entry) in descriptor.entries.iter().enumerate() {
        label.push_str(if i == 0 { " " } else { ", " });
        label.push_str(entry.key);
        label.push('=');
        label.push_str(entry.value);
        if label.len() > MAX_LABEL {
            break;
        }
    }
    if label.len() > MAX_LABEL {
        let mut end = MAX_LABEL;
        while !label.is_char_boundary(end) {
            end -= 1;
        }
        label.truncate(end);
        label.push('…');
    }
    label
}

fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// Wall-clock time for report timestamps (never for decisions).
#[allow(clippy::disallowed_methods)]
fn wall_now() -> SystemTime {
    SystemTime::now()
}
