//! Elementwise transcendental functions written to auto-vectorise: no
//! branches or calls in the loop body, only arithmetic, selects and bit
//! casts, so a loop over a slice becomes SIMD on every target (the libm
//! functions `f32::exp` and friends are scalar calls).
//!
//! Accuracy (checked against f64 in the tests): `exp` and `ln` within 2
//! ulp over their useful range, GELU's `erf` within 5e-7 absolute (so
//! GELU within `1e-6 (1 + |gelu|)`: its negative tail is absolute, as
//! PyTorch's own f32 `1 + erf` cancels there), sigmoid, SiLU and tanh
//! within 1e-6 relative, the others within a few ulp of their
//! definitions: far inside the 1e-4 the delegate is held to.
//!
//! Cost: a division is the dearest operation here (on AVX-512 about as
//! much as 18 fused multiply-adds, one per 16 lanes at a time), so each
//! function has at most one. Sigmoid, SiLU and the tanh GELU are one
//! exponential (of degree 5) and one division, tanh and the exact GELU one
//! rational function (no exponential): 0.22-0.28 ns an element on one
//! AVX-512 core (Xeon, 8192 elements), against 0.34-0.73 ns for the
//! exponential-and-division forms before them.

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

/// `e^-x` for the logistic forms `1 / (1 + e^-x)` below: `x` clamped to
/// `[-89, 88]`, where `e^-x` is infinity below about -88.4 (so their
/// quotients are 0, or `-0` or NaN where the numerator is `x`, as PyTorch's
/// f32 `1 / (1 + exp(-x))` gives below -88.7) and 0 above about 87.7 (the
/// quotients are then exact). Between, within 4e-7 relative: `e^-x = 2^n
/// e^r`, `n = round(-x log2 e)`, `r` in `[-ln2/2, ln2/2]` and `e^r` by a
/// degree-5 minimax polynomial (1.8e-7 in f32), which is what the
/// quotients need; [`exp`]'s degree 7 would be two multiply-adds more.
/// `2^n` comes from the rounding sum's bits alone: with `127 + 1.5 * 2^23`
/// added, its low nine bits are `127 + n`, the biased exponent, in `[0,
/// 255]` over the clamped range (0 gives 0.0, 255 infinity). With fused
/// multiply-adds `r = -x - n ln2` is one rounding (the error of `ln2` in
/// f32, 1.9e-9 relative, grows to 2.4e-7 at `n = 127`); without, `n ln2` is
/// split in two (Cody and Waite) so that its first product is exact.
/// NaN passes through (the clamps keep it).
#[inline(always)]
fn exp_neg_clamped<const F: bool>(x: f32) -> f32 {
    const MAGIC: f32 = 12_583_039.0; // 1.5 * 2^23 + 127
    let x = if x < -89.0 { -89.0 } else { x };
    let x = if x > 88.0 { 88.0 } else { x };
    let shifted = fma::<F>(x, -std::f32::consts::LOG2_E, MAGIC);
    let n = shifted - MAGIC;
    // `-r`, so that the polynomial below is `e^-(-r)` with alternating signs.
    let neg_r = if F {
        fma::<F>(n, std::f32::consts::LN_2, x)
    } else {
        fma::<F>(n, -2.121_944_4e-4, fma::<F>(n, 0.693_359_4, x))
    };
    let p = fma::<F>(-8.325_664_3e-3, neg_r, 4.190_804_4e-2);
    let p = fma::<F>(p, neg_r, -1.666_693_9e-1);
    let p = fma::<F>(p, neg_r, 4.999_904_3e-1);
    let p = fma::<F>(p, neg_r, -1.0);
    let er = fma::<F>(p, neg_r, 1.0);
    er * f32::from_bits(shifted.to_bits() << 23)
}

