//! A seeded generator for tests that replay random sequences: a failure names its seed.

/// xorshift64*.
pub struct Rng(pub u64);

impl Rng {
    /// The next number.
    #[allow(clippy::should_implement_trait)] // not an iterator: it never ends
    pub fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }

    /// The next number below `n` (not 0).
    pub fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
}
