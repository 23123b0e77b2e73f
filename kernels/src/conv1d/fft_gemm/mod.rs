//! Dense and grouped conv1d with moderate filters and many channels:
//! block FFT convolution whose channel mixing is one complex GEMM per
//! frequency bin, weight spectra computed per tile from the weights.
//!
//! Applies to stride 1 with any dilation, padding, bias and groups, where
//! the dilated filter spans at most 96 samples. It wins where a group
//! mixes many channels through a filter of about five taps or more (the
//! conv stacks of Wav2Letter-style speech models: 250 channels, `K = 11`).
//!
//! # Method
//!
//! Output `l` of a group is `y[o][l] = bias[o] + Σ_c Σ_k h[o][c][k] ·
//! xpad[c][l + k]`, with `h` the dilated filter of span `R + 1`
//! (`R = dilation · (K − 1)`). Overlap-save cuts the outputs into blocks of
//! `M`; block `j` reads the `L = M + R` padded samples from `j · M` on. In
//! the real DFT of length `L` the circular cross-correlation is a product
//! per bin, `Y_b = Σ_c conj(H_b[o][c]) · X_b[c]`, and it equals the linear
//! one at the block's first `M` outputs. So per bin the channel mixing is a
//! complex matrix product `[cout × cin] · [cin × blocks]`, where the direct
//! convolution (and the `gemm` algorithm) spends `K` real multiply-adds per
//! channel pair and output, this spends `(2L − 2) / M`: the two real bins
//! (0 and `L/2`) one each, the `L/2 − 1` others four. For `K = 11` that is
//! 2.8 at `L = 32` (`M = 22`) against 11, 3.9 times fewer. The transforms
//! are cheap beside it: `L² / M` per input channel and `L` per output
//! channel and output, against `(2L − 2) · cin · cout / M`.
//!
//! # Why this and not Winograd
//!
//! Winograd `F(m, r)` also mixes channels by one GEMM per transform point,
//! at `(m + r − 1) / m` products per output, but its transforms use the
//! points 0, ±1, ±2, ±1/2, ...: beyond about 8 points their condition
//! number makes fp32 results useless, which for `r = 11` leaves `m` close
//! to 1 and no saving. The DFT is orthogonal (its rounding error grows
//! with `log L`), so blocks of 32 or 64 points are as accurate as the
//! direct sum, and a product of complex numbers at four real
//! multiply-adds costs the same per transform point as Winograd's real
//! ones.
//!
//! # Transforms as small matrix products
//!
//! With `L` = 16 to 128 and thousands of blocks per call, the transforms
//! are matrix products too: the `L × L` real DFT matrix `F` (rows: the
//! real parts of bins 0 and `L/2`, then each other bin's real and
//! imaginary parts, the *planes*) times an `L × NJ` window of `NJ` blocks'
//! samples, and the `M × L` inverse `G` (scaled by `1/L`, with the factor
//! 2 of the paired bins) times a channel's spectra. Run by the same SIMD
//! micro-kernel as the channel mixing, vectorised across blocks, they cost
//! `L²` multiply-adds per block where a radix FFT costs `~2.5 L log2 L`
//! flops but runs one scalar block at a time: at these sizes the matrix
//! form is the faster.
//!
//! # Weight spectra per tile, weights read in place
//!
//! Kept at prepare, the weight spectra would take `L` floats per channel
//! pair against the weights' `K` (`32 / 11` for the conv stack), and peak
//! memory above the GEMM path's and XNNPACK's. So each tile computes a
//! panel's spectra as one more product on the same micro-kernel: `W`
//! (`L × K`, `F`'s columns at the taps, imaginary rows negated for
//! `conj(H_b)`) times the panel's `K × (cin · MR)` weights, `MR` planes
//! (whole bins) at a time, each mixed while in cache. That is `L · K`
//! multiply-adds per channel pair and tile against the mixing's
//! `(2L − 2) · NJ`: `11 / 62 ≈ 18%` more for the conv stack on AVX-512.
//!
//! Prepare keeps no copy of the weights either: `run` reads the model's
//! `[cout][cin][K]` weights (in the delegate, the blob's constant segment,
//! which then stays loaded instead of being freed after `init`), and the
//! spectra product's panels (`[tap][cin][MR]` per `MR` output channels)
//! are packed per call. Where several tiles use each panel (more than one
//! run of `NJ` blocks per group), the call packs every panel once into the
//! scratch's shared region, which all the convs of a delegate call share
//! (one layer's weights); where one tile does (short calls), it packs its
//! panels in its own scratch, each right before use. A copy kept at
//! prepare held every layer's weights a second time beside the blob while
//! `init` ran: the conv stack's peak went from 75 to about 50 MiB.
//!
//! The transform length is chosen at prepare by the cost model
//! ([`cost`]), among 16, 32, 64 and 128 with `M >= L / 4`: longer
//! transforms mean fewer products but more transform work per block and
//! more weight spectra to compute per tile.
//!
//! # Work split, scratch, fusion
//!
//! A tile is (batch item, group, run of `NJ` consecutive blocks, run of
//! panels of output channels); `NJ` is one register row of the
//! micro-kernels (32 blocks on AVX-512). A tile transforms its input,
//! computes a panel's weight spectra, mixes, and transforms back one
//! panel of output channels at a time,
//! handing each finished output row (`NJ · M` positions) to the caller
//! while in cache: stored, or passed to a fused epilogue (the
//! [`RowSink`] of the delegate's fused programs: bias, ReLU and other
//! elementwise ops run on the row, never as a pass of their own). The
//! output channels are split into several runs only where there are too
//! few tiles for the pool. Everything a tile needs (window, input spectra,
//! a packed panel where it packs its own, `MR` planes of weight spectra, a
//! panel's output spectra, the row) is in its thread's scratch slot, sized
//! at prepare, and the packed weights in the shared region; `run`
//! allocates nothing. Each output is computed the
//! same way whatever the split, so results do not depend on the number of
//! threads.
//!
//! # Measured
//!
//! One thread, release, `calibrate_fft_gemm` in `tests.rs`, batch 1,
//! "same" padding, on the 2-core AVX-512 AMD EPYC (Zen 5) VM this was
//! developed on while other builds ran (so noisy); ms per call, the cost
//! model's estimate in brackets:
//!
//! | shape                  | `gemm`      | `fft_gemm`  |
//! |------------------------|-------------|-------------|
//! | 250→250, K=11, N=4096  | 51.1 (60.3) | 20.7 (25.3) |
//! | 256→256, K=5, N=4096   | 25.9 (28.7) | 17.9 (20.6) |
//! | 128→128, K=7, N=4096   | 8.7 (10.3)  | 5.1 (6.0)   |
//! | 64→64, K=11, N=4096    | 3.4 (4.3)   | 1.9 (2.1)   |
//! | 32→32, K=11, N=4096    | 0.83 (1.17) | 0.69 (0.72) |
//! | 512→512, K=3, N=2048   | 29.7 (34.0) | 28.8 (35.9) |
//! | 250→250, K=11, N=512   | 7.0 (7.5)   | 3.4 (4.2)   |
//!
//! So [`RELATIVE_RATE`] = 0.8 puts the estimates within about 1.25× above
//! the measurements, as the `gemm` ones are, and on the right side of them
//! (K = 3 with 512 channels is a tie, and the model keeps the GEMM there).
//! Computing the weight spectra per tile costs about 18% over keeping
//! them (on the first shape 0.40 of the `gemm` time, against 0.34 when
//! prepare kept them, measured the same way): the price of prepared
//! memory at the weights' size instead of `L / K` times it. Packing the
//! weights per call instead of at prepare costs 2-4% more (same VM, one
//! thread, quiet, both builds interleaved: 8.9-9.0 against 8.6-8.7 ms on
//! the first shape, 1.63-1.68 against 1.57-1.60 on the last, where each
//! tile packs its own panels).
//!
//! # Accuracy
//!
//! Transforms and products are fp32; the error is that of a length-`L`
//! DFT, relative to the norms of a block's input and filter rather than to
//! each output: on 250 channels, `K = 11`, inputs in ±1 the largest error
//! against the f64 reference was below 2e-5 (outputs up to about 10); the
//! tests bound it at 1e-4 absolute.

