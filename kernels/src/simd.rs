//! The SIMD layer every kernel shares: which instruction set this CPU runs
//! ([`Backend`], detected once, here), the choice a kernel or program
//! keeps from its preparation ([`Isa`]), one vector of `f32` lanes per
//! backend behind the [`Simd`] trait (depthwise rows, GEMM and gemv
//! micro-kernels), and the one macro, [`per_backend`], that generates the
//! per-backend entry points from the one table of the backends' facts:
//! function-pointer variants of kernels written over [`Simd`], and a
//! dispatch on an [`Isa`] for loops written to auto-vectorise (the fused
//! elementwise ops).
//!
//! As tract's `Ops` table, the choice is made once, when a kernel is
//! prepared or a program compiled, and kept there: the run path matches
//! the kept [`Backend`] (or calls the function pointers resolved from it)
//! and never asks the CPU again. Entry points without a preparation (the
//! scans; `applicable` and `estimate_cost`, which ask the cost model)
//! choose once at their top and pass the choice down.
//!
//! Kernels are written once, generic over [`Simd`], and each backend
//! instantiates them inside a function compiled with its target features
//! (the table's, in [`per_backend`]), called through a function pointer
//! chosen once the features were detected. `#[inline(always)]` on the
//! generic code and on the trait methods makes the intrinsics inline into
//! those functions. The AVX-512 intrinsics were stabilised in Rust 1.89,
//! the crate's MSRV.

#![allow(unsafe_code)]
#![warn(clippy::undocumented_unsafe_blocks, unsafe_op_in_unsafe_fn)]

use std::sync::OnceLock;

/// The backends this CPU runs, one bit each (by discriminant), asked of
/// the CPU once. This is the one place the crate asks
/// ([`Backend::cpu_has`], which asks for the target features of the
/// backend's row in [`per_backend`]), and [`Backend::detect`] the one
/// reading of it: every kernel (the [`Simd`] kernels, the loops
/// [`per_backend`] dispatches, the scan, the FFT lanes, strided moves)
/// takes its instruction set from that one choice, made when it is
/// prepared.
fn available() -> u32 {
    static AVAILABLE: OnceLock<u32> = OnceLock::new();
    *AVAILABLE.get_or_init(|| {
        Backend::ALL
            .iter()
            .filter(|b| b.cpu_has())
            .fold(0, |bits, &b| bits | 1 << b as u32)
    })
}

/// An instruction set the vector kernels run on; later ones (on one
/// architecture) have every feature of earlier ones.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) enum Backend {
    /// Plain Rust on `[f32; 8]` chunks that LLVM auto-vectorises for the
    /// compile target's baseline (SSE2 on x86_64). Always available.
    Portable,
    /// x86_64 AVX2 + FMA intrinsics, 8 lanes.
    #[cfg(target_arch = "x86_64")]
    Avx2,
    /// x86_64 AVX-512 F intrinsics, 16 lanes, 32 vector registers.
    #[cfg(target_arch = "x86_64")]
    Avx512,
    /// aarch64 NEON intrinsics, 4 lanes.
    #[cfg(target_arch = "aarch64")]
    Neon,
}

/// The vector instructions the kernels prepared on this CPU run with
/// (`"avx512"`, `"avx2"`, `"neon"` or `"portable"`), the one choice
/// `Backend::detect` makes; for the plan's log, so a run on a device (or
/// under emulation) shows which code it took.
pub fn vector_instructions() -> &'static str {
    Isa::detect().name()
}

#[cfg(test)]
thread_local! {
    /// Calls of [`Backend::detect`] on this thread: the test that run paths
    /// do not detect counts them around a call.
    static DETECTS: std::cell::Cell<usize> = const { std::cell::Cell::new(0) };
}

/// How many times this thread has called [`Backend::detect`].
#[cfg(test)]
pub(crate) fn detects_on_this_thread() -> usize {
    DETECTS.with(std::cell::Cell::get)
}

impl Backend {
    /// The fastest backend this CPU supports: for preparations and the
    /// entry points without one, never for a run path (which keeps the
    /// backend it was prepared with).
    pub(crate) fn detect() -> Backend {
        #[cfg(test)]
        DETECTS.with(|d| d.set(d.get() + 1));
        // The last one available: each later one has every feature of the
        // earlier ones.
        let best = Backend::ALL.iter().rev().find(|b| b.is_available());
        *best.unwrap_or(&Backend::Portable)
    }

    /// Whether this CPU can run the backend.
    pub(crate) fn is_available(self) -> bool {
        available() & 1 << self as u32 != 0
    }

