//! First-order linear recurrence (diagonal linear scan):
//! `y[t] = a[t] * y[t - 1] + u[t]`, with `y[-1] = x0`, independently for
//! every `(batch, channel)` row.
//!
//! The scan is memory-bound once its work is spread over independent
//! recurrences: it must read `a` and `u` and write `y` once, 12 bytes per
//! element. A lone recurrence is not: each step waits for the previous
//! multiply-add. [`linear_scan_f32`] therefore picks one of two
//! [`Strategy`]s from the number of rows and the pool size, and one
//! [`RowKernel`] from the instruction set `crate::simd` chose (a
//! [`LinearScan`] keeps the one it was made with; the free functions detect
//! it at their top):
//!
//! * [`Strategy::Rows`] (rows >= threads): rows in parallel, in tasks of
//!   whole rows. On [`RowKernel::Avx2`] each row is scanned on its own, 8
//!   steps per vector by an in-register prefix scan whose only chain from
//!   vector to vector is one FMA (`simd.rs`). On [`RowKernel::Portable`],
//!   groups of [`ROWS_JOINT`](kernel::ROWS_JOINT) rows step through time
//!   together, so that their dependency chains overlap (each row exactly as
//!   the sequential loop computes it); leftover rows use the single-row scan
//!   of [`kernel::scan_row`], which overlaps chains within the row.
//! * [`Strategy::Chunked`] (fewer rows than threads, long rows): each row is
//!   also cut into pieces along time, scanned in parallel in two passes
//!   (reduce, then scan) with the pieces' carries kept on the stack. The
//!   pieces are scanned by the row kernel's single-row scan; the reduction is
//!   portable (`kernel::aggregate`).
//!
//! See `kernel.rs` for the portable building blocks and `simd.rs` for the
//! intrinsics (the module's only unsafe code).

mod fused;
mod kernel;
mod params;
mod row_kernel;
#[cfg(target_arch = "x86_64")]
mod simd;
#[cfg(test)]
mod tests;

use crate::error::{check_len, KernelError};
use crate::fused::{PairSource, RowsIn, RowsOut, SharedOut};
use crate::scratch::Scratch;
use crate::simd::Isa;
use fused::Decay;
use kernel::Affine;
use row_kernel::RowKernel;

pub use fused::scan_rows_scratch;
pub use params::ScanParams;

/// The scan on one instruction set, chosen once (where a plan is built), so
/// that its runs ask the CPU nothing: [`LinearScan::run`] is
/// [`linear_scan_f32`], [`LinearScan::run_rows`] and
/// [`LinearScan::run_rows_pair`] are [`linear_scan_rows`] and
/// [`linear_scan_rows_pair`], each on the row kernel `isa` runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LinearScan {
    row_kernel: RowKernel,
}

impl LinearScan {
    /// The scan on `isa`.
    pub fn new(isa: Isa) -> LinearScan {
        LinearScan {
            row_kernel: RowKernel::of(isa),
        }
    }

    /// [`linear_scan_f32`] on this scan's instruction set.
    ///
    /// # Errors
    ///
    /// As [`linear_scan_f32`].
    pub fn run(
        &self,
        p: &ScanParams,
        x0: &[f32],
        a: &[f32],
        u: &[f32],
        y: &mut [f32],
    ) -> Result<(), KernelError> {
        check(p, x0, a, u, y)?;
        if p.len <= fused::SHORT_STEPS {
            short_rows(p, x0, a, u, y);
            return Ok(());
        }
        let threads = crate::par::threads();
        let strategy = Strategy::choose(p, threads);
        run(strategy, self.row_kernel, p, x0, a, u, y, threads);
        Ok(())
    }
}