/// Logistic sigmoid `1 / (1 + e^-x)`, within 6e-7 relative (one division:
/// the division's throughput bounds the loop, a reciprocal refined by
/// Newton's method measured no faster). 0 below about -88.4 (PyTorch's f32
/// gives subnormals down to -88.7, then 0), 1 above about 17, NaN for NaN.
#[inline(always)]
pub(crate) fn sigmoid<const F: bool>(x: f32) -> f32 {
    1.0 / (1.0 + exp_neg_clamped::<F>(x))
}

/// SiLU `x * sigmoid(x)`, as `x / (1 + e^-x)`: no multiplication, and the
/// same edges as PyTorch's: `silu(-inf)` is NaN (`-inf / inf`),
/// `silu(-1e30)` is -0 and `silu(inf)` infinity.
#[inline(always)]
pub(crate) fn silu<const F: bool>(x: f32) -> f32 {
    x / (1.0 + exp_neg_clamped::<F>(x))
}

/// Hyperbolic tangent by a rational minimax approximation `x P(x^2) /
/// Q(x^2)` (degrees 9 and 8, fitted for relative error; 3.7e-7 relative in
/// f32 with or without fused multiply-adds): one division, no exponential.
/// `P(0) = Q(0) = 1`, so a tiny or subnormal `x` (and -0) comes back as
/// itself; `x` is clamped to `±TANH_CLAMP`, where the approximation rounds
/// to `±1` exactly, and `tanh(9) = 1 - 3e-8` rounds to 1 in f32 too.
#[inline(always)]
pub(crate) fn tanh<const F: bool>(x: f32) -> f32 {
    let z = if x < -TANH_CLAMP { -TANH_CLAMP } else { x };
    let z = if z > TANH_CLAMP { TANH_CLAMP } else { z };
    let w = z * z;
    let p = fma::<F>(1.338_364_1e-8, w, 2.066_909_5e-5);
    let p = fma::<F>(p, w, 3.501_088_4e-3);
    let p = fma::<F>(p, w, 1.338_629e-1);
    let p = fma::<F>(p, w, 1.0);
    let q = fma::<F>(7.799_665e-7, w, 3.293_301_3e-4);
    let q = fma::<F>(q, w, 2.589_988_3e-2);
    let q = fma::<F>(q, w, 4.671_962_3e-1);
    let q = fma::<F>(q, w, 1.0);
    z * p / q
}

/// Where [`tanh`]'s rational form is exactly 1 in f32, with and without
/// fused multiply-adds (checked by the tests).
const TANH_CLAMP: f32 = 8.999_001;

/// `erf(x / sqrt 2)` (GELU's), by a rational minimax approximation `x
/// P(x^2) / Q(x^2)` (degrees 11 and 10, fitted for absolute error 3e-8;
/// 3e-7 in f32 with fused multiply-adds, 4.2e-7 without): one division, no
/// exponential. `x` is clamped to `±ERF_CLAMP`, where the approximation is
/// exactly `±1` in f32 (`1 - erf(ERF_CLAMP / sqrt 2)` is 8.6e-8), so that
/// GELU's `1 + erf` is exactly 0 from there on. The quotient is rounded
/// before it is used, for the same reason.
#[inline(always)]
fn erf_scaled<const F: bool>(x: f32) -> f32 {
    let z = if x < -ERF_CLAMP { -ERF_CLAMP } else { x };
    let z = if z > ERF_CLAMP { ERF_CLAMP } else { z };
    let w = z * z;
    let p = fma::<F>(4.597_312_4e-8, w, 1.267_121_8e-5);
    let p = fma::<F>(p, w, 3.321_354_5e-4);
    let p = fma::<F>(p, w, 9.321_409e-3);
    let p = fma::<F>(p, w, 6.716_385e-2);
    let p = fma::<F>(p, w, 7.978_845e-1);
    let q = fma::<F>(1.203_138_5e-6, w, 7.277_259e-5);
    let q = fma::<F>(q, w, 1.868_897_5e-3);
    let q = fma::<F>(q, w, 2.849_102_4e-2);
    let q = fma::<F>(q, w, 2.508_435_2e-1);
    let q = fma::<F>(q, w, 1.0);
    z * p / q
}