    /// Every backend this CPU can run (tests force each in turn), but the
    /// portable one on aarch64: NEON is part of that architecture's
    /// baseline, so `detect` always chooses it there and the portable code
    /// (the same Rust as on x86-64, tested there) never runs. The aarch64
    /// tests run under emulation, where that halves the every-backend
    /// grids.
    #[cfg(test)]
    pub(crate) fn all_available() -> Vec<Backend> {
        let portable_runs = !cfg!(target_arch = "aarch64");
        Backend::ALL
            .iter()
            .copied()
            .filter(|&b| b.is_available() && (portable_runs || b != Backend::Portable))
            .collect()
    }
}

/// An instruction set this CPU has, checked once: what a compiled program
/// (and each kernel its operands feed) keeps, and what the functions
/// `per_backend!` dispatches take. Only [`Isa::detect`] (and the tests' list of
/// every backend the CPU has) makes one, so holding one proves the CPU has
/// its features: the dispatch on it asks nothing more.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Isa(Backend);

impl Isa {
    /// The fastest instruction set of this CPU.
    pub fn detect() -> Isa {
        Isa(Backend::detect())
    }

    /// Its name: `"avx512"`, `"avx2"`, `"neon"` or `"portable"`.
    pub fn name(self) -> &'static str {
        match self.0 {
            Backend::Portable => "portable",
            #[cfg(target_arch = "x86_64")]
            Backend::Avx2 => "avx2",
            #[cfg(target_arch = "x86_64")]
            Backend::Avx512 => "avx512",
            #[cfg(target_arch = "aarch64")]
            Backend::Neon => "neon",
        }
    }

    /// The backend chosen.
    pub(crate) fn backend(self) -> Backend {
        self.0
    }

    /// Every instruction set this CPU runs (tests force each in turn).
    #[cfg(test)]
    pub(crate) fn all_available() -> Vec<Isa> {
        Backend::all_available().into_iter().map(Isa).collect()
    }
}

/// Whether the baseline build (no run-time detected features) has fused
/// multiply-add: aarch64's NEON does; x86-64's baseline (SSE2) does not.
pub(crate) const BASELINE_FMA: bool = cfg!(target_arch = "aarch64");