#![allow(unsafe_code)]
#![warn(clippy::undocumented_unsafe_blocks)]

mod kernel;

use super::algorithm::{ConvAlgorithm, Entry, NotFusable};
use super::params::Conv1dGeometry;
use crate::fused::{RowSink, RowsIn, RowsOut};
use crate::scratch::Scratch;
use crate::simd::{Backend, Isa};
use kernel::{Block, Layout, TileArgs, TileKernel, Weights};

/// Transform lengths prepare chooses among.
const LENGTHS: [usize; 4] = [16, 32, 64, 128];
/// Longest dilated filter span minus one (`R`) the algorithm takes: the
/// largest length with `M >= L / 4`.
const MAX_REACH: usize = 96;
/// The channel mixing's multiply-add rate relative to the `gemm`
/// algorithm's large-matrix rate: its complex micro-kernel loads two
/// vectors and two broadcasts per four multiply-adds per row, and its
/// output spectra are stored and read back. Calibrated with
/// `calibrate_fft_gemm` in `tests.rs` (see [`cost`]).
const RELATIVE_RATE: f64 = 0.8;
/// Extra time per multiply-add for each `1 / in_per_group`: each bin's
/// complex product sums over the group's input channels only (the GEMM's
/// inner products run over channels and taps), and the transforms, one per
/// channel, weigh more beside a narrow mixing. Fitted with
/// `calibrate_fft_gemm_channels` (see [`cost`]).
const SHORT_CHANNELS: f64 = 32.0;
/// Fixed seconds per tile (task set-up, panel loop).
const SECONDS_PER_TILE: f64 = 0.5e-6;
/// Tiles per pool thread the split aims for before it splits output
/// channels (which repeats the forward transform per run).
const TILES_PER_THREAD: usize = 2;

