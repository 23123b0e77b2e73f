//! The AVX-512 engine of the FFT convolution: 32 rows per transform, one
//! per SIMD lane, in a complex FFT of our own.
//!
//! # Method
//!
//! A *group* is up to 32 consecutive channels of one batch element. Their
//! segments (see the parent module's overlap-save) are transposed into one
//! buffer of `M` positions, each holding 16 lanes of real parts (channels
//! `0..16` of the group) and 16 lanes of imaginary parts (channels
//! `16..32`): 16 complex signals `z = x_a + i x_b`, each carrying two real
//! rows. Every transform step is then the same operation on all lanes, so
//! the FFT is written like a scalar one on 16-wide vectors, with no
//! shuffles; the twiddles are broadcast scalars.
//!
//! * **Forward**: decimation in frequency, radix 4 (one radix-2 step at the
//!   bottom when `log2 M` is odd), depth first: stages on sub-transforms of
//!   at most [`ITER_MAX`] positions (32 KiB, in L1) run breadth first.
//!   The output is in bit-reversed order, which is never undone.
//! * **Pointwise**: with `Z = FFT(x_a + i x_b)`, the real rows' spectra are
//!   `X_a = (Z[k] + conj Z[-k]) / 2` and `X_b = (Z[k] - conj Z[-k]) / 2i`,
//!   so `X_a G_a + i X_b G_b = Z[k] A[k] + conj(Z[-k]) B[k]` with
//!   `A = (G_a + G_b) / 2`, `B = (G_a - G_b) / 2` and `G = conj(H) / M`.
//!   Bins `k` and `-k` are processed together (at bit-reversed positions `p`
//!   and `3 * 2^j - 1 - p` within the octave `2^j <= p < 2^(j+1)`), from one
//!   stored `(A, B)` per pair: `A[-k] = conj A[k]`, and likewise `B`.
//! * **Inverse**: the forward stages undone in reverse order with conjugate
//!   twiddles (decimation in time from bit-reversed input), which yields
//!   `M * IFFT` in natural order: `y_a + i y_b`, both rows' outputs.
//!
//! Work per row is a complex transform of `M / 2` each way, like a real FFT,
//! without realfft's pre- and post-processing passes or any reordering.
//!
//! # Prepared data and scratch
//!
//! Per group, `M / 2 + 1` pairs of `(A, B)`, 16 lanes each: the same
//! `8 * (M / 2 + 1)` bytes per channel as the realfft engine's spectra (a
//! partial last group pads with zero lanes). Per thread, the buffer of
//! `M` positions (`128 * M` bytes) and 64 bytes of alignment slack.
//!
//! # Fusion
//!
//! [`LanesConv::run_into`] takes the input from a prologue and / or hands
//! the output to an epilogue ([`crate::fused`]): a block's segment is
//! computed 16 rows of [`SINK_CHUNK`] positions at a time into a staging
//! block and transposed in from there, and its outputs are transposed out
//! into that block and handed over likewise, while in cache. Nothing of the
//! input or output but the stored operands and result touches memory (the
//! Hyena block: no arena at all). Scratch grows by the staging block (32
//! KiB) and the programs' line temporaries.

#![allow(unsafe_code)]
#![warn(clippy::undocumented_unsafe_blocks, unsafe_op_in_unsafe_fn)]

use std::arch::x86_64::*;

use num_complex::Complex;
use rayon::prelude::*;
use rustconv_fft_plans::Planner;

use super::super::params::Conv1dGeometry;
use crate::fused::{block_tmp, RowSink, RowSource, RowsIn, RowsOut};
use crate::scratch::Scratch;
use crate::simd::{Backend, Isa};

/// Lanes of one vector.
const LANES: usize = 16;
/// Channels per group: 16 in the real parts, 16 in the imaginary parts.
pub(crate) const GROUP: usize = 2 * LANES;
/// `f32`s per buffer position: 16 real parts, then 16 imaginary parts.
const POS: usize = 2 * LANES;
/// `f32`s per stored pair: `A.re`, `A.im`, `B.re`, `B.im`, 16 lanes each.
const PAIR: usize = 4 * LANES;
/// Sub-transforms of at most this many positions run breadth first.
const ITER_MAX: usize = 256;
/// The shortest transform (one transposed tile).
pub(crate) const MIN_LEN: usize = LANES;

/// Whether the engine runs on `backend` (AVX-512 F).
pub(crate) fn runs_on(backend: Backend) -> bool {
    backend == Backend::Avx512
}

/// Whether the engine takes transforms of length `m`.
pub(crate) fn supports(m: usize) -> bool {
    m.is_power_of_two() && m >= MIN_LEN
}

/// Bit reversal of `p` over `bits` bits.
fn bitrev(p: usize, bits: u32) -> usize {
    if bits == 0 {
        0
    } else {
        p.reverse_bits() >> (usize::BITS - bits)
    }
}

/// The positions `(p, partner)` of each stored pair, in storage order:
/// the self-paired bins 0 (position 0) and `M / 2` (position 1), then each
/// octave's first half with its mirror image.
fn pairs(m: usize) -> impl Iterator<Item = (usize, usize)> {
    let octaves = std::iter::successors(Some(2usize), |&o| Some(2 * o)).take_while(move |&o| o < m);
    [(0, 0), (1, 1)]
        .into_iter()
        .chain(octaves.flat_map(|o| (o..o + o / 2).map(move |p| (p, 3 * o - 1 - p))))
}

/// Outputs per block for length `m` and span `span`: `M - L + 1`, rounded
/// down to a multiple of 16 where that leaves at least 16, so that blocks
/// after an aligned first one store whole cache lines (see `run_task`).
pub(crate) fn block(m: usize, span: usize) -> usize {
    let valid = m - span + 1;
    if valid >= LANES {
        valid / LANES * LANES
    } else {
        valid
    }
}

/// Stored pairs per group, `M / 2 + 1`.
fn pair_count(m: usize) -> usize {
    m / 2 + 1
}

