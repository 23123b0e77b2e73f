//! The block policy and cost model of the FFT convolution.
//!
//! Overlap-save with real FFTs of length `M` computes `M - L + 1` outputs per
//! block, where `L = dilation * (kernel_size - 1) + 1` is the filter's span.
//! A block costs a forward and an inverse transform (about
//! `2.5 * M * log2 M` flops each, half a complex FFT of the same length),
//! a pointwise product over `M / 2 + 1` bins, and the copy of the input
//! segment in and of the outputs out. Short blocks waste most of each
//! transform on the `L - 1` overlapping samples; long ones pay `log2 M` per
//! sample and spill out of cache. [`choose`] prices every fast length
//! between the two extremes at the prepared (maximum) shape and keeps the
//! cheapest; the longest candidate is the single padded FFT, one block per
//! row, which wins when `L` is close to the output length.
//!
//! Prepared memory is `M / 2 + 1` complex `f32` per channel, that is
//! `(M + 2) / kernel_size` times the weight bytes: about 2x for the single
//! FFT of a causal `K = N` filter (`M ~ 2N`), more for short filters whose
//! blocks are several times `L` (still small in absolute terms: `K = 128`
//! with `M = 1024` is 4 KiB per channel). Among candidates within
//! [`TIE`] of the cheapest the shortest is kept, which bounds that memory
//! and keeps the per-thread working set in cache.

use super::super::cost::BYTES_PER_SEC;
use super::super::params::Conv1dGeometry;
use crate::simd::Backend;

/// Sustained rate of realfft transforms in nominal flops, counting
/// `2.5 * M * log2 M` per real transform of length `M`. Measured with
/// realfft 3.5 / rustfft 6.4 (AVX path) on the 2-core development machine
/// (AMD EPYC, 1 MiB L2 per core): a bare forward plus inverse pair ran at
/// 23–30 Gflop/s from `M = 256` to `M = 2^18`, and the whole kernel's
/// timings (see `mod.rs`) fit 30 Gflop/s with [`PER_SAMPLE_SEC`] and
/// [`PER_BLOCK_SEC`] to within about 30%.
const FFT_FLOPS_PER_SEC: f64 = 3.0e10;

/// Slowdown of the `3 * 2^a` and `5 * 2^a` lengths against powers of two,
/// from the same measurement (0.9x to 1.4x, noisy; mostly a bit slower).
const MIXED_RADIX_FACTOR: f64 = 1.15;

/// Per FFT sample, outside the transforms: the pointwise complex product
/// (half a bin per sample), copying the input segment in and the outputs
/// (plus bias) out. Fitted with the rate above on the whole-kernel timings.
const PER_SAMPLE_SEC: f64 = 0.4e-9;

/// Fixed cost of a block: two transform calls through dynamic dispatch,
/// slicing and the loop around them.
const PER_BLOCK_SEC: f64 = 1.0e-7;

/// Relative slack within which a shorter FFT is preferred to the cheapest
/// (see the module docs).
const TIE: f64 = 0.03;

/// The shortest FFT considered; shorter ones are all overhead.
const MIN_FFT_LEN: usize = 16;

/// Odd factors of the candidate lengths `f * 2^a` (`a >= 1`, so every
/// candidate is even and realfft takes its faster even-length path).
const FACTORS: [usize; 3] = [1, 3, 5];

/// Single-thread seconds of the lanes engine (AVX-512, 32 rows per
/// transform, see `lanes.rs`) per group of 32 rows and block, per
/// `M * log2 M`: the transposes in and out, both transforms and the
/// pointwise product. Measured 2.3 to 2.6 ns from `M = 64` to `M = 2^17`
/// (C = 512, N = 1024 .. 65536) on the 2-core development machine.
#[cfg(target_arch = "x86_64")]
const LANES_SEC_PER_UNIT: f64 = 2.4e-9;

/// Fixed cost of a lanes block (32 rows).
#[cfg(target_arch = "x86_64")]
const LANES_PER_BLOCK_SEC: f64 = 1.0e-7;

/// How a plan computes its transforms.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Engine {
    /// realfft, one row per transform, any length.
    Real,
    /// Our AVX-512 complex FFT with one row per lane, 32 rows per
    /// transform, power-of-two lengths (x86_64 with AVX-512 F only).
    #[cfg(target_arch = "x86_64")]
    Lanes,
}