/// Whether this algorithm computes `g`: stride 1, a dilated filter
/// spanning at most `MAX_REACH + 1` samples, and some transform length
/// within the scratch bound on `backend` (up to 4096 input channels per
/// group on AVX-512, at `L = 16`).
pub(crate) fn applies(g: &Conv1dGeometry, backend: Backend) -> bool {
    g.params.stride == 1 && reach(g) <= MAX_REACH && lengths(g, backend).next().is_some()
}

fn reach(g: &Conv1dGeometry) -> usize {
    (g.params.kernel_size - 1) * g.params.dilation
}

/// Most floats of input spectra a tile keeps in its thread's scratch
/// (`L · in_per_group · NJ`, 8 MB): wider groups would take the scratch
/// far out of cache and into the hundreds of megabytes per thread.
const MAX_SPECTRA_FLOATS: usize = 1 << 21;

/// The transform lengths usable for `g` on `backend`: `M = L − R >= L / 4`,
/// and input spectra within [`MAX_SPECTRA_FLOATS`].
fn lengths(g: &Conv1dGeometry, backend: Backend) -> impl Iterator<Item = usize> {
    let r = reach(g);
    let per_length = g.in_per_group.saturating_mul(kernel::block(backend).nj());
    LENGTHS.into_iter().filter(move |&l| {
        4 * (l - r.min(l)) >= l && per_length.saturating_mul(l) <= MAX_SPECTRA_FLOATS
    })
}

/// The share of a call's single-thread time more threads do not shorten
/// (see `cost::on_threads`): 3.3 times faster on 16 threads than on one,
/// 2.1 times on 4 (medians over 36 shapes of HiFi-GAN's blocks, 32 to 256
/// channels, `K` = 3 to 11 at dilations 1 to 5, on the 16-core Intel Xeon
/// device, 2026-11-28: `calibrate_vocoder`), where the GEMM
/// scales 7.3 and 3.2 times. Where column tiles are few, the pool splits
/// the output channels into runs, and each run transforms the whole input
/// block again. On 16 threads the GEMM was the faster of the two at all 36
/// shapes, this algorithm at 6 of them on one thread.
pub(crate) const SERIAL: f64 = 0.25;

