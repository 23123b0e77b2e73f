//! Every strategy against the `f64` reference, on the same inputs.

use super::kernel::{self, CHUNK, LANES, MIN_LANE_LEN, ROWS_JOINT};
use super::*;
use crate::reference;
use crate::test_support::{assert_close, Rng};

fn params(batch: usize, channels: usize, len: usize) -> ScanParams {
    ScanParams {
        batch,
        channels,
        len,
    }
}

/// Strategies every input is run with: each forced, and the automatic choice.
fn strategies() -> [Option<Strategy>; 6] {
    [
        None,
        Some(Strategy::Rows),
        Some(Strategy::Chunked { parts: 1 }),
        Some(Strategy::Chunked { parts: 2 }),
        Some(Strategy::Chunked { parts: 3 }),
        Some(Strategy::Chunked { parts: 7 }),
    ]
}

fn run(strategy: Option<Strategy>, p: &ScanParams, x0: &[f32], a: &[f32], u: &[f32]) -> Vec<f32> {
    let mut y = vec![f32::NAN; p.seq_elems()];
    match strategy {
        None => linear_scan_f32(p, x0, a, u, &mut y),
        Some(s) => linear_scan_with(s, p, x0, a, u, &mut y),
    }
    .unwrap();
    y
}

/// The rounding-error bound of every output, against the reference.
///
/// The bound is the reference scan of `|x0|`, `|a|`, `|u|` (the largest
/// the terms of `y[t]` can add up to) times `max(1e-5, 3 (t+1) eps)`: each
/// `f32` step adds at most about `2 eps` of that, and step errors are
/// damped by `|a|` on their way to later steps, so after `t + 1` steps the
/// error is below `2 (t+1) eps` of the bound. Blocked and chunked scans
/// compose maps of stretches instead of stepping through them; a map's
/// product and offset carry the same kind of error (at most one rounding
/// per element of the stretch, relative to the same bound), and chaining
/// maps adds at most two roundings per stretch, so the bound holds for them
/// too. Subnormal values round to absolute multiples of the smallest
/// subnormal, whence an absolute term per step.
fn tolerance(p: &ScanParams, x0: &[f32], a: &[f32], u: &[f32]) -> Vec<f32> {
    let abs = |v: &[f32]| v.iter().map(|e| e.abs()).collect::<Vec<_>>();
    let bound = reference::linear_scan_f32(p, &abs(x0), &abs(a), &abs(u)).unwrap();
    bound
        .iter()
        .enumerate()
        .map(|(idx, &b)| {
            let steps = (idx % p.len + 1) as f32;
            // Subnormal results carry an absolute rounding error instead:
            // up to the smallest subnormal per step.
            b * f32::max(1e-5, 3.0 * steps * f32::EPSILON) + steps * f32::from_bits(1)
        })
        .collect()
}

/// Runs every strategy and compares each with the reference.
fn check_against_reference(p: &ScanParams, x0: &[f32], a: &[f32], u: &[f32]) {
    let want = reference::linear_scan_f32(p, x0, a, u).unwrap();
    let tol = tolerance(p, x0, a, u);
    for strategy in strategies() {
        let y = run(strategy, p, x0, a, u);
        assert_close(&y, &want, &tol, &format!("{p:?} {strategy:?}"));
    }
}

/// Lengths around the chunk boundaries of the blocked single-row scan.
const SHORT_LENGTHS: [usize; 11] = [
    1,
    2,
    7,
    LANES * MIN_LANE_LEN - 1,
    LANES * MIN_LANE_LEN,
    CHUNK - 1,
    CHUNK,
    CHUNK + 1,
    CHUNK + LANES * MIN_LANE_LEN + 5,
    1000,
    2500,
];

/// Longer lengths: many chunks, and partial last chunks of every kind.
const LONG_LENGTHS: [usize; 5] = [
    8 * CHUNK - 1,
    8 * CHUNK + 1,
    8 * CHUNK + LANES * MIN_LANE_LEN - 1,
    9 * CHUNK + LANES * (CHUNK / LANES - 1) + 3,
    20_011,
];

#[test]
fn matches_reference_on_random_inputs() {
    let mut rng = Rng::new(7);
    for (batch, channels, len) in [(1, 1, 1), (1, 3, 2), (2, 5, 17), (3, 4, 64), (2, 1, 300)] {
        let p = params(batch, channels, len);
        let x0 = rng.vec(p.state_elems(), -1.0, 1.0);
        let a = rng.vec(p.seq_elems(), -1.0, 1.0);
        let u = rng.vec(p.seq_elems(), -1.0, 1.0);
        check_against_reference(&p, &x0, &a, &u);
    }
}

