//! Several regions: `--region`, `--peer-region`, `--region-sync-interval` and
//! `--region-stale-after` → [`RegionSettings`]. A peer region's store is the local one
//! (kind, TLS, auth, timeouts, batching, key prefix) at another URL.

use std::sync::Arc;
use std::time::Duration;

use super::cli::ServeArgs;
use super::{invalid, SettingsError, StoreKind};
use crate::regions::{RegionError, RegionPlan};
use crate::store::redis::{mask_url, RedisOptions};

/// Default of `--region-sync-interval`.
const DEFAULT_SYNC_INTERVAL: Duration = Duration::from_secs(1);

/// Shortest `--region-sync-interval`.
const MIN_SYNC_INTERVAL: Duration = Duration::from_millis(10);

/// Longest `--region-sync-interval`.
const MAX_SYNC_INTERVAL: Duration = Duration::from_secs(60);

/// Default of `--region-stale-after`, in sync intervals.
const STALE_AFTER_INTERVALS: u32 = 3;

/// Longest `--region-stale-after`.
const MAX_STALE_AFTER: Duration = Duration::from_secs(600);

/// What an instance in several regions needs.
#[derive(Clone, Debug)]
pub struct RegionSettings {
    /// Every region, this instance's among them.
    pub plan: Arc<RegionPlan>,
    /// Every peer region: its name and how to reach its store (in the plan's order).
    pub peers: Vec<(Arc<str>, RedisOptions)>,
    /// How often usage is published to the other regions.
    pub sync_interval: Duration,
    /// A peer region whose last delta is older than this uses its fallback share.
    pub stale_after: Duration,
}

/// The region settings (`None` without `--region`), for the store `store` reached with
/// `local`.
pub(crate) fn regions(
    args: &ServeArgs,
    store: StoreKind,
    local: &RedisOptions,
) -> Result<Option<RegionSettings>, SettingsError> {
    let region = args
        .region
        .as_deref()
        .map(str::trim)
        .filter(|region| !region.is_empty());
    let peers = peer_entries(args)?;
    let Some(region) = region else {
        return match flag_without_region(args, &peers) {
            Some(flag) => Err(invalid(flag, "", "needs --region (this instance's region)")),
            None => Ok(None),
        };
    };
    if store == StoreKind::Memory {
        return Err(invalid(
            "--region",
            region,
            "regions share counters through Redis: --region needs --store redis, redis-cluster or redis-sentinel",
        ));
    }
    let plan = RegionPlan::new(region, peers.iter().map(|(name, _)| *name))
        .map_err(|error| plan_error(region, &error))?;
    let (sync_interval, stale_after) = intervals(args)?;
    // In the plan's order; the local region is the one name no peer entry has.
    let peers = plan
        .names()
        .iter()
        .filter_map(|name| {
            let (_, url) = peers.iter().find(|(peer, _)| *peer == &**name)?;
            let options = RedisOptions {
                url: (*url).to_owned(),
                ..local.clone()
            };
            Some((name.clone(), options))
        })
        .collect();
    Ok(Some(RegionSettings {
        plan: Arc::new(plan),
        peers,
        sync_interval,
        stale_after,
    }))
}

/// The `--peer-region` entries as (name, URL), empty entries (a trailing `;`) skipped.
fn peer_entries(args: &ServeArgs) -> Result<Vec<(&str, &str)>, SettingsError> {
    let mut entries = Vec::new();
    for entry in args.peer_regions.iter().map(|entry| entry.trim()) {
        if entry.is_empty() {
            continue;
        }
        let Some((name, url)) = entry.split_once('=') else {
            return Err(invalid(
                "--peer-region",
                &mask_url(entry),
                "expected NAME=URL (a peer region and its Redis URL)",
            ));
        };
        let (name, url) = (name.trim(), url.trim());
        if url.is_empty() {
            return Err(invalid(
                "--peer-region",
                entry,
                "the peer region has no Redis URL (expected NAME=URL)",
            ));
        }
        entries.push((name, url));
    }
    Ok(entries)
}

/// The first region flag given without `--region`, if any.
fn flag_without_region(args: &ServeArgs, peers: &[(&str, &str)]) -> Option<&'static str> {
    if !peers.is_empty() {
        Some("--peer-region")
    } else if args.region_sync_interval.is_some() {
        Some("--region-sync-interval")
    } else if args.region_stale_after.is_some() {
        Some("--region-stale-after")
    } else {
        None
    }
}

/// A region list [`RegionPlan::new`] refused, named by the flag it came from.
fn plan_error(region: &str, error: &RegionError) -> SettingsError {
    let flag = match error {
        RegionError::BadName(name) if name == region => "--region",
        _ => "--peer-region",
    };
    invalid(flag, "", &error.to_string())
}

/// The sync interval and the stale age, checked against each other and their bounds.
fn intervals(args: &ServeArgs) -> Result<(Duration, Duration), SettingsError> {
    let sync = args.region_sync_interval.unwrap_or(DEFAULT_SYNC_INTERVAL);
    if !(MIN_SYNC_INTERVAL..=MAX_SYNC_INTERVAL).contains(&sync) {
        return Err(invalid(
            "--region-sync-interval",
            &humantime::format_duration(sync).to_string(),
            "must be 10ms to 60s",
        ));
    }
    let stale = args
        .region_stale_after
        .unwrap_or(sync * STALE_AFTER_INTERVALS);
    if stale <= sync || stale > MAX_STALE_AFTER {
        return Err(invalid(
            "--region-stale-after",
            &humantime::format_duration(stale).to_string(),
            &format!(
                "must be longer than --region-sync-interval ({}) and at most 10m",
                humantime::format_duration(sync)
            ),
        ));
    }
    Ok((sync, stale))
}