/// Where [`erf_scaled`] is exactly 1 in f32, with and without fused
/// multiply-adds (checked by the tests).
const ERF_CLAMP: f32 = 5.354_003_4;

/// GELU, exact form: `x Phi(x)`, `Phi(x) = (1 + erf(x / sqrt 2)) / 2`,
/// within 1e-6 (1 + |gelu|) absolute. As PyTorch's: -0 from about -5.35
/// down (`x * 0`), NaN at -inf (`-inf * 0`); infinity at +inf (PyTorch
/// 2.14's CPU kernel gives NaN there).
#[inline(always)]
pub(crate) fn gelu<const F: bool>(x: f32) -> f32 {
    x * fma::<F>(erf_scaled::<F>(x), 0.5, 0.5)
}

/// GELU, tanh approximation (PyTorch's `approximate="tanh"`): `x (1 +
/// tanh(u)) / 2 = x / (1 + e^-2u)`, `u = sqrt(2/pi) (x + 0.044715 x^3)`,
/// one exponential and one division. Edges as PyTorch's: NaN at -inf,
/// -0 for large negative `x`, infinity at +inf.
#[inline(always)]
pub(crate) fn gelu_tanh<const F: bool>(x: f32) -> f32 {
    const K2: f32 = 2.0 * 0.797_884_56; // 2 sqrt(2 / pi)
    let two_u = x * fma::<F>(x * x, K2 * 0.044_715, K2);
    x / (1.0 + exp_neg_clamped::<F>(two_u))
}

/// Where [`sin`] and [`cos`] are exact to about 1e-7: for `|x|` up to here
/// the reduction by multiples of pi/2 below is exact (`j` below 2^13, so
/// `j` times each part of pi/2, of at most 11 significant bits, is exact).
/// Beyond, or for NaN and infinities, the caller takes libm's functions
/// (`UnaryOp::apply_generic` checks the slice first).
pub(crate) const TRIG_FAST_MAX: f32 = 8192.0;

/// `sin(x)` for `|x| <= TRIG_FAST_MAX` (the Snake activation of audio
/// codecs, `x + sin(a x)^2 / a`).
#[inline(always)]
pub(crate) fn sin<const F: bool>(x: f32) -> f32 {
    sin_quadrant::<F>(x, 0)
}

/// `cos(x)` for `|x| <= TRIG_FAST_MAX`: the sine a quadrant on.
#[inline(always)]
pub(crate) fn cos<const F: bool>(x: f32) -> f32 {
    sin_quadrant::<F>(x, 1)
}

