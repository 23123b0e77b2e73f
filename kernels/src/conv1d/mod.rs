//! 1-D convolution (PyTorch `aten.convolution`, non-transposed, one spatial
//! dimension).
//!
//! `params` owns validation and derives the `Conv1dGeometry` every
//! algorithm takes. The algorithms are sibling modules (`direct`,
//! `depthwise`, `fft`, `gemm`, `fft_gemm`), each with its registration
//! (`ENTRY`: name, `applies`, `cost` (the roofline model of `cost`),
//! whether it takes fed weights, `prepare`) and a prepared form that
//! implements `algorithm::ConvAlgorithm` and takes its scratch from the
//! caller. `registry` lists them, once: [`Algorithm`] is generated from
//! that list, so adding an algorithm is its own module, its `mod` line
//! below and one line there. `gemv` runs the decode-sized calls of dense
//! and grouped convs whatever algorithm was prepared. `prepared` chooses,
//! prepares and checks each call before handing it to the algorithm
//! ([`PreparedConv1d`]); [`conv1d_f32`] is the direct loop as a one-shot
//! call, with nothing prepared.

mod algorithm;
mod cost;
mod depthwise;
mod direct;
mod fft;
mod fft_gemm;
mod gemm;
mod gemv;
mod params;
mod prepared;
mod registry;
mod tap_span;
mod weights;

pub use params::Conv1dParams;
pub use prepared::{applicable, estimate_cost, Choice, PreparedConv1d};
pub use registry::Algorithm;
pub use weights::Weights;

use crate::error::{check_len, KernelError};