/// A depthwise convolution prepared for this engine (see the module docs).
pub(crate) struct LanesConv {
    /// FFT length `M`.
    m: usize,
    /// Filter span `L`.
    span: usize,
    /// Outputs per block, [`block`].
    block: usize,
    /// Groups per batch element, `ceil(channels / 32)`.
    groups: usize,
    /// Radix-4 twiddles of each stage length `n >= 8`, indexed by `log2 n`:
    /// `w^j, w^2j, w^3j` (re, im) for `j < n / 4`, `w = exp(-2 pi i / n)`.
    twiddles: Vec<Vec<f32>>,
    /// `[groups, M / 2 + 1, 4, 16]`: the `(A, B)` pairs.
    spectra: Vec<f32>,
}

impl LanesConv {
    /// Plans length `m` (see [`supports`]) for `g` and computes every
    /// group's spectra from the dilated filters in `w`, to run on `isa`;
    /// `None` where the engine does not run on it ([`runs_on`]). A
    /// `LanesConv` thus exists only for an [`Isa`] with AVX-512 F, which an
    /// `Isa` names only where this CPU has it: what its runs' unsafe code
    /// relies on.
    pub(crate) fn prepare(
        isa: Isa,
        g: &Conv1dGeometry,
        w: &[f32],
        m: usize,
        span: usize,
    ) -> Option<Self> {
        if !runs_on(isa.backend()) {
            return None;
        }
        assert!(supports(m) && m >= span, "length {m} for span {span}");
        let p = &g.params;
        let channels = p.in_channels;
        let groups = channels.div_ceil(GROUP);

        let mut twiddles = vec![Vec::new(); m.trailing_zeros() as usize + 1];
        let mut n = m;
        while n >= 8 {
            let twiddle = |t: usize| {
                let a = -2.0 * std::f64::consts::PI * t as f64 / n as f64;
                [a.cos() as f32, a.sin() as f32]
            };
            twiddles[n.trailing_zeros() as usize] = (0..n / 4)
                .flat_map(|j| [twiddle(j), twiddle(2 * j), twiddle(3 * j)])
                .flatten()
                .collect();
            n /= 4;
        }

        let forward = Planner::new().forward(m);
        let bins = m / 2 + 1;
        let bits = m.trailing_zeros();
        let scale = 1.0 / m as f32;
        let per_group = pair_count(m) * PAIR;
        let mut spectra = vec![0.0; groups * per_group];
        spectra.par_chunks_mut(per_group).enumerate().for_each_init(
            || {
                (
                    forward.make_input_vec(),
                    forward.make_scratch_vec(),
                    vec![Complex::<f32>::default(); GROUP * bins],
                )
            },
            |(filter, fft_scratch, h), (group, out)| {
                // conj(FFT(h)) / M of each channel of the group (zero
                // for lanes past the last channel).
                h.fill(Complex::default());
                for (lane, spectrum) in h.chunks_exact_mut(bins).enumerate() {
                    let c = group * GROUP + lane;
                    if c >= channels {
                        break;
                    }
                    filter.fill(0.0);
                    for (k, &tap) in w[c * p.kernel_size..][..p.kernel_size].iter().enumerate() {
                        filter[k * p.dilation] = tap;
                    }
                    forward
                        .process_with_scratch(filter, spectrum, fft_scratch)
                        .expect("buffers sized by the plan");
                    for bin in spectrum.iter_mut() {
                        *bin = bin.conj() * scale;
                    }
                }
                let g_at = |lane: usize, k: usize| {
                    if k < bins {
                        h[lane * bins + k]
                    } else {
                        h[lane * bins + m - k].conj()
                    }
                };
                for ((p, _), entry) in pairs(m).zip(out.chunks_exact_mut(PAIR)) {
                    let k = bitrev(p, bits);
                    for lane in 0..LANES {
                        let (ga, gb) = (g_at(lane, k), g_at(LANES + lane, k));
                        let (a, b) = ((ga + gb) * 0.5, (ga - gb) * 0.5);
                        entry[lane] = a.re;
                        entry[LANES + lane] = a.im;
                        entry[2 * LANES + lane] = b.re;
                        entry[3 * LANES + lane] = b.im;
                    }
                }
            },
        );

        Some(LanesConv {
            m,
            span,
            block: block(m, span),
            groups,
            twiddles,
            spectra,
        })
    }

    /// `f32` elements of scratch per thread.
    pub(crate) fn scratch_per_thread(&self) -> usize {
        POS * (self.m + LANES) + LANES
    }

    /// Bytes of the prepared spectra.
    pub(crate) fn prepared_bytes(&self) -> usize {
        std::mem::size_of_val(self.spectra.as_slice())
    }

    /// `f32` elements of scratch per thread for [`Self::run_into`] with a
    /// sink needing `y_temps` line-sized temporaries: the transform buffer,
    /// a staging block of [`LANES`] rows of [`SINK_CHUNK`] outputs, and the
    /// sink's temporaries.
    pub(crate) fn rows_scratch(&self, y_temps: usize) -> usize {
        self.scratch_per_thread() + LANES * SINK_CHUNK + block_tmp(y_temps, SINK_CHUNK)
    }

    /// Computes `y` for `g` in parallel on the current rayon pool.
    pub(crate) fn run(
        &self,
        g: &Conv1dGeometry,
        x: &[f32],
        bias: Option<&[f32]>,
        y: &mut [f32],
        scratch: &Scratch,
    ) {
        assert_eq!(y.len(), g.output_elems);
        self.run_dest(
            g,
            Input::Stored(x),
            bias,
            Dest::Stored(OutPtr(y.as_mut_ptr())),
            scratch,
        )
    }