/// Estimated single-thread seconds (see `cost.rs`) at the best length.
///
/// Multiply-adds: per (batch item, group) and tile of `NJ` blocks (padded
/// blocks counted, as computed), the forward transform (`L²` per input
/// channel and block, plus the window copy), the channel mixing
/// (`2L − 2` per channel pair and block, output channels padded to the
/// panel), the weight spectra (`L · K` per channel pair, once per tile,
/// over columns padded to whole register rows) and the inverse (`M · L`
/// per output channel and block), at [`RELATIVE_RATE`] times the `gemm`
/// algorithm's large-matrix rate, slowed by `1 + SHORT_CHANNELS /
/// in_per_group`. Bytes: the compulsory ones plus the weights, which every
/// tile streams once. The larger of the two, plus [`SECONDS_PER_TILE`] per
/// tile.
///
/// The channel term was fitted on `calibrate_fft_gemm_channels` (dense, 8
/// to 256 channels, `K` = 5, 7, 11, 200 to 12800 outputs, one thread) on
/// two Intel Xeon machines (this project's 2-core VM and the 16-core
/// device machine, 2026-11-28), choosing between this and the `gemm`
/// algorithm by the estimates: without it the model took this algorithm
/// for 16 to 64 channels where it ran 1.1 to 3.2 times slower than the
/// GEMM (HiFi-GAN's last stages: 16 channels, `K` = 7, 12800 outputs, 1.48
/// against 0.53 ms); with it, the summed log-loss of the choices over the
/// 138 points fell from 18.0 to 0.31, the worst pick 1.2 times the better
/// algorithm's time (64 channels, `K` = 7, 800 outputs). Measured against
/// the `gemm` time, this estimate had been too low by 2 to 4.5 times at 8
/// and 16 channels, 1.2 to 1.8 at 64 and 1.0 to 1.4 at 128 and 256.
pub(crate) fn cost(g: &Conv1dGeometry, backend: Backend) -> f64 {
    lengths(g, backend)
        .map(|l| cost_at(g, backend, l))
        .min_by(f64::total_cmp)
        .unwrap_or(f64::INFINITY)
}

fn cost_at(g: &Conv1dGeometry, backend: Backend, l: usize) -> f64 {
    use super::cost::{compulsory_bytes, roofline, DIRECT_MACS_PER_SEC};
    let p = &g.params;
    let block = kernel::block(backend);
    let m = l - reach(g);
    let tiles_per_row = g.out_len.div_ceil(m).div_ceil(block.nj()).max(1);
    let cols = (tiles_per_row * block.nj()) as f64;
    let (cin, cout) = (g.in_per_group as f64, g.out_per_group as f64);
    let cout_pad = g.out_per_group.next_multiple_of(block.mr) as f64;
    let lf = l as f64;
    let forward = cin * cols * (lf * lf + lf);
    let mixing = cout_pad * cin * cols * (2.0 * lf - 2.0);
    let inverse = cout * cols * (m.next_multiple_of(block.mr) as f64 * lf + m as f64);
    let panels = g.out_per_group.div_ceil(block.mr);
    let spectra_cols = (g.in_per_group * block.mr).next_multiple_of(block.nj()) as f64;
    let weight_spectra = (tiles_per_row * panels) as f64 * spectra_cols * lf * p.kernel_size as f64;
    let outer = (p.batch * p.groups) as f64;
    let macs = outer * (forward + mixing + weight_spectra + inverse);
    let rate = DIRECT_MACS_PER_SEC * super::gemm::SPEEDUP_OVER_DIRECT * RELATIVE_RATE
        / (1.0 + SHORT_CHANNELS / cin);
    let weights = 4.0 * g.weight_elems as f64;
    let bytes = compulsory_bytes(g) + weights * (p.batch * tiles_per_row) as f64;
    let tiles = outer * tiles_per_row as f64;
    roofline(macs, rate, bytes) + tiles * SECONDS_PER_TILE
}

/// The weight spectra, transform matrices and tile kernel, chosen at
/// prepare; the geometry comes with every call.
pub(crate) struct FftGemmConv {
    /// Transform length and outputs per block.
    l: usize,
    m: usize,
    /// `W`: the `L` planes of `conj(H_b)` from the filter's taps, packed
    /// like `F`.
    wfwd: Box<[f32]>,
    /// `F`, packed for the micro-kernel (see `kernel::Layout`).
    fwd: Box<[f32]>,
    /// `G`, packed likewise.
    inv: Box<[f32]>,
    kernel: TileKernel,
    cin: usize,
    cout: usize,
    taps: usize,
}

