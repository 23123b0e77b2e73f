//! Depthwise conv1d with long filters: FFT with filter spectra computed at prepare.
//!
//! Applies to depthwise convolutions with channel multiplier 1
//! (`groups == in_channels == out_channels`) and stride 1, with any
//! padding, dilation and bias: the long convolutions of Hyena-style models
//! (`K` from tens of taps up to the sequence length, usually causal).
//!
//! # Method
//!
//! Each output row is a cross-correlation of the zero-padded input row with
//! the dilated filter `h` (`h[k * dilation] = w[k]`, zeros between taps,
//! span `L = dilation * (K - 1) + 1`):
//! `y[l] = bias + sum_j h[j] * xpad[l + j]`. Overlap-save computes it in
//! blocks: the segment `s = xpad[l0 .. l0 + M]` (taken straight from `x`,
//! the padding supplied as zeros, never materialised) is transformed, its
//! spectrum multiplied by `conj(H) / M` and transformed back; the circular
//! correlation that gives equals the linear one at `i < M - L + 1`, which are
//! the block's outputs `y[l0 + i]`. A block whose segment holds no input
//! sample (it reads only padding) is just the bias.
//!
//! The FFT length `M` is chosen at prepare by the cost model in [`plan`],
//! at the prepared (maximum) shape: a few times `L` for short filters, one
//! padded FFT per row (`M >= out_len + L - 1`) when `L` is close to the
//! output length. Calls with a shorter input keep that `M` and run fewer
//! blocks. (A uniformly partitioned convolution, for `L` long yet much
//! shorter than the sequence, is not implemented; `plan` picks blocks of
//! at least `L` there.)
//!
//! # Engines
//!
//! Two engines compute the transforms ([`plan::Engine`]); the cost model
//! picks one with `M`:
//!
//! * **lanes** (x86_64 with AVX-512 F, detected at prepare; `lanes.rs`):
//!   our own complex FFT on 16-lane vectors, 32 channels per transform (16
//!   in the real parts, 16 in the imaginary parts, one per lane), radix 4,
//!   in bit-reversed order that is never undone, power-of-two `M`. About
//!   2.5 to 4 times the throughput of realfft per row here; it wins
//!   wherever there are 32 channels or more, and against the depthwise
//!   SIMD kernel from about `K = 32`.
//! * **real**: realfft (rustfft), one row per transform, any even length
//!   `{1, 3, 5} * 2^a`: every other CPU, and few channels.
//!
//! The rest of this section describes the real engine; `lanes.rs` has the
//! lanes engine's details, which follow the same block scheme.
//!
//! # Prepared data and scratch
//!
//! At prepare the `M / 2 + 1` bins of `conj(FFT(h)) / M` are computed for
//! every channel, in parallel, and kept as complex `f32`: `8 * (M / 2 + 1)`
//! bytes per channel, about twice the weight bytes for a causal `K = N`
//! filter (see [`plan`] for short ones). `run` never reads `w`, so the
//! caller may drop the weights after prepare. The realfft plans (twiddles,
//! a few times `M` bytes) are shared by all threads.
//!
//! Per thread, the scratch holds the real segment (`M` f32), its spectrum
//! (`M / 2 + 1` complex) and the transforms' own scratch, so `run` performs
//! no heap allocation.
//!
//! # Parallelism and accuracy
//!
//! Rows `(batch, channel)` run in parallel; when there are fewer rows than
//! threads, each row's blocks are also split into contiguous runs of
//! blocks. Every block is computed the same way whatever the split, so the
//! result does not depend on the pool size.
//!
//! The fp32 FFT error is normwise, about `eps * log2 M` times
//! `||h||_2 * ||segment||_2`, rather than relative to each output: for
//! `|x| <= 1` and PyTorch's default init (`|w| <= 1 / sqrt(K)`) at
//! `K = N = 65536` the largest error against the f64 reference was 3.6e-7
//! (outputs up to 1.4), causal or centred; the tests bound it at 1e-5.
//! The lanes engine shares each transform between two rows, so a row's
//! error scales with the larger of the two rows' norms.
//!
//! # Timings
//!
//! Real engine (before the lanes engine existed). Release build, one thread, 2-core AMD EPYC development machine (shared,
//! noisy), batch 1, causal, best of 5 (the cost estimate in brackets):
//!
//! | shape                    | M      | blocks/row | fft               | direct   | depthwise_simd |
//! |--------------------------|--------|------------|-------------------|----------|----------------|
//! | C=64, N=16384, K=32      | 512    | 35         | 2.1 ms (2.4)      |          | 0.93 ms        |
//! | C=64, N=16384, K=128     | 1024   | 19         | 2.3 ms (2.7)      | 23 ms    | 3.8 ms         |
//! | C=64, N=16384, K=16384   | 32768  | 1          | 4.8 ms (6.1)      | 1.5 s    | 9.7 s          |
//! | C=8, N=65536, K=128      | 1024   | 74         | 1.06 ms (1.3)     |          |                |
//! | C=8, N=65536, K=65536    | 131072 | 1          | 2.8 ms (3.4)      |          |                |
//!
//! Prepare (spectra) took 12–20 ms for C=64, K=N=16384.