    /// [`Self::run`] with the output handed to `sink` (an epilogue) in
    /// blocks of [`LANES`] rows of [`SINK_CHUNK`] outputs as each block of
    /// the transform is finished, while they are in cache. `scratch` needs
    /// [`Self::rows_scratch`] elements per thread.
    pub(crate) fn run_into(
        &self,
        g: &Conv1dGeometry,
        x: RowsIn,
        bias: Option<&[f32]>,
        y: RowsOut,
        scratch: &Scratch,
    ) {
        let input = match x {
            RowsIn::Slice(x) => Input::Stored(x),
            RowsIn::Fused(src) => Input::Fused(src),
        };
        let (dest, y_temps) = match y {
            RowsOut::Slice(y) => {
                assert_eq!(y.len(), g.output_elems);
                (Dest::Stored(OutPtr(y.as_mut_ptr())), 0)
            }
            RowsOut::Fused(sink) => (Dest::Sink(sink), sink.temporaries()),
        };
        let temps = x.temporaries().max(y_temps);
        assert!(scratch.per_thread() >= self.rows_scratch(temps));
        self.run_dest(g, input, bias, dest, scratch)
    }

    fn run_dest(
        &self,
        g: &Conv1dGeometry,
        x: Input,
        bias: Option<&[f32]>,
        out: Dest,
        scratch: &Scratch,
    ) {
        let p = &g.params;
        if let Input::Stored(x) = x {
            assert_eq!(x.len(), g.input_elems);
        }
        assert!(bias.is_none_or(|b| b.len() == p.out_channels));
        let tasks = p.batch * self.groups;
        if tasks == 0 || g.out_len == 0 {
            return;
        }
        // With fewer groups than threads, split their blocks into runs
        // (about two tasks per thread). Runs start at multiples of the
        // block, so the result does not depend on the split.
        let blocks = g.out_len.div_ceil(self.block);
        let threads = crate::par::threads();
        let splits = if tasks >= threads {
            1
        } else {
            (2 * threads).div_ceil(tasks).min(blocks)
        };
        let run_len = blocks.div_ceil(splits) * self.block;
        let splits = g.out_len.div_ceil(run_len);
        crate::par::for_each(tasks * splits, |task| {
            let (group, run) = (task / splits, task % splits);
            let first = run * run_len;
            let end = (first + run_len).min(g.out_len);
            scratch.with_slot(|s| {
                // SAFETY: AVX-512 F is present (`prepare` had an `Isa` with it); a stored
                // `out` is valid for `output_elems` (asserted by `run`) and
                // this task writes only its group's rows at outputs
                // `first .. end`, which no other task writes (a sink is
                // handed exactly those); `s` holds `scratch_per_thread`
                // values (checked by the caller, `PreparedConv1d::run`),
                // `rows_scratch` with a sink (asserted by `run_into`).
                unsafe { self.run_task(g, x, bias, out, group, first, end, s) }
            });
        });
    }

    /// Outputs `first .. end` (`first` a multiple of the block) of the rows
    /// of `group` (counted over batch elements), block by block.
    ///
    /// # Safety
    /// AVX-512 F must be present; `out` must be valid for writing `g`'s
    /// output, with no one else accessing these rows and outputs; `s` must
    /// hold [`Self::scratch_per_thread`] values.
    #[allow(clippy::too_many_arguments)]
    #[target_feature(enable = "avx512f")]
    unsafe fn run_task(
        &self,
        g: &Conv1dGeometry,
        x: Input,
        bias: Option<&[f32]>,
        out: Dest,
        group: usize,
        first: usize,
        end: usize,
        s: &mut [f32],
    ) {
        let p = &g.params;
        let (m, channels) = (self.m, p.in_channels);
        let (in_len, out_len, pad_left) = (p.in_len, g.out_len, p.pad_left);
        let (b, gi) = (group / self.groups, group % self.groups);
        let c0 = gi * GROUP;
        let rows = (channels - c0).min(GROUP);
        let row0 = b * channels + c0;
        let spectra = &self.spectra[gi * pair_count(m) * PAIR..][..pair_count(m) * PAIR];
        assert!(s.len() >= self.scratch_per_thread());
        // Align the buffer to 64 bytes (the slack is LANES values). It has
        // LANES positions past m, which output tiles may read (and ignore).
        let skip = s.as_ptr().align_offset(64).min(LANES);
        let (buf, sink_buf) = s[skip..].split_at_mut(POS * (m + LANES));
        let bp = buf.as_mut_ptr();
        let bias_of = |lane: usize| match bias {
            Some(bias) if lane < rows => bias[c0 + lane],
            _ => 0.0,
        };

        let mut l0 = first;
        while l0 < end {
            let len = self.block.min(end - l0);
            // Segment position t reads input sample l0 + t - pad_left; the
            // block's outputs read positions t < len + span - 1.
            let start = l0 as isize - pad_left as isize;
            let need = (len + self.span - 1) as isize;
            if let (Dest::Sink(sink), true) = (out, start + need <= 0 || start >= in_len as isize) {
                // Only padding under this block: the bias alone, through
                // the sink.
                let (values, tmp) = sink_buf.split_at_mut(len);
                for lane in 0..rows {
                    values.fill(bias_of(lane));
                    sink.store(row0 + lane, l0, values, tmp);
                }
                l0 += len;
                continue;
            }
            let out = match out {
                Dest::Stored(out) => out,
                Dest::Sink(sink) => {
                    // SAFETY: as below (`bp` is aligned and sized for the
                    // transform; the rows are the group's).
                    unsafe { self.transform(spectra, x, start, in_len, row0, rows, bp, sink_buf) };
                    // SAFETY: AVX-512 F is present; `bp` holds the block's
                    // outputs at positions < len (whole tiles read at most
                    // LANES positions past, within the slack).
                    unsafe { self.hand_over(sink, bp, row0, rows, l0, len, &bias_of, sink_buf) };
                    l0 += len;
                    continue;
                }
            };
            if start + need <= 0 || start >= in_len as isize {
                // Only padding under this block: the bias alone.
                for lane in 0..rows {
                    let row = (row0 + lane) * out_len;
                    // SAFETY: the row's outputs l0 .. l0 + len are ours.
                    unsafe { std::slice::from_raw_parts_mut(out.0.add(row + l0), len) }
                        .fill(bias_of(lane));
                }
                l0 += len;
                continue;
            }
            // SAFETY: AVX-512 F is present; every position t < m of the
            // buffer is written before the transforms read it, and tiles
            // touch at most LANES positions past m, within the buffer's
            // slack; input reads are masked to samples 0 .. in_len of rows
            // that exist; output writes are masked to outputs l0 .. l0 +
            // len of rows that exist, within this task's range.
            unsafe {
                self.transform(spectra, x, start, in_len, row0, rows, bp, sink_buf);

                // Output tiles start where the rows' outputs are 64-byte
                // aligned (whole tiles read at most LANES positions past
                // len <= m, within the slack), when all rows share an alignment (out_len a
                // multiple of 16), so that stores fill whole cache lines:
                // a masked first tile up to there, then whole tiles.
                let dst0 = out.0.add(row0 * out_len + l0);
                let lead = if out_len % LANES == 0 {
                    dst0.align_offset(64).min(LANES) % LANES
                } else {
                    0
                };
                let tiles = std::iter::once(0)
                    .filter(|_| lead > 0)
                    .chain((lead..len).step_by(LANES));
                for t in tiles {
                    let count = if t == 0 && lead > 0 {
                        lead.min(len)
                    } else {
                        (len - t).min(LANES)
                    };
                    let mask = ((1u32 << count) - 1) as u16;
                    for half in 0..2 {
                        let mut tile = [_mm512_setzero_ps(); LANES];
                        for (i, v) in tile.iter_mut().enumerate() {
                            *v = _mm512_load_ps(bp.add(POS * (t + i) + half * LANES));
                        }
                        transpose16(&mut tile);
                        for (lane, v) in tile.iter().enumerate() {
                            let lane = half * LANES + lane;
                            if lane >= rows {
                                break;
                            }
                            let v = _mm512_add_ps(*v, _mm512_set1_ps(bias_of(lane)));
                            let dst = out.0.add((row0 + lane) * out_len + l0 + t);
                            if count == LANES {
                                _mm512_storeu_ps(dst, v);
                            } else {
                                _mm512_mask_storeu_ps(dst, mask, v);
                            }
                        }
                    }
                }
            }
            l0 += len;
        }
    }

