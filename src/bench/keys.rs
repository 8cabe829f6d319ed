//! What `sluice bench` sends: descriptor templates (`user={key}`) filled with keys drawn
//! from a distribution (`one`, `uniform:N`, `zipf:N:s`).

use crate::proto::common::{rate_limit_descriptor::Entry, RateLimitDescriptor};
use crate::proto::rls::RateLimitRequest;

/// Why a template or distribution could not be parsed.
#[derive(Debug, thiserror::Error)]
pub(crate) enum KeysError {
    /// A distribution other than `one`, `uniform:N`, `zipf:N:s`.
    #[error("invalid key distribution {0:?}: expected one, uniform:N or zipf:N:s (N ≥ 1, s > 0)")]
    Distribution(String),
    /// A descriptor template that is not `k=v[,k=v...]`.
    #[error("invalid descriptor template {0:?}: expected key=value[,key=value...]")]
    Template(String),
}

/// How request keys are drawn.
#[derive(Clone, Debug, PartialEq)]
pub(crate) enum Distribution {
    /// Always key `0`: one hot descriptor.
    One,
    /// Keys `0..n`, each equally likely.
    Uniform(u64),
    /// Keys `0..n`, key `k` with probability ∝ 1 / (k + 1)^s.
    Zipf(u64, f64),
}

impl std::str::FromStr for Distribution {
    type Err = KeysError;

    fn from_str(text: &str) -> Result<Self, KeysError> {
        let bad = || KeysError::Distribution(text.to_owned());
        let mut parts = text.split(':');
        let parsed = match parts.next() {
            Some("one") => Self::One,
            Some("uniform") => {
                let n: u64 = parts.next().and_then(|n| n.parse().ok()).ok_or_else(bad)?;
                Self::Uniform(n)
            }
            Some("zipf") => {
                let n: u64 = parts.next().and_then(|n| n.parse().ok()).ok_or_else(bad)?;
                let s: f64 = parts.next().and_then(|s| s.parse().ok()).ok_or_else(bad)?;
                if !(s > 0.0 && s.is_finite()) {
                    return Err(bad());
                }
                Self::Zipf(n, s)
            }
            _ => return Err(bad()),
        };
        if parts.next().is_some() || matches!(parsed, Self::Uniform(0) | Self::Zipf(0, _)) {
            return Err(bad());
        }
        Ok(parsed)
    }
}

/// One descriptor to send: entries whose values may contain `{key}`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Template {
    /// `(key, value template)` pairs in order.
    entries: Vec<(String, String)>,
}

impl std::str::FromStr for Template {
    type Err = KeysError;

    fn from_str(text: &str) -> Result<Self, KeysError> {
        let entries = text
            .split(',')
            .map(|pair| {
                pair.split_once('=')
                    .filter(|(key, _)| !key.is_empty())
                    .map(|(key, value)| (key.to_owned(), value.to_owned()))
                    .ok_or_else(|| KeysError::Template(text.to_owned()))
            })
            .collect::<Result<Vec<_>, _>>()?;
        Ok(Self { entries })
    }
}

/// Builds requests: templates, domain and hits addend fixed; the key varies.
#[derive(Clone, Debug)]
pub(crate) struct RequestMaker {
    /// Rule domain.
    domain: String,
    /// Descriptors of every request.
    templates: Vec<Template>,
    /// Request-level hits addend (0 = the server's default of 1).
    hits_addend: u32,
    /// Cumulative probabilities of a Zipf distribution (empty otherwise).
    zipf_cdf: Vec<f64>,
    /// The distribution keys come from.
    distribution: Distribution,
}

impl RequestMaker {
    /// A maker of requests to `domain` with `templates`, keys from `distribution`.
    pub(crate) fn new(
        domain: String,
        templates: Vec<Template>,
        distribution: Distribution,
        hits_addend: u32,
    ) -> Self {
        let zipf_cdf = match distribution {
            Distribution::Zipf(n, s) => {
                let mut total = 0.0;
                let mut cdf: Vec<f64> = (0..n)
                    .map(|k| {
                        total += 1.0 / ((k + 1) as f64).powf(s);
                        total
                    })
                    .collect();
                for p in &mut cdf {
                    *p /= total;
                }
                cdf
            }
            _ => Vec::new(),
        };
        Self {
            domain,
            templates,
            hits_addend,
            zipf_cdf,
            distribution,
        }
    }

