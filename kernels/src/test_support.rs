//! Helpers shared by the unit tests: a seeded PRNG and an element-wise
//! tolerance check. Test-only; compiled under `cfg(test)`.

/// SplitMix64: tiny, seedable and reproducible on every platform, which is
/// all test data needs, without a dependency.
pub(crate) struct Rng(u64);

impl Rng {
    pub(crate) fn new(seed: u64) -> Self {
        Self(seed)
    }

    pub(crate) fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// Uniform in `[lo, hi]`.
    pub(crate) fn uniform(&mut self, lo: f32, hi: f32) -> f32 {
        // 24 random bits give a unit value exactly representable in f32.
        let unit = (self.next_u64() >> 40) as f32 / (1u32 << 24) as f32;
        lo + (hi - lo) * unit
    }

    /// Uniform in `[lo, hi]` (inclusive), for picking shapes.
    pub(crate) fn range(&mut self, lo: usize, hi: usize) -> usize {
        lo + (self.next_u64() % (hi - lo + 1) as u64) as usize
    }

    pub(crate) fn vec(&mut self, len: usize, lo: f32, hi: f32) -> Vec<f32> {
        (0..len).map(|_| self.uniform(lo, hi)).collect()
    }
}

/// Panics, naming the first offending index, unless
/// `|actual[i] - expected[i]| <= tol[i]` for every `i` (so any NaN fails).
pub(crate) fn assert_close(actual: &[f32], expected: &[f32], tol: &[f32], context: &str) {
    assert_eq!(actual.len(), expected.len(), "length mismatch: {context}");
    assert_eq!(
        tol.len(),
        expected.len(),
        "tolerance length mismatch: {context}"
    );
    for (i, ((&got, &want), &tol)) in actual.iter().zip(expected).zip(tol).enumerate() {
        assert!(
            (got - want).abs() <= tol,
            "element {i}: got {got}, want {want} (tolerance {tol}): {context}"
        );
    }
}
