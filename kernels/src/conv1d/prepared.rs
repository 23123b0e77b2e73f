//! A conv1d prepared once for its static parameters: the algorithm chosen
//! (by the cost model, by measurement, or forced), weight-derived data built
//! (the FFT's filter spectra, the depthwise column walk's transposed taps)
//! and its scratch need known, so that each call only computes.
//!
//! The algorithms are those of the registry (`registry.rs`); this module
//! reads their [`Entry`](super::algorithm::Entry) to choose one and holds
//! the prepared one as a [`ConvAlgorithm`] trait object, called once per
//! conv call, after the checks every call makes here.
//!
//! Whether the weights are known at prepare is part of the preparation
//! ([`Weights`]): a model may feed a conv's weight at run time (a weight
//! reshaped outside the delegate reaches it as an input), and then nothing
//! may be derived from the weights ahead of the call. The preparation holds
//! weight-derived data only in forms built from [`Weights::Constant`]; with
//! [`Weights::Fed`] the algorithm that needs them (the FFT) does not apply,
//! and the depthwise column walk transposes each call's taps into scratch.

use std::time::Instant;

use super::algorithm::{ConvAlgorithm, NotFusable};
use super::gemv::Gemv;
use super::params::{Conv1dGeometry, Conv1dParams};
use super::registry::Algorithm;
use super::weights::Weights;
use crate::error::{check_len, KernelError};
use crate::fused::{RowsIn, RowsOut};
use crate::scratch::{zeroed_floats, Scratch};
use crate::simd::{Backend, Isa};

/// How [`PreparedConv1d::new`] picks the algorithm.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Choice {
    /// The cheapest applicable algorithm by the cost model, on the
    /// threads of the pool current at preparation (the delegate's, at
    /// `init`).
    Auto,
    /// Prepare every applicable algorithm, time one call of each at the
    /// prepared (maximum) shape on the current rayon pool, keep the fastest.
    Measure,
    /// This algorithm; an error if it does not apply.
    Force(Algorithm),
}

/// Estimated seconds of `algorithm` for `p` on this CPU's instruction set
/// and the current pool's threads (what [`Choice::Auto`] compares), or
/// None where it does not apply (or `p` is invalid). The delegate's plan
/// log shows it, and the benchmark prints it beside each candidate's
/// measured time so the model can be checked.
pub fn estimate_cost(algorithm: Algorithm, p: &Conv1dParams) -> Option<f64> {
    algorithm.estimate_on(
        &p.geometry().ok()?,
        Backend::detect(),
        crate::par::threads(),
    )
}

/// Whether `a` can compute `g` on `backend` with weights of this kind
/// (constant or fed).
fn usable(a: Algorithm, g: &Conv1dGeometry, weights: &Weights, backend: Backend) -> bool {
    a.applies(g, backend) && (a.takes_fed_weights() || !weights.fed())
}

/// The algorithms that can compute `p` on this CPU's instruction set with
/// `weights` (only their kind matters: constant or fed).
pub fn applicable(p: &Conv1dParams, weights: &Weights) -> Vec<Algorithm> {
    let backend = Backend::detect();
    match p.geometry() {
        Ok(g) => Algorithm::ALL
            .into_iter()
            .filter(|&a| usable(a, &g, weights, backend))
            .collect(),
        Err(_) => Vec::new(),
    }
}

/// A conv1d ready to run on inputs up to the shape it was prepared for.
pub struct PreparedConv1d {
    max: Conv1dGeometry,
    /// Whether every call feeds its own weights (see [`Weights`]).
    fed: bool,
    /// The algorithm `imp` runs.
    algorithm: Algorithm,
    imp: Box<dyn ConvAlgorithm>,
    /// For a dense or grouped conv whose algorithm reads the weights in
    /// place: the matrix-vector kernel that calls of a few outputs per
    /// row (decode steps, short streaming chunks: [`Gemv::takes`]) take
    /// instead.
    gemv: Option<Gemv>,
    /// What every call checks, known at prepare: [`Self::scratch_per_thread`],
    /// [`Self::shared_scratch`] and [`Self::reads_weights`].
    scratch_per_thread: usize,
    shared_scratch: usize,
    reads_weights: bool,
}