impl Engine {
    /// The engines `backend` runs.
    #[cfg_attr(not(target_arch = "x86_64"), allow(unused_variables))]
    pub(crate) fn available(backend: Backend) -> impl Iterator<Item = Engine> {
        let lanes = {
            #[cfg(target_arch = "x86_64")]
            {
                super::lanes::runs_on(backend).then_some(Engine::Lanes)
            }
            #[cfg(not(target_arch = "x86_64"))]
            {
                None
            }
        };
        std::iter::once(Engine::Real).chain(lanes)
    }

    /// Whether the engine takes transforms of length `m`.
    #[cfg_attr(not(target_arch = "x86_64"), allow(unused_variables))]
    pub(crate) fn supports(self, m: usize) -> bool {
        match self {
            Engine::Real => true,
            #[cfg(target_arch = "x86_64")]
            Engine::Lanes => super::lanes::supports(m),
        }
    }
}

/// One overlap-save configuration.
#[derive(Clone, Copy, Debug, PartialEq)]
pub(crate) struct BlockPlan {
    /// How the transforms are computed.
    pub engine: Engine,
    /// FFT length `M`.
    pub fft_len: usize,
    /// Filter span `L = dilation * (kernel_size - 1) + 1`.
    pub span: usize,
    /// Outputs per block, `M - L + 1`.
    pub block: usize,
    /// Estimated single-thread seconds at the shape the plan was made for.
    pub seconds: f64,
}

/// `dilation * (kernel_size - 1) + 1`; validation showed it fits.
pub(crate) fn span(g: &Conv1dGeometry) -> usize {
    g.params.dilation * (g.params.kernel_size - 1) + 1
}

/// The cheapest block configuration for `g` with the engines `backend`
/// runs (see the module docs), or None where no candidate length fits in
/// `usize` (absurd shapes).
pub(crate) fn choose(g: &Conv1dGeometry, backend: Backend) -> Option<BlockPlan> {
    let span = span(g);
    // A single block covers every output when M >= out_len + L - 1.
    let single = g.out_len.checked_add(span - 1)?;
    // Up to the power of two that does (the lanes engine's single FFT;
    // for the real engine, longer than its own single FFT of a 3 or 5
    // multiple, which is then just priced higher).
    let longest = smallest_multiple_at_least(1, single.max(MIN_FFT_LEN))?;
    let shortest = span.max(MIN_FFT_LEN);
    let plans: Vec<BlockPlan> = candidates(shortest, longest)
        .flat_map(|m| {
            Engine::available(backend)
                .filter(move |e| e.supports(m))
                .map(move |e| price(g, e, span, m))
        })
        .collect();
    let best = plans.iter().map(|p| p.seconds).min_by(f64::total_cmp)?;
    // Candidates are in increasing length: the first within TIE is the shortest.
    plans.into_iter().find(|p| p.seconds <= best * (1.0 + TIE))
}

/// The configuration with `engine` and FFT length `m` (at least the span,
/// one the engine supports), priced for `g`.
pub(crate) fn price(g: &Conv1dGeometry, engine: Engine, span: usize, m: usize) -> BlockPlan {
    debug_assert!(m >= span && engine.supports(m));
    let p = &g.params;
    let block = match engine {
        Engine::Real => m - span + 1,
        #[cfg(target_arch = "x86_64")]
        Engine::Lanes => super::lanes::block(m, span),
    };
    let blocks = g.out_len.div_ceil(block) as f64;
    // The choice must not degenerate at batch 0: price at least one row.
    let rows = (p.batch * p.in_channels).max(1) as f64;
    let mf = m as f64;
    let compute = match engine {
        Engine::Real => {
            let radix = if m.is_power_of_two() {
                1.0
            } else {
                MIXED_RADIX_FACTOR
            };
            let transforms = 2.0 * 2.5 * mf * mf.log2() * radix / FFT_FLOPS_PER_SEC;
            let per_block = transforms + mf * PER_SAMPLE_SEC + PER_BLOCK_SEC;
            rows * blocks * per_block
        }
        #[cfg(target_arch = "x86_64")]
        Engine::Lanes => {
            let groups = (p.batch.max(1) * p.in_channels.div_ceil(super::lanes::GROUP)) as f64;
            let per_block = mf * mf.log2() * LANES_SEC_PER_UNIT + LANES_PER_BLOCK_SEC;
            groups * blocks * per_block
        }
    };
    // Read x, write y, and stream each row's spectrum once (blocks of one
    // row reuse it from cache).
    let bytes = 4.0 * (g.input_elems + g.output_elems) as f64 + rows * 8.0 * (m / 2 + 1) as f64;
    BlockPlan {
        engine,
        fft_len: m,
        span,
        block,
        seconds: compute.max(bytes / BYTES_PER_SEC),
    }
}