#[cfg(target_arch = "x86_64")]
mod lanes;
mod plan;
#[cfg(test)]
mod tests;

use std::sync::Arc;

use num_complex::Complex;
use rayon::prelude::*;
use rustconv_fft_plans::{ComplexToReal, Planner, RealToComplex};

use super::algorithm::{ConvAlgorithm, Entry, NotFusable};
use super::params::Conv1dGeometry;
use super::weights::Weights;
use crate::fused::{RowsIn, RowsOut};
use crate::scratch::Scratch;
use crate::simd::{Backend, Isa};

/// Whether the FFT convolution computes `g`: depthwise with multiplier 1,
/// stride 1 (and a representable FFT length).
pub(crate) fn applies(g: &Conv1dGeometry, backend: Backend) -> bool {
    let p = &g.params;
    p.groups == p.in_channels
        && p.out_channels == p.in_channels
        && p.stride == 1
        && plan::choose(g, backend).is_some()
}

/// Estimated single-thread seconds of one call at `g` on `backend` with
/// the block configuration prepare would choose (see [`plan`]).
pub(crate) fn cost(g: &Conv1dGeometry, backend: Backend) -> f64 {
    plan::choose(g, backend).map_or(f64::INFINITY, |p| p.seconds)
}

/// The shortest FFT whose engine loops run a prologue and an epilogue.
/// Shorter ones read and store a few samples per row and block, each a
/// program line whose set-up outweighs it: a FastConformer's GLU and SiLU
/// around a depthwise conv of 16 frames (K = 9, C = 128, FFTs of 16) took
/// 34 µs a call fused, against 5 stored by a pass of their own around
/// the 2 µs FFT.
#[cfg_attr(not(target_arch = "x86_64"), allow(dead_code))]
const MIN_FUSED_FFT_LEN: usize = 64;

/// A depthwise convolution prepared for overlap-save FFTs of one length.
pub(crate) struct FftConv {
    /// FFT length `M`.
    fft_len: usize,
    /// Filter span `L`.
    span: usize,
    /// Outputs per block, `M - L + 1`.
    block: usize,
    engine: Engine,
}

/// The transforms and spectra, per engine (see [`plan::Engine`]).
enum Engine {
    Real(RealConv),
    #[cfg(target_arch = "x86_64")]
    Lanes(lanes::LanesConv),
}

/// The realfft engine: one row per transform.
struct RealConv {
    forward: Arc<dyn RealToComplex<f32>>,
    inverse: Arc<dyn ComplexToReal<f32>>,
    /// Complex elements of scratch the transforms need (the larger of the two).
    fft_scratch: usize,
    /// `[channels, M / 2 + 1]`: `conj(FFT(h_c)) / M` for each channel's dilated filter.
    spectra: Vec<Complex<f32>>,
}

impl FftConv {
    /// Plans the transforms for `g` (the maximum shape) and computes every
    /// channel's filter spectrum from `w` (`[channels, 1, kernel_size]`),
    /// with the engines `isa` runs.
    pub(crate) fn prepare(g: &Conv1dGeometry, w: &[f32], isa: Isa) -> Self {
        let plan = plan::choose(g, isa.backend()).expect("fft::applies checked that a plan exists");
        Self::with_plan(g, w, plan.engine, plan.fft_len, isa)
    }

