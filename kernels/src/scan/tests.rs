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

/// Runs `strategy` (`None`: the automatic choice) on `backend` (`None`:
/// the detected one).
fn run_on(
    strategy: Option<Strategy>,
    backend: Option<RowKernel>,
    p: &ScanParams,
    x0: &[f32],
    a: &[f32],
    u: &[f32],
) -> Vec<f32> {
    let mut y = vec![f32::NAN; p.seq_elems()];
    match (strategy, backend) {
        (None, None) => linear_scan_f32(p, x0, a, u, &mut y),
        (strategy, backend) => {
            let threads = rayon::current_num_threads();
            let strategy = strategy.unwrap_or_else(|| Strategy::choose(p, threads));
            let backend = backend.unwrap_or_else(|| RowKernel::of(Isa::detect()));
            linear_scan_with(strategy, backend, p, x0, a, u, &mut y)
        }
    }
    .unwrap();
    y
}

/// Every (strategy, backend) pair tests run: each strategy of
/// [`strategies`] on each backend this CPU has.
fn paths() -> Vec<(Option<Strategy>, Option<RowKernel>)> {
    let mut all = vec![(None, None)];
    for backend in RowKernel::all_available() {
        all.extend(strategies().map(|s| (s, Some(backend))));
    }
    all
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
    for (strategy, backend) in paths() {
        let y = run_on(strategy, backend, p, x0, a, u);
        assert_close(&y, &want, &tol, &format!("{p:?} {strategy:?} {backend:?}"));
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
    for (strategy, backend) in paths() {
        let got = run_on(strategy, backend, &p, &[0.0], &a, &zeros);
        assert_same(&got, &zeros, &format!("a = 2, {strategy:?} {backend:?}"));
    }
    // Huge a with zeros between: products overflow within a lane, then
    // inf * 0 = NaN.
    let mut a = vec![1e30; len];
    for t in (0..len).step_by(97) {
        a[t] = 0.0;
    }
    for (strategy, backend) in paths() {
        let got = run_on(strategy, backend, &p, &[0.0], &a, &zeros);
        assert_same(
            &got,
            &zeros,
            &format!("a = 1e30 and 0, {strategy:?} {backend:?}"),
        );
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
                let mut paths = vec![(None, None)];
                for backend in RowKernel::all_available() {
                    paths.push((Some(Strategy::Chunked { parts: threads }), Some(backend)));
                }
                for (strategy, backend) in paths {
                    let got = pool.install(|| run_on(strategy, backend, &p, &x0, &a, &u));
                    let what = format!("{p:?} {strategy:?} {backend:?} on {threads} threads");
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

/// Lengths up to a few groups of the AVX2 row kernel, every tail.
#[cfg(target_arch = "x86_64")]
#[test]
fn avx2_rows_of_every_short_length() {
    let Some(avx2) = super::simd::Avx2::of(Isa::detect()) else {
        return;
    };
    let mut rng = Rng::new(43);
    for len in (0..=3 * super::simd::GROUP + 9).chain([1000, 1024, 4099]) {
        let p = params(1, 1, len);
        let x0 = rng.vec(1, -1.0, 1.0);
        let a = rng.vec(len, -1.0, 1.0);
        let u = rng.vec(len, -1.0, 1.0);
        let want = reference::linear_scan_f32(&p, &x0, &a, &u).unwrap();
        let tol = tolerance(&p, &x0, &a, &u);
        let mut y = vec![f32::NAN; len];
        let last = avx2.scan_row(x0[0], &a, &u, &mut y);
        assert_close(&y, &want, &tol, &format!("len {len}"));
        assert_eq!(last, y.last().copied().unwrap_or(x0[0]), "len {len}");
    }
}

/// Products of `a` that underflow within a vector: an impulse from a huge
/// state through `a = 10^-5.5` for 8 steps, then `a = 10^5.5` for 8 steps,
/// round and round. The state stays normal (`>= 1e-6`) all along, but the
/// product of one vector's `a` (1e-44) is subnormal: unless the AVX2 scan
/// recomputes such groups stepwise, results are off by a large fraction.
/// (The portable blocked scans, the few-rows paths without AVX2, are not
/// held to this: their running products of 16 steps, rescaled only every
/// 16, lose precision the same way.)
#[cfg(target_arch = "x86_64")]
#[test]
fn avx2_tiny_a_products_stay_accurate() {
    let Some(avx2) = super::simd::Avx2::of(Isa::detect()) else {
        return;
    };
    let len = 3000;
    let p = params(1, 3, len);
    let a: Vec<f32> = (0..p.seq_elems())
        .map(|i| {
            if (i % len) / 8 % 2 == 0 {
                10f32.powf(-5.5)
            } else {
                10f32.powf(5.5)
            }
        })
        .collect();
    let u = vec![0.0; p.seq_elems()];
    let x0 = [1e37, -1e36, 1e30];
    // With a zero now and then too (a restart from an impulse), which must
    // not be taken for a tiny `a`.
    let mut a_zeros = a.clone();
    let mut u_impulses = u.clone();
    for t in (0..a.len()).filter(|t| t % len % 80 == 0) {
        a_zeros[t] = 0.0;
        u_impulses[t] = 1e30;
    }
    for (a, u) in [(&a, &u), (&a_zeros, &u_impulses)] {
        let want = reference::linear_scan_f32(&p, &x0, a, u).unwrap();
        let tol = tolerance(&p, &x0, a, u);
        for stream in [false, true] {
            // Every offset from a 32-byte boundary, so the streaming path's
            // aligned start is taken after 0 to 7 plain steps.
            let mut buf = vec![f32::NAN; p.seq_elems() + 8];
            for skip in 0..8 {
                let y = &mut buf[skip..skip + p.seq_elems()];
                y.fill(f32::NAN);
                avx2.scan_rows(&x0, a, u, y, stream);
                assert_close(
                    y,
                    &want,
                    &tol,
                    &format!("scan_rows, stream {stream}, +{skip}"),
                );
            }
        }
        let y = run_on(
            Some(Strategy::Rows),
            Some(RowKernel::Avx2(avx2)),
            &p,
            &x0,
            a,
            u,
        );
        assert_close(&y, &want, &tol, "rows strategy");
    }
}

/// Infinities and NaN, in the inputs or from overflow: every backend gives
/// exactly the plain loop's non-finite outputs, and the finite ones before
/// them within rounding.
#[test]
fn non_finite_values_follow_the_plain_loop() {
    let len = 1000;
    let p = params(1, 4, len);
    let mut rng = Rng::new(47);
    let x0 = rng.vec(4, -1.0, 1.0);
    let mut a = rng.vec(p.seq_elems(), -1.0, 1.0);
    let mut u = rng.vec(p.seq_elems(), -1.0, 1.0);
    u[123] = f32::INFINITY; // row 0
    a[len + 500] = f32::NAN; // row 1
    a[2 * len + 700..2 * len + 720].fill(1e30); // row 2 overflows
    u[3 * len + 999] = f32::NEG_INFINITY; // row 3, last step
    let mut want = vec![0.0; p.seq_elems()];
    for (r, &init) in x0.iter().enumerate() {
        let row = r * len..(r + 1) * len;
        kernel::scan_plain(init, &a[row.clone()], &u[row.clone()], &mut want[row]);
    }
    for (strategy, backend) in paths() {
        let got = run_on(strategy, backend, &p, &x0, &a, &u);
        let what = format!("{strategy:?} {backend:?}");
        for (t, (&g, &w)) in got.iter().zip(&want).enumerate() {
            if w.is_finite() {
                assert!(
                    (g - w).abs() <= 1e-4 * (1.0 + w.abs()),
                    "{what}: t={t}: {g} vs {w}"
                );
            } else {
                assert!(
                    g.to_bits() == w.to_bits() || (g.is_nan() && w.is_nan()),
                    "{what}: t={t}: {g} vs {w}"
                );
            }
        }
    }
}

/// Throughput of the rows strategy for 512 rows on 2 threads, in GB/s at
/// 12 bytes per element, against the plain loop with rows in parallel
/// (what the benchmark's C loop does with `#pragma omp parallel for`, but
/// unfused: Rust does not contract `a * s + u`) and a stream of the same
/// bytes (`y = a + u` in parallel, the roofline of this access pattern).
/// Candidates run in turns, many times each, and the best time counts:
/// the machine may be shared, so only numbers from one run compare.
///
/// `cargo test -p rustconv-kernels --release --lib -- --ignored --nocapture scan_throughput`
///
/// On the 2-core Zen 5 this was written on (best of many, on a shared
/// machine; L3-resident at 1024 and 4096, DRAM at 16384) it measured, in
/// GB/s at len 1024 / 4096 / 16384: AVX2 84 / 78 / 51, portable 47 / 45 /
/// 38, plain loop 17 / 16 / 16, stream 167 / 120 / 52.
#[test]
#[ignore = "timing, not a check; run in release mode"]
fn scan_throughput() {
    use rayon::prelude::*;
    use std::time::Instant;

    let threads = 2;
    let pool = rayon::ThreadPoolBuilder::new()
        .num_threads(threads)
        .build()
        .unwrap();
    let rows = 512;
    let mut rng = Rng::new(5);
    for len in [1024, 4096, 16_384] {
        let p = params(1, rows, len);
        let n = p.seq_elems();
        let x0 = rng.vec(rows, -1.0, 1.0);
        let a = rng.vec(n, 0.0, 1.0);
        let u = rng.vec(n, -1.0, 1.0);
        let mut y = vec![0.0f32; n];
        let (x0, a, u) = (&x0[..], &a[..], &u[..]);
        // Like OpenMP's static schedule: one contiguous block per thread.
        let block = rows.div_ceil(threads) * len;
        type Candidate<'a> = (String, Box<dyn Fn(&mut [f32]) + Sync + 'a>);
        let mut candidates: Vec<Candidate> = vec![
            (
                "stream y = a + u".into(),
                Box::new(|y: &mut [f32]| {
                    y.par_chunks_mut(block)
                        .zip(a.par_chunks(block))
                        .zip(u.par_chunks(block))
                        .for_each(|((y, a), u)| {
                            for ((y, &a), &u) in y.iter_mut().zip(a).zip(u) {
                                *y = a + u;
                            }
                        });
                }),
            ),
            (
                "plain loop".into(),
                Box::new(|y: &mut [f32]| {
                    y.par_chunks_mut(block)
                        .zip(a.par_chunks(block))
                        .zip(u.par_chunks(block))
                        .zip(x0.par_chunks(block / len))
                        .for_each(|(((y, a), u), x0)| {
                            for (((y, a), u), &s) in y
                                .chunks_exact_mut(len)
                                .zip(a.chunks_exact(len))
                                .zip(u.chunks_exact(len))
                                .zip(x0)
                            {
                                kernel::scan_plain(s, a, u, y);
                            }
                        });
                }),
            ),
            (
                "linear_scan_f32".into(),
                Box::new(|y: &mut [f32]| linear_scan_f32(&p, x0, a, u, y).unwrap()),
            ),
        ];
        for backend in RowKernel::all_available() {
            candidates.push((
                format!("rows on {backend:?}"),
                Box::new(move |y: &mut [f32]| {
                    linear_scan_with(Strategy::Rows, backend, &p, x0, a, u, y).unwrap();
                }),
            ));
        }
        let mut times = vec![Vec::new(); candidates.len()];
        let reps = (2_000_000 / n).max(2);
        for _turn in 0..40 {
            for ((_, f), times) in candidates.iter().zip(&mut times) {
                for _ in 0..reps {
                    let start = Instant::now();
                    pool.install(|| f(&mut y));
                    times.push(start.elapsed().as_secs_f64());
                }
            }
        }
        for ((name, _), times) in candidates.iter().zip(&mut times) {
            times.sort_by(f64::total_cmp);
            let gbs = |s: f64| 12.0 * n as f64 / s / 1e9;
            let (best, quartile) = (times[0], times[times.len() / 4]);
            println!(
                "len {len:5}  {name:24} best {:8.1} us {:6.1} GB/s, first quartile {:6.1} GB/s",
                best * 1e6,
                gbs(best),
                gbs(quartile)
            );
        }
    }
}

#[test]
fn decode_steps_equal_the_plain_loop_bit_for_bit() {
    // Rows of at most four steps take the plain recurrence (serial, and in
    // parallel past 64K elements): exactly the sequential loop's roundings.
    let mut rng = Rng::new(21);
    let pool = rayon::ThreadPoolBuilder::new()
        .num_threads(3)
        .build()
        .unwrap();
    for (b, c, len) in [
        (1, 1024, 1),
        (2, 3, 2),
        (1, 5, 4),
        (2, 40_000, 1),
        (3, 9_000, 3),
    ] {
        let p = params(b, c, len);
        let x0 = rng.vec(b * c, -1.0, 1.0);
        let a = rng.vec(b * c * len, 0.0, 1.0);
        let u = rng.vec(b * c * len, -1.0, 1.0);
        let mut y = vec![f32::NAN; b * c * len];
        pool.install(|| linear_scan_f32(&p, &x0, &a, &u, &mut y))
            .unwrap();
        let mut want = vec![0.0; y.len()];
        for r in 0..b * c {
            let mut s = x0[r];
            for t in 0..len {
                s = a[r * len + t] * s + u[r * len + t];
                want[r * len + t] = s;
            }
        }
        assert_eq!(y, want, "{p:?}");
    }
}