/// Runs the scan: `y[b,c,0] = a[b,c,0] * x0[b,c] + u[b,c,0]` and
/// `y[b,c,t] = a[b,c,t] * y[b,c,t-1] + u[b,c,t]`.
///
/// Checks the slice lengths against `p` (an error, never a panic) before
/// touching `y`. Runs on the *current* pool ([`crate::par`]): rows in parallel when there are at least as many
/// rows as threads, otherwise each long row is also cut into pieces along
/// time that are scanned in parallel (see the module docs).
///
/// The result equals the sequential `f32` recurrence (`y = a * y + u`, two
/// roundings per step, no FMA) up to rounding, within a few `f32` epsilons
/// per step of the sum of the terms' magnitudes. With AVX2 and FMA (where
/// the CPU has them) every row is computed by the reassociated in-register scan,
/// and rows with NaN or infinite outputs as the plain loop computes them.
/// Without, rows stepped four at a time are bit-identical to the plain
/// loop, while a row scanned on its own (the `rows % 4` left over in a
/// task) composes partial results. The result does not depend on the pool
/// size as long as there are at least `4 * threads` rows (with AVX2: at
/// least `threads` rows); with fewer rows than threads, long rows are cut
/// into pieces by the pool size.
/// Performs no heap allocation of its own; nor does the pool's scheduling
/// once it is warm (`tests/no_alloc.rs`). Asks the CPU for its instruction
/// set once a call; a [`LinearScan`] keeps one.
///
/// # Errors
///
/// Any error of [`ScanParams::validate`], or [`KernelError::BufferLen`] if
/// a slice's length differs from the shape's (`x0`, `a`, `u`, `y` checked in
/// that order).
pub fn linear_scan_f32(
    p: &ScanParams,
    x0: &[f32],
    a: &[f32],
    u: &[f32],
    y: &mut [f32],
) -> Result<(), KernelError> {
    LinearScan::new(Isa::detect()).run(p, x0, a, u, y)
}

/// [`linear_scan_f32`] with fused operands (see `fused.rs`).
/// `scratch` needs [`scan_rows_scratch`] elements per thread for the most
/// temporaries any operand or the sink needs. Asks the CPU for its
/// instruction set once a call; [`LinearScan::run_rows`] does not.
///
/// # Errors
/// A stored operand of the wrong length, or scratch too small.
pub fn linear_scan_rows(
    p: &ScanParams,
    x0: RowsIn,
    a: RowsIn,
    u: RowsIn,
    y: RowsOut,
    scratch: &Scratch,
) -> Result<(), KernelError> {
    LinearScan::new(Isa::detect()).run_rows(p, x0, a, u, y, scratch)
}

/// [`linear_scan_rows`] with `a` and `u` computed together by one prologue
/// (`au` fills `a` first, `u` second), so what they share is computed once.
///
/// # Errors
/// As [`linear_scan_rows`].
pub fn linear_scan_rows_pair(
    p: &ScanParams,
    x0: RowsIn,
    au: &dyn PairSource,
    y: RowsOut,
    scratch: &Scratch,
) -> Result<(), KernelError> {
    LinearScan::new(Isa::detect()).run_rows_pair(p, x0, au, y, scratch)
}

impl LinearScan {
    /// [`linear_scan_rows`] on this scan's instruction set.
    ///
    /// # Errors
    /// As [`linear_scan_rows`].
    pub fn run_rows(
        &self,
        p: &ScanParams,
        x0: RowsIn,
        a: RowsIn,
        u: RowsIn,
        y: RowsOut,
        scratch: &Scratch,
    ) -> Result<(), KernelError> {
        fused::scan(self.row_kernel, p, x0, Decay::Separate(a, u), y, scratch)
    }

    /// [`linear_scan_rows_pair`] on this scan's instruction set.
    ///
    /// # Errors
    /// As [`linear_scan_rows`].
    pub fn run_rows_pair(
        &self,
        p: &ScanParams,
        x0: RowsIn,
        au: &dyn PairSource,
        y: RowsOut,
        scratch: &Scratch,
    ) -> Result<(), KernelError> {
        fused::scan(self.row_kernel, p, x0, Decay::Pair(au), y, scratch)
    }
}