impl FftGemmConv {
    /// Chooses the length by the cost model and builds the transform
    /// matrices for `isa`; the weights are read in place by every call.
    pub(crate) fn prepare(g: &Conv1dGeometry, isa: Isa) -> Self {
        let backend = isa.backend();
        let l = lengths(g, backend)
            .min_by(|&a, &b| cost_at(g, backend, a).total_cmp(&cost_at(g, backend, b)))
            .expect("applies() holds");
        Self::with(g, isa, l)
    }

    /// As [`Self::prepare`] with a given length.
    pub(crate) fn with(g: &Conv1dGeometry, isa: Isa, l: usize) -> Self {
        let p = &g.params;
        let kernel = TileKernel::new(isa);
        let mr = kernel.block().mr;
        let (cin, cout, taps) = (g.in_per_group, g.out_per_group, p.kernel_size);
        let r = reach(g);
        assert!(
            l.is_multiple_of(4) && r < l,
            "transform length {l} for reach {r}"
        );
        let m = l - r;

        // F: plane rows (re 0, re L/2, then re b, im b), tap columns.
        let angle =
            |b: usize, t: usize| 2.0 * std::f64::consts::PI * ((b * t) % l) as f64 / l as f64;
        let plane = |row: usize, t: usize| -> f64 {
            match row {
                0 => 1.0,
                1 => angle(l / 2, t).cos(),
                _ if row.is_multiple_of(2) => angle(row / 2, t).cos(),
                _ => -angle(row / 2, t).sin(),
            }
        };
        let fwd = pack(l, l, mr, plane);
        // W: F's columns at the taps' positions, imaginary rows negated
        // (conj(H_b)).
        let wfwd = pack(l, taps, mr, |row, k| {
            let v = plane(row, k * p.dilation);
            if row >= 2 && row % 2 == 1 {
                -v
            } else {
                v
            }
        });
        // G: output rows t, plane columns; y = (1/L)(Y0 + (−1)^t Y_{L/2}
        // + 2 Σ_b (Re Y_b cos − Im Y_b sin)).
        let inv = pack(m, l, mr, |t, col| {
            let v = match col {
                0 => 1.0,
                1 => angle(l / 2, t).cos(),
                _ if col.is_multiple_of(2) => 2.0 * angle(col / 2, t).cos(),
                _ => -2.0 * angle(col / 2, t).sin(),
            };
            v / l as f64
        });
        FftGemmConv {
            l,
            m,
            wfwd,
            fwd,
            inv,
            kernel,
            cin,
            cout,
            taps,
        }
    }

    /// The transform length chosen.
    #[cfg(test)]
    pub(crate) fn length(&self) -> usize {
        self.l
    }

    pub(crate) fn scratch_per_thread(&self) -> usize {
        kernel::tile_scratch(self.l, self.m, self.cin, self.taps, self.kernel.block())
    }

    /// Scratch with `y_temps` line temporaries for a fused epilogue.
    pub(crate) fn rows_scratch(&self, y_temps: usize) -> usize {
        self.scratch_per_thread() + y_temps * self.kernel.block().nj() * self.m
    }

    /// Floats of the scratch's shared region a call needs: the weights of
    /// every group packed per panel of `MR` output channels (the last
    /// padded), then `NJ` more that the last panel's spectra product reads
    /// past its end.
    pub(crate) fn shared_scratch(&self, groups: usize) -> usize {
        let block = self.kernel.block();
        let panels = self.cout.div_ceil(block.mr);
        groups * panels * kernel::panel_len(self.cin, self.taps, block) + block.nj()
    }

    pub(crate) fn prepared_bytes(&self) -> usize {
        4 * (self.wfwd.len() + self.fwd.len() + self.inv.len())
    }

    /// Computes `y = conv1d(x, w) + bias` for `g` (the prepared static
    /// parameters; batch and input length may be smaller), `w` being
    /// `[out_channels, in_per_group, kernel_size]`. The caller has checked
    /// every slice length and the scratch.
    pub(crate) fn run(
        &self,
        g: &Conv1dGeometry,
        x: &[f32],
        w: &[f32],
        bias: Option<&[f32]>,
        y: &mut [f32],
        scratch: &Scratch,
    ) {
        debug_assert_eq!(y.len(), g.output_elems);
        self.run_tiles(g, x, w, bias, Dest::Stored(OutPtr(y.as_mut_ptr())), scratch);
    }