impl PreparedConv1d {
    /// Prepares for `max`: the largest batch and input length calls will use
    /// (a dynamic sequence length's upper bound), with the other parameters
    /// fixed, for the constant weights `w` (`[out_channels, in_channels /
    /// groups, kernel_size]`): [`Self::for_weights`] with
    /// [`Weights::Constant`].
    pub fn new(max: &Conv1dParams, w: &[f32], choice: Choice) -> Result<Self, KernelError> {
        Self::for_weights(max, Weights::Constant(w), choice)
    }

    /// Prepares for `max` (see [`Self::new`]). With [`Weights::Constant`],
    /// every call passes the same values (or none, where
    /// [`Self::reads_weights`] is false); with [`Weights::Fed`], every call
    /// passes its own.
    ///
    /// # Errors
    /// Any error of the parameters' validation, [`KernelError::BufferLen`]
    /// for constant weights of the wrong length, and
    /// [`KernelError::NotApplicable`] for a forced algorithm that cannot
    /// compute `max` with such weights.
    pub fn for_weights(
        max: &Conv1dParams,
        weights: Weights,
        choice: Choice,
    ) -> Result<Self, KernelError> {
        Self::on_isa(max, weights, choice, Isa::detect())
    }

    /// [`Self::for_weights`] on `isa`, chosen once here: the cost model
    /// prices it and every kernel the preparation builds runs it.
    pub(crate) fn on_isa(
        max: &Conv1dParams,
        weights: Weights,
        choice: Choice,
        isa: Isa,
    ) -> Result<Self, KernelError> {
        let backend = isa.backend();
        let g = max.geometry()?;
        if let Weights::Constant(w) = weights {
            check_len("w", g.weight_elems, w.len())?;
        }
        match choice {
            Choice::Force(a) => {
                if !usable(a, &g, &weights, backend) {
                    return Err(KernelError::NotApplicable {
                        algorithm: a.name(),
                    });
                }
                Self::with(a, g, weights, isa)
            }
            // Where even the longest call is a decode step of a dense or
            // grouped conv, or a short call of constant weights it packs,
            // the matrix-vector kernel runs every call; of
            // the algorithms it stands in for, `gemm` is the one whose
            // epilogue hook it serves, so a fused epilogue stays fused.
            Choice::Auto
                if (Gemv::takes(&g) || (Gemv::packs(&g) && !weights.fed()))
                    && Algorithm::Gemm.applies(&g, backend) =>
            {
                Self::with(Algorithm::Gemm, g, weights, isa)
            }
            Choice::Auto => {
                let threads = crate::par::threads();
                let best = Algorithm::ALL
                    .into_iter()
                    .filter(|&a| usable(a, &g, &weights, backend))
                    .filter_map(|a| a.estimate_on(&g, backend, threads).map(|c| (a, c)))
                    .min_by(|x, y| x.1.total_cmp(&y.1))
                    .map_or(Algorithm::Direct, |(a, _)| a);
                Self::with(best, g, weights, isa)
            }
            Choice::Measure => Self::measure(g, weights, isa),
        }
    }

    /// Builds algorithm `a`, which the caller checked applies, through its
    /// registered `prepare`. Weight-derived data is built only from
    /// [`Weights::Constant`]: that is the one place a preparation sees
    /// weight values.
    fn with(
        a: Algorithm,
        g: Conv1dGeometry,
        weights: Weights,
        isa: Isa,
    ) -> Result<Self, KernelError> {
        let backend = isa.backend();
        let imp = (a.entry().prepare)(&g, weights, isa).ok_or(KernelError::NotApplicable {
            algorithm: a.name(),
        })?;
        // The matrix-vector kernel reads the weights in place, so it
        // stands in only for an algorithm that reads them too (not the
        // FFT, whose caller may have released them).
        let mut gemv =
            (Algorithm::Gemm.applies(&g, backend) && imp.reads_weights()).then(|| Gemv::new(isa));
        if let (Some(gemv), Weights::Constant(w)) = (&mut gemv, weights) {
            gemv.pack(&g, w);
        }
        let gemv_scratch = gemv
            .as_ref()
            .map_or(0, |_| Gemv::scratch_per_thread(&g, None, 0));
        let gemv_shared = gemv.as_ref().map_or(0, |_| Gemv::shared_scratch(&g));
        Ok(PreparedConv1d {
            max: g,
            fed: weights.fed(),
            algorithm: a,
            scratch_per_thread: imp.scratch_per_thread().max(gemv_scratch),
            shared_scratch: imp.shared_scratch(&g).max(gemv_shared),
            reads_weights: weights.fed() || imp.reads_weights(),
            imp,
            gemv,
        })
    }