/// Computes `y = conv1d(x, w) + bias` as described on [`Conv1dParams`].
///
/// `x` is `[batch, in_channels, in_len]`, `w` is
/// `[out_channels, in_channels / groups, kernel_size]`, `bias` (if any) is
/// `[out_channels]` and `y` is `[batch, out_channels, out_len]`, all
/// row-major and contiguous; `y` is overwritten.
///
/// Parameters and slice lengths are checked first, and a mismatch is an
/// error, never a panic; on error `y` is untouched. Output rows
/// `(batch, out_channel)` are computed in parallel on the *current* rayon
/// pool, so the caller chooses the threads with `ThreadPool::install`. Each
/// row is summed in a fixed order, so the result does not depend on the
/// pool size. Performs no heap allocation of its own; rayon's scheduling
/// makes none either once the pool is warm (`tests/no_alloc.rs`).
///
/// # Errors
///
/// Any error of [`Conv1dParams::validate`], or [`KernelError::BufferLen`]
/// if a slice's length differs from the shape's (`x`, `w`, `bias`, `y`
/// checked in that order).
pub fn conv1d_f32(
    p: &Conv1dParams,
    x: &[f32],
    w: &[f32],
    bias: Option<&[f32]>,
    y: &mut [f32],
) -> Result<(), KernelError> {
    let geom = p.geometry()?;
    geom.check_inputs(x, w, bias)?;
    check_len("y", geom.output_elems, y.len())?;
    direct::conv1d(&geom, x, w, bias, y);
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::reference;
    use crate::test_support::{assert_conv_close, conv_params, Rng};

    /// Relative tolerance against the sum of absolute values of the terms
    /// of each output. Recursive f32 summation of n terms errs by at most
    /// about n * eps of that sum; here n = in_per_group * kernel_size + 1 is
    /// at most 20, so the bound is about 2.4e-6 and 1e-5 leaves headroom.
    const RTOL: f32 = 1e-5;

    /// Shapes named by what they exercise; bias is tested on and off for each.
    struct Case {
        name: &'static str,
        p: Conv1dParams,
    }

    #[allow(clippy::too_many_arguments)]
    fn case(
        name: &'static str,
        batch: usize,
        (in_channels, out_channels, groups): (usize, usize, usize),
        in_len: usize,
        kernel_size: usize,
        stride: usize,
        (pad_left, pad_right): (usize, usize),
        dilation: usize,
    ) -> Case {
        let channels = (in_channels, out_channels, groups);
        let pads = (pad_left, pad_right);
        Case {
            name,
            p: conv_params(batch, channels, in_len, kernel_size, stride, pads, dilation),
        }
    }

    fn grid() -> Vec<Case> {
        vec![
            case("dense", 1, (3, 5, 1), 16, 3, 1, (1, 1), 1),
            case("dense batch 2", 2, (3, 5, 1), 16, 3, 1, (1, 1), 1),
            case("depthwise", 2, (4, 4, 4), 20, 5, 1, (2, 2), 1),
            case(
                "depthwise strided dilated",
                2,
                (3, 3, 3),
                25,
                3,
                3,
                (4, 1),
                2,
            ),
            case("groups in between", 2, (6, 4, 2), 17, 3, 1, (1, 1), 1),
            case(
                "groups, more outputs than inputs",
                1,
                (4, 8, 2),
                9,
                2,
                2,
                (0, 1),
                1,
            ),
            case("pointwise K=1", 2, (3, 2, 1), 9, 1, 1, (0, 0), 1),
            case("pointwise strided", 1, (2, 3, 1), 10, 1, 3, (0, 0), 1),
            case("K > N with padding", 1, (2, 3, 1), 4, 7, 1, (3, 3), 1),
            case("K = N", 2, (3, 2, 1), 6, 6, 1, (0, 0), 1),
            case("stride > N", 1, (2, 2, 1), 5, 2, 8, (1, 1), 1),
            case("stride > N, two outputs", 2, (2, 2, 1), 5, 2, 8, (1, 10), 1),
            case("dilation 2", 2, (3, 4, 1), 19, 3, 1, (2, 2), 2),
            case("dilation 3 stride 2", 1, (4, 2, 2), 23, 4, 2, (5, 1), 3),
            case("causal pad_left only", 2, (2, 3, 1), 12, 4, 1, (3, 0), 1),
            case("pad_right only", 1, (3, 3, 3), 11, 3, 3, (0, 4), 2),
            case(
                "outputs reading only padding",
                1,
                (2, 2, 1),
                3,
                2,
                1,
                (6, 5),
                1,
            ),
            case(
                "empty input, padding only",
                2,
                (2, 3, 1),
                0,
                3,
                1,
                (2, 1),
                1,
            ),
            case("long row", 1, (2, 2, 1), 1000, 9, 1, (4, 4), 1),
        ]
    }

    /// Runs the kernel, writing into a NaN-filled buffer so unwritten outputs fail.
    fn run(p: &Conv1dParams, x: &[f32], w: &[f32], bias: Option<&[f32]>) -> Vec<f32> {
        let mut y = vec![f32::NAN; p.output_elems().unwrap()];
        conv1d_f32(p, x, w, bias, &mut y).unwrap();
        y
    }

    /// Kernel vs reference, within RTOL of the per-output sum of |terms|
    /// (itself the reference applied to absolute values).
    fn check_random(p: &Conv1dParams, rng: &mut Rng, with_bias: bool, context: &str) {
        let x = rng.vec(p.input_elems(), -1.0, 1.0);
        let w = rng.vec(p.weight_elems(), -1.0, 1.0);
        let bias = rng.vec(p.bias_elems(), -1.0, 1.0);
        let bias = with_bias.then_some(&bias[..]);

        let got = run(p, &x, &w, bias);
        assert_conv_close(p, &x, &w, bias, &got, RTOL, context);
    }

    #[test]
    fn grid_matches_reference_on_random_inputs() {
        let mut rng = Rng::new(42);
        for Case { name, p } in grid() {
            for with_bias in [false, true] {
                check_random(
                    &p,
                    &mut rng,
                    with_bias,
                    &format!("{name}, bias {with_bias}: {p:?}"),
                );
            }
        }
    }

    #[test]
    fn grid_matches_reference_exactly_on_structured_inputs() {
        // Small integers keep every partial sum exact in f32, so kernel and
        // reference must agree bit for bit whatever the summation order.
        for Case { name, p } in grid() {
            let ones = |n| vec![1.0f32; n];
            let ramp =
                |n: usize, modulus: usize| (0..n).map(|i| (i % modulus) as f32).collect::<Vec<_>>();
            let inputs = [
                ("ones", ones(p.input_elems()), ones(p.weight_elems())),
                (
                    "ramps",
                    ramp(p.input_elems(), 64),
                    ramp(p.weight_elems(), 7),
                ),
                (
                    "ramp x, ones w",
                    ramp(p.input_elems(), 1000),
                    ones(p.weight_elems()),
                ),
            ];
            let bias = ramp(p.bias_elems(), 5);
            for (kind, x, w) in &inputs {
                for bias in [None, Some(&bias[..])] {
                    let want = reference::conv1d_f32(&p, x, w, bias).unwrap();
                    assert_eq!(
                        run(&p, x, w, bias),
                        want,
                        "{name}, {kind}, bias {}",
                        bias.is_some()
                    );
                }
            }
        }
    }

    #[test]
    fn all_ones_counts_taps_inside_the_input() {
        // N=4, K=3, pad 1/1: outputs at the edges lose one tap to padding.
        let p = case("", 1, (1, 1, 1), 4, 3, 1, (1, 1), 1).p;
        assert_eq!(run(&p, &[1.0; 4], &[1.0; 3], None), [2.0, 3.0, 3.0, 2.0]);
        // Two input channels double every count; bias adds on top.
        let p = case("", 1, (2, 1, 1), 4, 3, 1, (1, 1), 1).p;
        assert_eq!(
            run(&p, &[1.0; 8], &[1.0; 6], Some(&[0.5])),
            [4.5, 6.5, 6.5, 4.5]
        );
    }

    #[test]
    fn random_shapes_agree_with_reference_including_errors() {
        // Wide random sweep, including invalid shapes: kernel and reference
        // must return the same error or results within tolerance.
        let mut rng = Rng::new(1234);
        for trial in 0..400 {
            let groups = rng.range(1, 3);
            let p = Conv1dParams {
                batch: rng.range(0, 2),
                in_channels: groups * rng.range(1, 3) + usize::from(rng.range(0, 9) == 0),
                out_channels: groups * rng.range(1, 3),
                in_len: rng.range(0, 12),
                kernel_size: rng.range(1, 6),
                stride: rng.range(1, 4),
                pad_left: rng.range(0, 4),
                pad_right: rng.range(0, 4),
                dilation: rng.range(1, 3),
                groups,
            };
            let context = format!("trial {trial}: {p:?}");
            match p.validate() {
                Ok(()) => {
                    let with_bias = rng.range(0, 1) == 1;
                    check_random(&p, &mut rng, with_bias, &context);
                }
                Err(err) => {
                    // Buffers sized as if valid (saturating sizes are capped to keep allocation small).
                    let x = vec![0.0; p.input_elems().min(1 << 16)];
                    let w = vec![0.0; p.weight_elems().min(1 << 16)];
                    let mut y = [0.0; 4];
                    assert_eq!(
                        conv1d_f32(&p, &x, &w, None, &mut y),
                        Err(err.clone()),
                        "{context}"
                    );
                    assert_eq!(
                        reference::conv1d_f32(&p, &x, &w, None),
                        Err(err),
                        "{context}"
                    );
                }
            }
        }
    }

    #[test]
    fn zero_batch_is_a_no_op() {
        let p = case("", 0, (2, 3, 1), 5, 3, 1, (0, 0), 1).p;
        assert_eq!(
            conv1d_f32(&p, &[], &[0.0; 18], Some(&[0.0; 3]), &mut []),
            Ok(())
        );
    }

    #[test]
    fn empty_input_with_padding_yields_bias() {
        // PyTorch itself rejects in_len == 0, but the formula is well defined:
        // every tap reads padding.
        let p = case("", 2, (1, 2, 1), 0, 2, 1, (1, 1), 1).p;
        assert_eq!(
            run(&p, &[], &[9.0; 4], Some(&[1.0, -2.0])),
            [1.0, -2.0, 1.0, -2.0]
        );
        assert_eq!(run(&p, &[], &[9.0; 4], None), [0.0; 4]);
    }

    #[test]
    fn invalid_params_are_errors_not_panics() {
        let valid = case("", 1, (2, 2, 1), 4, 3, 1, (0, 0), 1).p;
        let (x, w) = ([0.0; 8], [0.0; 12]);
        let mut y = [0.0; 4];
        let broken = [
            Conv1dParams { stride: 0, ..valid },
            Conv1dParams {
                dilation: 0,
                ..valid
            },
            Conv1dParams { groups: 0, ..valid },
            Conv1dParams {
                kernel_size: 0,
                ..valid
            },
            Conv1dParams {
                in_channels: 0,
                ..valid
            },
            Conv1dParams {
                out_channels: 0,
                ..valid
            },
            Conv1dParams {
                groups: 2,
                out_channels: 3,
                ..valid
            },
            Conv1dParams {
                kernel_size: 5,
                ..valid
            },
            Conv1dParams {
                dilation: usize::MAX,
                ..valid
            },
        ];
        for p in broken {
            let err = p.validate().unwrap_err();
            assert_eq!(conv1d_f32(&p, &x, &w, None, &mut y), Err(err), "{p:?}");
        }
        assert_eq!(conv1d_f32(&valid, &x, &w, None, &mut y), Ok(()));
    }

    #[test]
    fn wrong_buffer_lengths_are_errors() {
        // Expected lengths: x 8, w 18, bias 3, y 6.
        let p = case("", 1, (2, 3, 1), 4, 3, 1, (0, 0), 1).p;
        let (x, w, bias) = ([0.0; 9], [0.0; 19], [0.0; 4]);
        let mut y = [7.0; 7];
        // (lengths passed for x, w, bias, y), then the error expected.
        let cases = [
            ((7, 18, None, 6), ("x", 8, 7)),
            ((9, 18, None, 6), ("x", 8, 9)),
            ((8, 17, None, 6), ("w", 18, 17)),
            ((8, 18, Some(4), 6), ("bias", 3, 4)),
            ((8, 18, Some(2), 6), ("bias", 3, 2)),
            ((8, 18, Some(3), 7), ("y", 6, 7)),
            ((8, 18, None, 0), ("y", 6, 0)),
        ];
        for ((x_len, w_len, bias_len, y_len), (which, expected, actual)) in cases {
            let bias = bias_len.map(|n| &bias[..n]);
            assert_eq!(
                conv1d_f32(&p, &x[..x_len], &w[..w_len], bias, &mut y[..y_len]),
                Err(KernelError::BufferLen {
                    which,
                    expected,
                    actual
                })
            );
        }
        // Nothing was written before the errors.
        assert_eq!(y, [7.0; 7]);
    }

    #[test]
    fn result_does_not_depend_on_pool_size() {
        let mut rng = Rng::new(5);
        let p = case("", 2, (6, 8, 2), 300, 5, 2, (3, 1), 2).p;
        let x = rng.vec(p.input_elems(), -1.0, 1.0);
        let w = rng.vec(p.weight_elems(), -1.0, 1.0);
        let bias = rng.vec(p.bias_elems(), -1.0, 1.0);
        let run_on = |threads| {
            let pool = rayon::ThreadPoolBuilder::new()
                .num_threads(threads)
                .build()
                .unwrap();
            pool.install(|| run(&p, &x, &w, Some(&bias)))
        };
        let single = run_on(1);
        for threads in [2, 3] {
            assert_eq!(run_on(threads), single, "{threads} threads");
        }
    }
}