    /// [`Self::run`] with each output row handed to `sink` while in cache.
    pub(crate) fn run_into(
        &self,
        g: &Conv1dGeometry,
        x: &[f32],
        w: &[f32],
        bias: Option<&[f32]>,
        sink: &dyn RowSink,
        scratch: &Scratch,
    ) {
        self.run_tiles(g, x, w, bias, Dest::Sink(sink), scratch);
    }

    fn run_tiles(
        &self,
        g: &Conv1dGeometry,
        x: &[f32],
        w: &[f32],
        bias: Option<&[f32]>,
        dest: Dest<'_>,
        scratch: &Scratch,
    ) {
        let p = &g.params;
        let (cin, cout, m) = (self.cin, self.cout, self.m);
        assert_eq!(
            (g.in_per_group, g.out_per_group),
            (cin, cout),
            "prepared for another shape"
        );
        assert_eq!(reach(g), self.l - m, "prepared for another shape");
        debug_assert_eq!(x.len(), g.input_elems);
        debug_assert_eq!(w.len(), g.weight_elems);
        if g.out_len == 0 || p.batch == 0 {
            return;
        }
        let block: Block = self.kernel.block();
        let nj = block.nj();
        let panels = cout.div_ceil(block.mr);
        let col_tiles = g.out_len.div_ceil(m).div_ceil(nj);
        let outer = p.batch * p.groups * col_tiles;
        // Split output channels only where the pool would idle otherwise.
        let want = TILES_PER_THREAD * crate::par::threads();
        let runs = want.div_ceil(outer).clamp(1, panels);
        let per_run = panels.div_ceil(runs);
        let runs = panels.div_ceil(per_run);
        let lay = Layout {
            l: self.l,
            m,
            cin,
            cout,
            fwd: &self.fwd,
            inv: &self.inv,
            taps: self.taps,
            wfwd: &self.wfwd,
        };
        let panel_len = kernel::panel_len(cin, self.taps, block);
        let group_weights = cout * cin * self.taps;
        // Where several tiles use a panel (more than one run of blocks per
        // group), the call packs the weights once into the shared region;
        // where one does, it packs its panels itself, each right before use
        // while in cache.
        let shared = p.batch * col_tiles > 1;
        scratch.with_shared(|packed| {
            let total = p.groups * panels * panel_len;
            let packed = &mut packed[..self.shared_scratch(p.groups)];
            if shared {
                packed[total..].fill(0.0);
                crate::par::for_each_chunk_mut(&mut packed[..total], panel_len, |gp, panel| {
                    let (group, pn) = (gp / panels, gp % panels);
                    let w = &w[group * group_weights..][..group_weights];
                    self.kernel.pack(w, cin, self.taps, pn * block.mr, panel);
                });
            }
            let packed = &*packed;
            crate::par::for_each(outer * runs, |t| {
                let (rest, run) = (t / runs, t % runs);
                let (bg, tile) = (rest / col_tiles, rest % col_tiles);
                let (b, group) = (bg / p.groups, bg % p.groups);
                let j0 = tile * nj;
                let args = TileArgs {
                    x: &x[(b * p.in_channels + group * cin) * p.in_len..][..cin * p.in_len],
                    in_len: p.in_len,
                    pad_left: p.pad_left,
                    j0,
                    blocks: (g.out_len.div_ceil(m) - j0).min(nj),
                    out_len: g.out_len,
                    weights: if shared {
                        Weights::Packed(&packed[group * panels * panel_len..])
                    } else {
                        Weights::Raw(&w[group * group_weights..][..group_weights])
                    },
                    panels: run * per_run..((run + 1) * per_run).min(panels),
                    bias: bias.map(|bias| &bias[group * cout..][..cout]),
                };
                let row0 = b * p.out_channels + group * cout;
                let t0 = j0 * m;
                scratch.with_slot(|slot| match dest {
                    Dest::Stored(out) => {
                        let mut emit = |o: usize, values: &mut [f32], _: &mut [f32]| {
                            let at = (row0 + o) * g.out_len + t0;
                            // SAFETY: row `row0 + o`, positions t0 .. t0 +
                            // values.len() <= out_len of `y`, which outlives
                            // the loop; tiles cover disjoint (row, position)
                            // sets (distinct batch item, group, output-channel
                            // run or block run), so no other task writes them.
                            let dst =
                                unsafe { std::slice::from_raw_parts_mut(out.at(at), values.len()) };
                            dst.copy_from_slice(values);
                        };
                        self.kernel.tile(&lay, &args, slot, &mut emit);
                    }
                    Dest::Sink(sink) => {
                        let mut emit = |o: usize, values: &mut [f32], tmp: &mut [f32]| {
                            sink.store(row0 + o, t0, values, tmp);
                        };
                        self.kernel.tile(&lay, &args, slot, &mut emit);
                    }
                });
            });
        });
    }
}