    /// As [`prepare`](Self::prepare), with the engine (one `isa` runs) and
    /// the FFT length `fft_len` (at least the filter span, and one the
    /// engine supports) instead of the cost model's choice.
    #[cfg_attr(not(target_arch = "x86_64"), allow(unused_variables))]
    fn with_plan(
        g: &Conv1dGeometry,
        w: &[f32],
        engine: plan::Engine,
        fft_len: usize,
        isa: Isa,
    ) -> Self {
        let p = &g.params;
        let span = plan::span(g);
        assert!(
            fft_len >= span,
            "FFT length {fft_len} below the span {span}"
        );
        debug_assert_eq!(w.len(), p.in_channels * p.kernel_size);
        let engine = match engine {
            plan::Engine::Real => Engine::Real(RealConv::prepare(g, w, fft_len)),
            #[cfg(target_arch = "x86_64")]
            plan::Engine::Lanes => Engine::Lanes(
                lanes::LanesConv::prepare(isa, g, w, fft_len, span)
                    .expect("the lanes engine is planned only on an instruction set it runs on"),
            ),
        };
        FftConv {
            fft_len,
            span,
            block: fft_len - span + 1,
            engine,
        }
    }

    /// The engine this preparation runs (tests of the x86_64-only lanes
    /// engine ask).
    #[cfg(all(test, target_arch = "x86_64"))]
    fn engine(&self) -> plan::Engine {
        match self.engine {
            Engine::Real(_) => plan::Engine::Real,
            #[cfg(target_arch = "x86_64")]
            Engine::Lanes(_) => plan::Engine::Lanes,
        }
    }

    /// `f32` elements of scratch per thread.
    pub(crate) fn scratch_per_thread(&self) -> usize {
        match &self.engine {
            Engine::Real(e) => self.fft_len + 2 * self.bins() + 2 * e.fft_scratch,
            #[cfg(target_arch = "x86_64")]
            Engine::Lanes(e) => e.scratch_per_thread(),
        }
    }

    /// Bytes of the filter spectra.
    pub(crate) fn prepared_bytes(&self) -> usize {
        match &self.engine {
            Engine::Real(e) => std::mem::size_of_val(e.spectra.as_slice()),
            #[cfg(target_arch = "x86_64")]
            Engine::Lanes(e) => e.prepared_bytes(),
        }
    }

    /// Bins per spectrum, `M / 2 + 1`.
    fn bins(&self) -> usize {
        self.fft_len / 2 + 1
    }

    /// Computes `y` for `g` (the prepared shape or one with a smaller batch
    /// and input length), in parallel on the current rayon pool.
    pub(crate) fn run(
        &self,
        g: &Conv1dGeometry,
        x: &[f32],
        bias: Option<&[f32]>,
        y: &mut [f32],
        scratch: &Scratch,
    ) {
        debug_assert_eq!(plan::span(g), self.span);
        debug_assert_eq!(x.len(), g.input_elems);
        debug_assert_eq!(y.len(), g.output_elems);
        match &self.engine {
            Engine::Real(e) => self.run_real(e, g, x, bias, y, scratch),
            #[cfg(target_arch = "x86_64")]
            Engine::Lanes(e) => e.run(g, x, bias, y, scratch),
        }
    }

    /// Whether [`Self::run_rows`] runs a prologue in the engine's input
    /// loop and an epilogue in its output loop (the AVX-512 lanes engine,
    /// at FFT lengths of at least [`MIN_FUSED_FFT_LEN`]); otherwise the
    /// input and output are stored.
    pub(crate) fn fuses(&self) -> bool {
        match &self.engine {
            Engine::Real(_) => false,
            #[cfg(target_arch = "x86_64")]
            Engine::Lanes(_) => self.fft_len >= MIN_FUSED_FFT_LEN,
        }
    }

    /// `f32` elements of scratch per thread for [`Self::run_rows`] with a
    /// source or sink needing `temps` line-sized temporaries at most.
    // Off x86-64 only the realfft engine exists, which uses no argument.
    #[cfg_attr(not(target_arch = "x86_64"), allow(unused_variables))]
    pub(crate) fn rows_scratch(&self, temps: usize) -> usize {
        match &self.engine {
            Engine::Real(_) => self.scratch_per_thread(),
            #[cfg(target_arch = "x86_64")]
            Engine::Lanes(e) => e.rows_scratch(temps),
        }
    }

