//! How requests are answered and logged: response shaping (headers, shadow and quota
//! modes, dynamic metadata), the limiter's request semantics, and the log format and
//! level; each flag, or the reference variable that maps to it.

use super::cli::ServeArgs;
use super::reference::Reference;
use super::{invalid, SettingsError};
use crate::limiter::LimiterSettings;
use crate::service::{HeaderMode, ResponseOptions};
use crate::telemetry::LogFormat;

/// The log format and filter.
pub(crate) fn logging(
    args: &ServeArgs,
    env: Reference<'_>,
) -> Result<(LogFormat, String), SettingsError> {
    let format = match args.log_format {
        Some(format) => format,
        None => match env
            .get("LOG_FORMAT")
            .as_deref()
            .map(str::to_ascii_lowercase)
            .as_deref()
        {
            None | Some("") | Some("text") => LogFormat::Text,
            Some("json") => LogFormat::Json,
            Some(other) => return Err(invalid("LOG_FORMAT", other, "expected text or json")),
        },
    };
    let level = args
        .log_level
        .clone()
        .or_else(|| env.get("LOG_LEVEL").map(|level| level.to_ascii_lowercase()))
        .unwrap_or_else(|| "info".into());
    Ok((format, level))
}

/// Response shaping.
pub(crate) fn response(
    args: &ServeArgs,
    env: Reference<'_>,
) -> Result<ResponseOptions, SettingsError> {
    let header_mode = match args.response_headers {
        Some(mode) => mode,
        None if env.bool("LIMIT_RESPONSE_HEADERS_ENABLED")?.unwrap_or(false) => {
            HeaderMode::Reference
        }
        None => HeaderMode::None,
    };
    let defaults = ResponseOptions::default();
    Ok(ResponseOptions {
        global_shadow_mode: env.pick(args.shadow_mode, "SHADOW_MODE")?,
        global_quota_mode: env.pick(args.quota_mode, "QUOTA_MODE")?,
        header_mode,
        limit_header: env
            .get("LIMIT_LIMIT_HEADER")
            .unwrap_or(defaults.limit_header),
        remaining_header: env
            .get("LIMIT_REMAINING_HEADER")
            .unwrap_or(defaults.remaining_header),
        reset_header: env
            .get("LIMIT_RESET_HEADER")
            .unwrap_or(defaults.reset_header),
        dynamic_metadata: env.pick(args.dynamic_metadata, "RESPONSE_DYNAMIC_METADATA")?,
    })
}

/// The limiter's request semantics.
pub(crate) fn limiter(
    args: &ServeArgs,
    env: Reference<'_>,
) -> Result<LimiterSettings, SettingsError> {
    Ok(LimiterSettings {
        near_limit_ratio: near_limit_ratio(args, env)?,
        stop_increment_when_over_limit: env.pick(
            args.stop_increment_when_over_limit,
            "STOP_CACHE_KEY_INCREMENT_WHEN_OVERLIMIT",
        )?,
        report_local_cache: env
            .get("LOCAL_CACHE_SIZE_IN_BYTES")
            .is_some_and(|size| size.trim().parse::<u64>().is_ok_and(|n| n > 0)),
        replicas: args.replicas.max(1),
    })
}

/// The near-limit threshold, a fraction of the limit.
fn near_limit_ratio(args: &ServeArgs, env: Reference<'_>) -> Result<f32, SettingsError> {
    let ratio = match args.near_limit_ratio {
        Some(ratio) => ratio,
        None => match env.get("NEAR_LIMIT_RATIO") {
            Some(text) => text
                .parse()
                .map_err(|_| invalid("NEAR_LIMIT_RATIO", &text, "expected a number"))?,
            None => 0.8,
        },
    };
    if !(0.0..=1.0).contains(&ratio) {
        return Err(invalid(
            "near-limit-ratio",
            &ratio.to_string(),
            "expected a fraction between 0 and 1",
        ));
    }
    Ok(ratio)
}