    fn measure(g: Conv1dGeometry, weights: Weights, isa: Isa) -> Result<Self, KernelError> {
        let backend = isa.backend();
        let threads = crate::par::threads();
        // The sizes are the plan's (a blob's): allocated fallibly.
        let mut x = zeroed_floats(g.input_elems, "measuring input")?;
        for (i, v) in x.iter_mut().enumerate() {
            *v = ((i * 7919) % 97) as f32 / 97.0 - 0.5;
        }
        // Fed weights are timed on stand-in values: only the time matters.
        let mut stand_in;
        let w = match weights {
            Weights::Constant(w) => w,
            Weights::Fed => {
                stand_in = zeroed_floats(g.weight_elems, "measuring weights")?;
                stand_in.fill(0.5);
                &stand_in
            }
        };
        let mut y = zeroed_floats(g.output_elems, "measuring output")?;
        let mut best: Option<(f64, PreparedConv1d)> = None;
        for a in Algorithm::ALL
            .into_iter()
            .filter(|&a| usable(a, &g, &weights, backend))
        {
            let candidate = Self::with(a, g, weights, isa)?;
            let scratch = Scratch::try_sized(
                threads,
                candidate.scratch_per_thread(),
                candidate.shared_scratch(),
            )?;
            let start = Instant::now();
            candidate.run(&g.params, &x, Some(w), None, &mut y, &scratch)?;
            let seconds = start.elapsed().as_secs_f64();
            if best.as_ref().is_none_or(|(t, _)| seconds < *t) {
                best = Some((seconds, candidate));
            }
        }
        Ok(best.expect("direct always applies").1)
    }

    /// Whether every call feeds its own weights ([`Weights::Fed`]).
    pub fn weights_fed(&self) -> bool {
        self.fed
    }

    /// The algorithm this preparation runs.
    pub fn algorithm(&self) -> Algorithm {
        self.algorithm
    }

    /// Whether short calls read the weights packed at prepare.
    #[cfg(test)]
    pub(crate) fn packed(&self) -> bool {
        self.gemv.as_ref().is_some_and(Gemv::is_packed)
    }

    /// `f32` elements of scratch each thread needs for any call up to the
    /// prepared shape.
    pub fn scratch_per_thread(&self) -> usize {
        self.scratch_per_thread
    }

    /// Scratch per thread of the matrix-vector kernel, if there is one
    /// (with room for a prologue's input where `x_temps` is given).
    fn gemv_scratch(&self, x_temps: Option<usize>, y_temps: usize) -> usize {
        self.gemv
            .as_ref()
            .map_or(0, |_| Gemv::scratch_per_thread(&self.max, x_temps, y_temps))
    }

    /// The matrix-vector kernel, where it takes a call of `g`.
    fn gemv_for(&self, g: &Conv1dGeometry) -> Option<&Gemv> {
        self.gemv.as_ref().filter(|gemv| gemv.runs(g))
    }

    /// `f32` elements of the scratch's shared region a call needs (see
    /// [`Scratch::with_shared`]): `fft_gemm`'s weights, packed per call;
    /// `gemm`'s windows, where its chunks are split into blocks of rows;
    /// the matrix-vector kernel's columns, for short calls.
    pub fn shared_scratch(&self) -> usize {
        self.shared_scratch
    }