/// `x0`, `a`, `u` and `y` of a run of rows, as zipped chunks.
type ShortRows<'a> = (&'a [f32], ((&'a [f32], &'a [f32]), &'a mut [f32]));

/// A decode step (rows of a few steps): the plain recurrence over rows,
/// which the compiler vectorises across channels for one step, with none
/// of the row kernels' set-up; on the calling thread below
/// [`fused::SERIAL_ELEMS`] elements.
fn short_rows(p: &ScanParams, x0: &[f32], a: &[f32], u: &[f32], y: &mut [f32]) {
    let len = p.len;
    if len == 0 {
        return;
    }
    let rows = |(x0, ((a, u), y)): ShortRows| {
        if len == 1 {
            for (((y, &s), &a), &u) in y.iter_mut().zip(x0).zip(a).zip(u) {
                *y = a * s + u;
            }
            return;
        }
        for (((&s0, a), u), y) in x0
            .iter()
            .zip(a.chunks_exact(len))
            .zip(u.chunks_exact(len))
            .zip(y.chunks_exact_mut(len))
        {
            let mut s = s0;
            for ((y, &a), &u) in y.iter_mut().zip(a).zip(u) {
                s = a * s + u;
                *y = s;
            }
        }
    };
    if p.seq_elems() <= fused::SERIAL_ELEMS || crate::par::threads() <= 1 {
        rows((x0, ((a, u), y)));
    } else {
        const BLOCK: usize = 4096;
        crate::par::for_each_chunk_mut(y, BLOCK * len, |i, y| {
            let at = i * BLOCK * len;
            let (a, u) = (&a[at..][..y.len()], &u[at..][..y.len()]);
            rows((&x0[i * BLOCK..][..y.len() / len], ((a, u), y)))
        });
    }
}

/// [`linear_scan_f32`] with the strategy and row kernel forced, so that tests
/// can run every path on the same inputs.
#[cfg(test)]
pub(crate) fn linear_scan_with(
    strategy: Strategy,
    row_kernel: RowKernel,
    p: &ScanParams,
    x0: &[f32],
    a: &[f32],
    u: &[f32],
    y: &mut [f32],
) -> Result<(), KernelError> {
    check(p, x0, a, u, y)?;
    let threads = crate::par::threads();
    run(strategy, row_kernel, p, x0, a, u, y, threads);
    Ok(())
}

/// How [`linear_scan_f32`] spreads the work over the pool.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Strategy {
    /// Rows in parallel, each row sequential in time.
    Rows,
    /// Each row cut into `parts + 1` pieces along time: pass 1 scans the
    /// first piece and reduces the next `parts - 1` to their affine maps
    /// (`parts` tasks per row), a sequential pass chains the maps into the
    /// pieces' start states, pass 2 scans the last `parts` pieces (`parts`
    /// tasks per row). The first piece is 2/3 the size of the others, which
    /// roughly balances pass 1 (a scan moves 12 bytes per element and does
    /// more arithmetic, a reduction moves 8). `parts` is clamped to what
    /// the stack carries hold and to one element per piece; at 0 it runs as
    /// [`Strategy::Rows`]. The last piece is never reduced, so memory
    /// traffic is `12 + 8 * (parts - 1) / (parts + 2/3)` bytes per element.
    Chunked {
        /// Tasks per row in each pass.
        parts: usize,
    },
}

/// Shortest piece the chunked scan makes when it chooses itself: smaller
/// ones cost more in task overhead and the extra pass than they save.
const MIN_PIECE: usize = 16 * 1024;

/// Stack slots for the chunked scan's carries: `rows * parts` is at most
/// this (4 KiB of maps, 1 KiB of start states).
const MAX_PIECES: usize = 256;

// Fewest elements in a task of the rows strategy.
use crate::par::MIN_TASK_ELEMS;

// The size from which the rows strategy writes its output with non-temporal
// stores: the one threshold the fused epilogues use too (fused/ops.rs).
use crate::fused::STREAM_OUTPUT_BYTES;

/// Tasks per thread that the rows strategy aims at, for load balance.
const TASKS_PER_THREAD: usize = 4;

impl Strategy {
    /// The strategy for `p` on a pool of `threads` threads.
    pub(crate) fn choose(p: &ScanParams, threads: usize) -> Strategy {
        let rows = p.state_elems();
        if rows == 0 || rows >= threads {
            return Strategy::Rows;
        }
        let parts = (threads / rows).min(p.len / MIN_PIECE);
        if parts >= 2 {
            Strategy::Chunked { parts }
        } else {
            Strategy::Rows
        }
    }
}

/// The argument checks of [`linear_scan_f32`].
fn check(p: &ScanParams, x0: &[f32], a: &[f32], u: &[f32], y: &[f32]) -> Result<(), KernelError> {
    p.validate()?;
    check_len("x0", p.state_elems(), x0.len())?;
    check_len("a", p.seq_elems(), a.len())?;
    check_len("u", p.seq_elems(), u.len())?;
    check_len("y", p.seq_elems(), y.len())
}

/// Runs a checked scan.
#[allow(clippy::too_many_arguments)]
fn run(
    strategy: Strategy,
    row_kernel: RowKernel,
    p: &ScanParams,
    x0: &[f32],
    a: &[f32],
    u: &[f32],
    y: &mut [f32],
    threads: usize,
) {
    if p.len == 0 || x0.is_empty() {
        // Nothing to compute, and `par_chunks(0)` would panic.
        return;
    }
    match strategy {
        Strategy::Rows => scan_rows(row_kernel, x0, a, u, y, p.len, threads),
        Strategy::Chunked { parts } => scan_chunked(row_kernel, x0, a, u, y, p.len, parts),
    }
}