/// Every `f * 2^a` (`f` in [`FACTORS`], `a >= 1`) in `lo..=hi`, increasing.
fn candidates(lo: usize, hi: usize) -> impl Iterator<Item = usize> {
    let mut all: Vec<usize> = FACTORS
        .iter()
        .flat_map(|&f| {
            std::iter::successors(Some(2 * f), |&m: &usize| m.checked_mul(2))
                .take_while(move |&m| m <= hi)
                .filter(move |&m| m >= lo)
        })
        .collect();
    all.sort_unstable();
    all.into_iter()
}

/// The least `f * 2^a` (`a >= 1`) that is at least `n`.
fn smallest_multiple_at_least(f: usize, n: usize) -> Option<usize> {
    let mut m = 2 * f;
    while m < n {
        m = m.checked_mul(2)?;
    }
    Some(m)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Conv1dParams;

    fn geometry(channels: usize, n: usize, k: usize, pads: (usize, usize)) -> Conv1dGeometry {
        Conv1dParams {
            batch: 1,
            in_channels: channels,
            out_channels: channels,
            in_len: n,
            kernel_size: k,
            stride: 1,
            pad_left: pads.0,
            pad_right: pads.1,
            dilation: 1,
            groups: channels,
        }
        .geometry()
        .unwrap()
    }

    #[test]
    fn candidates_are_even_fast_lengths_in_order() {
        let c: Vec<usize> = candidates(100, 700).collect();
        assert_eq!(c, [128, 160, 192, 256, 320, 384, 512, 640]);
        assert_eq!(smallest_multiple_at_least(3, 100), Some(192));
        assert_eq!(smallest_multiple_at_least(1, 2), Some(2));
        assert_eq!(smallest_multiple_at_least(1, usize::MAX), None);
    }

    #[test]
    fn single_fft_when_kernel_is_close_to_the_length() {
        for (n, k) in [(16384, 16384), (65536, 65536), (4096, 3000), (1000, 1000)] {
            let g = geometry(64, n, k, (k - 1, 0));
            let plan = choose(&g, Backend::detect()).unwrap();
            assert!(plan.block >= g.out_len, "n={n} k={k}: {plan:?}");
            assert!(plan.fft_len >= n + k - 1);
        }
        // Uncausal K = N: one output, one FFT of at least N.
        let g = geometry(8, 8192, 8192, (0, 0));
        let plan = choose(&g, Backend::detect()).unwrap();
        assert_eq!((plan.fft_len, g.out_len), (8192, 1));
    }

    #[test]
    fn blocks_when_kernel_is_much_shorter() {
        for (n, k) in [(16384, 128), (65536, 128), (65536, 32), (16384, 33)] {
            let g = geometry(64, n, k, (k - 1, 0));
            let plan = choose(&g, Backend::detect()).unwrap();
            let blocks = g.out_len.div_ceil(plan.block);
            assert!(blocks >= 4, "n={n} k={k}: {plan:?}");
            // Several times the span, far below the single FFT.
            assert!(plan.fft_len >= 3 * k && plan.fft_len <= 32 * k, "{plan:?}");
        }
    }

    #[test]
    fn plan_is_the_cheapest_up_to_the_tie() {
        let g = geometry(16, 20000, 300, (150, 149));
        let plan = choose(&g, Backend::detect()).unwrap();
        for m in candidates(300, 1 << 16) {
            for e in Engine::available(Backend::detect()).filter(|e| e.supports(m)) {
                assert!(plan.seconds <= price(&g, e, 300, m).seconds * (1.0 + TIE));
            }
        }
    }
}
