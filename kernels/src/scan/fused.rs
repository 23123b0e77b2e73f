//! The scan with fused operands: `a`, `u` and `x0` computed by prologues and
//! `y` finished by an epilogue, a chunk of [`FUSED_CHUNK`] steps of one row
//! at a time, so nothing but the stored inputs and the result touches
//! memory.
//!
//! Rows run in parallel (the rows strategy); a row is never cut along time,
//! so with fewer rows than threads some threads idle (the chunked strategy
//! needs `a` twice, which a prologue would compute twice).

use super::params::ScanParams;
use super::row_kernel::RowKernel;
use crate::error::{check_len, KernelError};
use crate::fused::{PairSource, RowsIn, RowsOut};
use crate::scratch::Scratch;

/// Time steps computed per chunk (and channels per block of a short
/// scan's columns). Each chunk pays the line set-up of its prologue and
/// epilogue (locating the row, the operands' lines, a scratch slot): at
/// 512 steps that was 3% of the SSM block once its elementwise work ran
/// as one-pass recipes; 1024 (as the depthwise conv's chunk) keeps `a`,
/// `u`, `y` and a few interpreter temporaries within a 48 KiB L1.
pub const FUSED_CHUNK: usize = 1024;

// Fewest elements per task.
use crate::par::MIN_TASK_ELEMS;

/// f32 elements of per-thread scratch [`super::linear_scan_rows`] needs when its
/// operands need `temporaries` line-sized temporaries at most.
pub fn scan_rows_scratch(temporaries: usize) -> usize {
    (3 + temporaries) * FUSED_CHUNK
}

/// How the scan gets `a` and `u`.
#[derive(Clone, Copy)]
pub(super) enum Decay<'a> {
    Separate(RowsIn<'a>, RowsIn<'a>),
    Pair(&'a dyn PairSource),
}

/// [`super::linear_scan_rows`] and [`super::linear_scan_rows_pair`] on
/// `row_kernel`.
pub(super) fn scan(
    row_kernel: RowKernel,
    p: &ScanParams,
    x0: RowsIn,
    au: Decay,
    y: RowsOut,
    scratch: &Scratch,
) -> Result<(), KernelError> {
    p.validate()?;
    if let RowsIn::Slice(s) = x0 {
        check_len("x0", p.state_elems(), s.len())?;
    }
    if let Decay::Separate(a, u) = &au {
        for (name, operand) in [("a", a), ("u", u)] {
            if let RowsIn::Slice(s) = operand {
                check_len(name, p.seq_elems(), s.len())?;
            }
        }
    }
    let au_temporaries = match &au {
        Decay::Separate(a, u) => a.temporaries().max(u.temporaries()),
        Decay::Pair(src) => src.pair_temporaries(),
    };
    let temporaries = [
        x0.temporaries(),
        au_temporaries,
        match &y {
            RowsOut::Slice(y) => {
                check_len("y", p.seq_elems(), y.len())?;
                0
            }
            RowsOut::Fused(sink) => sink.temporaries(),
        },
    ]
    .into_iter()
    .max()
    .unwrap_or(0);
    let need = scan_rows_scratch(temporaries);
    if scratch.per_thread() < need {
        return Err(KernelError::BufferLen {
            which: "scratch",
            expected: need,
            actual: scratch.per_thread(),
        });
    }
    let (rows, len) = (p.state_elems(), p.len);
    if rows == 0 || len == 0 {
        return Ok(());
    }
    if len <= SHORT_STEPS {
        columns(p, x0, au, y, scratch);
        return Ok(());
    }
    let (stored, sink) = match y {
        RowsOut::Slice(y) => (Some(y), None),
        RowsOut::Fused(sink) => (None, Some(sink)),
    };
    let row = |r: usize, mut y_row: Option<&mut [f32]>| {
        scratch.with_slot(|slot| {
            let (bufs, tmp) = slot.split_at_mut(3 * FUSED_CHUNK);
            let (a_buf, rest) = bufs.split_at_mut(FUSED_CHUNK);
            let (u_buf, y_buf) = rest.split_at_mut(FUSED_CHUNK);
            let mut s = match x0 {
                RowsIn::Slice(x0) => x0[r],
                RowsIn::Fused(src) => {
                    src.fill(r, 0, &mut a_buf[..1], tmp);
                    a_buf[0]
                }
            };
            for t0 in (0..len).step_by(FUSED_CHUNK) {
                let n = FUSED_CHUNK.min(len - t0);
                let (a_chunk, u_chunk): (&[f32], &[f32]) = match au {
                    Decay::Pair(src) => {
                        src.fill_pair(r, t0, &mut a_buf[..n], &mut u_buf[..n], tmp);
                        (&a_buf[..n], &u_buf[..n])
                    }
                    Decay::Separate(a, u) => (
                        match a {
                            RowsIn::Slice(a) => &a[r * len + t0..][..n],
                            RowsIn::Fused(src) => {
                                src.fill(r, t0, &mut a_buf[..n], tmp);
                                &a_buf[..n]
                            }
                        },
                        match u {
                            RowsIn::Slice(u) => &u[r * len + t0..][..n],
                            RowsIn::Fused(src) => {
                                src.fill(r, t0, &mut u_buf[..n], tmp);
                                &u_buf[..n]
                            }
                        },
                    ),
                };
                match (&mut y_row, sink) {
                    (Some(y_row), _) => {
                        s = row_kernel.scan_row(s, a_chunk, u_chunk, &mut y_row[t0..t0 + n])
                    }
                    (None, Some(sink)) => {
                        s = row_kernel.scan_row(s, a_chunk, u_chunk, &mut y_buf[..n]);
                        sink.store(r, t0, &y_buf[..n], tmp);
                    }
                    (None, None) => unreachable!("stored outputs come with their row"),
                }
            }
        })
    };
    let min_rows = MIN_TASK_ELEMS.div_ceil(len);
    match stored {
        Some(y) => {
            crate::par::for_each_chunk_mut_min(y, len, min_rows, |r, y_row| row(r, Some(y_row)))
        }
        None => crate::par::for_each_min(rows, min_rows, |r| row(r, None)),
    }
    Ok(())
}