    /// Reads the segment of `m` positions from `start` of the group's
    /// `rows` rows from `row0` (zeros outside the input) into `bp`,
    /// transformed, multiplied by the spectra and transformed back: the
    /// block's outputs at positions `0 .. len`, [`POS`] values apart.
    ///
    /// # Safety
    /// AVX-512 F must be present; `bp` must be 64-byte aligned and valid
    /// for `POS * (m + LANES)` values; rows `row0 .. row0 + rows` must be
    /// rows of `x` (`in_len` samples each) of the group whose spectra
    /// `spectra` holds.
    #[target_feature(enable = "avx512f")]
    #[allow(clippy::too_many_arguments)]
    unsafe fn transform(
        &self,
        spectra: &[f32],
        x: Input,
        start: isize,
        in_len: usize,
        row0: usize,
        rows: usize,
        bp: *mut f32,
        stage: &mut [f32],
    ) {
        let x = match x {
            Input::Stored(x) => x,
            Input::Fused(src) => {
                // SAFETY: the caller's contract, passed on.
                unsafe { self.stage_input(src, start, in_len, row0, rows, bp, stage) };
                // SAFETY: as below: every position t < m was written.
                unsafe {
                    self.forward(bp, self.m);
                    pointwise(bp, self.m, spectra.as_ptr());
                    self.inverse(bp, self.m);
                }
                return;
            }
        };
        let m = self.m;
        // SAFETY: input reads are masked to samples 0 .. in_len of rows
        // that exist; every position t < m of the buffer is written before
        // the transforms read it, and tiles touch at most LANES positions
        // past m, within the buffer's slack (the caller's contract).
        unsafe {
            // Input tiles start where the rows' samples are 64-byte
            // aligned when all rows share an alignment (in_len a
            // multiple of 16), after an unaligned first tile that the
            // next one overlaps (same values), so that loads do not
            // split cache lines. The last tile may run past m, into
            // the slack positions.
            let src0 = (x.as_ptr() as usize)
                .wrapping_add(4 * row0 * in_len)
                .wrapping_add_signed(4 * start);
            let lead = if in_len.is_multiple_of(LANES) {
                (64 - src0 % 64) % 64 / 4
            } else {
                0
            };
            let tiles = std::iter::once(0)
                .filter(|_| lead > 0)
                .chain((lead..m).step_by(LANES));
            for half in 0..2 {
                for t in tiles.clone() {
                    let mut tile = [_mm512_setzero_ps(); LANES];
                    let at = start + t as isize;
                    let lo = (-at).clamp(0, LANES as isize) as u32;
                    let hi = (in_len as isize - at).clamp(0, LANES as isize) as u32;
                    if lo < hi {
                        let mask = (((1u32 << hi) - 1) & !((1u32 << lo) - 1)) as u16;
                        for (lane, v) in tile.iter_mut().enumerate() {
                            let lane = half * LANES + lane;
                            if lane >= rows {
                                break;
                            }
                            let row = x.as_ptr().add((row0 + lane) * in_len);
                            let src = row.wrapping_offset(at);
                            *v = if mask == u16::MAX {
                                _mm512_loadu_ps(src)
                            } else {
                                _mm512_maskz_loadu_ps(mask, src)
                            };
                        }
                        transpose16(&mut tile);
                    }
                    for (i, v) in tile.iter().enumerate() {
                        _mm512_store_ps(bp.add(POS * (t + i) + half * LANES), *v);
                    }
                }
            }
            self.forward(bp, m);
            pointwise(bp, m, spectra.as_ptr());
            self.inverse(bp, m);
        }
    }

