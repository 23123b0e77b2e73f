//! Helpers shared by the unit tests: a seeded PRNG, element-wise tolerance
//! checks, a ReLU epilogue sink and a fused program's values by index. Test-only; compiled under `cfg(test)`.

/// SplitMix64: tiny, seedable and reproducible on every platform, which is
/// all test data needs, without a dependency.
pub(crate) struct Rng(u64);

impl Rng {
    pub(crate) fn new(seed: u64) -> Self {
        Self(seed)
    }

    pub(crate) fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// Uniform in `[lo, hi]`.
    pub(crate) fn uniform(&mut self, lo: f32, hi: f32) -> f32 {
        // 24 random bits give a unit value exactly representable in f32.
        let unit = (self.next_u64() >> 40) as f32 / (1u32 << 24) as f32;
        lo + (hi - lo) * unit
    }

    /// Uniform in `[lo, hi]` (inclusive), for picking shapes.
    pub(crate) fn range(&mut self, lo: usize, hi: usize) -> usize {
        lo + (self.next_u64() % (hi - lo + 1) as u64) as usize
    }

    pub(crate) fn vec(&mut self, len: usize, lo: f32, hi: f32) -> Vec<f32> {
        (0..len).map(|_| self.uniform(lo, hi)).collect()
    }
}

/// Whether these tests run under user-mode emulation: the test command runs
/// the aarch64 build under QEMU with `RUSTCONV_TESTS_EMULATED=1`, where
/// arithmetic runs tens of times slower than natively.
pub(crate) fn emulated() -> bool {
    std::env::var_os("RUSTCONV_TESTS_EMULATED").is_some_and(|v| v == "1")
}

/// `cases`, or under [`emulated`] every third of them (the first, the
/// fourth, ...): the largest grids keep their spread of shapes there at a
/// third of the cost, and native runs take every case.
pub(crate) fn thinned_under_emulation<T>(cases: impl IntoIterator<Item = T>) -> Vec<T> {
    let keep = if emulated() { 3 } else { 1 };
    cases.into_iter().step_by(keep).collect()
}

/// Panics, naming the first offending index, unless
/// `|actual[i] - expected[i]| <= tol[i]` for every `i` (so any NaN fails).
pub(crate) fn assert_close(actual: &[f32], expected: &[f32], tol: &[f32], context: &str) {
    assert_eq!(actual.len(), expected.len(), "length mismatch: {context}");
    assert_eq!(
        tol.len(),
        expected.len(),
        "tolerance length mismatch: {context}"
    );
    for (i, ((&got, &want), &tol)) in actual.iter().zip(expected).zip(tol).enumerate() {
        assert!(
            (got - want).abs() <= tol,
            "element {i}: got {got}, want {want} (tolerance {tol}): {context}"
        );
    }
}

/// A conv1d's parameters in the order the tests' grids list them.
pub(crate) fn conv_params(
    batch: usize,
    (in_channels, out_channels, groups): (usize, usize, usize),
    in_len: usize,
    kernel_size: usize,
    stride: usize,
    (pad_left, pad_right): (usize, usize),
    dilation: usize,
) -> crate::Conv1dParams {
    crate::Conv1dParams {
        batch,
        in_channels,
        out_channels,
        in_len,
        kernel_size,
        stride,
        pad_left,
        pad_right,
        dilation,
        groups,
    }
}

/// A depthwise conv1d (channel multiplier 1) at stride 1.
pub(crate) fn depthwise_params(
    batch: usize,
    channels: usize,
    in_len: usize,
    kernel_size: usize,
    pads: (usize, usize),
    dilation: usize,
) -> crate::Conv1dParams {
    let channels3 = (channels, channels, channels);
    conv_params(batch, channels3, in_len, kernel_size, 1, pads, dilation)
}

/// Checks a conv's output `got` against the naive reference, element by
/// element within `rtol` times the output's sum of |terms| (the reference
/// applied to absolute values): summing `n` terms in f32, in any order,
/// errs by at most about `n` epsilons of that sum.
pub(crate) fn assert_conv_close(
    p: &crate::Conv1dParams,
    x: &[f32],
    w: &[f32],
    bias: Option<&[f32]>,
    got: &[f32],
    rtol: f32,
    context: &str,
) {
    use crate::reference::conv1d_f32;
    let abs = |v: &[f32]| v.iter().map(|e| e.abs()).collect::<Vec<f32>>();
    let want = conv1d_f32(p, x, w, bias).unwrap();
    let abs_bias = bias.map(abs);
    let magnitude = conv1d_f32(p, &abs(x), &abs(w), abs_bias.as_deref()).unwrap();
    let tol: Vec<f32> = magnitude.iter().map(|m| rtol * m).collect();
    assert_close(got, &want, &tol, context);
}