/// Steps at most this many (a decode step: one, or a few) run a column of
/// channels at a time ([`columns`]).
pub(super) const SHORT_STEPS: usize = 4;

/// Elements below which a short scan runs on the calling thread.
pub(super) const SERIAL_ELEMS: usize = 1 << 16;

/// A scan of a few steps is a vector operation across channels: per block
/// of [`FUSED_CHUNK`] channels, the state column starts at `x0`'s and each
/// step reads a column of `a` and `u` (from a prologue, one program line
/// across the channels: a transposed `[B, N, C]` projection is read
/// contiguously, and the program's set-up is paid per column, not per row),
/// updates it (`s = a * s + u`, the two roundings of the row kernels) and
/// stores it, or hands it to the epilogue as one line.
fn columns(p: &ScanParams, x0: RowsIn, au: Decay, y: RowsOut, scratch: &Scratch) {
    let (channels, len) = (p.channels, p.len);
    let blocks = channels.div_ceil(FUSED_CHUNK);
    let serial = p.seq_elems() <= SERIAL_ELEMS || crate::par::threads() <= 1;
    let sink = match &y {
        RowsOut::Fused(sink) => Some(*sink),
        RowsOut::Slice(_) => None,
    };
    // Channels `c0 ..` of item `b`; `y_blk` their stored rows, if stored.
    let block = |b: usize, c0: usize, mut y_blk: Option<&mut [f32]>| {
        let n = FUSED_CHUNK.min(channels - c0);
        let row0 = b * channels + c0;
        scratch.with_slot(|slot| {
            let (bufs, tmp) = slot.split_at_mut(3 * FUSED_CHUNK);
            let (a_col, rest) = bufs.split_at_mut(FUSED_CHUNK);
            let (u_col, s) = rest.split_at_mut(FUSED_CHUNK);
            let (a_col, u_col, s) = (&mut a_col[..n], &mut u_col[..n], &mut s[..n]);
            match x0 {
                RowsIn::Slice(x0) => s.copy_from_slice(&x0[row0..row0 + n]),
                RowsIn::Fused(src) => src.fill_col(row0, 0, s, tmp),
            }
            let column = |operand: RowsIn, t: usize, col: &mut [f32], tmp: &mut [f32]| match operand
            {
                RowsIn::Slice(v) => {
                    for (c, row) in col.iter_mut().zip(v[row0 * len..].chunks_exact(len)) {
                        *c = row[t];
                    }
                }
                RowsIn::Fused(src) => src.fill_col(row0, t, col, tmp),
            };
            for t in 0..len {
                match au {
                    Decay::Pair(src) => src.fill_pair_col(row0, t, a_col, u_col, tmp),
                    Decay::Separate(a, u) => {
                        column(a, t, a_col, tmp);
                        column(u, t, u_col, tmp);
                    }
                }
                for ((s, &a), &u) in s.iter_mut().zip(&*a_col).zip(&*u_col) {
                    *s = a * *s + u;
                }
                match (&mut y_blk, sink) {
                    (Some(y_blk), _) => {
                        for (row, &v) in y_blk.chunks_exact_mut(len).zip(&*s) {
                            row[t] = v;
                        }
                    }
                    (None, Some(sink)) => sink.store_col(row0, t, s, tmp),
                    (None, None) => unreachable!("stored outputs come with their block"),
                }
            }
        })
    };
    match y {
        RowsOut::Slice(y) => {
            let item = channels * len;
            if serial {
                for (b, y_item) in y.chunks_mut(item).enumerate() {
                    for (i, y_blk) in y_item.chunks_mut(FUSED_CHUNK * len).enumerate() {
                        block(b, i * FUSED_CHUNK, Some(y_blk));
                    }
                }
            } else {
                crate::par::for_each_chunk_mut_2d(y, item, FUSED_CHUNK * len, |b, i, y_blk| {
                    block(b, i * FUSED_CHUNK, Some(y_blk))
                });
            }
        }
        RowsOut::Fused(_) => {
            let tasks = p.batch * blocks;
            let run = |t: usize| block(t / blocks, (t % blocks) * FUSED_CHUNK, None);
            if serial {
                (0..tasks).for_each(run);
            } else {
                crate::par::for_each(tasks, run);
            }
        }
    }
}