/// [`Strategy::Rows`].
fn scan_rows(
    row_kernel: RowKernel,
    x0: &[f32],
    a: &[f32],
    u: &[f32],
    y: &mut [f32],
    len: usize,
    threads: usize,
) {
    let rows = x0.len();
    let mut per_task = rows
        .div_ceil(TASKS_PER_THREAD * threads.max(1))
        .max(MIN_TASK_ELEMS.div_ceil(len));
    let joint = row_kernel.rows_joint();
    if rows >= joint * threads {
        // Whole groups of rows: every row then lands in the same kind of
        // group whatever the pool size, so the result does not depend on it.
        per_task = per_task.next_multiple_of(joint);
    }
    let per_task = per_task.min(rows);
    let chunk = per_task * len;
    let stream = std::mem::size_of_val(y) >= STREAM_OUTPUT_BYTES;
    crate::par::for_each_chunk_mut(y, chunk, |i, y| {
        let (a, u) = (&a[i * chunk..][..y.len()], &u[i * chunk..][..y.len()]);
        row_kernel.scan_rows(&x0[i * per_task..][..y.len() / len], a, u, y, stream)
    });
}

/// [`Strategy::Chunked`].
fn scan_chunked(
    row_kernel: RowKernel,
    x0: &[f32],
    a: &[f32],
    u: &[f32],
    y: &mut [f32],
    len: usize,
    parts: usize,
) {
    let rows = x0.len();
    // Every piece keeps at least one element: `len * 3 / (3 * parts + 2)`
    // is at least 1 for `parts <= len - 1`.
    let parts = parts.min(MAX_PIECES / rows).min(len - 1);
    if parts == 0 {
        return scan_rows(row_kernel, x0, a, u, y, len, crate::par::threads());
    }
    // Piece 0 is [0, first); piece j >= 1 is [first + (j-1) * size, first + j * size).
    let size = len * 3 / (3 * parts + 2);
    let first = len - parts * size;

    // Pass 1. Per row, `maps[0]` gets piece 0's final state (as a constant
    // map) and `maps[j]` piece j's map, for j in 1..parts.
    let mut maps = [Affine::IDENTITY; MAX_PIECES];
    let maps = &mut maps[..rows * parts];
    // Tasks are (row, piece): piece 0 scans the row's head into `y`,
    // pieces 1.. aggregate their maps.
    let ys = SharedOut::new(y);
    crate::par::for_each_chunk_mut(maps, 1, |t, map| {
        let (r, j) = (t / parts, t % parts);
        let (a, u) = (&a[r * len..][..len], &u[r * len..][..len]);
        map[0] = if j == 0 {
            let end = ys.with_line(r * len, first, |y| {
                row_kernel.scan_row(x0[r], &a[..first], &u[..first], y)
            });
            Affine {
                mul: 0.0,
                add: f64::from(end),
            }
        } else {
            let lo = first + (j - 1) * size;
            kernel::aggregate(&a[lo..lo + size], &u[lo..lo + size])
        };
    });

    // Chain the maps into the start states of pieces 1..=parts, in f64.
    // A map that overflowed is stepped through instead (slow, but only for
    // inputs whose products of `a` overflow even f64).
    let mut starts = [0.0f32; MAX_PIECES];
    let starts = &mut starts[..rows * parts];
    for (((starts, maps), a), u) in starts
        .chunks_exact_mut(parts)
        .zip(maps.chunks_exact(parts))
        .zip(a.chunks_exact(len))
        .zip(u.chunks_exact(len))
    {
        let mut s = maps[0].add;
        starts[0] = s as f32;
        for j in 1..parts {
            let map = maps[j];
            s = if map.is_finite() {
                map.apply(s)
            } else {
                let lo = first + (j - 1) * size;
                f64::from(kernel::state_plain(
                    s as f32,
                    &a[lo..lo + size],
                    &u[lo..lo + size],
                ))
            };
            starts[j] = s as f32;
        }
    }

    // Pass 2: piece j of row r is y[r * len + first + j * size..][..size].
    let starts = &*starts;
    crate::par::for_each(rows * parts, |t| {
        let lo = t / parts * len + first + t % parts * size;
        let (a, u) = (&a[lo..lo + size], &u[lo..lo + size]);
        ys.with_line(lo, size, |y| row_kernel.scan_row(starts[t], a, u, y));
    });
}
