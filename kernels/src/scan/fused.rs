//! The scan with fused operands: `a`, `u` and `x0` computed by prologues and
//! `y` finished by an epilogue, a chunk of [`FUSED_CHUNK`] steps of one row
//! at a time, so nothing but the stored inputs and the result touches
//! memory.
//!
//! Rows run in parallel (the rows strategy); a row is never cut along time,
//! so with fewer rows than threads some threads idle (the chunked strategy
//! needs `a` twice, which a prologue would compute twice).

use rayon::prelude::*;

use super::{Backend, ScanParams};
use crate::error::{check_len, KernelError};
use crate::fused::{PairSource, RowsIn, RowsOut};
use crate::scratch::Scratch;

/// Time steps computed per chunk.
pub const FUSED_CHUNK: usize = 512;

/// Fewest elements per task.
const MIN_TASK_ELEMS: usize = 16 * 1024;

/// f32 elements of per-thread scratch [`linear_scan_rows`] needs when its
/// operands need `temporaries` line-sized temporaries at most.
pub fn scan_rows_scratch(temporaries: usize) -> usize {
    (3 + temporaries) * FUSED_CHUNK
}

/// [`super::linear_scan_f32`] with fused operands (see the module docs).
/// `scratch` needs [`scan_rows_scratch`] elements per thread for the most
/// temporaries any operand or the sink needs.
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
    scan(p, x0, Decay::Separate(a, u), y, scratch)
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
    scan(p, x0, Decay::Pair(au), y, scratch)
}

/// How the scan gets `a` and `u`.
enum Decay<'a> {
    Separate(RowsIn<'a>, RowsIn<'a>),
    Pair(&'a dyn PairSource),
}

fn scan(
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
    let backend = Backend::detect();
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
                        s = backend.scan_row(s, a_chunk, u_chunk, &mut y_row[t0..t0 + n])
                    }
                    (None, Some(sink)) => {
                        s = backend.scan_row(s, a_chunk, u_chunk, &mut y_buf[..n]);
                        sink.store(r, t0, &y_buf[..n], tmp);
                    }
                    (None, None) => unreachable!("stored outputs come with their row"),
                }
            }
        })
    };
    let min_rows = MIN_TASK_ELEMS.div_ceil(len);
    match stored {
        Some(y) => y
            .par_chunks_mut(len)
            .enumerate()
            .with_min_len(min_rows)
            .for_each(|(r, y_row)| row(r, Some(y_row))),
        None => (0..rows)
            .into_par_iter()
            .with_min_len(min_rows)
            .for_each(|r| row(r, None)),
    }
    Ok(())
}