    /// Writes the segment of `m` positions from sample `start` of rows
    /// `row0 .. row0 + rows`, computed by `src` (a prologue) [`SINK_CHUNK`]
    /// positions of [`LANES`] rows at a time into `stage` (followed by the
    /// program's temporaries), zeros outside samples `0 .. in_len`, into
    /// `bp` as [`Self::transform`] lays it out.
    ///
    /// # Safety
    /// AVX-512 F must be present; `bp` must be 64-byte aligned and valid
    /// for `POS * (m + LANES)` values.
    #[allow(clippy::too_many_arguments)]
    #[target_feature(enable = "avx512f")]
    unsafe fn stage_input(
        &self,
        src: &dyn RowSource,
        start: isize,
        in_len: usize,
        row0: usize,
        rows: usize,
        bp: *mut f32,
        stage: &mut [f32],
    ) {
        let (stage, tmp) = stage.split_at_mut(LANES * SINK_CHUNK);
        let m = self.m;
        for half in 0..2 {
            let lanes = rows.saturating_sub(half * LANES).min(LANES);
            for c0 in (0..m).step_by(SINK_CHUNK) {
                let n = SINK_CHUNK.min(m - c0);
                // Samples s0 .. s0 + n; those in lo .. hi exist.
                let s0 = start + c0 as isize;
                let lo = s0.clamp(0, in_len as isize);
                let hi = (s0 + n as isize).clamp(0, in_len as isize);
                let len = (hi - lo) as usize;
                if len > 0 && lanes > 0 {
                    src.fill_rows(
                        row0 + half * LANES,
                        lanes,
                        lo as usize,
                        len,
                        &mut stage[..lanes * len],
                        tmp,
                    );
                }
                for t in (0..n).step_by(LANES) {
                    let mut tile = [_mm512_setzero_ps(); LANES];
                    let at = s0 + t as isize;
                    let a = (lo - at).clamp(0, LANES as isize) as u32;
                    let b = (hi - at).clamp(0, LANES as isize) as u32;
                    if a < b && lanes > 0 {
                        let mask = (((1u64 << b) - 1) & !((1u64 << a) - 1)) as u16;
                        for (lane, v) in tile.iter_mut().enumerate().take(lanes) {
                            // Position `at` of this row is stage element
                            // lane * len + (at - lo); the mask selects
                            // samples lo .. hi, elements 0 .. len of it.
                            let p = stage
                                .as_ptr()
                                .wrapping_add(lane * len)
                                .wrapping_offset(at - lo);
                            // SAFETY: the masked load reads only the
                            // selected elements, all within the row.
                            *v = unsafe { _mm512_maskz_loadu_ps(mask, p) };
                        }
                        // SAFETY: AVX-512 F is present.
                        unsafe { transpose16(&mut tile) };
                    }
                    for (i, v) in tile.iter().enumerate() {
                        // SAFETY: position c0 + t + i < m; the buffer holds
                        // POS values (64-byte aligned) per position.
                        unsafe { _mm512_store_ps(bp.add(POS * (c0 + t + i) + half * LANES), *v) };
                    }
                }
            }
        }
    }

    /// Hands the block's outputs `0 .. len` in `bp` (plus the bias) to
    /// `sink`, [`LANES`] rows of [`SINK_CHUNK`] outputs at a time, staged
    /// row-major in `stage` (followed by the sink's temporaries).
    ///
    /// # Safety
    /// AVX-512 F must be present; `bp` must be 64-byte aligned and hold
    /// the block (`POS * (m + LANES)` values, `len <= m`).
    #[allow(clippy::too_many_arguments)]
    #[target_feature(enable = "avx512f")]
    unsafe fn hand_over(
        &self,
        sink: &dyn RowSink,
        bp: *const f32,
        row0: usize,
        rows: usize,
        l0: usize,
        len: usize,
        bias_of: &dyn Fn(usize) -> f32,
        stage: &mut [f32],
    ) {
        let (stage, tmp) = stage.split_at_mut(LANES * SINK_CHUNK);
        for half in 0..2 {
            let lanes = rows.saturating_sub(half * LANES).min(LANES);
            if lanes == 0 {
                break;
            }
            for c0 in (0..len).step_by(SINK_CHUNK) {
                let n = SINK_CHUNK.min(len - c0);
                for t in (0..n).step_by(LANES) {
                    let count = (n - t).min(LANES);
                    let mut tile = [_mm512_setzero_ps(); LANES];
                    for (i, v) in tile.iter_mut().enumerate() {
                        // SAFETY: position c0 + t + i < len + LANES <= m +
                        // LANES, within the buffer (aligned: POS values of
                        // 64 bytes apart, half * LANES values in).
                        *v = unsafe { _mm512_load_ps(bp.add(POS * (c0 + t + i) + half * LANES)) };
                    }
                    // SAFETY: AVX-512 F is present (this function's contract).
                    unsafe { transpose16(&mut tile) };
                    let mask = ((1u32 << count) - 1) as u16;
                    for (lane, v) in tile.iter().enumerate().take(lanes) {
                        let v = _mm512_add_ps(*v, _mm512_set1_ps(bias_of(half * LANES + lane)));
                        let row = &mut stage[lane * n..][..n];
                        // SAFETY: the masked store writes `count` values at
                        // t .. t + count <= n of this row of the stage.
                        unsafe { _mm512_mask_storeu_ps(row.as_mut_ptr().add(t), mask, v) };
                    }
                }
                sink.store_rows(
                    row0 + half * LANES,
                    lanes,
                    l0 + c0,
                    n,
                    &mut stage[..lanes * n],
                    tmp,
                );
            }
        }
    }

    /// Stage twiddles of length `n`.
    fn twiddles(&self, n: usize) -> *const f32 {
        self.twiddles[n.trailing_zeros() as usize].as_ptr()
    }