/// An epilogue that stores ReLU of each row it is handed into a NaN-filled
/// `[rows, out_len]` buffer, so unwritten outputs fail.
pub(crate) struct ReluSink {
    out: std::sync::Mutex<Vec<f32>>,
    out_len: usize,
}

impl ReluSink {
    pub(crate) fn new(len: usize, out_len: usize) -> Self {
        ReluSink {
            out: std::sync::Mutex::new(vec![f32::NAN; len]),
            out_len,
        }
    }

    /// What the kernel stored.
    pub(crate) fn into_values(self) -> Vec<f32> {
        self.out.into_inner().unwrap()
    }
}

impl crate::fused::RowSink for ReluSink {
    fn store(&self, row: usize, t0: usize, values: &[f32], _tmp: &mut [f32]) {
        let mut out = self.out.lock().unwrap();
        for (d, v) in out[row * self.out_len + t0..][..values.len()]
            .iter_mut()
            .zip(values)
        {
            *d = v.max(0.0);
        }
    }
    fn temporaries(&self) -> usize {
        0
    }
}

/// `conv`'s call `p` on the stored input `x` through a [`ReluSink`]: what
/// the epilogue was handed, to compare with ReLU of the stored result.
pub(crate) fn run_into_relu(
    conv: &crate::PreparedConv1d,
    p: &crate::Conv1dParams,
    x: &[f32],
    w: &[f32],
    bias: Option<&[f32]>,
    scratch: &crate::Scratch,
) -> Vec<f32> {
    use crate::fused::{RowsIn, RowsOut};
    let g = p.geometry().unwrap();
    let sink = ReluSink::new(g.output_elems, g.out_len);
    conv.run_rows(
        p,
        RowsIn::Slice(x),
        Some(w),
        bias,
        RowsOut::Fused(&sink),
        0,
        0,
        scratch,
    )
    .unwrap();
    sink.into_values()
}

/// A fused program's values by index: shapes for all, data for the stored
/// ones (`fused::Env` for the tests of programs, recipes and reductions).
#[derive(Default)]
pub(crate) struct TestEnv {
    pub(crate) shapes: Vec<crate::fused::Shape>,
    pub(crate) data: Vec<Vec<f32>>,
}

impl crate::fused::Env for TestEnv {
    fn shape(&self, value: usize) -> crate::fused::Shape {
        self.shapes[value]
    }
    fn data(&self, value: usize) -> &[f32] {
        &self.data[value]
    }
}

/// A [`TestEnv`] under a shape generation (or none), counting the shapes
/// it is asked: what a program keeps per generation asks none again.
pub(crate) struct CountingEnv {
    env: TestEnv,
    pub(crate) generation: Option<crate::fused::ShapeGeneration>,
    shapes: std::sync::atomic::AtomicUsize,
}

impl CountingEnv {
    pub(crate) fn new(env: TestEnv, generation: Option<crate::fused::ShapeGeneration>) -> Self {
        CountingEnv {
            env,
            generation,
            shapes: std::sync::atomic::AtomicUsize::new(0),
        }
    }

    /// The shapes asked since the last call.
    pub(crate) fn asked(&self) -> usize {
        self.shapes.swap(0, std::sync::atomic::Ordering::Relaxed)
    }
}

impl crate::fused::Env for CountingEnv {
    fn shape(&self, value: usize) -> crate::fused::Shape {
        self.shapes
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        self.env.shape(value)
    }
    fn data(&self, value: usize) -> &[f32] {
        self.env.data(value)
    }
    fn generation(&self) -> Option<crate::fused::ShapeGeneration> {
        self.generation
    }
}

impl TestEnv {
    /// A stored value.
    pub(crate) fn stored(&mut self, dims: &[usize], data: Vec<f32>) -> usize {
        let shape = crate::fused::Shape::new(dims);
        assert_eq!(shape.numel(), data.len());
        self.shapes.push(shape);
        self.data.push(data);
        self.shapes.len() - 1
    }
    /// A computed value with no data (what a program computes, never read
    /// from the environment).
    pub(crate) fn computed(&mut self, dims: &[usize]) -> usize {
        self.shapes.push(crate::fused::Shape::new(dims));
        self.data.push(Vec::new());
        self.shapes.len() - 1
    }
    /// A computed (virtual) value, zero-filled.
    pub(crate) fn virt(&mut self, dims: &[usize]) -> usize {
        self.stored(dims, vec![0.0; crate::fused::Shape::new(dims).numel()])
    }
}
