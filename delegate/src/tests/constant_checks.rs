//! Blobs whose constants disagree with what the kernels will read: a
//! constant segment shorter than a weight, a weight whose declared bytes
//! are fewer than its shape needs, a weight or bias whose shape does not
//! fit its conv (constant or fed). Each fails `init` with a typed error
//! that names the value; none is read out of bounds.

use super::*;

const CI: usize = 3;
const CO: usize = 4;
const KW: usize = 3;

/// `y = conv(x, w, b)`, the weight the segment's last constant, with the
/// given weight and bias values (or a weight input).
fn conv_blob(w: V, b: V) -> Vec<u8> {
    let weight_is_input = w.kind == fb::ValueKind::Input;
    build_blob(
        &[
            input("x", 0, &[s(1), s(CI as i64), s(16)]),
            b,
            w,
            output("y", 0, &[s(1), s(CO as i64), s(16)]),
        ],
        if weight_is_input { &[0, 2] } else { &[0] },
        &[3],
        &[N::Conv {
            input: 0,
            weight: 2,
            bias: 1,
            output: 3,
            stride: 1,
            pad: (1, 1),
            dilation: 1,
            groups: 1,
        }],
    )
}

fn weight(dims: &[i64]) -> V {
    let n = dims.iter().product::<i64>() as usize;
    constant("conv_w", dims, ramp(n, 0.1))
}

fn bias(n: usize) -> V {
    constant("conv_b", &[n as i64], ramp(n, 0.2))
}

/// `init` fails as an invalid program, naming `name` and saying `needle`.
fn assert_refused(blob: &[u8], name: &str, needle: &str) {
    let err = init(blob).err().expect("refused");
    assert_eq!(err.status(), Status::InvalidProgram, "{err}");
    let msg = err.to_string();
    assert!(msg.contains(&format!("'{name}'")), "{msg}");
    assert!(msg.contains(needle), "{msg}");
}

#[test]
fn a_well_formed_conv_blob_runs() {
    let blob = conv_blob(weight(&[CO as i64, CI as i64, KW as i64]), bias(CO));
    let d = init(&blob).unwrap();
    let x = ramp(CI * 16, 0.05);
    let mut args = Args(vec![
        tensor(&[1, CI as i32, 16], x.clone()),
        out_tensor(&[1, CO as i32, 16]),
    ]);
    d.execute(&mut args).unwrap();
    let p = Conv1dParams {
        batch: 1,
        in_channels: CI,
        out_channels: CO,
        in_len: 16,
        kernel_size: KW,
        stride: 1,
        pad_left: 1,
        pad_right: 1,
        dilation: 1,
        groups: 1,
    };
    let want =
        reference::conv1d_f32(&p, &x, &ramp(CO * CI * KW, 0.1), Some(&ramp(CO, 0.2))).unwrap();
    assert_close(&args.0[1].data, &want);
}

#[test]
fn a_constant_segment_shorter_than_the_weight_is_refused() {
    let good = conv_blob(weight(&[CO as i64, CI as i64, KW as i64]), bias(CO));
    // The segment's declared length (header bytes 40..48), cut by one float
    // and by the whole weight; and the blob itself cut the same way.
    let len = u64::from_le_bytes(good[40..48].try_into().unwrap());
    for cut in [4, 4 * (CO * CI * KW) as u64] {
        let mut blob = good.clone();
        blob[40..48].copy_from_slice(&(len - cut).to_le_bytes());
        assert_refused(&blob, "conv_w", "lie outside");
        let truncated = &good[..good.len() - cut as usize];
        let err = init(truncated).err().expect("refused");
        assert_eq!(err.status(), Status::InvalidProgram, "{err}");
    }
}

#[test]
fn a_weight_declaring_fewer_bytes_than_its_shape_is_refused() {
    for bytes in [0, 4, 4 * (CO * CI * KW) as u64 - 4] {
        let w = V {
            declared_bytes: Some(bytes),
            ..weight(&[CO as i64, CI as i64, KW as i64])
        };
        assert_refused(
            &conv_blob(w, bias(CO)),
            "conv_w",
            "its shape and dtype need",
        );
    }
    let b = V {
        declared_bytes: Some(4),
        ..bias(CO)
    };
    assert_refused(
        &conv_blob(weight(&[CO as i64, CI as i64, KW as i64]), b),
        "conv_b",
        "its shape and dtype need",
    );
}

#[test]
fn a_weight_or_bias_whose_shape_disagrees_with_its_conv_is_refused() {
    let (co, ci, k) = (CO as i64, CI as i64, KW as i64);
    // More input channels per group than the input has, fewer, none; the
    // shape given as a run-time input too.
    for dims in [[co, ci + 1, k], [co, ci - 1, k], [co, 0, k]] {
        assert_refused(
            &conv_blob(weight(&dims), bias(CO)),
            "conv_w",
            "does not fit input 'x'",
        );
        let fed = input("conv_w", 1, &dims.map(s));
        assert_refused(
            &conv_blob(fed, bias(CO)),
            "conv_w",
            "does not fit input 'x'",
        );
    }
    // No tap: a kernel would read nothing, or underflow computing a span.
    assert_refused(
        &conv_blob(weight(&[co, ci, 0]), bias(CO)),
        "conv_w",
        "no output channel or no tap",
    );
    // The bias longer or shorter than the weight's output channels.
    for n in [CO - 1, CO + 1] {
        assert_refused(
            &conv_blob(weight(&[co, ci, k]), bias(n)),
            "conv_b",
            "entries for the 4 output channels of weight 'conv_w'",
        );
    }
    // A weight of the wrong rank.
    assert_refused(
        &conv_blob(
            constant("conv_w", &[co, ci * k], ramp(CO * CI * KW, 0.1)),
            bias(CO),
        ),
        "conv_w",
        "has rank 2, expected 3",
    );
}