    /// Bytes of weight-derived data this preparation holds (filter spectra,
    /// transform matrices, weights packed for short calls), for memory
    /// reporting.
    pub fn prepared_bytes(&self) -> usize {
        self.imp.prepared_bytes() + self.gemv.as_ref().map_or(0, Gemv::prepared_bytes)
    }

    /// Whether `run` still reads the original weights (otherwise the
    /// caller may release them after `new` and pass `None` to `run`). Always
    /// true for fed weights.
    pub fn reads_weights(&self) -> bool {
        self.reads_weights
    }

    /// Whether [`Self::run_rows`] takes a computed input (a prologue run in
    /// this algorithm's loops); otherwise the input must be stored.
    pub fn fuses_input(&self) -> bool {
        self.imp.fuses_input()
    }

    /// Whether [`Self::run_rows`] hands its output to an epilogue inside
    /// its loops; otherwise the output must be stored.
    pub fn fuses_output(&self) -> bool {
        self.imp.fuses_output()
    }

    /// `f32` elements of scratch each thread needs for [`Self::run_rows`]
    /// when the input's and the output's programs need `x_temps` and
    /// `y_temps` line-sized temporaries (0 for stored ones).
    pub fn rows_scratch_per_thread(&self, x_temps: usize, y_temps: usize) -> usize {
        let imp = self.imp.rows_scratch(&self.max, x_temps, y_temps);
        let gemv_input = self.fuses_input().then_some(x_temps);
        imp.max(self.gemv_scratch(gemv_input, y_temps))
    }

    /// [`Self::run`] with the input computed by a prologue and / or the
    /// output handed to an epilogue, row chunk by row chunk (see
    /// [`crate::fused`]), where [`Self::fuses_input`] / [`Self::fuses_output`]
    /// allow; a stored input and output always work. `scratch` needs
    /// [`Self::rows_scratch_per_thread`] elements per thread and a shared
    /// region of [`Self::shared_scratch`].
    ///
    /// # Errors
    /// As [`Self::run`]; [`KernelError::NotFusable`] for a fused operand
    /// this algorithm cannot take.
    #[allow(clippy::too_many_arguments)]
    pub fn run_rows(
        &self,
        p: &Conv1dParams,
        x: RowsIn,
        w: Option<&[f32]>,
        bias: Option<&[f32]>,
        y: RowsOut,
        x_temps: usize,
        y_temps: usize,
        scratch: &Scratch,
    ) -> Result<(), KernelError> {
        match (x, y) {
            (RowsIn::Slice(x), RowsOut::Slice(y)) => self.run(p, x, w, bias, y, scratch),
            (x, y) => {
                let g = self.check_call(p, w, bias)?;
                if let RowsIn::Slice(x) = x {
                    check_len("x", g.input_elems, x.len())?;
                }
                if let RowsOut::Slice(y) = &y {
                    check_len("y", g.output_elems, y.len())?;
                }
                self.check_scratch(scratch, self.rows_scratch_per_thread(x_temps, y_temps))?;
                // Every algorithm the matrix-vector kernel stands in for,
                // and every one but the FFT, reads the weights, so `w` was
                // given where they are read.
                let w = w.unwrap_or_default();
                // Short calls (decode steps) as matrix-vector products, a
                // prologue's input computed whole first.
                if let Some(gemv) = self.gemv_for(&g) {
                    if (matches!(y, RowsOut::Slice(_)) || self.fuses_output())
                        && (matches!(x, RowsIn::Slice(_)) || self.fuses_input())
                    {
                        gemv.run(&g, x, w, bias, y, scratch);
                        return Ok(());
                    }
                }
                self.imp
                    .run_rows(&g, x, w, bias, y, scratch)
                    .map_err(|NotFusable| KernelError::NotFusable {
                        algorithm: self.algorithm.name(),
                    })
            }
        }
    }