    /// In-place forward transform of the `n` positions at `b` (natural
    /// order in, bit-reversed out).
    ///
    /// # Safety
    /// AVX-512 F present; `b` valid for `n` positions, 64-byte aligned.
    #[target_feature(enable = "avx512f")]
    unsafe fn forward(&self, b: *mut f32, n: usize) {
        // SAFETY: every access stays within the n positions at b.
        unsafe {
            if n > ITER_MAX {
                radix4_forward(b, n, self.twiddles(n));
                for quarter in 0..4 {
                    self.forward(b.add(POS * quarter * (n / 4)), n / 4);
                }
                return;
            }
            let mut s = n;
            while s >= 8 {
                let tw = self.twiddles(s);
                for sub in 0..n / s {
                    radix4_forward(b.add(POS * sub * s), s, tw);
                }
                s /= 4;
            }
            match s {
                4 => base4_forward(b, n),
                2 => base2(b, n),
                _ => {}
            }
        }
    }

    /// The inverse of [`Self::forward`] times `n`: bit-reversed in,
    /// natural order out.
    ///
    /// # Safety
    /// As [`Self::forward`].
    #[target_feature(enable = "avx512f")]
    unsafe fn inverse(&self, b: *mut f32, n: usize) {
        // SAFETY: every access stays within the n positions at b.
        unsafe {
            if n > ITER_MAX {
                for quarter in 0..4 {
                    self.inverse(b.add(POS * quarter * (n / 4)), n / 4);
                }
                radix4_inverse(b, n, self.twiddles(n));
                return;
            }
            // The forward's stage lengths, smallest first.
            let mut stages = [0usize; usize::BITS as usize / 2];
            let mut count = 0;
            let mut s = n;
            while s >= 8 {
                stages[count] = s;
                count += 1;
                s /= 4;
            }
            match s {
                4 => base4_inverse(b, n),
                2 => base2(b, n),
                _ => {}
            }
            for &s in stages[..count].iter().rev() {
                let tw = self.twiddles(s);
                for sub in 0..n / s {
                    radix4_inverse(b.add(POS * sub * s), s, tw);
                }
            }
        }
    }
}

/// The output pointer shared by the tasks, which write disjoint parts.
#[derive(Clone, Copy)]
struct OutPtr(*mut f32);

