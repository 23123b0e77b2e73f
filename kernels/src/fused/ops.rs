//! The elementwise operations a fused kernel applies, and their loops over
//! chunks of values (what the delegate's `Unary`, `Binary`, `Where` and
//! `Clamp` nodes compute).

// The instruction-set variants are `unsafe fn`s with target features,
// called only on an `Isa` that has them; `copy` uses SSE intrinsics.
#![allow(unsafe_code)]

use super::math;
use crate::simd::{per_backend, Isa};

/// Defines an op enum from one table: per op, its variant (named as the
/// schema's enum value, which the delegate maps by that name), its name in
/// plans and logs (PyTorch's spelling) and its function of an element (or
/// of a pair). The function may name `F` (fused multiply-add, as in
/// `math.rs`). Generated: the enum, `ALL`, `name`, `from_schema_name` and
/// `apply_generic`, one loop per op so each compiles to its own vector
/// loop. Adding an op is one row (and its math, where new).
macro_rules! elementwise_ops {
    (@common $op:ident $($variant:ident = $name:literal)+) => {
        impl $op {
            /// Every op, in the table's order.
            pub const ALL: &'static [$op] = &[$($op::$variant,)+];

            /// The op's name in plans and logs (PyTorch's spelling).
            pub fn name(self) -> &'static str {
                match self {
                    $($op::$variant => $name,)+
                }
            }

            /// The op the schema's enum value `name` stands for.
            pub fn from_schema_name(name: &str) -> Option<Self> {
                match name {
                    $(stringify!($variant) => Some($op::$variant),)+
                    _ => None,
                }
            }
        }
    };
    (
        $(#[$meta:meta])*
        pub enum $op:ident (x) {
            $($(#[$doc:meta])* $variant:ident = $name:literal => $f:expr,)+
        }
    ) => {
        $(#[$meta])*
        #[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
        #[allow(missing_docs)]
        pub enum $op {
            $($(#[$doc])* $variant,)+
        }
        elementwise_ops!(@common $op $($variant = $name)+);
        impl $op {
            /// The loops, one per op (`F`: the variant's CPU has fused
            /// multiply-add); [`UnaryOp::apply_generic`] picks them.
            #[inline(always)]
            fn apply_elements<const F: bool>(self, x: &mut [f32]) {
                #[inline(always)]
                fn each(x: &mut [f32], f: impl Fn(f32) -> f32) {
                    for v in x {
                        *v = f(*v);
                    }
                }
                match self {
                    $($op::$variant => each(x, $f),)+
                }
            }
        }
    };
    (
        $(#[$meta:meta])*
        pub enum $op:ident (a, b) {
            $($(#[$doc:meta])* $variant:ident = $name:literal => $f:expr,)+
        }
    ) => {
        $(#[$meta])*
        #[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
        #[allow(missing_docs)]
        pub enum $op {
            $($(#[$doc])* $variant,)+
        }
        elementwise_ops!(@common $op $($variant = $name)+);
        impl $op {
            /// The loops, inlined into each instruction-set variant of
            /// [`binary`] (`F` as for [`UnaryOp`]).
            #[inline(always)]
            pub(super) fn apply_generic<const F: bool>(self, a: &mut [f32], b: &[f32]) {
                #[inline(always)]
                fn each(a: &mut [f32], b: &[f32], f: impl Fn(f32, f32) -> f32) {
                    for (x, &y) in a.iter_mut().zip(b) {
                        *x = f(*x, y);
                    }
                }
                match self {
                    $($op::$variant => each(a, b, $f),)+
                }
            }

            /// [`Self::apply_generic`] with every `b` equal to `b`: the
            /// same function of each pair, so the same values bit for bit.
            #[inline(always)]
            pub(super) fn apply_scalar_generic<const F: bool>(self, a: &mut [f32], b: f32) {
                #[inline(always)]
                fn each(a: &mut [f32], y: f32, f: impl Fn(f32, f32) -> f32) {
                    for x in a.iter_mut() {
                        *x = f(*x, y);
                    }
                }
                match self {
                    $($op::$variant => each(a, b, $f),)+
                }
            }

            /// `out[i] = a[i] op b[i]` (as far as the shortest goes): the
            /// function of [`Self::apply_generic`] in one pass where the
            /// left operand is not the destination (a flat instruction
            /// whose `x` is a leaf, the anchor or another register, or a
            /// root's last into the output), so the same values bit for
            /// bit without a copy first.
            #[inline(always)]
            pub(super) fn apply_into_generic<const F: bool>(
                self,
                a: &[f32],
                b: &[f32],
                out: &mut [f32],
            ) {
                #[inline(always)]
                fn each(a: &[f32], b: &[f32], out: &mut [f32], f: impl Fn(f32, f32) -> f32) {
                    for ((o, &x), &y) in out.iter_mut().zip(a).zip(b) {
                        *o = f(x, y);
                    }
                }
                match self {
                    $($op::$variant => each(a, b, out, $f),)+
                }
            }

            /// [`Self::apply_into_generic`] with every `b` equal to `b`.
            #[inline(always)]
            pub(super) fn apply_scalar_into_generic<const F: bool>(
                self,
                a: &[f32],
                b: f32,
                out: &mut [f32],
            ) {
                #[inline(always)]
                fn each(a: &[f32], y: f32, out: &mut [f32], f: impl Fn(f32, f32) -> f32) {
                    for (o, &x) in out.iter_mut().zip(a) {
                        *o = f(x, y);
                    }
                }
                match self {
                    $($op::$variant => each(a, b, out, $f),)+
                }
            }
        }
    };
}

elementwise_ops! {
    /// One-operand elementwise functions (the schema's `UnaryOp`).
    pub enum UnaryOp (x) {
        Identity = "copy" => |v| v,
        Neg = "neg" => |v: f32| -v,
        Abs = "abs" => f32::abs,
        // max(v, 0) would turn NaN into 0; PyTorch keeps NaN.
        Relu = "relu" => |v| if v < 0.0 { 0.0 } else { v },
        Sigmoid = "sigmoid" => math::sigmoid::<F>,
        Tanh = "tanh" => math::tanh::<F>,
        Silu = "silu" => math::silu::<F>,
        /// Exact (erf) GELU.
        Gelu = "gelu" => math::gelu::<F>,
        /// GELU's tanh approximation.
        GeluTanh = "gelu_tanh" => math::gelu_tanh::<F>,
        Exp = "exp" => math::exp::<F>,
        Log = "log" => math::ln::<F>,
        Log1p = "log1p" => math::log1p::<F>,
        /// Beta 1, threshold 20.
        Softplus = "softplus" => math::softplus::<F>,
        Sqrt = "sqrt" => f32::sqrt,
        Rsqrt = "rsqrt" => |v: f32| 1.0 / v.sqrt(),
        Reciprocal = "reciprocal" => |v| 1.0 / v,
        /// For `|x| <= math::TRIG_FAST_MAX` (see `apply_generic`).
        Sin = "sin" => math::sin::<F>,
        Cos = "cos" => math::cos::<F>,
    }
}

impl UnaryOp {
    /// The op's loop over `x`, inlined into each instruction-set variant
    /// of [`unary`] and into the flat programs' (`F`: the variant's CPU
    /// has fused multiply-add). The vector sine and cosine reduce their
    /// argument exactly only up to `math::TRIG_FAST_MAX`; a slice holding
    /// anything larger, or NaN or an infinity, takes libm's (rare: a
    /// codec's Snake activation reads `sin(a x)` of activations).
    #[inline(always)]
    pub(super) fn apply_generic<const F: bool>(self, x: &mut [f32]) {
        let libm: Option<fn(f32) -> f32> = match self {
            UnaryOp::Sin => Some(f32::sin),
            UnaryOp::Cos => Some(f32::cos),
            _ => None,
        };
        match libm {
            Some(f) if !x.iter().all(|v| v.abs() <= math::TRIG_FAST_MAX) => {
                x.iter_mut().for_each(|v| *v = f(*v))
            }
            // Keeps some elements as they are: staged (see `staged`).
            _ if self == UnaryOp::Relu => staged(x, |v| if v < 0.0 { 0.0 } else { v }),
            _ => self.apply_elements::<F>(x),
        }
    }
}

elementwise_ops! {
    /// Two-operand elementwise functions (the schema's `BinaryOp`);
    /// comparisons give 1.0 or 0.0.
    pub enum BinaryOp (a, b) {
        Add = "add" => |x, y| x + y,
        Sub = "sub" => |x, y| x - y,
        Mul = "mul" => |x, y| x * y,
        Div = "div" => |x, y| x / y,
        Maximum = "maximum" => |x, y| nan_or(x, y, f32::max),
        Minimum = "minimum" => |x, y| nan_or(x, y, f32::min),
        Gt = "gt" => |x, y| flag(x > y),
        Ge = "ge" => |x, y| flag(x >= y),
        Lt = "lt" => |x, y| flag(x < y),
        Le = "le" => |x, y| flag(x <= y),
        Eq = "eq" => |x, y| flag(x == y),
        Ne = "ne" => |x, y| flag(x != y),
    }
}

/// `f(x, y)`, or NaN where either is: torch.maximum and minimum propagate
/// NaN from either side.
#[inline(always)]
fn nan_or(x: f32, y: f32, f: fn(f32, f32) -> f32) -> f32 {
    if x.is_nan() || y.is_nan() {
        f32::NAN
    } else {
        f(x, y)
    }
}

/// A comparison's result.
#[inline(always)]
fn flag(c: bool) -> f32 {
    if c {
        1.0
    } else {
        0.0
    }
}

per_backend! {
    /// [`UnaryOp::apply`], per instruction set.
    fn unary(op: UnaryOp, x: &mut [f32]) => unary_generic
}

#[inline(always)]
fn unary_generic<const F: bool>(op: UnaryOp, x: &mut [f32]) {
    op.apply_generic::<F>(x)
}

per_backend! {
    /// [`BinaryOp::apply`], per instruction set.
    fn binary(op: BinaryOp, a: &mut [f32], b: &[f32]) => binary_generic
}

#[inline(always)]
fn binary_generic<const F: bool>(op: BinaryOp, a: &mut [f32], b: &[f32]) {
    op.apply_generic::<F>(a, b)
}

impl UnaryOp {
    /// Applies the function to every element of `x` in place, with the
    /// vectors of `isa`, the program's (the loops are written to
    /// auto-vectorise; see `math.rs`).
    pub fn apply(self, isa: Isa, x: &mut [f32]) {
        unary(isa, self, x)
    }
}

impl BinaryOp {
    /// `a[i] = a[i] op b[i]` for every element (`a` and `b` equally long),
    /// with the vectors of `isa`.
    pub fn apply(self, isa: Isa, a: &mut [f32], b: &[f32]) {
        binary(isa, self, a, b)
    }
}

/// `dst.copy_from_slice(src)` for the line-sized copies of the fused
/// loops, as vector moves: `copy_from_slice` calls `memcpy`, which glibc
/// runs as `rep movsb` from 2 KiB on, measured several times slower than
/// vector moves on AMD Zen for these L1-resident 4 KiB lines (a third of
/// the SSM block's time went there).
///
/// # Panics
/// If the lengths differ.
#[inline]
pub(crate) fn copy(dst: &mut [f32], src: &[f32]) {
    assert_eq!(dst.len(), src.len(), "copy of unequal lengths");
    #[cfg(target_arch = "x86_64")]
    {
        use std::arch::x86_64::{_mm_loadu_ps, _mm_storeu_ps};
        let mut d = dst.chunks_exact_mut(16);
        let mut s = src.chunks_exact(16);
        for (d, s) in (&mut d).zip(&mut s) {
            for k in 0..4 {
                // SAFETY: SSE is part of the x86-64 baseline; both chunks
                // hold 16 elements, so each 4-element access at 4k is in
                // bounds (unaligned access is what loadu/storeu do), and
                // `dst` and `src` cannot overlap (`&mut` and `&`).
                unsafe {
                    _mm_storeu_ps(
                        d.as_mut_ptr().add(4 * k),
                        _mm_loadu_ps(s.as_ptr().add(4 * k)),
                    )
                };
            }
        }
        d.into_remainder().copy_from_slice(s.remainder());
    }
    #[cfg(not(target_arch = "x86_64"))]
    dst.copy_from_slice(src);
}

/// Outputs of at least this many bytes are written with non-temporal
/// stores, by the scan's rows strategy (where the backend has them) and by
/// the epilogue recipes ([`copy_streaming`]): they would not stay cached
/// anyway, and skipping the read of each line before it is overwritten
/// saves a quarter of the traffic; below it a result may stay in L3 for the
/// next op. One threshold for both, defined here beside the non-temporal
/// copy. Measured on the scan through pte_runner on the 2-core EPYC, 2
/// threads, p50 of alternating runs: C = 2048, N = 65536: 50 -> 37-40 ms;
/// C = 512, N = 65536 and C = 2048, N = 16384: 12.3 -> 9.4 ms; C = 2048,
/// N = 4096 (32 MiB): 2.9 -> 2.2-2.7 ms; C = 512, N = 4096 (8 MiB, mostly
/// cache-resident): no difference.
pub(crate) const STREAM_OUTPUT_BYTES: usize = 16 << 20;

/// [`copy`] with non-temporal stores where `dst` is 16-byte aligned (the
/// few elements before that, and the tail, are plain stores), then a
/// store fence: the lines of `dst` are not read into the cache before
/// being overwritten, which saves a fifth of a DRAM-sized gated output's
/// traffic. The fence orders these weakly ordered stores before anything
/// the caller does next (such as reporting its task done to other
/// threads). Elsewhere than x86-64, [`copy`].
///
/// # Panics
/// If the lengths differ.
#[inline]
pub(crate) fn copy_streaming(dst: &mut [f32], src: &[f32]) {
    assert_eq!(dst.len(), src.len(), "copy of unequal lengths");
    #[cfg(target_arch = "x86_64")]
    {
        use std::arch::x86_64::{__m128, _mm_loadu_ps, _mm_sfence, _mm_stream_ps};
        // SAFETY: `align_to_mut` only reinterprets the 16-byte aligned
        // middle of `dst` as vectors of 4 f32 (any bit pattern is valid).
        let (head, body, tail) = unsafe { dst.align_to_mut::<__m128>() };
        let (src_head, rest) = src.split_at(head.len());
        let (src_body, src_tail) = rest.split_at(4 * body.len());
        head.copy_from_slice(src_head);
        for (d, s) in body.iter_mut().zip(src_body.chunks_exact(4)) {
            // SAFETY: SSE is part of the x86-64 baseline; `d` is a 16-byte
            // aligned vector (what `_mm_stream_ps` needs) and `s` holds 4
            // elements (an unaligned load).
            unsafe { _mm_stream_ps((d as *mut __m128).cast(), _mm_loadu_ps(s.as_ptr())) };
        }
        tail.copy_from_slice(src_tail);
        // SAFETY: SSE (baseline); a fence has no other effect.
        unsafe { _mm_sfence() };
    }
    #[cfg(not(target_arch = "x86_64"))]
    copy(dst, src);
}

/// Asks for `data`'s cache lines ahead of their use (a hint: no effect on
/// results; a no-op off x86-64).
#[inline]
pub(crate) fn prefetch(data: &[f32]) {
    #[cfg(target_arch = "x86_64")]
    for chunk in data.chunks(16) {
        use std::arch::x86_64::{_mm_prefetch, _MM_HINT_T0};
        // SAFETY: a prefetch is a hint that never faults nor changes memory
        // (SSE, part of the x86-64 baseline); the address is in `data`.
        unsafe { _mm_prefetch::<_MM_HINT_T0>(chunk.as_ptr().cast()) };
    }
    #[cfg(not(target_arch = "x86_64"))]
    let _ = data;
}

/// Elements a keep-or-replace loop computes on the stack before storing
/// them back (see [`staged`]).
const STAGE: usize = 64;

/// `x[i] = f(x[i])`, for an `f` that keeps some elements as they are (a
/// ReLU, a clamp), computed a block at a time into a buffer on the stack
/// and copied back. Written in place, such a loop is a store of
/// `select(m, x[i], y)` to where `x[i]` was loaded, which LLVM turns into a
/// masked store of the `y`s: on AVX2 `vpmaskmovd`, one vector per 25 or so
/// cycles on AMD Zen 3. In place a ReLU there took 0.8-0.97 ns per element,
/// staged 0.17 (and the masked stores of the ELUs' `where`s, in
/// [`select`], were a quarter of a Mimi encoder's fused elementwise time).
/// The store and the copy are plain vector moves, on every instruction set
/// (`tests/test_release_machine_code.py` finds no masked store in the
/// release library).
#[inline(always)]
pub(crate) fn staged(x: &mut [f32], f: impl Fn(f32) -> f32) {
    let mut block = [0.0; STAGE];
    for x in x.chunks_mut(STAGE) {
        let block = &mut block[..x.len()];
        for (o, &v) in block.iter_mut().zip(&*x) {
            *o = f(v);
        }
        copy(x, block);
    }
}

/// `a[i] = if cond[i] != 0 { a[i] } else { b[i] }`, staged as [`staged`]
/// is (it keeps the elements of `a` where `cond` holds).
#[inline(always)]
pub(crate) fn select(cond: &[f32], a: &mut [f32], b: &[f32]) {
    let mut block = [0.0; STAGE];
    let (cond, b) = (cond.chunks(STAGE), b.chunks(STAGE));
    for ((a, c), b) in a.chunks_mut(STAGE).zip(cond).zip(b) {
        let block = &mut block[..a.len()];
        for (((o, &x), &c), &y) in block.iter_mut().zip(&*a).zip(c).zip(b) {
            *o = pick(c, x, y);
        }
        copy(a, block);
    }
}

/// ELU as the blob writes it, `where(x > 0, x, (exp(x) - 1) * alpha)`,
/// over `x` in one loop (staged: it keeps the positive elements): per
/// element the same operations as those five ops' own loops, so the same
/// values bit for bit, without four passes over the block. A Mimi
/// encoder's convs fuse an ELU into every prologue or epilogue.
#[inline(always)]
pub(crate) fn elu<const F: bool>(x: &mut [f32], alpha: f32) {
    staged(x, |v| {
        let negative = (math::exp::<F>(v) - 1.0) * alpha;
        pick(flag(v > 0.0), v, negative)
    })
}

/// `out[i] = if cond[i] != 0 { a[i] } else { b[i] }`, into a buffer of its
/// own: no element is kept in place, so the loop stores plain vectors
/// (see [`staged`]) without a block on the stack.
#[inline(always)]
pub(crate) fn select_into(cond: &[f32], a: &[f32], b: &[f32], out: &mut [f32]) {
    for (((o, &c), &x), &y) in out.iter_mut().zip(cond).zip(a).zip(b) {
        *o = pick(c, x, y);
    }
}

/// [`select`] with every `b[i]` equal to `b`.
#[inline(always)]
pub(crate) fn select_scalar(cond: &[f32], a: &mut [f32], b: f32) {
    let mut block = [0.0; STAGE];
    for (a, c) in a.chunks_mut(STAGE).zip(cond.chunks(STAGE)) {
        let block = &mut block[..a.len()];
        for ((o, &x), &c) in block.iter_mut().zip(&*a).zip(c) {
            *o = pick(c, x, b);
        }
        copy(a, block);
    }
}

/// `if c != 0 { x } else { y }` (NaN counts as true), chosen with bit
/// masks: written as an `if`, the compiler chose between the two
/// *addresses* and loaded one element at a time, which made a leaky ReLU
/// (`where(x > 0, x, x * slope)`) the slowest op of a HiFi-GAN's fused
/// kernels; masks vectorise, and give the same bits.
#[inline(always)]
pub(crate) fn pick(c: f32, x: f32, y: f32) -> f32 {
    let keep = u32::from(c != 0.0).wrapping_neg();
    f32::from_bits((x.to_bits() & keep) | (y.to_bits() & !keep))
}

/// Clamps every element into `[min, max]` (either bound may be infinite);
/// NaN stays NaN, as in `torch.clamp`.
/// Staged (see [`staged`]): it keeps the elements already in range.
#[inline(always)]
pub(crate) fn clamp(x: &mut [f32], min: f32, max: f32) {
    staged(x, |v| {
        let lo = if v < min { min } else { v };
        if lo > max {
            max
        } else {
            lo
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unary_ops_follow_pytorch_on_edge_values() {
        let isa = Isa::detect();
        let mut x = [-2.0, 0.0, 3.0, f32::NAN];
        UnaryOp::Relu.apply(isa, &mut x);
        assert_eq!(&x[..3], &[0.0, 0.0, 3.0]);
        assert!(x[3].is_nan(), "relu keeps NaN");
        let mut x = [0.0, 1.0];
        UnaryOp::Silu.apply(isa, &mut x);
        assert!((x[1] - 0.731_058_6).abs() < 1e-6 && x[0] == 0.0);
        let mut x = [4.0];
        UnaryOp::Rsqrt.apply(isa, &mut x);
        assert_eq!(x, [0.5]);
    }

    /// Every instruction set's variant (the one forced, whatever this CPU
    /// would pick: the portable one rounds bit for bit as the loop without
    /// fused multiply-adds), against its own scalar remainder loop and the
    /// loop without fused multiply-adds.
    #[test]
    fn vector_variants_equal_the_scalar_loop_for_every_op() {
        for isa in Isa::all_available() {
            vector_variant_equals_the_scalar_loop(isa);
        }
    }

    fn vector_variant_equals_the_scalar_loop(isa: Isa) {
        let x: Vec<f32> = (0..1000).map(|i| (i as f32 - 500.0) * 0.037).collect();
        for &op in UnaryOp::ALL {
            let mut fast = x.clone();
            op.apply(isa, &mut fast);
            // One element at a time: the same variant's scalar remainder loop.
            let mut slow = x.clone();
            for v in &mut slow {
                let mut one = [*v];
                op.apply(isa, &mut one);
                *v = one[0];
            }
            // Without fused multiply-adds (the baseline x86-64 loop): equal
            // but for rounding.
            let mut plain = x.clone();
            op.apply_generic::<false>(&mut plain);
            // Relative, but for the GELUs, whose bounds are absolute
            // (`1e-6 (1 + |gelu|)`, see `math::gelu`): in the exact form's
            // negative tail `1 + erf` cancels, in PyTorch's f32 as in ours;
            // the tanh form's tail (values near 1e-25) carries the rounding
            // of its exponent, `|2u| ~ 60` there, relatively.
            let atol = match op {
                UnaryOp::Gelu | UnaryOp::GeluTanh => 1e-6,
                _ => 1e-30,
            };
            for ((f, s), p) in fast.iter().zip(&slow).zip(&plain) {
                assert!(
                    f.to_bits() == s.to_bits() || (f.is_nan() && s.is_nan()),
                    "{isa:?} {op:?}: {f} vs {s}"
                );
                if isa.backend() == crate::simd::Backend::Portable && !crate::simd::BASELINE_FMA {
                    assert!(
                        f.to_bits() == p.to_bits() || (f.is_nan() && p.is_nan()),
                        "{op:?}: the portable variant ran {f}, the loop without FMA {p}"
                    );
                }
                assert!(
                    f == p || (f - p).abs() <= 1e-6 * p.abs() + atol || (f.is_nan() && p.is_nan()),
                    "{op:?}: {f} with FMA vs {p} without"
                );
            }
        }
        let b: Vec<f32> = x.iter().map(|v| v * 0.5 + 1.0).collect();
        for op in [
            BinaryOp::Add,
            BinaryOp::Div,
            BinaryOp::Maximum,
            BinaryOp::Ge,
        ] {
            let mut fast = x.clone();
            op.apply(isa, &mut fast, &b);
            let mut slow = x.clone();
            op.apply_generic::<false>(&mut slow, &b);
            assert_eq!(fast, slow, "{op:?}");
        }
    }

    /// A slice with an argument beyond the vector sine's exact reduction
    /// (or NaN, or an infinity) takes libm's for the whole slice; within
    /// it, the vector one, equal to libm's to 2e-7.
    #[test]
    fn sin_and_cos_beyond_the_vector_range_are_libms() {
        for isa in Isa::all_available() {
            for (op, libm) in [
                (UnaryOp::Sin, f32::sin as fn(f32) -> f32),
                (UnaryOp::Cos, f32::cos),
            ] {
                for big in [1.0e6, -8192.5, 3.0e38, f32::INFINITY, f32::NAN] {
                    let x = [0.5, big, -2.0, 100.25];
                    let mut got = x;
                    op.apply(isa, &mut got);
                    for (g, v) in got.iter().zip(x) {
                        let want = libm(v);
                        assert!(
                            g.to_bits() == want.to_bits() || (g.is_nan() && want.is_nan()),
                            "{isa:?} {op:?}({v}) = {g}, libm's {want}"
                        );
                    }
                }
                let x = [0.5, 8192.0, -2.0, 100.25];
                let mut got = x;
                op.apply(isa, &mut got);
                for (g, v) in got.iter().zip(x) {
                    assert!((g - libm(v)).abs() <= 2e-7, "{isa:?} {op:?}({v}) = {g}");
                }
            }
        }
    }

    #[test]
    fn streaming_copies_every_length_at_every_alignment() {
        let src: Vec<f32> = (0..300).map(|i| i as f32 * 0.5 - 7.0).collect();
        for offset in 0..4 {
            for len in (0..40).chain([63, 64, 65, 255, 296]) {
                let mut dst = vec![-1.0f32; 300];
                copy_streaming(&mut dst[offset..offset + len], &src[..len]);
                assert_eq!(&dst[offset..offset + len], &src[..len], "{offset} {len}");
                assert!(dst[..offset].iter().all(|&v| v == -1.0));
                assert!(dst[offset + len..].iter().all(|&v| v == -1.0));
            }
        }
    }

    #[test]
    fn binary_ops_and_comparisons() {
        let b = [2.0, 2.0, 2.0];
        let isa = Isa::detect();
        let mut a = [1.0, 2.0, 3.0];
        BinaryOp::Gt.apply(isa, &mut a, &b);
        assert_eq!(a, [0.0, 0.0, 1.0]);
        let mut a = [1.0, f32::NAN, 3.0];
        BinaryOp::Maximum.apply(isa, &mut a, &b);
        assert_eq!((a[0], a[2]), (2.0, 3.0));
        assert!(a[1].is_nan());
        let mut a = [1.0, 4.0];
        select(&[1.0, 0.0], &mut a, &[7.0, 8.0]);
        assert_eq!(a, [1.0, 8.0]);
        // NaN conditions count as true (as `c != 0` does); -0 as false; the
        // chosen values keep their bits (NaN payloads, signed zeros).
        let payload = f32::from_bits(0x7fc0_1234);
        let mut a = [payload, -0.0, 1.0, 2.0];
        select(&[f32::NAN, -0.0, 0.0, -3.0], &mut a, &[9.0, 5.0, -0.0, 7.0]);
        assert_eq!(a[0].to_bits(), payload.to_bits());
        assert_eq!(
            a[1..3].iter().map(|v| v.to_bits()).collect::<Vec<_>>(),
            [5.0f32.to_bits(), (-0.0f32).to_bits()]
        );
        assert_eq!(a[3], 2.0);
        let mut a = [-5.0, 0.5, 5.0];
        clamp(&mut a, -1.0, f32::INFINITY);
        assert_eq!(a, [-1.0, 0.5, 5.0]);
    }
}
