//! Elementwise transcendental functions written to auto-vectorise: no
//! branches or calls in the loop body, only arithmetic, selects and bit
//! casts, so a loop over a slice becomes SIMD on every target (the libm
//! functions `f32::exp` and friends are scalar calls).
//!
//! Accuracy (checked against f64 in the tests): `exp` and `ln` within 2
//! ulp over their useful range, `erf` within 5e-7 absolute, the derived
//! functions within a few ulp of their definitions: far inside the 1e-4
//! the delegate is held to.

// The polynomial coefficients are written as published (Cephes), with
// more digits than f32 holds.
#![allow(clippy::excessive_precision)]

/// `a * b + c`, as one fused multiply-add where `F` (the caller compiled
/// for a CPU with FMA; without it `mul_add` would be a libm call), else as
/// two operations. The polynomials below are Horner chains of these.
#[inline(always)]
fn fma<const F: bool>(a: f32, b: f32, c: f32) -> f32 {
    if F {
        a.mul_add(b, c)
    } else {
        a * b + c
    }
}

/// `e^x`; below about -87.3 it returns the smallest normal (about 1.2e-38)
/// instead of a subnormal or 0, and infinity above 88.7.
#[inline(always)]
pub(crate) fn exp<const F: bool>(x: f32) -> f32 {
    // Above 88.73 e^x overflows f32: 89 gives n = 128 and infinity below.
    let (er, n) = exp_parts::<F>(x.clamp(EXP_MIN, 89.0));
    // 2^n as two factors 2^n1 * 2^n2 (each within [-63, 64]), so that
    // n = 128 (x near the clamp) overflows to infinity and n = -126 stays
    // exact, with no branch.
    let n1 = n >> 1;
    let n2 = n - n1;
    er * pow2(n1) * pow2(n2)
}

/// [`exp`] for `x <= 0` (NaN in, NaN out): `n <= 0`, so one factor `2^n`
/// is exact (`n >= -126`) and no upper clamp is needed: seven operations
/// fewer. Equal to `exp(x)` bit for bit (scaling by a power of two is
/// exact while normal, and both round a subnormal once).
#[inline(always)]
pub(crate) fn exp_nonpositive<const F: bool>(x: f32) -> f32 {
    // `x < EXP_MIN` is false for NaN, which passes through.
    let (er, n) = exp_parts::<F>(if x < EXP_MIN { EXP_MIN } else { x });
    er * pow2(n)
}

/// Where [`exp`] stops: `e^EXP_MIN` is the smallest normal, `2^-126`.
const EXP_MIN: f32 = -87.336_55;

/// `e^r` and `n` with `e^x = e^r * 2^n`, for `x` already clamped to
/// `[EXP_MIN, 89]`.
#[inline(always)]
fn exp_parts<const F: bool>(x: f32) -> (f32, i32) {
    // e^x = 2^n * e^r, n = round(x / ln 2), r = x - n ln 2 in [-ln2/2, ln2/2],
    // e^r by a degree-6 polynomial (Cephes expf's coefficients).
    const LN2_HI: f32 = 0.693_359_4;
    const LN2_LO: f32 = -2.121_944_4e-4;
    // Round to nearest by adding and removing 1.5 * 2^23 (f32::round is a
    // libm call on baseline x86_64, and `as i32` a saturating conversion:
    // either would stop vectorisation). The sum's low mantissa bits hold n.
    const ROUND: f32 = 12_582_912.0;
    let shifted = fma::<F>(x, std::f32::consts::LOG2_E, ROUND);
    let n = shifted - ROUND;
    let r = fma::<F>(-n, LN2_LO, fma::<F>(-n, LN2_HI, x));
    let p = 1.987_569_1e-4_f32;
    let p = fma::<F>(p, r, 1.398_199_9e-3);
    let p = fma::<F>(p, r, 8.333_452e-3);
    let p = fma::<F>(p, r, 4.166_579_6e-2);
    let p = fma::<F>(p, r, 1.666_666_5e-1);
    let p = fma::<F>(p, r, 5.000_000_1e-1);
    let er = fma::<F>(p, r * r, r) + 1.0;
    let n = shifted.to_bits().wrapping_sub(ROUND.to_bits()) as i32;
    (er, n)
}

/// `2^k` for `k` in `[-126, 127]`.
#[inline(always)]
fn pow2(k: i32) -> f32 {
    f32::from_bits(((k + 127) as u32) << 23)
}