    /// [`Self::run`] with the input computed by a prologue as each block
    /// reads it and / or the output handed to an epilogue as each block of
    /// it is computed.
    ///
    /// # Panics
    /// On an engine that does not [`Self::fuses`] (a caller's bug).
    #[cfg_attr(not(target_arch = "x86_64"), allow(unused_variables))]
    pub(crate) fn run_rows(
        &self,
        g: &Conv1dGeometry,
        x: RowsIn,
        bias: Option<&[f32]>,
        y: RowsOut,
        scratch: &Scratch,
    ) {
        debug_assert_eq!(plan::span(g), self.span);
        match &self.engine {
            Engine::Real(_) => panic!("the realfft engine does not take fused operands"),
            #[cfg(target_arch = "x86_64")]
            Engine::Lanes(e) => e.run_into(g, x, bias, y, scratch),
        }
    }

    /// [`Self::run`] on the realfft engine.
    fn run_real(
        &self,
        e: &RealConv,
        g: &Conv1dGeometry,
        x: &[f32],
        bias: Option<&[f32]>,
        y: &mut [f32],
        scratch: &Scratch,
    ) {
        let p = &g.params;
        let channels = p.in_channels;
        debug_assert_eq!(e.spectra.len(), channels * self.bins());
        let rows = p.batch * channels;
        if rows == 0 {
            return;
        }

        // With fewer rows than threads, split rows into runs of blocks
        // (about two tasks per thread). Runs start at multiples of the
        // block, so the blocks, and the result, do not depend on the split.
        let blocks = g.out_len.div_ceil(self.block);
        let threads = crate::par::threads();
        let splits = if rows >= threads {
            1
        } else {
            (2 * threads).div_ceil(rows).min(blocks)
        };
        let run_len = blocks.div_ceil(splits) * self.block;

        crate::par::for_each_chunk_mut_2d(y, g.out_len, run_len, |row, run, y_run| {
            let channel = row % channels;
            // Indexed rather than `chunks(in_len)`, which panics when `in_len == 0`.
            let x_row = &x[row * p.in_len..][..p.in_len];
            let bias = bias.map_or(0.0, |b| b[channel]);
            scratch.with_slot(|s| {
                self.run_blocks(e, g, x_row, channel, bias, run * run_len, y_run, s);
            });
        });
    }

    /// Outputs `first .. first + y.len()` of one row (`first` a multiple of
    /// the block), block by block, with one thread's scratch `s`.
    #[allow(clippy::too_many_arguments)]
    fn run_blocks(
        &self,
        e: &RealConv,
        g: &Conv1dGeometry,
        x_row: &[f32],
        channel: usize,
        bias: f32,
        first: usize,
        y: &mut [f32],
        s: &mut [f32],
    ) {
        let (m, bins) = (self.fft_len, self.bins());
        let (pad_left, in_len) = (g.params.pad_left, g.params.in_len);
        let (segment, rest) = s.split_at_mut(m);
        let (spectrum, rest) = rest.split_at_mut(2 * bins);
        let spectrum: &mut [Complex<f32>] = bytemuck::cast_slice_mut(spectrum);
        let fft_scratch: &mut [Complex<f32>] =
            bytemuck::cast_slice_mut(&mut rest[..2 * e.fft_scratch]);
        let filter = &e.spectra[channel * bins..][..bins];

        for (i, y_block) in y.chunks_mut(self.block).enumerate() {
            // The block's outputs l0 .. l0 + len read padded positions
            // l0 .. l0 + need; input sample j sits at padded position pad_left + j.
            let l0 = first + i * self.block;
            let need = y_block.len() + self.span - 1;
            let lo = pad_left.saturating_sub(l0).min(need);
            let hi = (pad_left + in_len).saturating_sub(l0).min(need);
            if lo >= hi {
                y_block.fill(bias); // only padding under this block
                continue;
            }
            segment[..lo].fill(0.0);
            segment[lo..hi].copy_from_slice(&x_row[l0 + lo - pad_left..][..hi - lo]);
            segment[hi..].fill(0.0);

            e.forward
                .process_with_scratch(segment, spectrum, fft_scratch)
                .expect("buffers sized by the plan");
            for (bin, &h) in spectrum.iter_mut().zip(filter) {
                *bin *= h;
            }
            // The DC bin, and the Nyquist bin of an even length, are real
            // for a real signal; clear the rounding in their imaginary parts.
            spectrum[0].im = 0.0;
            if m % 2 == 0 {
                spectrum[bins - 1].im = 0.0;
            }
            e.inverse
                .process_with_scratch(spectrum, segment, fft_scratch)
                .expect("buffers sized by the plan");
            for (out, &v) in y_block.iter_mut().zip(segment.iter()) {
                *out = v + bias;
            }
        }
    }
}