/// Generates the per-backend entry points of a kernel from the one table of
/// the backends (the `@rows` arm below), in two forms:
///
/// - `fn $name($args) -> $ret => $generic` defines `fn $name(isa: Isa,
///   $args) -> $ret`, which runs `$generic::<FMA>($args)` compiled with the
///   target features of `isa`, the instruction set its caller chose when it
///   was prepared: the call matches `isa` to pick the backend's variant.
///   For loops written to auto-vectorise (the fused elementwise ops and
///   recipes, `math.rs`) rather than over [`Simd`]. `FMA` says whether the
///   backend has fused multiply-add, so that `math.rs` rounds alike in
///   every loop one variant compiles; `$generic` is `#[inline(always)]`, so
///   each variant compiles its own loops.
/// - `unsafe fn [$portable, $avx2, $avx512, $neon]<consts>($args) =>
///   $generic::<S, ..>` defines one entry point per backend (the table's
///   order; `_` for none) of a kernel written once over [`Simd`]:
///   `$generic` with `S` the backend's vector type, compiled with the
///   backend's target features. The kernel picks one as a function pointer
///   once its [`Backend`] is known, at preparation. Each is `unsafe`: the
///   CPU has the backend's features, and the generic kernel's own contract
///   holds. With `=> $plain` (a function not generic over [`Simd`], loops
///   written to auto-vectorise), each entry point is `$plain` compiled with
///   the backend's features.
///
/// The table also gives [`Backend::ALL`] and [`Backend::cpu_has`], so the
/// features detection asks for are, by construction, those the variants
/// are compiled with.
macro_rules! per_backend {
    // The backends, each stated once, as `{ variant fn (cfg) [target
    // features] Simd FMA }`: its `Backend` variant, the name of its variant
    // functions in the dispatch form, the `cfg` it exists under, the target
    // features its variants are compiled with (exactly those
    // `Backend::cpu_has` asks the CPU for before an `Isa` may name it), its
    // `Simd` vector type and whether it has fused multiply-add. On one
    // architecture, each later one has every feature of the earlier ones.
    // The portable one is the baseline build: no features, FMA where the
    // baseline has it. rustc enables `avx2`, `fma` and `f16c` with
    // `avx512f` (`rustc --print cfg -C target-feature=+avx512f`); they are
    // listed so that detection asks for each one.
    (@rows $form:ident $packed:tt) => {
        $crate::simd::per_backend! { @$form $packed [
            { Portable portable (all()) [] Portable { $crate::simd::BASELINE_FMA } }
            { Avx2 avx2 (target_arch = "x86_64") ["avx2", "fma"] Avx2 { true } }
            {
                Avx512 avx512 (target_arch = "x86_64") ["avx512f", "avx2", "fma", "f16c"]
                Avx512 { true }
            }
            { Neon neon (target_arch = "aarch64") ["neon"] Neon { true } }
        ] }
    };

    // The list of backends and the detection of each (simd.rs alone). The
    // features are `tt`s: `is_x86_feature_detected!` matches a literal's
    // tokens, which a `literal` fragment would hide.
    (@detect {} [$( { $b:ident $f:ident $cfg:tt [$($feat:tt),*] $s:ident $fma:tt } )*]) => {
        /// Every row of the table, whatever the compile target: the
        /// backend's name and its target features, against which the tests
        /// check the `target_feature` strings written by hand outside it.
        #[cfg(test)]
        const TABLE_FEATURES: &[(&str, &[&str])] = &[$( (stringify!($b), &[$($feat),*]), )*];

        impl Backend {
            /// Every backend of the compile target, in the table's order.
            const ALL: &'static [Backend] = &[$( #[cfg $cfg] Backend::$b, )*];

            /// Whether this CPU has every target feature of the backend's
            /// variants; asked anew (see [`available`]).
            fn cpu_has(self) -> bool {
                #[cfg(target_arch = "x86_64")]
                use std::arch::is_x86_feature_detected as has;
                #[cfg(target_arch = "aarch64")]
                use std::arch::is_aarch64_feature_detected as has;
                match self {
                    $( #[cfg $cfg] Backend::$b => $( has!($feat) && )* true, )*
                }
            }
        }
    };

    // The dispatch form: a variant per backend with target features, and
    // the match on the `Isa`; the portable backend (no features) calls the
    // generic where it stands.
    (@dispatch { $isa:ident $generic:ident $params:tt $args:tt $ret:tt }
        [$( { $b:ident $f:ident $cfg:tt $feats:tt $s:ident $fma:tt } )*]) => {{
        $( $crate::simd::per_backend! {
            @dispatch_variant $f $cfg $feats $fma $generic $params $args $ret
        } )*
        match $isa.backend() {
            $(
                #[cfg $cfg]
                $crate::simd::Backend::$b => {
                    $crate::simd::per_backend!(@dispatch_call $feats $f $generic $fma $args)
                }
            )*
        }
    }};
    (@dispatch_variant $f:ident $cfg:tt [] $($rest:tt)*) => {};
    (@dispatch_variant $f:ident ($($cfg:tt)*) [$($feat:literal),+] $fma:tt $generic:ident
        ($($params:tt)*) $args:tt ($($ret:tt)*)) => {
        #[cfg($($cfg)*)]
        $( #[target_feature(enable = $feat)] )*
        unsafe fn $f($($params)*) $($ret)* {
            $generic::<$fma> $args
        }
    };
    (@dispatch_call [] $f:ident $generic:ident $fma:tt $args:tt) => {
        $generic::<$fma> $args
    };
    (@dispatch_call [$($feat:tt),+] $f:ident $generic:ident $fma:tt $args:tt) => {
        // SAFETY: an `Isa` names a backend only where this CPU has every
        // feature of its row (`Backend::cpu_has`), which are the ones its
        // variant is compiled with.
        unsafe { $f $args }
    };

    // The function-pointer form: one entry point per backend named.
    (@variants { [$($name:tt),*] $rest:tt }
        [$( { $b:ident $f:ident $cfg:tt $feats:tt $s:ident $fma:tt } )*]) => {
        $( $crate::simd::per_backend! { @variant $name $cfg $feats $s $rest } )*
    };
    (@variant _ $($rest:tt)*) => {};
    (@variant $name:ident ($($cfg:tt)*) [$($feat:literal),*] $s:ident {
        [$($attr:tt)*] [$($gen:tt)*] ($($params:tt)*) $args:tt simd $generic:ident [$($g:tt)*]
    }) => {
        $($attr)*
        #[allow(unsafe_code)]
        #[cfg($($cfg)*)]
        $( #[target_feature(enable = $feat)] )*
        unsafe fn $name $($gen)* ($($params)*) {
            // SAFETY: our caller guarantees that this CPU has the backend's
            // target features (this function's) and the kernel's contract.
            unsafe { $generic::<$crate::simd::$s $($g)*> $args }
        }
    };
    (@variant $name:ident ($($cfg:tt)*) [$($feat:literal),*] $s:ident {
        [$($attr:tt)*] [] ($($params:tt)*) $args:tt plain $plain:ident []
    }) => {
        $($attr)*
        #[allow(unsafe_code)]
        #[cfg($($cfg)*)]
        $( #[target_feature(enable = $feat)] )*
        unsafe fn $name($($params)*) {
            $plain $args
        }
    };

    // The forms a kernel writes.
    (
        $(#[$attr:meta])*
        unsafe fn [$($name:tt),* $(,)?]
            $(<$(const $c:ident: $ct:ty),*>)? ($($arg:ident: $ty:ty),* $(,)?)
            => $generic:ident::<S $(, $g:tt)*>
    ) => {
        $crate::simd::per_backend! { @rows variants { [$($name),*] {
            [$(#[$attr])*] [$(<$(const $c: $ct),*>)?] ($($arg: $ty),*) ($($arg),*)
            simd $generic [$(, $g)*]
        } } }
    };
    (
        $(#[$attr:meta])*
        unsafe fn [$($name:tt),* $(,)?] ($($arg:ident: $ty:ty),* $(,)?) => $plain:ident
    ) => {
        $crate::simd::per_backend! { @rows variants { [$($name),*] {
            [$(#[$attr])*] [] ($($arg: $ty),*) ($($arg),*) plain $plain []
        } } }
    };
    (
        $(#[$attr:meta])*
        $vis:vis fn $name:ident($($arg:ident: $ty:ty),* $(,)?) $(-> $ret:ty)? => $generic:ident
    ) => {
        $(#[$attr])*
        #[allow(unsafe_code)]
        $vis fn $name(isa: $crate::simd::Isa, $($arg: $ty),*) $(-> $ret)? {
            $crate::simd::per_backend!(@rows dispatch {
                isa $generic ($($arg: $ty),*) ($($arg),*) ($(-> $ret)?)
            })
        }
    };
}
pub(crate) use per_backend;

per_backend!(@rows detect {});

/// The vector trait, in a module of its own so that the backends below
/// implement it without importing their parent.
mod lanes {
    /// One vector of `LANES` `f32`s and the operations the kernels use.
    ///
    /// # Safety
    /// Every method may require the backend's CPU features; callers must only
    /// use an implementation whose features are present. Pointer arguments must
    /// be valid for `LANES` reads (`load`) or writes (`store`).
    pub(crate) trait Simd {
        const LANES: usize;
        type V: Copy;
        /// Every lane `v`.
        unsafe fn splat(v: f32) -> Self::V;
        /// Unaligned load of `LANES` values from `p`.
        unsafe fn load(p: *const f32) -> Self::V;
        /// Unaligned store of `LANES` values to `p`.
        unsafe fn store(p: *mut f32, v: Self::V);
        /// `acc + w * x`, lane-wise, rounded as the backend's scalar version.
        unsafe fn mul_add(acc: Self::V, w: Self::V, x: Self::V) -> Self::V;
        /// `acc + w * x` for one value, rounded as [`Simd::mul_add`].
        unsafe fn mul_add_scalar(acc: f32, w: f32, x: f32) -> f32;
        /// `acc - w * x`, lane-wise (fused where `mul_add` is): the real part
        /// of a complex product without negated copies of an operand.
        unsafe fn neg_mul_add(acc: Self::V, w: Self::V, x: Self::V) -> Self::V;
    }
}
pub(crate) use lanes::Simd;

// ---------------------------------------------------------------------------
// Portable backend.

/// Plain Rust on `[f32; 8]`, auto-vectorised for the compile target.
pub(crate) struct Portable;

/// `[f32; 8]`: lane-wise loops over it auto-vectorise.
type F32x8 = [f32; 8];

impl Simd for Portable {
    const LANES: usize = 8;
    type V = F32x8;

    #[inline(always)]
    unsafe fn splat(v: f32) -> F32x8 {
        [v; 8]
    }
    #[inline(always)]
    unsafe fn load(p: *const f32) -> F32x8 {
        // SAFETY: the caller guarantees 8 readable values at p; unaligned read.
        unsafe { p.cast::<F32x8>().read_unaligned() }
    }
    #[inline(always)]
    unsafe fn store(p: *mut f32, v: F32x8) {
        // SAFETY: the caller guarantees 8 writable values at p; unaligned write.
        unsafe { p.cast::<F32x8>().write_unaligned(v) }
    }
    #[inline(always)]
    unsafe fn mul_add(acc: F32x8, w: F32x8, x: F32x8) -> F32x8 {
        let mut out = acc;
        for j in 0..8 {
            out[j] += w[j] * x[j];
        }
        out
    }
    #[inline(always)]
    unsafe fn mul_add_scalar(acc: f32, w: f32, x: f32) -> f32 {
        // Unfused, like `mul_add` (Rust never contracts into an FMA).
        acc + w * x
    }
    #[inline(always)]
    unsafe fn neg_mul_add(acc: F32x8, w: F32x8, x: F32x8) -> F32x8 {
        let mut out = acc;
        for j in 0..8 {
            out[j] -= w[j] * x[j];
        }
        out
    }
}

// ---------------------------------------------------------------------------
// AVX2 + FMA backend.

#[cfg(target_arch = "x86_64")]
mod avx2 {
    use std::arch::x86_64::*;

    use super::lanes::Simd;

    /// AVX2 + FMA, 8 lanes.
    pub(crate) struct Avx2;

    // Each method is only reached from functions compiled with avx2 and
    // fma, called only once both were detected (`Backend::is_available`).
    impl Simd for Avx2 {
        const LANES: usize = 8;
        type V = __m256;

        #[inline(always)]
        unsafe fn splat(v: f32) -> __m256 {
            // SAFETY: AVX is present (see the impl's comment).
            unsafe { _mm256_set1_ps(v) }
        }
        #[inline(always)]
        unsafe fn load(p: *const f32) -> __m256 {
            // SAFETY: AVX is present; the caller guarantees 8 readable
            // values at p, and loadu has no alignment requirement.
            unsafe { _mm256_loadu_ps(p) }
        }
        #[inline(always)]
        unsafe fn store(p: *mut f32, v: __m256) {
            // SAFETY: AVX is present; the caller guarantees 8 writable
            // values at p, and storeu has no alignment requirement.
            unsafe { _mm256_storeu_ps(p, v) }
        }
        #[inline(always)]
        unsafe fn mul_add(acc: __m256, w: __m256, x: __m256) -> __m256 {
            // SAFETY: FMA is present.
            unsafe { _mm256_fmadd_ps(w, x, acc) }
        }
        #[inline(always)]
        unsafe fn mul_add_scalar(acc: f32, w: f32, x: f32) -> f32 {
            // SAFETY: FMA is present. Fused like `mul_add`.
            unsafe { _mm_cvtss_f32(_mm_fmadd_ss(_mm_set_ss(w), _mm_set_ss(x), _mm_set_ss(acc))) }
        }
        #[inline(always)]
        unsafe fn neg_mul_add(acc: __m256, w: __m256, x: __m256) -> __m256 {
            // SAFETY: FMA is present.
            unsafe { _mm256_fnmadd_ps(w, x, acc) }
        }
    }
}
#[cfg(target_arch = "x86_64")]
pub(crate) use avx2::Avx2;

// ---------------------------------------------------------------------------
// AVX-512 backend.

#[cfg(target_arch = "x86_64")]
mod avx512 {
    use std::arch::x86_64::*;

    use super::lanes::Simd;

    /// AVX-512 F, 16 lanes.
    pub(crate) struct Avx512;

    // Each method is only reached from functions compiled with avx512f
    // and fma, called only once both were detected
    // (`Backend::is_available`).
    impl Simd for Avx512 {
        const LANES: usize = 16;
        type V = __m512;

        #[inline(always)]
        unsafe fn splat(v: f32) -> __m512 {
            // SAFETY: AVX-512 F is present (see the impl's comment).
            unsafe { _mm512_set1_ps(v) }
        }
        #[inline(always)]
        unsafe fn load(p: *const f32) -> __m512 {
            // SAFETY: AVX-512 F is present; the caller guarantees 16
            // readable values at p, and loadu has no alignment requirement.
            unsafe { _mm512_loadu_ps(p) }
        }
        #[inline(always)]
        unsafe fn store(p: *mut f32, v: __m512) {
            // SAFETY: AVX-512 F is present; the caller guarantees 16
            // writable values at p, and storeu has no alignment requirement.
            unsafe { _mm512_storeu_ps(p, v) }
        }
        #[inline(always)]
        unsafe fn mul_add(acc: __m512, w: __m512, x: __m512) -> __m512 {
            // SAFETY: AVX-512 F is present.
            unsafe { _mm512_fmadd_ps(w, x, acc) }
        }
        #[inline(always)]
        unsafe fn mul_add_scalar(acc: f32, w: f32, x: f32) -> f32 {
            // SAFETY: FMA is present. Fused like `mul_add`.
            unsafe { _mm_cvtss_f32(_mm_fmadd_ss(_mm_set_ss(w), _mm_set_ss(x), _mm_set_ss(acc))) }
        }
        #[inline(always)]
        unsafe fn neg_mul_add(acc: __m512, w: __m512, x: __m512) -> __m512 {
            // SAFETY: AVX-512 F is present.
            unsafe { _mm512_fnmadd_ps(w, x, acc) }
        }
    }
}
#[cfg(target_arch = "x86_64")]
pub(crate) use avx512::Avx512;

// ---------------------------------------------------------------------------
// NEON backend.

#[cfg(target_arch = "aarch64")]
mod neon {
    use std::arch::aarch64::*;

    use super::lanes::Simd;

    /// NEON, 4 lanes.
    pub(crate) struct Neon;

    // Each method is only reached from functions compiled with neon,
    // called only once it was detected (`Backend::is_available`).
    impl Simd for Neon {
        const LANES: usize = 4;
        type V = float32x4_t;

        #[inline(always)]
        unsafe fn splat(v: f32) -> float32x4_t {
            // SAFETY: NEON is present (see the impl's comment).
            #[allow(unused_unsafe)]
            unsafe {
                vdupq_n_f32(v)
            }
        }
        #[inline(always)]
        unsafe fn load(p: *const f32) -> float32x4_t {
            // SAFETY: NEON is present; the caller guarantees 4 readable
            // values at p, and vld1q needs only f32 alignment, which any
            // *const f32 into a slice has.
            unsafe { vld1q_f32(p) }
        }
        #[inline(always)]
        unsafe fn store(p: *mut f32, v: float32x4_t) {
            // SAFETY: NEON is present; the caller guarantees 4 writable
            // values at p, aligned as f32.
            unsafe { vst1q_f32(p, v) }
        }
        #[inline(always)]
        unsafe fn mul_add(acc: float32x4_t, w: float32x4_t, x: float32x4_t) -> float32x4_t {
            // SAFETY: NEON is present.
            #[allow(unused_unsafe)]
            unsafe {
                vfmaq_f32(acc, w, x)
            }
        }
        #[inline(always)]
        unsafe fn mul_add_scalar(acc: f32, w: f32, x: f32) -> f32 {
            // Fused like `vfmaq_f32`; a single fmadd on aarch64.
            w.mul_add(x, acc)
        }
        #[inline(always)]
        unsafe fn neg_mul_add(acc: float32x4_t, w: float32x4_t, x: float32x4_t) -> float32x4_t {
            // SAFETY: NEON is present.
            #[allow(unused_unsafe)]
            unsafe {
                vfmsq_f32(acc, w, x)
            }
        }
    }
}
#[cfg(target_arch = "aarch64")]
pub(crate) use neon::Neon;

#[cfg(test)]
mod tests {
    use super::*;

    /// The workspace's Rust sources (path, text), read at test time.
    fn workspace_sources() -> Vec<(std::path::PathBuf, String)> {
        fn walk(dir: &std::path::Path, found: &mut Vec<(std::path::PathBuf, String)>) {
            for entry in std::fs::read_dir(dir).expect("a source directory") {
                let path = entry.expect("an entry").path();
                if path.is_dir() {
                    walk(&path, found);
                } else if path.extension().is_some_and(|e| e == "rs") {
                    let text = std::fs::read_to_string(&path).expect("a source file");
                    found.push((path, text));
                }
            }
        }
        let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
        let mut found = Vec::new();
        for crate_dir in ["kernels", "delegate", "pte_runner", "schema"] {
            let src = root.join(crate_dir).join("src");
            if src.is_dir() {
                walk(&src, &mut found);
            }
        }
        found
    }

    /// The CPU is asked in this file alone: a kernel that detected its
    /// features itself could disagree with the others (and paid the check
    /// per call). Walks the workspace's Rust sources.
    #[test]
    fn features_are_detected_in_this_file_alone() {
        let asks = ["is_x86_feature_detected", "is_aarch64_feature_detected"];
        let found: Vec<String> = workspace_sources()
            .into_iter()
            .filter(|(path, text)| {
                !path.ends_with("kernels/src/simd.rs") && asks.iter().any(|a| text.contains(a))
            })
            .map(|(path, _)| path.display().to_string())
            .collect();
        assert!(
            found.is_empty(),
            "CPU features detected outside simd.rs: {found:?}"
        );
        // And what it detected is coherent: each backend has every feature
        // of the earlier ones, so one available leaves them available too.
        for pair in Backend::ALL.windows(2) {
            assert!(
                !pair[1].is_available() || pair[0].is_available(),
                "{pair:?}"
            );
        }
        assert!(Backend::Portable.is_available());
        assert!(Backend::detect().is_available());
    }

    /// A function whose `target_feature` attribute is written by hand,
    /// outside [`per_backend`], runs only where some backend was detected,
    /// so it may enable no more than that backend's row asks the CPU for: each
    /// string lies within one row of the table (an `avx512f` variant within
    /// the AVX-512 row, a NEON one within NEON's), or else it could run,
    /// undetected, on a CPU without the feature. Each is spelt as the row
    /// spells its features: a feature a row only implies (`avx`, which
    /// rustc enables with `avx2`) names no row.
    #[test]
    fn hand_written_target_features_are_within_one_row() {
        let marker = "target_feature(enable = \"";
        let mut seen = 0;
        for (path, text) in workspace_sources() {
            for (at, _) in text.match_indices(marker) {
                let rest = &text[at + marker.len()..];
                let features = &rest[..rest.find('"').expect("a closing quote")];
                let line = text[..at].lines().count();
                let rows: Vec<&str> = TABLE_FEATURES
                    .iter()
                    .filter(|(_, row)| features.split(',').all(|f| row.contains(&f)))
                    .map(|(name, _)| *name)
                    .collect();
                assert!(
                    !rows.is_empty(),
                    "{}:{line}: target_feature \"{features}\" is within no row of per_backend!'s \
                     table {TABLE_FEATURES:?}",
                    path.display()
                );
                if features.contains("avx512") {
                    assert!(rows.contains(&"Avx512"), "{}:{line}", path.display());
                }
                seen += 1;
            }
        }
        // The hand-written ones (the scan, the FFT lanes, the strided moves)
        // were found, so the walk looked where they are.
        assert!(seen >= 10, "found only {seen} target_feature strings");
    }

    /// The run paths ask the CPU nothing: a conv prepared on each backend
    /// (every algorithm, the matrix-vector path of decode steps, fused
    /// operands compiled for that backend, short rows materialised through
    /// the strided moves) runs with the backend it kept, without one call
    /// of [`Backend::detect`]; so does a scan made for each backend
    /// ([`crate::scan::LinearScan`], as the delegate's scan step keeps one).
    /// An entry point without a preparation (the free scan functions)
    /// detects once at its top, not per row or tile. Counted on this
    /// thread, the runs on the serial pool.
    #[test]
    fn run_paths_do_not_detect() {
        use crate::conv1d::{Algorithm, Choice, PreparedConv1d, Weights};
        use crate::fused::{
            materialise, BinaryOp, EpilogueSink, Expr, Program, ProgramRows, RowSink, RowSource,
            RowsIn, RowsOut, Shape, UnaryOp,
        };
        use crate::scan::{linear_scan_f32, scan_rows_scratch, ScanParams};
        use crate::scratch::Scratch;
        use crate::test_support::{conv_params, Rng, TestEnv};

        let mut rng = Rng::new(31);
        let shapes = [
            conv_params(1, (32, 32, 32), 300, 4, 1, (3, 0), 1),
            conv_params(1, (16, 16, 1), 200, 5, 1, (2, 2), 1),
            // A decode step: the matrix-vector kernel.
            conv_params(1, (64, 64, 1), 4, 4, 1, (0, 0), 1),
        ];
        for isa in Isa::all_available() {
            for p in &shapes {
                let g = p.geometry().unwrap();
                let (n, rows) = (g.out_len, p.batch * p.out_channels);
                let w = rng.vec(p.weight_elems(), -0.5, 0.5);
                let bias = rng.vec(p.out_channels, -0.5, 0.5);
                let x = rng.vec(p.input_elems(), -1.0, 1.0);
                // Fused operands: `x * x` in, `gelu(y + 1)` out.
                let mut env = TestEnv::default();
                let xs = env.stored(&[p.batch, p.in_channels, p.in_len], x.clone());
                let xv = env.virt(&[p.batch, p.in_channels, p.in_len]);
                let mut pro = Program::default();
                let l = pro.push(Expr::Load, xs);
                let (a, b) = (l, l);
                pro.push(
                    Expr::Binary {
                        op: BinaryOp::Mul,
                        a,
                        b,
                    },
                    xv,
                );
                let y = env.virt(&[p.batch, p.out_channels, n]);
                let mut epi = Program::default();
                let an = epi.push(Expr::Anchor, y);
                let one = epi.push(Expr::Const(1.0), y);
                let sum = epi.push(
                    Expr::Binary {
                        op: BinaryOp::Add,
                        a: an,
                        b: one,
                    },
                    y,
                );
                epi.push(
                    Expr::Unary {
                        op: UnaryOp::Gelu,
                        x: sum,
                    },
                    y,
                );
                let (pro, epi) = (pro.compile_for(isa), epi.compile_for(isa));
                let shape = Shape::new(&[p.batch, p.out_channels, n]);
                let mut convs = Vec::new();
                for a in Algorithm::ALL {
                    let choice = Choice::Force(a);
                    let weights = Weights::Constant(&w);
                    if let Ok(c) = PreparedConv1d::on_isa(p, weights, choice, isa) {
                        convs.push(c);
                    }
                }
                assert!(convs.len() >= 2, "{p:?}");
                let before = detects_on_this_thread();
                crate::par::install(&crate::par::Serial, || {
                    for conv in &convs {
                        let source = ProgramRows::new(&pro, &env);
                        let mut out = vec![0.0; rows * n];
                        let sink = EpilogueSink::new(&epi, &env, shape, &[], &mut out, shape);
                        let (xt, yt) = (source.temporaries(), sink.temporaries());
                        let scratch = Scratch::sized(
                            1,
                            conv.rows_scratch_per_thread(xt, yt)
                                .max(conv.scratch_per_thread()),
                            conv.shared_scratch(),
                        );
                        let mut y = vec![0.0; rows * n];
                        conv.run(p, &x, Some(&w), Some(&bias), &mut y, &scratch)
                            .unwrap();
                        let (x_in, y_out) = (RowsIn::Fused(&source), RowsOut::Fused(&sink));
                        if conv.fuses_input() && conv.fuses_output() {
                            conv.run_rows(p, x_in, Some(&w), Some(&bias), y_out, xt, yt, &scratch)
                                .unwrap();
                        }
                    }
                    // The prologue's rows materialised: `K - 1` long rows
                    // of a decode step's state are written from their columns.
                    let source = ProgramRows::new(&pro, &env);
                    let mut out = vec![0.0; p.batch * p.in_channels * p.in_len];
                    let scratch = Scratch::new(
                        crate::par::threads(),
                        crate::fused::line_scratch(source.temporaries()),
                    );
                    materialise(&source, &mut out, p.in_len, &scratch);
                });
                assert_eq!(detects_on_this_thread(), before, "{isa:?} {p:?}");
            }
        }
        // The scan: a `LinearScan` keeps the instruction set it was made
        // with, stored and fused operands alike (`a = -x`, `u = x * x`,
        // apart and as one pair program).
        let sp = ScanParams {
            batch: 2,
            channels: 64,
            len: 3000,
        };
        let dims = [sp.batch, sp.channels, sp.len];
        let x0 = vec![0.5; sp.state_elems()];
        let x = rng.vec(sp.seq_elems(), -1.0, 1.0);
        let mut env = TestEnv::default();
        let xs = env.stored(&dims, x.clone());
        let av = env.virt(&dims);
        let uv = env.virt(&dims);
        let operands = |pair: bool| {
            let mut p = Program::default();
            let l = p.push(Expr::Load, xs);
            let neg = p.push(
                Expr::Unary {
                    op: UnaryOp::Neg,
                    x: l,
                },
                av,
            );
            if pair {
                let sq = p.push(
                    Expr::Binary {
                        op: BinaryOp::Mul,
                        a: l,
                        b: l,
                    },
                    uv,
                );
                p.set_roots(vec![neg, sq]);
            }
            p
        };
        let mut y = vec![0.0; sp.seq_elems()];
        for isa in Isa::all_available() {
            let scan = crate::scan::LinearScan::new(isa);
            let (a, pair) = (
                operands(false).compile_for(isa),
                operands(true).compile_for(isa),
            );
            let scratch = Scratch::new(
                1,
                scan_rows_scratch(a.temporaries().max(pair.temporaries())),
            );
            let before = detects_on_this_thread();
            crate::par::install(&crate::par::Serial, || {
                scan.run(&sp, &x0, &x, &x, &mut y).unwrap();
                let (a, pair) = (ProgramRows::new(&a, &env), ProgramRows::new(&pair, &env));
                let (x0, u) = (RowsIn::Slice(&x0), RowsIn::Slice(&x));
                let a = RowsIn::Fused(&a);
                scan.run_rows(&sp, x0, a, u, RowsOut::Slice(&mut y), &scratch)
                    .unwrap();
                scan.run_rows_pair(&sp, x0, &pair, RowsOut::Slice(&mut y), &scratch)
                    .unwrap();
            });
            assert_eq!(detects_on_this_thread(), before, "{isa:?}");
        }
        // The free functions, which have no preparation, detect once a call.
        let before = detects_on_this_thread();
        crate::par::install(&crate::par::Serial, || {
            linear_scan_f32(&sp, &x0, &x, &x, &mut y).unwrap()
        });
        assert_eq!(detects_on_this_thread(), before + 1);
    }
}
