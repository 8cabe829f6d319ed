//! The memory store holds a token-bucket key in at most 128 bytes (DESIGN §5): one
//! million keys, resident set growth divided by keys held. Alone in its binary (it takes
//! [`crate::alone`]), as RSS is process-wide.

#[test]
fn token_bucket_key_costs_at_most_128_bytes() {
    let _alone = crate::alone();
    let report = sluice::bench::memory::measure(1_000_000).expect("/proc/self/status readable");
    println!("{report:?}");
    assert_eq!(report.held, 1_000_000, "the probe must not evict");
    assert!(
        report.bytes_per_key <= 128.0,
        "{:.1} bytes per key",
        report.bytes_per_key
    );
}