impl RealConv {
    /// Plans realfft transforms of length `fft_len` and computes every
    /// channel's spectrum.
    fn prepare(g: &Conv1dGeometry, w: &[f32], fft_len: usize) -> Self {
        let p = &g.params;
        let mut planner = Planner::new();
        let forward = planner.forward(fft_len);
        let inverse = planner.inverse(fft_len);
        let fft_scratch = forward.get_scratch_len().max(inverse.get_scratch_len());

        let bins = fft_len / 2 + 1;
        let scale = 1.0 / fft_len as f32;
        let mut spectra = vec![Complex::default(); p.in_channels * bins];
        spectra
            .par_chunks_mut(bins)
            .zip(w.par_chunks_exact(p.kernel_size))
            .for_each_init(
                || (forward.make_input_vec(), forward.make_scratch_vec()),
                |(filter, fft_scratch), (spectrum, taps)| {
                    filter.fill(0.0);
                    for (k, &tap) in taps.iter().enumerate() {
                        filter[k * p.dilation] = tap;
                    }
                    forward
                        .process_with_scratch(filter, spectrum, fft_scratch)
                        .expect("buffers sized by the plan");
                    for bin in spectrum.iter_mut() {
                        *bin = bin.conj() * scale;
                    }
                },
            );
        RealConv {
            forward,
            inverse,
            fft_scratch,
            spectra,
        }
    }
}

/// The registration: depthwise, multiplier 1, stride 1, with a plan;
/// constant weights only, since prepare transforms the filters.
pub(super) const ENTRY: Entry = Entry {
    name: "fft",
    applies,
    cost,
    serial: super::cost::SERIAL,
    takes_fed_weights: false,
    prepare: |g, weights, isa| match weights {
        Weights::Constant(w) => Some(Box::new(FftConv::prepare(g, w, isa))),
        Weights::Fed => None,
    },
};

/// Reads only the spectra, never the weights; fuses a prologue and an
/// epilogue on the lanes engine ([`FftConv::fuses`]), nothing on the
/// realfft one.
impl ConvAlgorithm for FftConv {
    fn scratch_per_thread(&self) -> usize {
        FftConv::scratch_per_thread(self)
    }

    fn prepared_bytes(&self) -> usize {
        FftConv::prepared_bytes(self)
    }

    fn reads_weights(&self) -> bool {
        false
    }

    fn fuses_input(&self) -> bool {
        self.fuses()
    }

    fn fuses_output(&self) -> bool {
        self.fuses()
    }

    fn rows_scratch(&self, _max: &Conv1dGeometry, x_temps: usize, y_temps: usize) -> usize {
        FftConv::rows_scratch(self, x_temps.max(y_temps))
    }

    fn run(
        &self,
        g: &Conv1dGeometry,
        x: &[f32],
        _w: &[f32],
        bias: Option<&[f32]>,
        y: &mut [f32],
        scratch: &Scratch,
    ) {
        FftConv::run(self, g, x, bias, y, scratch);
    }

    fn run_rows(
        &self,
        g: &Conv1dGeometry,
        x: RowsIn,
        _w: &[f32],
        bias: Option<&[f32]>,
        y: RowsOut,
        scratch: &Scratch,
    ) -> Result<(), NotFusable> {
        if !self.fuses() {
            return Err(NotFusable);
        }
        FftConv::run_rows(self, g, x, bias, y, scratch);
        Ok(())
    }
}