#[test]
fn every_row_count_and_length() {
    let mut rng = Rng::new(19);
    let j = ROWS_JOINT;
    for rows in [1, 2, 3, j - 1, j, j + 1, 2 * j + 3] {
        for len in SHORT_LENGTHS {
            let p = params(1, rows, len);
            let x0 = rng.vec(p.state_elems(), -1.0, 1.0);
            let a = rng.vec(p.seq_elems(), -1.0, 1.0);
            let u = rng.vec(p.seq_elems(), -1.0, 1.0);
            check_against_reference(&p, &x0, &a, &u);
        }
    }
    for rows in [1, 2] {
        for len in LONG_LENGTHS {
            let p = params(1, rows, len);
            let x0 = rng.vec(p.state_elems(), -1.0, 1.0);
            let a = rng.vec(p.seq_elems(), -1.0, 1.0);
            let u = rng.vec(p.seq_elems(), -1.0, 1.0);
            check_against_reference(&p, &x0, &a, &u);
        }
    }
}

/// The blocked single-row scan with other lane counts per chunk.
#[test]
fn blocked_row_scan_with_other_lane_counts() {
    let mut rng = Rng::new(41);
    for len in SHORT_LENGTHS.into_iter().chain(LONG_LENGTHS) {
        let p = params(1, 1, len);
        let x0 = rng.vec(1, -1.0, 1.0);
        let a = rng.vec(len, -1.0, 1.0);
        let u = rng.vec(len, -1.0, 1.0);
        let want = reference::linear_scan_f32(&p, &x0, &a, &u).unwrap();
        let tol = tolerance(&p, &x0, &a, &u);
        let mut y = vec![f32::NAN; len];
        kernel::scan_row_with::<1>(x0[0], &a, &u, &mut y);
        assert_close(&y, &want, &tol, &format!("4 lanes, len {len}"));
        kernel::scan_row_with::<2>(x0[0], &a, &u, &mut y);
        assert_close(&y, &want, &tol, &format!("8 lanes, len {len}"));
        kernel::scan_row_with::<4>(x0[0], &a, &u, &mut y);
        assert_close(&y, &want, &tol, &format!("16 lanes, len {len}"));
    }
}

/// `a` classes: decaying both signs, slow decay, slow alternation, exactly 1
/// (running sums that grow), exactly 0 (`y = u`), tiny (products that
/// underflow within a few steps), slow growth, and large magnitudes.
#[test]
fn value_classes() {
    let mut rng = Rng::new(11);
    for (rows, len) in [(1, 100 * CHUNK + 77), (3, 20_011), (ROWS_JOINT + 2, 5000)] {
        let p = params(1, rows, len);
        let n = p.seq_elems();
        let x0 = rng.vec(p.state_elems(), -1.0, 1.0);
        let u = rng.vec(n, -1.0, 1.0);
        for (lo, hi) in [
            (-1.0, 1.0),
            (0.999, 1.0),
            (-1.0, -0.999),
            (1.0, 1.0),
            (0.0, 0.0),
            (-0.01, 0.01),
            (0.003, 0.02),
            (1.0, 1.0005),
        ] {
            let a = rng.vec(n, lo, hi);
            check_against_reference(&p, &x0, &a, &u);
        }
        // Large values: states near 1e36, products of `a` that underflow.
        let big_x0 = rng.vec(p.state_elems(), -1e36, 1e36);
        let big_u = rng.vec(n, -1e35, 1e35);
        let a = rng.vec(n, -0.9, 0.9);
        check_against_reference(&p, &big_x0, &a, &big_u);
        // Impulse responses: y is x0 times a product of `a`, decaying
        // through the whole f32 range; the blocked scans must carry the
        // tiny products faithfully, not flush them.
        let zeros = vec![0.0; n];
        for (lo, hi) in [(0.98, 1.0), (0.5, 0.5), (-0.3, 0.3)] {
            let a = rng.vec(n, lo, hi);
            check_against_reference(&p, &big_x0, &a, &zeros);
        }
    }
}

#[test]
fn long_sequences_with_a_near_one() {
    let mut rng = Rng::new(13);
    let p = params(2, 3, 20_000);
    let x0 = rng.vec(p.state_elems(), -1.0, 1.0);
    let u = rng.vec(p.seq_elems(), -1.0, 1.0);
    for (lo, hi) in [(0.999, 1.0), (-1.0, -0.999), (1.0, 1.0)] {
        let a = rng.vec(p.seq_elems(), lo, hi);
        check_against_reference(&p, &x0, &a, &u);
    }
}

/// Asserts `got == want` element by element, naming the first mismatch
/// (without printing whole vectors).
fn assert_same(got: &[f32], want: &[f32], what: &str) {
    assert_eq!(got.len(), want.len(), "{what}");
    if let Some(t) = (0..got.len()).find(|&t| got[t] != want[t]) {
        panic!("{what}: t={t}: got {}, want {}", got[t], want[t]);
    }
}