/// Natural logarithm for `x > 0`; `ln(0) = -inf`, negative or NaN gives NaN.
#[inline(always)]
pub(crate) fn ln<const F: bool>(x: f32) -> f32 {
    // x = m * 2^e with m in [sqrt(1/2), sqrt(2)); ln x = e ln 2 + ln m, with
    // ln m from the Cephes logf polynomial in f = m - 1.
    // Subnormals: scale into the normal range first (no call, no branch).
    let subnormal = x < f32::MIN_POSITIVE;
    let xs = if subnormal { x * 8_388_608.0 } else { x };
    let bits = xs.to_bits();
    let mut e = ((bits >> 23) & 0xff) as i32 - 127 - if subnormal { 23 } else { 0 };
    let mut m = f32::from_bits((bits & 0x007f_ffff) | 0x3f80_0000);
    let shift = m > std::f32::consts::SQRT_2;
    m = if shift { m * 0.5 } else { m };
    e += shift as i32;
    let f = m - 1.0;
    let z = f * f;
    let p = 7.037_683_6e-2_f32;
    let p = fma::<F>(p, f, -1.151_461e-1);
    let p = fma::<F>(p, f, 1.167_699_9e-1);
    let p = fma::<F>(p, f, -1.242_014_1e-1);
    let p = fma::<F>(p, f, 1.424_932_3e-1);
    let p = fma::<F>(p, f, -1.666_805_8e-1);
    let p = fma::<F>(p, f, 2.000_071_4e-1);
    let p = fma::<F>(p, f, -2.499_999_4e-1);
    let p = fma::<F>(p, f, 3.333_333e-1);
    let y = f + (p * f * z - 0.5 * z) + e as f32 * std::f32::consts::LN_2;
    // Zero, negatives, infinity and NaN, where the bit trick does not hold.
    if x == f32::INFINITY {
        f32::INFINITY
    } else if x == 0.0 {
        f32::NEG_INFINITY
    } else if x.is_nan() || x < 0.0 {
        f32::NAN
    } else {
        y
    }
}

/// `ln(1 + x)`, accurate for small `x`: `ln(u) - ((u - 1) - x) / u` with
/// `u = 1 + x` removes the rounding of `1 + x` to first order.
#[inline(always)]
pub(crate) fn log1p<const F: bool>(x: f32) -> f32 {
    let u = 1.0 + x;
    let y = ln::<F>(u) - ((u - 1.0) - x) / u;
    if u == f32::INFINITY {
        u
    } else {
        y
    }
}

/// `softplus(x) = max(x, 0) + log1p(e^-|x|)` (beta 1; PyTorch's threshold
/// 20 changes nothing in f32). `t = e^-|x|` lies in `(0, 1]`, where
/// `log1p(t) = 2 atanh(s)` with `s = t / (2 + t)` in `(0, 1/3]`: the odd
/// series `2 s (1 + s^2/3 + s^4/5 + ...)` to `s^12/13` is within 1.5e-8
/// relative there (the next term is `s^14/15 <= 9^-7/15`). That is one
/// division and seven multiply-adds instead of a logarithm's exponent and
/// mantissa split, range reduction and nine-term polynomial: the SSM
/// block's prologue computes a softplus per element, and this made it
/// about a quarter cheaper. NaN gives NaN.
#[inline(always)]
pub(crate) fn softplus<const F: bool>(x: f32) -> f32 {
    let t = exp_nonpositive::<F>(-x.abs());
    let s = t / (2.0 + t);
    let z = s * s;
    let p = 2.0 / 13.0;
    let p = fma::<F>(p, z, 2.0 / 11.0);
    let p = fma::<F>(p, z, 2.0 / 9.0);
    let p = fma::<F>(p, z, 2.0 / 7.0);
    let p = fma::<F>(p, z, 2.0 / 5.0);
    let p = fma::<F>(p, z, 2.0 / 3.0);
    let log1p_t = s * fma::<F>(p, z, 2.0);
    // NaN needs no case of its own: `t`, `s` and so the sum are NaN.
    (if x > 0.0 { x } else { 0.0 }) + log1p_t
}

/// Logistic sigmoid: `1 / (1 + t)` for `x >= 0` and `t / (1 + t)` below,
/// `t = e^-|x|` in `(0, 1]`: the exponent is never positive, so the
/// cheaper [`exp_nonpositive`] serves (the SSM block's gate computes a
/// sigmoid per element). Below `EXP_MIN`, where `t` stops at the smallest
/// normal, the result is 0, as `1 / (1 + e^-x)` gives in f32 and PyTorch
/// returns (so `silu(-inf)` is NaN and `silu(-1e30)` is -0, as there).
#[inline(always)]
pub(crate) fn sigmoid<const F: bool>(x: f32) -> f32 {
    let t = exp_nonpositive::<F>(-x.abs());
    // NaN needs no case of its own: `t`, and so the quotient, is NaN.
    let num = if x < EXP_MIN {
        0.0
    } else if x < 0.0 {
        t
    } else {
        1.0
    };
    num / (1.0 + t)
}