    /// That `scratch` has `per_thread` elements per thread and the shared
    /// region this algorithm needs.
    fn check_scratch(&self, scratch: &Scratch, per_thread: usize) -> Result<(), KernelError> {
        for (which, expected, actual) in [
            ("scratch", per_thread, scratch.per_thread()),
            (
                "shared scratch",
                self.shared_scratch(),
                scratch.shared_len(),
            ),
        ] {
            if actual < expected {
                return Err(KernelError::BufferLen {
                    which,
                    expected,
                    actual,
                });
            }
        }
        Ok(())
    }

    /// The checks every call makes of its parameters, weights and bias.
    fn check_call(
        &self,
        p: &Conv1dParams,
        w: Option<&[f32]>,
        bias: Option<&[f32]>,
    ) -> Result<Conv1dGeometry, KernelError> {
        let g = p.geometry()?;
        let m = &self.max.params;
        let same_static = Conv1dParams {
            batch: m.batch,
            in_len: m.in_len,
            ..*p
        } == *m;
        if !same_static || p.batch > m.batch || p.in_len > m.in_len {
            return Err(KernelError::NotPrepared);
        }
        match w {
            Some(w) => check_len("w", g.weight_elems, w.len())?,
            None if self.reads_weights() => return Err(KernelError::MissingWeights),
            None => {}
        }
        if let Some(bias) = bias {
            check_len("bias", p.out_channels, bias.len())?;
        }
        Ok(g)
    }

    /// Computes `y = conv1d(x, w) + bias` for `p`, which must equal the
    /// prepared parameters except for a batch and input length no larger
    /// than prepared. `w` are the weights `new` was given; they may be
    /// `None` when [`Self::reads_weights`] is false. `scratch` must have at
    /// least [`Self::scratch_per_thread`] elements per thread of the current
    /// pool and a shared region of [`Self::shared_scratch`].
    pub fn run(
        &self,
        p: &Conv1dParams,
        x: &[f32],
        w: Option<&[f32]>,
        bias: Option<&[f32]>,
        y: &mut [f32],
        scratch: &Scratch,
    ) -> Result<(), KernelError> {
        let g = self.check_call(p, w, bias)?;
        check_len("x", g.input_elems, x.len())?;
        check_len("y", g.output_elems, y.len())?;
        self.check_scratch(scratch, self.scratch_per_thread())?;
        // `check_call` made sure `w` was given where it is read: by every
        // algorithm the matrix-vector kernel stands in for, and by every
        // one but the FFT.
        let w = w.unwrap_or_default();
        if let Some(gemv) = self.gemv_for(&g) {
            gemv.run(&g, RowsIn::Slice(x), w, bias, RowsOut::Slice(y), scratch);
            return Ok(());
        }
        self.imp.run(&g, x, w, bias, y, scratch);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Mutex;

    use super::*;
    use crate::fused::{RowSink, RowSource};
    use crate::test_support::{assert_conv_close, conv_params, depthwise_params, Rng};

    /// A stored input handed over as a fused operand, read along rows or
    /// across them (as a transposed `[B, N, C]` prologue prefers).
    struct Source<'a> {
        x: &'a [f32],
        in_len: usize,
        columns: bool,
    }