/// Products of `a` that overflow make a stretch's map useless (`inf * 0`);
/// the kernels then step through the stretch like the plain loop.
#[test]
fn overflowing_products_fall_back_to_stepping() {
    let len = 40 * CHUNK + 9;
    let p = params(1, 1, len);
    let zeros = vec![0.0; len];
    // State 0 stays 0 under a = 2 however long; the maps of long pieces
    // overflow even f64: (inf, 0).
    let a = vec![2.0; len];
    for strategy in strategies() {
        let got = run(strategy, &p, &[0.0], &a, &zeros);
        assert_same(&got, &zeros, &format!("a = 2, {strategy:?}"));
    }
    // Huge a with zeros between: products overflow within a lane, then
    // inf * 0 = NaN.
    let mut a = vec![1e30; len];
    for t in (0..len).step_by(97) {
        a[t] = 0.0;
    }
    for strategy in strategies() {
        let got = run(strategy, &p, &[0.0], &a, &zeros);
        assert_same(&got, &zeros, &format!("a = 1e30 and 0, {strategy:?}"));
    }
}

/// The chunked scan against the reference for lengths from 1 to 100k on
/// pools of several sizes, forced and as chosen.
#[test]
fn chunked_scan_on_several_pools() {
    let mut rng = Rng::new(29);
    for threads in [1, 2, 3, 4, 8] {
        let pool = rayon::ThreadPoolBuilder::new()
            .num_threads(threads)
            .build()
            .unwrap();
        for len in [1, 2, 3, 5, 100, 4097, 40_000, 100_000] {
            for rows in [1, 2, 3] {
                let p = params(1, rows, len);
                let x0 = rng.vec(rows, -1.0, 1.0);
                let a = rng.vec(p.seq_elems(), -1.0, 1.0);
                let u = rng.vec(p.seq_elems(), -1.0, 1.0);
                let want = reference::linear_scan_f32(&p, &x0, &a, &u).unwrap();
                let tol = tolerance(&p, &x0, &a, &u);
                for strategy in [None, Some(Strategy::Chunked { parts: threads })] {
                    let got = pool.install(|| run(strategy, &p, &x0, &a, &u));
                    let what = format!("{p:?} {strategy:?} on {threads} threads");
                    assert_close(&got, &want, &tol, &what);
                }
            }
        }
    }
}

#[test]
fn strategy_choice() {
    let choose = |rows, len, threads| Strategy::choose(&params(1, rows, len), threads);
    assert_eq!(choose(512, 16_384, 2), Strategy::Rows);
    assert_eq!(choose(2, 1 << 20, 2), Strategy::Rows);
    assert_eq!(choose(1, 1 << 20, 1), Strategy::Rows);
    assert_eq!(choose(1, 1 << 20, 2), Strategy::Chunked { parts: 2 });
    assert_eq!(choose(3, 1 << 20, 8), Strategy::Chunked { parts: 2 });
    assert_eq!(choose(1, 1 << 20, 64), Strategy::Chunked { parts: 64 });
    // Too short to be worth chunking.
    assert_eq!(choose(1, 1000, 8), Strategy::Rows);
    assert_eq!(choose(1, 40_000, 8), Strategy::Chunked { parts: 2 });
    assert_eq!(choose(0, 10, 8), Strategy::Rows);
}

#[test]
fn joint_rows_equal_the_plain_loop_exactly() {
    let mut rng = Rng::new(31);
    for rows in [ROWS_JOINT, 2 * ROWS_JOINT] {
        for len in [1, 5, 1003] {
            let x0 = rng.vec(rows, -1.0, 1.0);
            let a = rng.vec(rows * len, -1.0, 1.0);
            let u = rng.vec(rows * len, -1.0, 1.0);
            let mut y = vec![f32::NAN; rows * len];
            kernel::scan_rows(&x0, &a, &u, &mut y);
            for (r, &init) in x0.iter().enumerate() {
                let row = r * len..(r + 1) * len;
                let mut want = vec![0.0; len];
                kernel::scan_plain(init, &a[row.clone()], &u[row.clone()], &mut want);
                assert_same(&y[row], &want, &format!("row {r} of {rows}, len {len}"));
            }
        }
    }
}