    /// Draws one key with `rng`.
    pub(crate) fn key(&self, rng: &mut Rng) -> u64 {
        match self.distribution {
            Distribution::One => 0,
            Distribution::Uniform(n) => rng.below(n),
            Distribution::Zipf(n, _) => {
                let u = rng.unit();
                (self.zipf_cdf.partition_point(|p| *p < u) as u64).min(n - 1)
            }
        }
    }

    /// The request for `key`.
    pub(crate) fn request(&self, key: u64) -> RateLimitRequest {
        let key = key.to_string();
        RateLimitRequest {
            domain: self.domain.clone(),
            descriptors: self
                .templates
                .iter()
                .map(|template| RateLimitDescriptor {
                    entries: template
                        .entries
                        .iter()
                        .map(|(name, value)| Entry {
                            key: name.clone(),
                            value: value.replace("{key}", &key),
                        })
                        .collect(),
                    ..RateLimitDescriptor::default()
                })
                .collect(),
            hits_addend: self.hits_addend,
        }
    }
}

/// A small, fast PRNG (SplitMix64): key choice needs speed and repeatability, not secrecy.
#[derive(Clone, Debug)]
pub(crate) struct Rng(u64);

impl Rng {
    /// A generator seeded with `seed`.
    pub(crate) fn new(seed: u64) -> Self {
        Self(seed)
    }

    /// The next 64 random bits.
    pub(crate) fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// Uniform in `0..n` (`n ≥ 1`), by multiply-shift.
    pub(crate) fn below(&mut self, n: u64) -> u64 {
        ((u128::from(self.next_u64()) * u128::from(n)) >> 64) as u64
    }

    /// Uniform in `[0, 1)`.
    pub(crate) fn unit(&mut self) -> f64 {
        (self.next_u64() >> 11) as f64 / (1u64 << 53) as f64
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_distributions() {
        assert_eq!("one".parse::<Distribution>().ok(), Some(Distribution::One));
        assert_eq!(
            "uniform:100000".parse::<Distribution>().ok(),
            Some(Distribution::Uniform(100_000))
        );
        assert_eq!(
            "zipf:10:1.1".parse::<Distribution>().ok(),
            Some(Distribution::Zipf(10, 1.1))
        );
        for bad in [
            "",
            "uniform",
            "uniform:0",
            "zipf:10",
            "zipf:10:-1",
            "one:2",
            "x",
        ] {
            assert!(bad.parse::<Distribution>().is_err(), "{bad}");
        }
    }

    #[test]
    fn fills_templates() {
        let maker = RequestMaker::new(
            "bench".into(),
            vec!["user={key},path=/x".parse().expect("template")],
            Distribution::Uniform(10),
            3,
        );
        let request = maker.request(7);
        assert_eq!(request.domain, "bench");
        assert_eq!(request.hits_addend, 3);
        let entries = &request.descriptors[0].entries;
        assert_eq!(
            (entries[0].key.as_str(), entries[0].value.as_str()),
            ("user", "7")
        );
        assert_eq!(
            (entries[1].key.as_str(), entries[1].value.as_str()),
            ("path", "/x")
        );
        assert!("=v".parse::<Template>().is_err());
        assert!("novalue".parse::<Template>().is_err());
    }

    #[test]
    fn zipf_favours_low_keys_and_stays_in_range() {
        let maker = RequestMaker::new("d".into(), vec![], Distribution::Zipf(1000, 1.2), 0);
        let mut rng = Rng::new(1);
        let mut low = 0;
        for _ in 0..10_000 {
            let key = maker.key(&mut rng);
            assert!(key < 1000);
            if key < 10 {
                low += 1;
            }
        }
        assert!(low > 5_000, "{low}");
    }
}