    impl RowSource for Source<'_> {
        fn fill(&self, row: usize, t0: usize, out: &mut [f32], _tmp: &mut [f32]) {
            out.copy_from_slice(&self.x[row * self.in_len + t0..][..out.len()]);
        }
        fn temporaries(&self) -> usize {
            0
        }
        fn isa(&self) -> crate::simd::Isa {
            crate::simd::Isa::detect()
        }
        fn prefers_columns(&self) -> bool {
            self.columns
        }
    }

    /// An epilogue that stores what it is handed into a NaN-filled buffer.
    struct Sink {
        out: Mutex<Vec<f32>>,
        out_len: usize,
        columns: bool,
    }

    impl RowSink for Sink {
        fn store(&self, row: usize, t0: usize, values: &[f32], _tmp: &mut [f32]) {
            let mut out = self.out.lock().unwrap();
            out[row * self.out_len + t0..][..values.len()].copy_from_slice(values);
        }
        fn temporaries(&self) -> usize {
            0
        }
        fn prefers_columns(&self) -> bool {
            self.columns
        }
    }

    /// Every path of every algorithm that takes fed weights, on a shape
    /// that reaches it: depthwise long rows (row kernels), decode steps
    /// (the column walk, and the plain channel loop past its window),
    /// channels-last fused operands (the column walk on long rows), dense
    /// and grouped convs long (gemm, fft_gemm, direct) and decode-sized
    /// (the matrix-vector kernel).
    fn shapes() -> Vec<(&'static str, Conv1dParams)> {
        vec![
            ("depthwise rows", depthwise_params(2, 24, 300, 4, (3, 0), 1)),
            (
                "depthwise dilated",
                depthwise_params(1, 9, 70, 3, (2, 2), 2),
            ),
            ("depthwise decode", depthwise_params(2, 70, 3, 3, (0, 0), 1)),
            (
                "depthwise decode 4",
                depthwise_params(1, 1100, 7, 4, (0, 0), 1),
            ),
            (
                "depthwise short, K 17",
                depthwise_params(1, 8, 18, 17, (0, 0), 1),
            ),
            (
                "depthwise long K 33",
                depthwise_params(1, 6, 200, 33, (32, 0), 1),
            ),
            // A FastConformer's: rows of 32, K = 9, "same" padding; more
            // rows than one task of a fused call takes (114 of them).
            (
                "depthwise short rows, K 9",
                depthwise_params(1, 130, 32, 9, (4, 4), 1),
            ),
            ("dense", conv_params(2, (6, 5, 1), 40, 3, 1, (2, 0), 1)),
            (
                "dense wide",
                conv_params(1, (32, 48, 1), 96, 7, 1, (6, 0), 1),
            ),
            (
                "grouped strided",
                conv_params(1, (8, 4, 2), 33, 4, 2, (1, 1), 1),
            ),
            (
                "dense decode",
                conv_params(2, (16, 12, 1), 4, 3, 1, (0, 0), 1),
            ),
            (
                "grouped decode",
                conv_params(1, (8, 8, 4), 2, 2, 1, (0, 0), 1),
            ),
        ]
    }

    const RTOL: f32 = 1e-4;

    #[test]
    fn fed_weights_are_read_at_every_call_by_every_algorithm() {
        let pool = rayon::ThreadPoolBuilder::new()
            .num_threads(2)
            .build()
            .unwrap();
        let mut rng = Rng::new(16);
        for (name, p) in shapes() {
            let x = rng.vec(p.input_elems(), -1.0, 1.0);
            let bias = rng.vec(p.bias_elems(), -1.0, 1.0);
            let algorithms = applicable(&p, &Weights::Fed);
            assert!(!algorithms.contains(&Algorithm::Fft), "{name}");
            for a in algorithms {
                let conv = PreparedConv1d::for_weights(&p, Weights::Fed, Choice::Force(a)).unwrap();
                assert!(conv.weights_fed() && conv.reads_weights(), "{name} {a:?}");
                if a == Algorithm::DepthwiseSimd {
                    assert_eq!(conv.prepared_bytes(), 0, "{name}: no transposed taps");
                }
                let g = p.geometry().unwrap();
                // Channels-last operands take the column walk on long rows.
                for columns in [false, true] {
                    let source = Source {
                        x: &x,
                        in_len: p.in_len,
                        columns,
                    };
                    let per_thread = conv
                        .rows_scratch_per_thread(0, 0)
                        .max(conv.scratch_per_thread());
                    let scratch =
                        Scratch::sized(crate::par::threads(), per_thread, conv.shared_scratch());
                    // A different filter each call: nothing may be kept from
                    // the one before (or from preparation, which saw none).
                    for call in 0..3 {
                        let w = rng.vec(p.weight_elems(), -1.0, 1.0);
                        let ctx = format!("{name}, {a:?}, call {call}, columns {columns}");
                        let mut y = vec![f32::NAN; g.output_elems];
                        pool.install(|| conv.run(&p, &x, Some(&w), Some(&bias), &mut y, &scratch))
                            .unwrap();
                        assert_conv_close(&p, &x, &w, Some(&bias), &y, RTOL, &ctx);
                        let sink = Sink {
                            out: Mutex::new(vec![f32::NAN; g.output_elems]),
                            out_len: g.out_len,
                            columns,
                        };
                        let x_in = if conv.fuses_input() {
                            RowsIn::Fused(&source)
                        } else {
                            RowsIn::Slice(&x)
                        };
                        if conv.fuses_output() {
                            pool.install(|| {
                                conv.run_rows(
                                    &p,
                                    x_in,
                                    Some(&w),
                                    Some(&bias),
                                    RowsOut::Fused(&sink),
                                    0,
                                    0,
                                    &scratch,
                                )
                            })
                            .unwrap();
                            let got = sink.out.into_inner().unwrap();
                            assert_conv_close(&p, &x, &w, Some(&bias), &got, RTOL, &ctx);
                        }
                    }
                }
            }
        }
    }

    /// The contract of `run_rows` that the plan relies on: every algorithm
    /// takes exactly the fused operands its `fuses_input` and
    /// `fuses_output` allow (computing the conv), and refuses any other
    /// combination with `NotFusable` under its name before writing
    /// anything. Constant weights, so that the FFT is among them (its
    /// lanes engine, which fuses, for 32 channels where the CPU has
    /// AVX-512; the realfft one, which does not, for 3).
    #[test]
    fn run_rows_takes_exactly_the_fused_operands_the_algorithm_declares() {
        let mut rng = Rng::new(17);
        let mut cases = shapes();
        cases.push(("fft", depthwise_params(1, 32, 1024, 65, (64, 0), 1)));
        cases.push((
            "fft, few channels",
            depthwise_params(1, 3, 900, 40, (39, 0), 1),
        ));
        let mut seen = Vec::new();
        for (name, p) in cases {
            let x = rng.vec(p.input_elems(), -1.0, 1.0);
            let w = rng.vec(p.weight_elems(), -1.0, 1.0);
            let bias = rng.vec(p.bias_elems(), -1.0, 1.0);
            let g = p.geometry().unwrap();
            for a in applicable(&p, &Weights::Constant(&w)) {
                let conv = PreparedConv1d::new(&p, &w, Choice::Force(a)).unwrap();
                let per_thread = conv
                    .rows_scratch_per_thread(0, 0)
                    .max(conv.scratch_per_thread());
                let scratch =
                    Scratch::sized(crate::par::threads(), per_thread, conv.shared_scratch());
                let source = Source {
                    x: &x,
                    in_len: p.in_len,
                    columns: false,
                };
                for (fused_x, fused_y) in [(true, false), (false, true), (true, true)] {
                    let ctx = format!("{name}, {a:?}, fused x {fused_x}, fused y {fused_y}");
                    let x_in = if fused_x {
                        RowsIn::Fused(&source)
                    } else {
                        RowsIn::Slice(&x)
                    };
                    let sink = Sink {
                        out: Mutex::new(vec![f32::NAN; g.output_elems]),
                        out_len: g.out_len,
                        columns: false,
                    };
                    let mut stored = vec![f32::NAN; g.output_elems];
                    let y_out = if fused_y {
                        RowsOut::Fused(&sink)
                    } else {
                        RowsOut::Slice(&mut stored)
                    };
                    let result =
                        conv.run_rows(&p, x_in, Some(&w), Some(&bias), y_out, 0, 0, &scratch);
                    let got = if fused_y {
                        sink.out.into_inner().unwrap()
                    } else {
                        stored
                    };
                    let allowed =
                        (!fused_x || conv.fuses_input()) && (!fused_y || conv.fuses_output());
                    seen.push((a, allowed));
                    if allowed {
                        assert_eq!(result, Ok(()), "{ctx}");
                        assert_conv_close(&p, &x, &w, Some(&bias), &got, RTOL, &ctx);
                    } else {
                        assert_eq!(
                            result,
                            Err(KernelError::NotFusable {
                                algorithm: a.name()
                            }),
                            "{ctx}"
                        );
                        assert!(
                            got.iter().all(|v| v.is_nan()),
                            "{ctx}: wrote before refusing"
                        );
                    }
                }
            }
        }
        // Both outcomes were reached, and by the algorithms expected.
        assert!(seen.contains(&(Algorithm::Direct, false)));
        assert!(seen.contains(&(Algorithm::FftGemm, true)));
        assert!(seen.contains(&(Algorithm::FftGemm, false)));
        assert!(seen.contains(&(Algorithm::Gemm, true)));
        assert!(seen.contains(&(Algorithm::DepthwiseSimd, true)));
        assert!(seen.iter().any(|&(a, _)| a == Algorithm::Fft));
    }

    #[test]
    fn algorithms_that_derive_from_the_weights_refuse_fed_ones() {
        let p = depthwise_params(1, 4, 4096, 129, (128, 0), 1);
        assert!(
            applicable(&p, &Weights::Constant(&vec![0.0; p.weight_elems()]))
                .contains(&Algorithm::Fft)
        );
        assert!(!applicable(&p, &Weights::Fed).contains(&Algorithm::Fft));
        assert_eq!(
            PreparedConv1d::for_weights(&p, Weights::Fed, Choice::Force(Algorithm::Fft)).err(),
            Some(KernelError::NotApplicable { algorithm: "fft" })
        );
        for choice in [Choice::Auto, Choice::Measure] {
            let conv = PreparedConv1d::for_weights(&p, Weights::Fed, choice).unwrap();
            assert_ne!(conv.algorithm(), Algorithm::Fft, "{choice:?}");
            // A fed weight must come with every call.
            let x = vec![0.0; p.input_elems()];
            let mut y = vec![0.0; p.output_elems().unwrap()];
            let scratch = Scratch::sized(
                crate::par::threads(),
                conv.scratch_per_thread(),
                conv.shared_scratch(),
            );
            assert_eq!(
                conv.run(&p, &x, None, None, &mut y, &scratch).err(),
                Some(KernelError::MissingWeights)
            );
        }
    }

    /// `Choice::Auto` prices each algorithm on the threads of the pool it
    /// is prepared on: at a shape where `fft_gemm` is the cheaper on one
    /// thread but scales worse than the GEMM (`cost::on_threads`), a
    /// 16-thread pool gets the GEMM.
    #[test]
    fn auto_chooses_for_the_threads_of_the_current_pool() {
        /// A pool that only reports its size (preparing runs no task).
        struct Sized(usize);
        impl crate::par::Pool for Sized {
            fn threads(&self) -> usize {
                self.0
            }
            fn run(&self, tasks: usize, task: &(dyn Fn(usize, usize) + Sync)) {
                (0..tasks).for_each(|i| task(0, i));
            }
        }
        let on = |threads: usize, p: &Conv1dParams| {
            let w = vec![0.5; p.weight_elems()];
            crate::par::install(&Sized(threads), || {
                PreparedConv1d::new(p, &w, Choice::Auto)
                    .unwrap()
                    .algorithm()
            })
        };
        let mut checked = 0;
        for c in [32, 64, 128, 256] {
            for (n, k) in [(800, 7), (800, 11), (3200, 11), (12800, 11)] {
                let p = conv_params(1, (c, c, 1), n, k, 1, (k / 2, k / 2), 1);
                if on(1, &p) != Algorithm::FftGemm {
                    continue;
                }
                let g = p.geometry().unwrap();
                let backend = Backend::detect();
                let cost = |a: Algorithm, t| a.estimate_on(&g, backend, t).unwrap();
                let gemm_cheaper = cost(Algorithm::Gemm, 16) < cost(Algorithm::FftGemm, 16);
                let want = if gemm_cheaper {
                    Algorithm::Gemm
                } else {
                    Algorithm::FftGemm
                };
                assert_eq!(on(16, &p), want, "C={c} N={n} K={k}");
                checked += usize::from(gemm_cheaper);
            }
        }
        // The SIMD backends' estimates have such shapes among these; the
        // portable fallback's need not.
        if Backend::detect() != Backend::Portable {
            assert!(
                checked > 0,
                "no shape where the thread count changes the choice"
            );
        }
    }
}