/// Where a task's inputs come from: stored, or computed by a prologue.
#[derive(Clone, Copy)]
enum Input<'a> {
    Stored(&'a [f32]),
    Fused(&'a dyn RowSource),
}

/// Where a task's outputs go: stored, or handed to an epilogue.
#[derive(Clone, Copy)]
enum Dest<'a> {
    Stored(OutPtr),
    Sink(&'a dyn RowSink),
}

/// Outputs per row a sink is handed at a time by [`LanesConv::run_into`].
const SINK_CHUNK: usize = 512;
// SAFETY: tasks only write disjoint ranges through it (see `run`).
unsafe impl Send for OutPtr {}
// SAFETY: as above.
unsafe impl Sync for OutPtr {}

/// A complex vector: 16 real parts and 16 imaginary parts.
type Cv = (__m512, __m512);

// The helpers below are only inlined into `#[target_feature(enable =
// "avx512f")]` functions, whose callers guarantee AVX-512 F.

/// # Safety
/// AVX-512 F present; `p` valid for one position, 64-byte aligned.
#[inline(always)]
unsafe fn load(p: *const f32) -> Cv {
    // SAFETY: by the contract.
    unsafe { (_mm512_load_ps(p), _mm512_load_ps(p.add(LANES))) }
}

/// # Safety
/// As [`load`], for writing.
#[inline(always)]
unsafe fn store(p: *mut f32, v: Cv) {
    // SAFETY: by the contract.
    unsafe {
        _mm512_store_ps(p, v.0);
        _mm512_store_ps(p.add(LANES), v.1);
    }
}

/// # Safety
/// AVX-512 F present.
#[inline(always)]
unsafe fn add(a: Cv, b: Cv) -> Cv {
    // SAFETY: by the contract.
    unsafe { (_mm512_add_ps(a.0, b.0), _mm512_add_ps(a.1, b.1)) }
}

/// # Safety
/// AVX-512 F present.
#[inline(always)]
unsafe fn sub(a: Cv, b: Cv) -> Cv {
    // SAFETY: by the contract.
    unsafe { (_mm512_sub_ps(a.0, b.0), _mm512_sub_ps(a.1, b.1)) }
}

/// `a - i b`.
///
/// # Safety
/// AVX-512 F present.
#[inline(always)]
unsafe fn sub_i(a: Cv, b: Cv) -> Cv {
    // SAFETY: by the contract.
    unsafe { (_mm512_add_ps(a.0, b.1), _mm512_sub_ps(a.1, b.0)) }
}

/// `a + i b`.
///
/// # Safety
/// AVX-512 F present.
#[inline(always)]
unsafe fn add_i(a: Cv, b: Cv) -> Cv {
    // SAFETY: by the contract.
    unsafe { (_mm512_sub_ps(a.0, b.1), _mm512_add_ps(a.1, b.0)) }
}

/// `x * w` with `w = (re, im)` at `w`, broadcast.
///
/// # Safety
/// AVX-512 F present; `w` valid for two values.
#[inline(always)]
unsafe fn mul(x: Cv, w: *const f32) -> Cv {
    // SAFETY: by the contract.
    unsafe {
        let (wr, wi) = (_mm512_set1_ps(*w), _mm512_set1_ps(*w.add(1)));
        (
            _mm512_fmsub_ps(x.0, wr, _mm512_mul_ps(x.1, wi)),
            _mm512_fmadd_ps(x.0, wi, _mm512_mul_ps(x.1, wr)),
        )
    }
}

/// `x * conj(w)` with `w` as in [`mul`].
///
/// # Safety
/// As [`mul`].
#[inline(always)]
unsafe fn mul_conj(x: Cv, w: *const f32) -> Cv {
    // SAFETY: by the contract.
    unsafe {
        let (wr, wi) = (_mm512_set1_ps(*w), _mm512_set1_ps(*w.add(1)));
        (
            _mm512_fmadd_ps(x.0, wr, _mm512_mul_ps(x.1, wi)),
            _mm512_fmsub_ps(x.1, wr, _mm512_mul_ps(x.0, wi)),
        )
    }
}

/// One radix-4 decimation-in-frequency stage on the `n` positions at `b`
/// (two radix-2 stages fused, so the order stays bit-reversed).
///
/// # Safety
/// AVX-512 F present; `b` valid for `n` aligned positions; `tw` holds the
/// stage's `6 * n / 4` twiddles.
#[inline(always)]
unsafe fn radix4_forward(b: *mut f32, n: usize, tw: *const f32) {
    let q = n / 4;
    // SAFETY: positions j + k * q < n; twiddles 6 j + 5 < 6 q.
    unsafe {
        for j in 0..q {
            let p0 = b.add(POS * j);
            let (p1, p2, p3) = (p0.add(POS * q), p0.add(2 * POS * q), p0.add(3 * POS * q));
            let (a0, a1, a2, a3) = (load(p0), load(p1), load(p2), load(p3));
            let (t0, t1) = (add(a0, a2), sub(a0, a2));
            let (t2, t3) = (add(a1, a3), sub(a1, a3));
            let w = tw.add(6 * j);
            store(p0, add(t0, t2));
            store(p1, mul(sub(t0, t2), w.add(2)));
            store(p2, mul(sub_i(t1, t3), w));
            store(p3, mul(add_i(t1, t3), w.add(4)));
        }
    }
}

/// The inverse of [`radix4_forward`] times 4.
///
/// # Safety
/// As [`radix4_forward`].
#[inline(always)]
unsafe fn radix4_inverse(b: *mut f32, n: usize, tw: *const f32) {
    let q = n / 4;
    // SAFETY: as in radix4_forward.
    unsafe {
        for j in 0..q {
            let p0 = b.add(POS * j);
            let (p1, p2, p3) = (p0.add(POS * q), p0.add(2 * POS * q), p0.add(3 * POS * q));
            let w = tw.add(6 * j);
            let c0 = load(p0);
            let d1 = mul_conj(load(p1), w.add(2));
            let d2 = mul_conj(load(p2), w);
            let d3 = mul_conj(load(p3), w.add(4));
            let (e0, e2) = (add(c0, d1), sub(c0, d1));
            let (e1, d) = (add(d2, d3), sub(d3, d2));
            store(p0, add(e0, e1));
            store(p2, sub(e0, e1));
            store(p1, sub_i(e2, d));
            store(p3, add_i(e2, d));
        }
    }
}

/// [`radix4_forward`] on every 4-position block of `n` (twiddles all 1).
///
/// # Safety
/// AVX-512 F present; `b` valid for `n` aligned positions, `4 | n`.
#[inline(always)]
unsafe fn base4_forward(b: *mut f32, n: usize) {
    // SAFETY: positions < n.
    unsafe {
        for blk in 0..n / 4 {
            let p0 = b.add(POS * 4 * blk);
            let (p1, p2, p3) = (p0.add(POS), p0.add(2 * POS), p0.add(3 * POS));
            let (a0, a1, a2, a3) = (load(p0), load(p1), load(p2), load(p3));
            let (t0, t1) = (add(a0, a2), sub(a0, a2));
            let (t2, t3) = (add(a1, a3), sub(a1, a3));
            store(p0, add(t0, t2));
            store(p1, sub(t0, t2));
            store(p2, sub_i(t1, t3));
            store(p3, add_i(t1, t3));
        }
    }
}

/// [`radix4_inverse`] on every 4-position block of `n`.
///
/// # Safety
/// As [`base4_forward`].
#[inline(always)]
unsafe fn base4_inverse(b: *mut f32, n: usize) {
    // SAFETY: positions < n.
    unsafe {
        for blk in 0..n / 4 {
            let p0 = b.add(POS * 4 * blk);
            let (p1, p2, p3) = (p0.add(POS), p0.add(2 * POS), p0.add(3 * POS));
            let (c0, c1, c2, c3) = (load(p0), load(p1), load(p2), load(p3));
            let (e0, e2) = (add(c0, c1), sub(c0, c1));
            let (e1, d) = (add(c2, c3), sub(c3, c2));
            store(p0, add(e0, e1));
            store(p2, sub(e0, e1));
            store(p1, sub_i(e2, d));
            store(p3, add_i(e2, d));
        }
    }
}

/// `(a + b, a - b)` on every 2-position block of `n`: the radix-2 stage
/// of length 2, its own inverse times 2.
///
/// # Safety
/// AVX-512 F present; `b` valid for `n` aligned positions, `2 | n`.
#[inline(always)]
unsafe fn base2(b: *mut f32, n: usize) {
    // SAFETY: positions < n.
    unsafe {
        for blk in 0..n / 2 {
            let p0 = b.add(POS * 2 * blk);
            let p1 = p0.add(POS);
            let (a0, a1) = (load(p0), load(p1));
            store(p0, add(a0, a1));
            store(p1, sub(a0, a1));
        }
    }
}

/// `W[p] = Z[p] A + conj(Z[p']) B` and `W[p'] = conj(conj(Z[p']) A +
/// Z[p] B)` for every stored pair `(p, p')` (see the module docs).
///
/// # Safety
/// AVX-512 F present; `b` valid for `m` aligned positions; `spectra`
/// holds `pair_count(m)` pairs.
#[inline(always)]
unsafe fn pointwise(b: *mut f32, m: usize, spectra: *const f32) {
    // SAFETY: positions p, p' < m; pair e < pair_count(m).
    unsafe {
        for (e, (p, q)) in pairs(m).enumerate() {
            let s = spectra.add(PAIR * e);
            let (ar, ai) = (_mm512_loadu_ps(s), _mm512_loadu_ps(s.add(LANES)));
            let (br, bi) = (
                _mm512_loadu_ps(s.add(2 * LANES)),
                _mm512_loadu_ps(s.add(3 * LANES)),
            );
            let (zp, yp) = (b.add(POS * p), b.add(POS * q));
            let ((zr, zi), (yr, yi)) = (load(zp), load(yp));
            // Zr Ar - Zi Ai + Yr Br + Yi Bi
            let wr = _mm512_fmsub_ps(zr, ar, _mm512_mul_ps(zi, ai));
            let wr = _mm512_fmadd_ps(yi, bi, _mm512_fmadd_ps(yr, br, wr));
            // Zr Ai + Zi Ar + Yr Bi - Yi Br
            let wi = _mm512_fmadd_ps(zr, ai, _mm512_mul_ps(zi, ar));
            let wi = _mm512_fnmadd_ps(yi, br, _mm512_fmadd_ps(yr, bi, wi));
            if p != q {
                // Yr Ar + Yi Ai + Zr Br - Zi Bi
                let vr = _mm512_fmadd_ps(yr, ar, _mm512_mul_ps(yi, ai));
                let vr = _mm512_fnmadd_ps(zi, bi, _mm512_fmadd_ps(zr, br, vr));
                // Yi Ar - Yr Ai - Zr Bi - Zi Br
                let vi = _mm512_fmsub_ps(yi, ar, _mm512_mul_ps(yr, ai));
                let vi = _mm512_fnmadd_ps(zi, br, _mm512_fnmadd_ps(zr, bi, vi));
                store(yp, (vr, vi));
            }
            store(zp, (wr, wi));
        }
    }
}

/// Transposes the 16 x 16 tile `r` (row `i` lane `j` to row `j` lane `i`).
///
/// # Safety
/// AVX-512 F present.
#[inline(always)]
unsafe fn transpose16(r: &mut [__m512; LANES]) {
    // SAFETY: register operations only.
    unsafe {
        // Interleave 32-bit pairs, then 64-bit pairs, within 128-bit lanes:
        // s[4i + c], 128-bit lane l, holds column 4l + c of rows 4i .. 4i + 4.
        let mut t = [_mm512_setzero_ps(); LANES];
        for i in 0..8 {
            t[2 * i] = _mm512_unpacklo_ps(r[2 * i], r[2 * i + 1]);
            t[2 * i + 1] = _mm512_unpackhi_ps(r[2 * i], r[2 * i + 1]);
        }
        let pd = |v: __m512| _mm512_castps_pd(v);
        let ps = |v: __m512d| _mm512_castpd_ps(v);
        let mut s = [_mm512_setzero_ps(); LANES];
        for i in 0..4 {
            let (lo, hi) = (t[4 * i], t[4 * i + 1]);
            let (lo2, hi2) = (t[4 * i + 2], t[4 * i + 3]);
            s[4 * i] = ps(_mm512_unpacklo_pd(pd(lo), pd(lo2)));
            s[4 * i + 1] = ps(_mm512_unpackhi_pd(pd(lo), pd(lo2)));
            s[4 * i + 2] = ps(_mm512_unpacklo_pd(pd(hi), pd(hi2)));
            s[4 * i + 3] = ps(_mm512_unpackhi_pd(pd(hi), pd(hi2)));
        }
        // Then a 4 x 4 transpose of 128-bit lanes for each c.
        for c in 0..4 {
            let (a, b, e, d) = (s[c], s[4 + c], s[8 + c], s[12 + c]);
            let u0 = _mm512_shuffle_f32x4::<0x88>(a, b);
            let u1 = _mm512_shuffle_f32x4::<0xDD>(a, b);
            let v0 = _mm512_shuffle_f32x4::<0x88>(e, d);
            let v1 = _mm512_shuffle_f32x4::<0xDD>(e, d);
            r[c] = _mm512_shuffle_f32x4::<0x88>(u0, v0);
            r[4 + c] = _mm512_shuffle_f32x4::<0x88>(u1, v1);
            r[8 + c] = _mm512_shuffle_f32x4::<0xDD>(u0, v0);
            r[12 + c] = _mm512_shuffle_f32x4::<0xDD>(u1, v1);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A `LanesConv` is made only for an instruction set with AVX-512 F:
    /// its runs' unsafe code takes the CPU's features from that `Isa`.
    #[test]
    fn prepares_only_for_an_avx512_isa() {
        let p = crate::test_support::depthwise_params(1, 40, 100, 9, (4, 4), 1);
        let g = p.geometry().unwrap();
        let w = vec![0.25; p.weight_elems()];
        for isa in Isa::all_available() {
            let conv = LanesConv::prepare(isa, &g, &w, 64, 9);
            assert_eq!(conv.is_some(), isa.backend() == Backend::Avx512, "{isa:?}");
        }
    }

    #[test]
    fn pairs_are_bins_k_and_minus_k() {
        for m in [16usize, 32, 64, 1024] {
            let bits = m.trailing_zeros();
            let all: Vec<(usize, usize)> = pairs(m).collect();
            assert_eq!(all.len(), pair_count(m));
            let mut seen = vec![false; m];
            for &(p, q) in &all {
                let (k, kq) = (bitrev(p, bits), bitrev(q, bits));
                assert_eq!((k + kq) % m, 0, "m={m}: {p} {q}");
                assert!(!seen[p] && !seen[q]);
                seen[p] = true;
                seen[q] = true;
            }
            assert!(seen.iter().all(|&s| s), "every position paired");
        }
    }

    #[test]
    fn transpose_transposes() {
        if !runs_on(Backend::detect()) {
            return;
        }
        let a: Vec<f32> = (0..256).map(|i| i as f32).collect();
        let mut got = [0.0f32; 256];
        // SAFETY: AVX-512 F is present; loads and stores stay in a and got.
        unsafe {
            let mut r = [_mm512_setzero_ps(); LANES];
            for (i, v) in r.iter_mut().enumerate() {
                *v = _mm512_loadu_ps(a.as_ptr().add(16 * i));
            }
            transpose16(&mut r);
            for (i, v) in r.iter().enumerate() {
                _mm512_storeu_ps(got.as_mut_ptr().add(16 * i), *v);
            }
        }
        for i in 0..16 {
            for j in 0..16 {
                assert_eq!(got[16 * i + j], a[16 * j + i]);
            }
        }
    }
}
