//! The metrics of the links to other regions (`--region`): one series per other region.

use std::sync::atomic::AtomicU64;

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;

/// Another region's label.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(crate) struct RegionLabel {
    /// Its name.
    pub(crate) region: String,
}

/// A gauge of seconds.
type Seconds = Gauge<f64, AtomicU64>;

/// The links' metrics (see `docs/src/regions.md`).
#[derive(Clone, Default)]
pub(crate) struct RegionMetrics {
    /// 1 while publications to the region succeed and its own reach this region.
    pub(crate) link_up: Family<RegionLabel, Gauge>,
    /// 1 while the region's usage is not known lately: checks take its fallback share.
    pub(crate) stale: Family<RegionLabel, Gauge>,
    /// Time since a publication to the region last succeeded.
    pub(crate) lag: Family<RegionLabel, Seconds>,
    /// Round trip of the last publication to the region.
    pub(crate) round_trip: Family<RegionLabel, Seconds>,
    /// When a publication to the region last succeeded (Unix seconds).
    pub(crate) last_sent: Family<RegionLabel, Seconds>,
    /// Keys published to the region.
    pub(crate) sent_keys: Family<RegionLabel, Counter>,
    /// Publications to the region that failed.
    pub(crate) failures: Family<RegionLabel, Counter>,
    /// Age of the region's last publication to this one.
    pub(crate) received_age: Family<RegionLabel, Seconds>,
    /// Keys in the region's last publication to this one.
    pub(crate) received_keys: Family<RegionLabel, Gauge>,
    /// Charged keys not published because too many waited.
    pub(crate) dropped_keys: Counter,
}

impl RegionMetrics {
    /// The metrics, registered in `registry`.
    pub(crate) fn register(registry: &mut Registry) -> Self {
        let metrics = Self::default();
        registry.register(
            "region_link_up",
            "1 while publications to the region succeed and its publications reach this one",
            metrics.link_up.clone(),
        );
        registry.register(
            "region_stale",
            "1 while the region's usage is not known lately (no publication from it within the stale time): checks take its fallback share",
            metrics.stale.clone(),
        );
        registry.register(
            "region_link_lag_seconds",
            "Time since a publication to the region last succeeded",
            metrics.lag.clone(),
        );
        registry.register(
            "region_link_round_trip_seconds",
            "Round trip of the last publication to the region",
            metrics.round_trip.clone(),
        );
        registry.register(
            "region_last_sent_timestamp_seconds",
            "When a publication to the region last succeeded (Unix seconds)",
            metrics.last_sent.clone(),
        );
        registry.register(
            "region_sent_keys",
            "Keys of aggregated limits published to the region",
            metrics.sent_keys.clone(),
        );
        registry.register(
            "region_publish_failures",
            "Publications to the region that failed (kept and sent again)",
            metrics.failures.clone(),
        );
        registry.register(
            "region_last_received_age_seconds",
            "Age of the region's last publication to this one",
            metrics.received_age.clone(),
        );
        registry.register(
            "region_last_received_keys",
            "Keys in the region's last publication to this one",
            metrics.received_keys.clone(),
        );
        registry.register(
            "region_dropped_keys",
            "Charged keys of aggregated limits not published because too many waited",
            metrics.dropped_keys.clone(),
        );
        metrics
    }

    /// The label of region `name`.
    pub(crate) fn label(name: &str) -> RegionLabel {
        RegionLabel {
            region: name.to_owned(),
        }
    }
}