#[test]
fn aggregate_matches_stepping() {
    let mut rng = Rng::new(37);
    for len in SHORT_LENGTHS.into_iter().chain(LONG_LENGTHS) {
        // Products from about 1 down to f64 underflow.
        let a = rng.vec(len, 0.9, 1.0);
        let u = rng.vec(len, -1.0, 1.0);
        let map = kernel::aggregate(&a, &u);
        let mul: f64 = a.iter().map(|&v| f64::from(v)).product();
        let add = kernel::state_plain(0.0, &a, &u);
        let sum_abs: f32 = u.iter().map(|v| v.abs()).sum();
        let tol = 3.0 * (len as f32) * f32::EPSILON;
        assert!(
            (map.mul - mul).abs() <= f64::from(tol) * mul + f64::MIN_POSITIVE,
            "len {len}: product {} vs {mul}",
            map.mul
        );
        assert!(
            (map.add - f64::from(add)).abs() <= f64::from(2.0 * tol * sum_abs),
            "len {len}"
        );
    }
}

#[test]
fn len_one_is_a_single_step() {
    let p = params(1, 2, 1);
    let mut y = [0.0; 2];
    linear_scan_f32(&p, &[2.0, 3.0], &[0.5, -1.0], &[1.0, 1.0], &mut y).unwrap();
    assert_eq!(y, [2.0, -2.0]);
}

#[test]
fn zero_a_passes_u_through() {
    let p = params(1, 1, 4);
    let u = [1.0, -2.0, 3.0, -4.0];
    let mut y = [0.0; 4];
    linear_scan_f32(&p, &[100.0], &[0.0; 4], &u, &mut y).unwrap();
    assert_eq!(y, u);
}

#[test]
fn empty_shapes_are_no_ops() {
    // len = 0: x0 still has one value per row, everything else is empty.
    let mut y: [f32; 0] = [];
    assert_eq!(
        linear_scan_f32(&params(2, 3, 0), &[1.0; 6], &[], &[], &mut y),
        Ok(())
    );
    assert_eq!(
        linear_scan_f32(&params(0, 3, 5), &[], &[], &[], &mut y),
        Ok(())
    );
    assert_eq!(
        linear_scan_f32(&params(2, 0, 5), &[], &[], &[], &mut y),
        Ok(())
    );
    assert_eq!(params(usize::MAX, 2, 0).seq_elems(), 0);
    assert_eq!(params(0, usize::MAX, usize::MAX).validate(), Ok(()));
}

#[test]
fn wrong_buffer_lengths_are_errors() {
    // Expected lengths: x0 2, a, u and y 6.
    let p = params(1, 2, 3);
    let (x0, a, u) = ([0.0; 3], [0.0; 7], [0.0; 7]);
    let mut y = [7.0; 7];
    let err = |which, expected, actual| {
        Err(KernelError::BufferLen {
            which,
            expected,
            actual,
        })
    };
    let mut run = |x0_len, a_len, u_len, y_len| {
        linear_scan_f32(&p, &x0[..x0_len], &a[..a_len], &u[..u_len], &mut y[..y_len])
    };
    assert_eq!(run(1, 6, 6, 6), err("x0", 2, 1));
    assert_eq!(run(3, 6, 6, 6), err("x0", 2, 3));
    assert_eq!(run(2, 5, 6, 6), err("a", 6, 5));
    assert_eq!(run(2, 6, 7, 6), err("u", 6, 7));
    assert_eq!(run(2, 6, 6, 7), err("y", 6, 7));
    assert_eq!(run(2, 6, 6, 0), err("y", 6, 0));
    // Nothing was written before the errors.
    assert_eq!(y, [7.0; 7]);
}

#[test]
fn overflowing_shape_is_an_error() {
    let p = params(usize::MAX, 2, 1);
    assert_eq!(
        linear_scan_f32(&p, &[], &[], &[], &mut []),
        Err(KernelError::Overflow {
            what: "scan state element count"
        })
    );
    let p = params(usize::MAX / 2, 2, 3);
    assert_eq!(
        p.validate(),
        Err(KernelError::Overflow {
            what: "scan sequence element count"
        })
    );
}

#[test]
fn result_does_not_depend_on_pool_size_with_many_rows() {
    // At least 8 rows per thread: the rows strategy with whole row groups.
    let mut rng = Rng::new(3);
    let p = params(5, 6, 3000);
    let x0 = rng.vec(p.state_elems(), -1.0, 1.0);
    let a = rng.vec(p.seq_elems(), -1.0, 1.0);
    let u = rng.vec(p.seq_elems(), -1.0, 1.0);
    let run = |threads| {
        let pool = rayon::ThreadPoolBuilder::new()
            .num_threads(threads)
            .build()
            .unwrap();
        let mut y = vec![0.0; p.seq_elems()];
        pool.install(|| linear_scan_f32(&p, &x0, &a, &u, &mut y))
            .unwrap();
        y
    };
    let single = run(1);
    for threads in [2, 3] {
        assert_eq!(run(threads), single, "{threads} threads");
    }
}