/// `rows × cols` values of `f(row, col)` packed for the micro-kernel:
/// panels of `mr` rows (the last padded with zeros), `[panel][col][mr]`.
fn pack(rows: usize, cols: usize, mr: usize, f: impl Fn(usize, usize) -> f64) -> Box<[f32]> {
    let panels = rows.div_ceil(mr);
    let mut out = vec![0.0f32; panels * cols * mr];
    for r in 0..rows {
        for c in 0..cols {
            out[((r / mr) * cols + c) * mr + r % mr] = f(r, c) as f32;
        }
    }
    out.into_boxed_slice()
}

/// Where rows go: the output tensor, or an epilogue.
#[derive(Clone, Copy)]
enum Dest<'a> {
    Stored(OutPtr),
    Sink(&'a dyn RowSink),
}

/// The output pointer, shared by the tile tasks (each writes only its own rows).
#[derive(Clone, Copy)]
struct OutPtr(*mut f32);
// SAFETY: tasks write disjoint elements through it (see `run_tiles`).
unsafe impl Send for OutPtr {}
// SAFETY: as above.
unsafe impl Sync for OutPtr {}

impl OutPtr {
    /// The element `offset` past the start (not dereferenced here).
    fn at(self, offset: usize) -> *mut f32 {
        self.0.wrapping_add(offset)
    }
}

/// The registration: stride 1, a dilated filter within the transform
/// lengths; the weights, fed or constant, are read in place.
pub(super) const ENTRY: Entry = Entry {
    name: "fft_gemm",
    applies,
    cost,
    serial: SERIAL,
    takes_fed_weights: true,
    prepare: |g, _, isa| Some(Box::new(FftGemmConv::prepare(g, isa))),
};

/// Fuses an epilogue into its rows' stores; its input is transformed from
/// stored rows only.
impl ConvAlgorithm for FftGemmConv {
    fn scratch_per_thread(&self) -> usize {
        FftGemmConv::scratch_per_thread(self)
    }

    fn shared_scratch(&self, max: &Conv1dGeometry) -> usize {
        FftGemmConv::shared_scratch(self, max.params.groups)
    }

    fn prepared_bytes(&self) -> usize {
        FftGemmConv::prepared_bytes(self)
    }

    fn fuses_output(&self) -> bool {
        true
    }

    fn rows_scratch(&self, _max: &Conv1dGeometry, _x_temps: usize, y_temps: usize) -> usize {
        FftGemmConv::rows_scratch(self, y_temps)
    }

    fn run(
        &self,
        g: &Conv1dGeometry,
        x: &[f32],
        w: &[f32],
        bias: Option<&[f32]>,
        y: &mut [f32],
        scratch: &Scratch,
    ) {
        FftGemmConv::run(self, g, x, w, bias, y, scratch);
    }

    fn run_rows(
        &self,
        g: &Conv1dGeometry,
        x: RowsIn,
        w: &[f32],
        bias: Option<&[f32]>,
        y: RowsOut,
        scratch: &Scratch,
    ) -> Result<(), NotFusable> {
        match (x, y) {
            (RowsIn::Slice(x), RowsOut::Fused(sink)) => {
                self.run_into(g, x, w, bias, sink, scratch);
                Ok(())
            }
            _ => Err(NotFusable),
        }
    }
}

#[cfg(test)]
mod tests;
