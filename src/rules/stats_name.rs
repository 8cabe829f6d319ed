//! The reference's statistic names: a stats key as envoyproxy/ratelimit names the
//! counters it makes for it (`SanitizeStatName`), so that the `rule` metric label maps
//! one to one onto its statistics.

use std::borrow::Cow;

/// `key` as the reference names its statistics: `:` and `|` become `_`, and so do the
/// dots of every IPv4 address in it (`10.1.2.3` → `10_1_2_3`). Borrowed when nothing
/// changes, as for nearly every key.
pub(crate) fn stats_name(key: &str) -> Cow<'_, str> {
    let bytes = key.as_bytes();
    let mut out: Option<Vec<u8>> = None;
    let mut start = 0;
    while start < bytes.len() {
        if let Some(end) = ipv4_at(bytes, start) {
            let out = out.get_or_insert_with(|| bytes.to_vec());
            for byte in &mut out[start..end] {
                if *byte == b'.' {
                    *byte = b'_';
                }
            }
            start = end;
            continue;
        }
        if matches!(bytes[start], b':' | b'|') {
            out.get_or_insert_with(|| bytes.to_vec())[start] = b'_';
        }
        start += 1;
    }
    match out {
        // Only ASCII bytes were replaced by ASCII bytes: still UTF-8.
        Some(out) => Cow::Owned(String::from_utf8(out).unwrap_or_else(|_| key.to_owned())),
        None => Cow::Borrowed(key),
    }
}

/// The end of the IPv4 address (four runs of 1 to 3 digits joined by dots, the
/// reference's `\d{1,3}\.\d{1,3}\.\d{1,3}\.\d{1,3}`, leftmost and greedy) that starts
/// at `start`, if one does.
fn ipv4_at(bytes: &[u8], start: usize) -> Option<usize> {
    let mut at = start;
    for group in 0..4 {
        let digits = bytes[at..]
            .iter()
            .take(3)
            .take_while(|byte| byte.is_ascii_digit())
            .count();
        if digits == 0 {
            return None;
        }
        at += digits;
        if group < 3 {
            if bytes.get(at) != Some(&b'.') {
                return None;
            }
            at += 1;
        }
    }
    Some(at)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_as_the_reference_does() {
        for (key, name) in [
            ("d.key_value", "d.key_value"),
            ("d.ip_10.1.2.3", "d.ip_10_1_2_3"),
            ("d.ip_a:b|c", "d.ip_a_b_c"),
            ("d.ip_1234.5.6.7.8", "d.ip_1234_5_6_7.8"),
            ("d.v_1.2.3", "d.v_1.2.3"),
            ("d.h_10.0.0.1:8080", "d.h_10_0_0_1_8080"),
            ("d.é_1.2.3.4", "d.é_1_2_3_4"),
            ("", ""),
        ] {
            assert_eq!(stats_name(key), name, "{key}");
        }
        assert!(matches!(stats_name("d.plain_key"), Cow::Borrowed(_)));
    }
}