/// Hyperbolic tangent: Cephes tanhf's odd polynomial below 0.625 (where
/// `1 - 2 / (e^2x + 1)` would cancel), that form above.
#[inline(always)]
pub(crate) fn tanh<const F: bool>(x: f32) -> f32 {
    let z = x * x;
    let p = -5.704_988_7e-3_f32;
    let p = fma::<F>(p, z, 2.063_908_9e-2);
    let p = fma::<F>(p, z, -5.373_971_6e-2);
    let p = fma::<F>(p, z, 1.333_144_2e-1);
    let p = fma::<F>(p, z, -3.333_328_2e-1);
    let small = p * z * x + x;
    let big = 1.0 - 2.0 / (exp::<F>(2.0 * x) + 1.0);
    if x.abs() < 0.625 {
        small
    } else {
        big
    }
}

/// The error function by Abramowitz and Stegun 7.1.26: |error| < 5e-7 in
/// f32 (a rational form would be tighter; this is far inside 1e-4).
#[inline(always)]
pub(crate) fn erf<const F: bool>(x: f32) -> f32 {
    // erf(x) = sign(x) (1 - t P(t) e^{-x^2}), t = 1 / (1 + p |x|), with the
    // five-term fit of A&S 7.1.26 evaluated in f32 (max error 1.5e-7).
    let a = x.abs();
    let t = 1.0 / (1.0 + 0.327_591_1 * a);
    let p = 1.061_405_4_f32;
    let p = fma::<F>(p, t, -1.453_152_1);
    let p = fma::<F>(p, t, 1.421_413_8);
    let p = fma::<F>(p, t, -0.284_496_74);
    let p = fma::<F>(p, t, 0.254_829_6);
    // -a^2 <= 0: the cheaper exp, equal bit for bit.
    let y = 1.0 - p * t * exp_nonpositive::<F>(-a * a);
    if x < 0.0 {
        -y
    } else {
        y
    }
}

/// GELU, exact form: `x/2 (1 + erf(x / sqrt 2))`.
#[inline(always)]
pub(crate) fn gelu<const F: bool>(x: f32) -> f32 {
    0.5 * x * (1.0 + erf::<F>(x * std::f32::consts::FRAC_1_SQRT_2))
}

