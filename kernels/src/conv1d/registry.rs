//! The one list of conv1d algorithms. [`Algorithm`] and its
//! [`Algorithm::ALL`] are generated from it, and everything that chooses
//! or names an algorithm (`from_name`, `applicable`, `estimate_cost`,
//! [`super::Choice`]'s auto, measure and force) reads each algorithm's
//! [`Entry`] through [`Algorithm::entry`]. Adding an algorithm is one line
//! here (its variant and its module's `ENTRY`, by path, so no `use` to
//! add) plus its own module and its `mod` line in `conv1d/mod.rs`.

use super::algorithm::Entry;
use super::params::Conv1dGeometry;
use crate::simd::Backend;

/// Defines [`Algorithm`] with one variant per line, in the order given
/// (the order [`super::Choice::Measure`] tries them), and maps each
/// variant to its [`Entry`].
macro_rules! algorithms {
    ($($(#[$doc:meta])* $variant:ident => $entry:path,)+) => {
        /// The conv1d algorithms, in the order [`Choice::Measure`] tries
        /// them.
        ///
        /// [`Choice::Measure`]: super::Choice::Measure
        #[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
        pub enum Algorithm {
            $($(#[$doc])* $variant,)+
        }

        impl Algorithm {
            /// Every algorithm, in the order measurement tries them.
            pub const ALL: [Algorithm; [$(Algorithm::$variant),+].len()] =
                [$(Algorithm::$variant),+];

            /// Its registration.
            pub(crate) fn entry(self) -> &'static Entry {
                match self {
                    $(Algorithm::$variant => &$entry,)+
                }
            }
        }
    };
}

algorithms! {
    /// Any parameters: the scalar direct loop ([`super::conv1d_f32`]).
    Direct => super::direct::ENTRY,
    /// Depthwise, short filters: SIMD along time with the taps in registers.
    DepthwiseSimd => super::depthwise::ENTRY,
    /// Depthwise, long filters: FFT with filter spectra computed at prepare.
    Fft => super::fft::ENTRY,
    /// Dense and grouped: GEMM reading the weights in place.
    Gemm => super::gemm::ENTRY,
    /// Dense and grouped, stride 1, moderate filters and many channels:
    /// block FFT with one complex GEMM per bin, weight spectra per tile
    /// from the weights, read in place.
    FftGemm => super::fft_gemm::ENTRY,
}

impl Algorithm {
    /// The name used in compile specs, logs and the benchmark.
    pub fn name(self) -> &'static str {
        self.entry().name
    }

    /// The algorithm called `name` (see [`Algorithm::name`]).
    pub fn from_name(name: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|a| a.name() == name)
    }

    /// Whether the algorithm can run with weights fed at run time: all
    /// but those that derive data from the weights at prepare (the FFT,
    /// which transforms the filters).
    pub fn takes_fed_weights(self) -> bool {
        self.entry().takes_fed_weights
    }

    /// Whether the algorithm can compute convolutions of this shape on
    /// `backend`.
    pub(crate) fn applies(self, g: &Conv1dGeometry, backend: Backend) -> bool {
        (self.entry().applies)(g, backend)
    }

    /// The cost model: estimated single-thread seconds for one call at the
    /// shape `g` on `backend`, or None where the algorithm does not apply.
    /// See `cost.rs` for the constants and how they were calibrated.
    pub(crate) fn estimate(self, g: &Conv1dGeometry, backend: Backend) -> Option<f64> {
        self.applies(g, backend)
            .then(|| (self.entry().cost)(g, backend))
    }

    /// [`Self::estimate`] on `threads` threads: algorithms scale
    /// differently (the `fft_gemm` algorithm 3.3 times on 16 threads where
    /// the `gemm` one scales 7.3 times), so the cheapest on one thread need
    /// not be on many.
    pub(crate) fn estimate_on(
        self,
        g: &Conv1dGeometry,
        backend: Backend,
        threads: usize,
    ) -> Option<f64> {
        let serial = self.entry().serial;
        self.estimate(g, backend)
            .map(|seconds| super::cost::on_threads(seconds, serial, threads))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Blobs, compile specs, `inspect` and the Python side name the
    /// algorithms: the names and their order (measurement's) stay those of
    /// earlier releases.
    #[test]
    fn names_and_order_are_those_exported_models_use() {
        let names: Vec<_> = Algorithm::ALL.iter().map(|a| a.name()).collect();
        assert_eq!(
            names,
            ["direct", "depthwise_simd", "fft", "gemm", "fft_gemm"]
        );
        for a in Algorithm::ALL {
            assert_eq!(Algorithm::from_name(a.name()), Some(a));
        }
        assert_eq!(Algorithm::from_name("winograd"), None);
        let fed: Vec<_> = Algorithm::ALL
            .into_iter()
            .filter(|a| !a.takes_fed_weights())
            .collect();
        assert_eq!(fed, [Algorithm::Fft]);
    }
}