/// `sin(x + shift * pi/2)`: `x = j pi/2 + r` with `|r| <= pi/4` (Cody and
/// Waite's reduction by pi/2 in three parts), then the sine or cosine of
/// `r` (Cephes sinf's and cosf's polynomials) as `j + shift` picks, its
/// sign flipped in the lower half-turn. No branch: the quadrant's choice
/// is a select and a sign bit.
#[inline(always)]
fn sin_quadrant<const F: bool>(x: f32, shift: u32) -> f32 {
    const PIO2_1: f32 = 1.570_312_5;
    const PIO2_2: f32 = 4.837_512_969_970_703e-4;
    const PIO2_3: f32 = 7.549_789_954_891_882e-8;
    // Round to nearest as `exp_parts` does: the low mantissa bits hold j.
    const ROUND: f32 = 12_582_912.0;
    let shifted = x * std::f32::consts::FRAC_2_PI + ROUND;
    let j = shifted - ROUND;
    let quadrant = shifted.to_bits().wrapping_add(shift);
    let r = ((x - j * PIO2_1) - j * PIO2_2) - j * PIO2_3;
    let z = r * r;
    let s = fma::<F>(
        r * z,
        fma::<F>(
            fma::<F>(-1.951_529_589_1e-4, z, 8.332_160_873_6e-3),
            z,
            -1.666_665_461_1e-1,
        ),
        r,
    );
    let c = fma::<F>(
        z * z,
        fma::<F>(
            fma::<F>(2.443_315_711_809_948e-5, z, -1.388_731_625_493_765e-3),
            z,
            4.166_664_568_298_827e-2,
        ),
        fma::<F>(-0.5, z, 1.0),
    );
    let v = if quadrant & 1 == 0 { s } else { c };
    f32::from_bits(v.to_bits() ^ ((quadrant & 2) << 30))
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

    #[test]
    fn sin_and_cos_are_within_2e7_over_their_fast_range() {
        sin_and_cos::<false>();
        sin_and_cos::<true>();
    }

    fn sin_and_cos<const F: bool>() {
        // A tenth of the points under emulation (QEMU's f64 sine is slow).
        let points = if crate::test_support::emulated() {
            20_000
        } else {
            200_000
        };
        for (lo, hi) in [(-TRIG_FAST_MAX, TRIG_FAST_MAX), (-8.0, 8.0), (-1e-3, 1e-3)] {
            for x in grid(lo, hi, points) {
                for (name, got, want) in [
                    ("sin", sin::<F>(x), (x as f64).sin()),
                    ("cos", cos::<F>(x), (x as f64).cos()),
                ] {
                    let err = (got as f64 - want).abs();
                    assert!(
                        err <= 2e-7,
                        "{name}({x}) = {got}, want {want} (error {err:e})"
                    );
                }
            }
        }
        // Tiny arguments keep their relative accuracy (-0.0 comes out +0.0).
        assert_eq!(sin::<F>(1e-20), 1e-20);
        assert_eq!(sin::<F>(-3e-30), -3e-30);
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
        let silu64 = |x: f64| x / (1.0 + (-x).exp());
        check("silu", silu::<F>, silu64, -80.0, 80.0, 1e-6);
        check("tanh", tanh, f64::tanh, -20.0, 20.0, 2e-6);
        check("tanh", tanh, f64::tanh, -1e-3, 1e-3, 2e-6);
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

    fn erf_and_gelu<const F: bool>() {
        let (erf_scaled, gelu, gelu_tanh) = (erf_scaled::<F>, gelu::<F>, gelu_tanh::<F>);
        // erf(z) for z in [-6, 6], as GELU evaluates it: erf_scaled(z sqrt 2).
        for x in grid(-8.5, 8.5, 3000) {
            let want = erf64(x as f64 / 2f64.sqrt());
            assert!(
                (erf_scaled(x) as f64 - want).abs() < 5e-7,
                "erf({x} / sqrt 2) = {}, want {want}",
                erf_scaled(x)
            );
            let gelu_want = 0.5 * x as f64 * (1.0 + want);
            let got = gelu(x) as f64;
            assert!(
                (got - gelu_want).abs() < 1e-6 * (1.0 + gelu_want.abs()),
                "gelu({x}) = {got}, want {gelu_want}"
            );
        }
        let k = (2.0 / std::f64::consts::PI).sqrt();
        for x in grid(-10.0, 10.0, 3000) {
            let x64 = x as f64;
            let want = 0.5 * x64 * (1.0 + (k * (x64 + 0.044715 * x64.powi(3))).tanh());
            let got = gelu_tanh(x) as f64;
            assert!(
                (got - want).abs() < 2e-6 * (1.0 + want.abs()),
                "gelu_tanh({x}) = {got}, want {want}"
            );
        }
    }

    /// The clamps sit where the rational forms are exactly ±1, so that
    /// `tanh` saturates and GELU's `1 + erf` is exactly 0 beyond them.
    #[test]
    fn rational_forms_are_exactly_one_at_their_clamps() {
        for (a, b) in [
            (tanh::<false>(TANH_CLAMP), erf_scaled::<false>(ERF_CLAMP)),
            (tanh::<true>(TANH_CLAMP), erf_scaled::<true>(ERF_CLAMP)),
        ] {
            assert_eq!((a, b), (1.0, 1.0));
        }
    }

    /// NaN, infinities, signed zeros, subnormals and large arguments give
    /// what PyTorch 2.14's f32 CPU kernels give (checked there), but where
    /// the docs say otherwise.
    #[test]
    fn edges_follow_pytorch() {
        edges::<false>();
        edges::<true>();
    }

    fn edges<const F: bool>() {
        let (inf, sub) = (f32::INFINITY, 1e-40_f32);
        let same = |got: f32, want: f32, what: &str| {
            assert!(
                got.to_bits() == want.to_bits() || (got.is_nan() && want.is_nan()),
                "{what}: {got:e} (sign {}), want {want:e}",
                got.is_sign_negative()
            );
        };
        for (name, f) in [
            ("sigmoid", sigmoid::<F> as fn(f32) -> f32),
            ("silu", silu::<F>),
            ("tanh", tanh::<F>),
            ("gelu", gelu::<F>),
            ("gelu_tanh", gelu_tanh::<F>),
        ] {
            assert!(f(f32::NAN).is_nan() && f(-f32::NAN).is_nan(), "{name}(NaN)");
        }
        same(sigmoid::<F>(-inf), 0.0, "sigmoid(-inf)");
        same(sigmoid::<F>(-1e30), 0.0, "sigmoid(-1e30)");
        same(sigmoid::<F>(-100.0), 0.0, "sigmoid(-100)");
        same(sigmoid::<F>(inf), 1.0, "sigmoid(inf)");
        same(sigmoid::<F>(1e30), 1.0, "sigmoid(1e30)");
        same(sigmoid::<F>(-0.0), 0.5, "sigmoid(-0)");
        same(sigmoid::<F>(sub), 0.5, "sigmoid(1e-40)");
        // PyTorch: 6.0546e-39, a subnormal; ours is within 1e-45 of it.
        assert!((sigmoid::<F>(-88.0) - 6.054_601_5e-39).abs() < 1e-44);
        same(silu::<F>(-inf), f32::NAN, "silu(-inf)");
        same(silu::<F>(-1e30), -0.0, "silu(-1e30)");
        same(silu::<F>(inf), inf, "silu(inf)");
        same(silu::<F>(-0.0), -0.0, "silu(-0)");
        same(silu::<F>(-sub), -sub * 0.5, "silu(-1e-40)");
        same(tanh::<F>(-inf), -1.0, "tanh(-inf)");
        same(tanh::<F>(inf), 1.0, "tanh(inf)");
        same(tanh::<F>(-1e30), -1.0, "tanh(-1e30)");
        same(tanh::<F>(-0.0), -0.0, "tanh(-0)");
        same(tanh::<F>(sub), sub, "tanh(1e-40)");
        same(tanh::<F>(-sub), -sub, "tanh(-1e-40)");
        same(tanh::<F>(1e-20), 1e-20, "tanh(1e-20)");
        same(gelu::<F>(-inf), f32::NAN, "gelu(-inf)");
        same(gelu::<F>(inf), inf, "gelu(inf)");
        same(gelu::<F>(-1e30), -0.0, "gelu(-1e30)");
        same(gelu::<F>(-10.0), -0.0, "gelu(-10)");
        same(gelu::<F>(1e30), 1e30, "gelu(1e30)");
        same(gelu::<F>(-0.0), -0.0, "gelu(-0)");
        same(gelu::<F>(sub), sub * 0.5, "gelu(1e-40)");
        same(gelu_tanh::<F>(-inf), f32::NAN, "gelu_tanh(-inf)");
        same(gelu_tanh::<F>(inf), inf, "gelu_tanh(inf)");
        same(gelu_tanh::<F>(-1e30), -0.0, "gelu_tanh(-1e30)");
        same(gelu_tanh::<F>(1e30), 1e30, "gelu_tanh(1e30)");
        same(gelu_tanh::<F>(-0.0), -0.0, "gelu_tanh(-0)");
        same(gelu_tanh::<F>(-sub), -sub * 0.5, "gelu_tanh(-1e-40)");
    }
}