/// GELU, tanh approximation (PyTorch's `approximate="tanh"`).
#[inline(always)]
pub(crate) fn gelu_tanh<const F: bool>(x: f32) -> f32 {
    const K: f32 = 0.797_884_56; // sqrt(2 / pi)
    0.5 * x * (1.0 + tanh::<F>(K * (x + 0.044_715 * x * x * x)))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn grid(lo: f32, hi: f32, n: usize) -> impl Iterator<Item = f32> {
        (0..=n).map(move |i| lo + (hi - lo) * i as f32 / n as f32)
    }

    fn check(name: &str, f: fn(f32) -> f32, g: fn(f64) -> f64, lo: f32, hi: f32, rtol: f64) {
        for x in grid(lo, hi, 20_000) {
            let want = g(x as f64);
            let got = f(x) as f64;
            let err = (got - want).abs();
            assert!(
                err <= rtol * want.abs().max(1e-30) || err <= 1e-37,
                "{name}({x}) = {got}, want {want} (error {err:e})"
            );
        }
    }

    /// Each test runs both forms: with fused multiply-adds (as the AVX2,
    /// AVX-512 and aarch64 loops compile) and without (baseline x86-64).
    #[test]
    fn exp_and_ln_are_within_a_few_ulp() {
        exp_and_ln::<false>();
        exp_and_ln::<true>();
    }

    fn exp_and_ln<const F: bool>() {
        let (exp, ln) = (exp::<F>, ln::<F>);
        check("exp", exp, f64::exp, -87.0, 88.0, 3e-7);
        check("ln", ln, f64::ln, 1e-30, 1e30, 3e-7);
        check("ln", ln, f64::ln, 0.5, 2.0, 3e-7);
        assert!(exp(-200.0) < 1.2e-38, "flushes to the smallest normal");
        assert_eq!(exp(200.0), f32::INFINITY);
        assert!(ln(-1.0).is_nan() && ln(f32::NAN).is_nan());
        assert_eq!(ln(0.0), f32::NEG_INFINITY);
        assert_eq!(ln(f32::INFINITY), f32::INFINITY);
        assert!((ln(1e-40) as f64 - (1e-40f64).ln()).abs() < 1e-4);
    }

    #[test]
    fn exp_of_nonpositive_arguments_is_exp_bit_for_bit() {
        for x in grid(-100.0, 0.0, 200_000).chain([0.0, -0.0, f32::NEG_INFINITY, -87.336_55]) {
            for (a, b) in [
                (exp_nonpositive::<false>(x), exp::<false>(x)),
                (exp_nonpositive::<true>(x), exp::<true>(x)),
            ] {
                assert_eq!(a.to_bits(), b.to_bits(), "exp({x})");
            }
        }
        assert!(exp_nonpositive::<true>(f32::NAN).is_nan());
    }

    #[test]
    fn derived_functions_match_their_definitions() {
        derived::<false>();
        derived::<true>();
    }

    fn derived<const F: bool>() {
        let (log1p, sigmoid, tanh) = (log1p::<F>, sigmoid::<F>, tanh::<F>);
        check("log1p", log1p, f64::ln_1p, -0.999, 1e6, 4e-7);
        check("log1p", log1p, f64::ln_1p, -1e-6, 1e-6, 4e-7);
        check(
            "sigmoid",
            sigmoid,
            |x| 1.0 / (1.0 + (-x).exp()),
            -80.0,
            80.0,
            1e-6,
        );
        check("tanh", tanh, f64::tanh, -20.0, 20.0, 2e-6);
        let softplus64 = |x: f64| if x > 20.0 { x } else { x.exp().ln_1p() };
        check("softplus", softplus::<F>, softplus64, -80.0, 80.0, 1e-6);
        check("softplus", softplus::<F>, softplus64, -1e-3, 1e-3, 1e-6);
        check("softplus", softplus::<F>, softplus64, 1e3, 1e30, 1e-7);
        assert!(softplus::<F>(f32::NAN).is_nan());
        assert!(sigmoid(f32::NAN).is_nan());
        assert_eq!(sigmoid(f32::NEG_INFINITY), 0.0);
        assert_eq!(sigmoid(-100.0), 0.0);
        assert_eq!(sigmoid(f32::INFINITY), 1.0);
        assert!(sigmoid(-f32::NAN).is_nan());
        assert_eq!(softplus::<F>(f32::INFINITY), f32::INFINITY);
        // e^x flushes to the smallest normal (see exp), not to 0.
        assert!((0.0..1.2e-38).contains(&softplus::<F>(f32::NEG_INFINITY)));
        assert!((0.0..1.2e-38).contains(&softplus::<F>(-200.0)));
        assert_eq!(tanh(100.0), 1.0);
        assert_eq!(tanh(-100.0), -1.0);
    }

    #[test]
    fn erf_and_gelu_are_within_5e7_absolute() {
        erf_and_gelu::<false>();
        erf_and_gelu::<true>();
    }

    fn erf_and_gelu<const F: bool>() {
        let (erf, gelu, gelu_tanh) = (erf::<F>, gelu::<F>, gelu_tanh::<F>);
        fn erf64(x: f64) -> f64 {
            // Rust's std has no erf: integrate in f64 instead,
            // erf(x) = 2/sqrt(pi) * integral_0^x e^{-t^2} dt, Simpson, 2000 steps.
            let n = 2000;
            let h = x / n as f64;
            let f = |t: f64| (-t * t).exp();
            let mut s = f(0.0) + f(x);
            for i in 1..n {
                s += f(i as f64 * h) * if i % 2 == 1 { 4.0 } else { 2.0 };
            }
            s * h / 3.0 * 2.0 / std::f64::consts::PI.sqrt()
        }
        for x in grid(-6.0, 6.0, 3000) {
            let want = erf64(x as f64);
            assert!(
                (erf(x) as f64 - want).abs() < 5e-7,
                "erf({x}) = {}, want {want}",
                erf(x)
            );
            let gelu_want = 0.5 * x as f64 * (1.0 + erf64(x as f64 / 2f64.sqrt()));
            assert!((gelu(x) as f64 - gelu_want).abs() < 1e-6 * (1.0 + gelu_want.abs()));
        }
        let k = (2.0 / std::f64::consts::PI).sqrt();
        for x in grid(-10.0, 10.0, 3000) {
            let x64 = x as f64;
            let want = 0.5 * x64 * (1.0 + (k * (x64 + 0.044715 * x64.powi(3))).tanh());
            assert!((gelu_tanh(x) as f64 - want).abs() < 2e-6 * (1.0 + want.abs()));
        }
    }
}
