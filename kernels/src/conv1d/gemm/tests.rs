use super::*;
use crate::reference;
use crate::test_support::{assert_conv_close, conv_params as params, thinned_under_emulation, Rng};
use crate::{Algorithm, Choice, Conv1dParams, KernelError, PreparedConv1d};

fn prepare(max: &Conv1dParams, w: &[f32]) -> PreparedConv1d {
    let conv = PreparedConv1d::new(max, w, Choice::Force(Algorithm::Gemm)).unwrap();
    assert_eq!(conv.algorithm(), Algorithm::Gemm);
    conv
}

/// Runs `conv` at `p` into a NaN-filled buffer, so unwritten outputs fail.
fn run(
    conv: &PreparedConv1d,
    p: &Conv1dParams,
    x: &[f32],
    w: &[f32],
    bias: Option<&[f32]>,
) -> Vec<f32> {
    let mut y = vec![f32::NAN; p.output_elems().unwrap()];
    let scratch = Scratch::sized(
        rayon::current_num_threads(),
        conv.scratch_per_thread(),
        conv.shared_scratch(),
    );
    assert!(conv.reads_weights());
    conv.run(p, x, Some(w), bias, &mut y, &scratch).unwrap();
    y
}

/// Runs `conv` at `p` on random `x` and checks it against the reference
/// within `2 n eps` of the per-output sum of |terms|, `n` the number of
/// terms: f32 summation of `n` terms in any order errs by at most about
/// `n eps` of that sum.
fn check_at(
    conv: &PreparedConv1d,
    p: &Conv1dParams,
    w: &[f32],
    bias: Option<&[f32]>,
    rng: &mut Rng,
    context: &str,
) {
    let x = rng.vec(p.input_elems(), -1.0, 1.0);
    let got = run(conv, p, &x, w, bias);
    let terms = (p.in_channels / p.groups * p.kernel_size + 1) as f32;
    assert_conv_close(p, &x, w, bias, &got, 2.0 * terms * f32::EPSILON, context);
}

/// Prepares at `max` with random weights and bias, then checks runs at
/// `max` and at each smaller (batch, in_len) that is valid.
fn check_prepared(max: &Conv1dParams, smaller: &[(usize, usize)], rng: &mut Rng, name: &str) {
    let w = rng.vec(max.weight_elems(), -1.0, 1.0);
    let bias = rng.vec(max.bias_elems(), -1.0, 1.0);
    let conv = prepare(max, &w);
    // The GEMM reads the weights in place; a conv of only short calls
    // packs a copy for the matrix-vector kernel (`gemv/panels.rs`).
    let packs = crate::conv1d::gemv::Gemv::packs(&max.geometry().unwrap());
    assert_eq!(conv.prepared_bytes() > 0, packs, "{name}: {max:?}");
    for with_bias in [false, true] {
        let bias = with_bias.then_some(&bias[..]);
        let runs = std::iter::once((max.batch, max.in_len)).chain(smaller.iter().copied());
        for (batch, in_len) in runs {
            let p = Conv1dParams {
                batch,
                in_len,
                ..*max
            };
            if batch > max.batch || in_len > max.in_len || p.validate().is_err() {
                continue;
            }
            let context = format!("{name}, bias {with_bias}: {p:?} prepared at {max:?}");
            check_at(&conv, &p, &w, bias, rng, &context);
        }
    }
}

#[test]
fn grid_matches_reference() {
    let mut rng = Rng::new(7);
    let channels = [
        ("dense", (3, 5, 1)),
        ("groups 4", (12, 8, 4)),
        ("groups 2", (6, 4, 2)),
        ("depthwise multiplier 2", (3, 6, 3)),
    ];
    let pads = [(0, 0), (2, 2), (3, 1), (4, 0)];
    for (name, ch) in channels {
        for kernel_size in [1, 3, 7] {
            for stride in 1..=3 {
                for dilation in 1..=3 {
                    for pad in pads {
                        let in_len = rng.range(1, 40);
                        let max = params(2, ch, in_len, kernel_size, stride, pad, dilation);
                        if max.validate().is_err() {
                            continue;
                        }
                        let smaller = [(1, in_len), (2, in_len / 2), (1, 1)];
                        check_prepared(&max, &smaller, &mut rng, name);
                    }
                }
            }
        }
    }
}

#[test]
fn edge_shapes_match_reference() {
    let mut rng = Rng::new(11);
    let cases = [
        (
            "K > N with padding",
            params(1, (2, 3, 1), 4, 7, 1, (3, 3), 1),
        ),
        ("K > N grouped", params(2, (6, 4, 2), 2, 7, 1, (6, 3), 1)),
        ("stride > N", params(1, (2, 2, 1), 5, 2, 8, (1, 1), 1)),
        (
            "stride > N, two outputs",
            params(2, (4, 2, 2), 5, 2, 8, (1, 10), 1),
        ),
        (
            "outputs reading only padding",
            params(1, (2, 2, 1), 3, 2, 1, (6, 5), 1),
        ),
        (
            "empty input, padding only",
            params(2, (2, 3, 1), 0, 3, 1, (2, 1), 1),
        ),
        ("N = 1", params(2, (12, 8, 4), 1, 3, 1, (1, 1), 1)),
        ("K = N", params(2, (3, 2, 1), 6, 6, 1, (0, 0), 1)),
        ("pointwise", params(2, (5, 7, 1), 200, 1, 1, (0, 0), 1)),
        ("long causal", params(1, (6, 4, 2), 200, 7, 1, (6, 0), 1)),
        (
            "long dilated strided",
            params(2, (12, 8, 4), 197, 3, 3, (2, 5), 3),
        ),
        (
            "one output channel",
            params(1, (8, 1, 1), 50, 3, 2, (1, 1), 2),
        ),
        (
            "one input channel per group",
            params(1, (4, 8, 4), 60, 3, 1, (1, 1), 1),
        ),
    ];
    for (name, max) in cases {
        check_prepared(&max, &[(1, max.in_len / 2), (1, 0)], &mut rng, name);
    }
}

#[test]
fn several_tiles_and_blocks_match_reference() {
    // Shapes whose tiling has many chunks, channel blocks, or both, with
    // channel counts large enough for gemm's full micro-kernels.
    let mut rng = Rng::new(13);
    let cases = [
        ("many chunks", params(1, (16, 24, 1), 1500, 3, 1, (1, 1), 1)),
        (
            "many chunks, stride 2",
            params(1, (16, 24, 1), 1500, 3, 2, (1, 1), 1),
        ),
        (
            "chunks, stride 3, dilation 2, grouped",
            params(2, (12, 8, 4), 4000, 7, 3, (6, 2), 2),
        ),
        ("row blocks", params(1, (40, 128, 1), 100, 5, 1, (2, 2), 1)),
        (
            "row blocks grouped",
            params(1, (64, 192, 2), 70, 3, 2, (1, 0), 2),
        ),
        (
            "batch 2, chunks",
            params(2, (32, 32, 4), 1100, 7, 1, (3, 3), 1),
        ),
    ];
    for (name, max) in cases {
        let g = max.geometry().unwrap();
        let t = Tiling::new(&g, choose_block(Backend::detect(), g.out_per_group));
        assert!(t.chunks > 1 || t.row_blocks > 1, "{name}: {t:?}");
        check_prepared(&max, &[(1, max.in_len - 37), (2, 130)], &mut rng, name);
    }
}

#[test]
fn random_shapes_match_reference() {
    let mut rng = Rng::new(1234);
    let mut checked = 0;
    for trial in 0..300 {
        let groups = rng.range(1, 4);
        let max = Conv1dParams {
            batch: rng.range(1, 2),
            in_channels: groups * rng.range(1, 6),
            out_channels: groups * rng.range(1, 6),
            in_len: rng.range(1, 200),
            kernel_size: rng.range(1, 8),
            stride: rng.range(1, 3),
            pad_left: rng.range(0, 6),
            pad_right: rng.range(0, 6),
            dilation: rng.range(1, 3),
            groups,
        };
        let Ok(g) = max.geometry() else { continue };
        if !applies(&g) {
            continue;
        }
        let smaller = [(1, rng.range(0, max.in_len))];
        check_prepared(&max, &smaller, &mut rng, &format!("trial {trial}"));
        checked += 1;
    }
    assert!(checked > 150, "only {checked} valid shapes");
}

#[test]
fn structured_inputs_match_reference_exactly() {
    // Small integers keep every partial sum exact in f32, so the result
    // must equal the reference bit for bit whatever the summation order.
    let cases = [
        params(2, (12, 8, 4), 31, 3, 2, (1, 2), 2),
        params(1, (3, 5, 1), 20, 7, 1, (6, 0), 1),
        params(2, (40, 128, 1), 90, 3, 1, (1, 1), 1),
    ];
    for max in cases {
        let ramp = |n: usize, modulus: usize| (0..n).map(|i| (i % modulus) as f32).collect();
        let x: Vec<f32> = ramp(max.input_elems(), 17);
        let w: Vec<f32> = ramp(max.weight_elems(), 7);
        let bias: Vec<f32> = ramp(max.bias_elems(), 5);
        let conv = prepare(&max, &w);
        for bias in [None, Some(&bias[..])] {
            let want = reference::conv1d_f32(&max, &x, &w, bias).unwrap();
            assert_eq!(run(&conv, &max, &x, &w, bias), want, "{max:?}");
        }
    }
}

#[test]
fn result_does_not_depend_on_pool_size() {
    let mut rng = Rng::new(5);
    let p = params(2, (24, 32, 2), 700, 5, 2, (3, 1), 2);
    let x = rng.vec(p.input_elems(), -1.0, 1.0);
    let w = rng.vec(p.weight_elems(), -1.0, 1.0);
    let bias = rng.vec(p.bias_elems(), -1.0, 1.0);
    let conv = prepare(&p, &w);
    let run_on = |threads| {
        let pool = rayon::ThreadPoolBuilder::new()
            .num_threads(threads)
            .build()
            .unwrap();
        pool.install(|| run(&conv, &p, &x, &w, Some(&bias)))
    };
    let single = run_on(1);
    for threads in [2, 3] {
        assert_eq!(run_on(threads), single, "{threads} threads");
    }
}

#[test]
fn applies_to_all_but_depthwise_multiplier_one() {
    let applies_to = |ch| applies(&params(1, ch, 10, 3, 1, (0, 0), 1).geometry().unwrap());
    assert!(applies_to((4, 4, 1)));
    assert!(applies_to((6, 4, 2)));
    assert!(applies_to((4, 8, 4)));
    assert!(!applies_to((4, 4, 4)));
    assert!(!applies_to((1, 1, 1)));
    let p = params(1, (4, 4, 4), 10, 3, 1, (0, 0), 1);
    assert_eq!(
        PreparedConv1d::new(&p, &[0.0; 12], Choice::Force(Algorithm::Gemm)).err(),
        Some(KernelError::NotApplicable { algorithm: "gemm" })
    );
}

#[test]
fn partial_blocks_read_only_their_own_filters() {
    // w[o, c, k] = 100 o + 10 c + k + 1; 2 groups of 2 inputs and 11
    // outputs, 3 taps: every tile of MR-row blocks ends with a partial one,
    // whose missing rows repeat its last filter (the second group's last
    // one is the end of the weights) and are never stored.
    let p = params(1, (4, 22, 2), 8, 3, 1, (0, 0), 1);
    let g = p.geometry().unwrap();
    let value = |o: usize, c: usize, k: usize| (100 * o + 10 * c + k + 1) as f32;
    let w: Vec<f32> = (0..22)
        .flat_map(|o| (0..2).flat_map(move |c| (0..3).map(move |k| value(o, c, k))))
        .collect();
    let x: Vec<f32> = (0..p.input_elems()).map(|i| (i % 5) as f32 - 2.0).collect();
    let want = reference::conv1d_f32(&p, &x, &w, None).unwrap();
    for isa in Isa::all_available() {
        let backend = isa.backend();
        let conv = GemmConv::new(&g, isa);
        let mr = conv.kernel.block().mr;
        assert!(11 % mr != 0, "{backend:?}: mr {mr}");
        // Exact: integer-valued terms, far below 2^24.
        assert_eq!(run_gemm(&conv, &p, &x, &w[..], None), want, "{backend:?}");
        // One input channel's window: one phase row of the longest chunk
        // (the whole output here, or one block) plus the filter's reach,
        // rounded up to 64 bytes, then to an odd number of them.
        let cols = conv.kernel.block().cols();
        let lines = (6usize.max(cols) + 2).div_ceil(16);
        assert_eq!(conv.scratch_per_thread(), 2 * 16 * (lines | 1));
    }
}

#[test]
fn window_rows_per_phase() {
    // Stride 3, dilation 2, 5 taps: tap k reads padded position 3 l + 2 k,
    // phase (2 k) % 3 = 0, 2, 1, 0, 2 at offsets (2 k) / 3 = 0, 0, 1, 2, 2.
    // Rows of 100 + 2 values, padded to 112 (64-byte multiples).
    let w = Window::new(2, 5, 3, 2, 100, 48);
    assert_eq!((w.pitch, w.halo, w.stride), (112, 2, 3));
    assert_eq!(&*w.offsets, &[0, 2 * 112, 112 + 1, 2, 2 * 112 + 2]);
    assert_eq!(&*w.phases, &[0, 1, 2]);
    assert_eq!(w.channel_stride(), 336);
    // The micro-kernels' reads: channel 0's taps, then channel 1's.
    assert_eq!(&w.reads[..5], &*w.offsets);
    let next: Vec<usize> = w.offsets.iter().map(|o| 336 + o).collect();
    assert_eq!(&w.reads[5..], &next[..]);
    // Stride 2, dilation 2: every tap reads the even phase, the only row.
    // Its two lines are padded to three between channels, so that channels
    // read at one column spread over the L1 cache's sets.
    let w = Window::new(2, 3, 2, 2, 10, 16);
    assert_eq!((w.pitch, w.halo), (32, 2));
    assert_eq!(&*w.offsets, &[0, 1, 2]);
    assert_eq!(&*w.phases, &[0]);
    assert_eq!(w.channel_stride(), 48);
    assert_eq!(&w.reads[3..], &[48, 49, 50]);
    // Stride 4, K = 3: phases 0, 1, 2 are read, 3 has no row.
    let w = Window::new(2, 3, 4, 1, 20, 16);
    assert_eq!((w.pitch, w.halo), (32, 0));
    assert_eq!(&*w.offsets, &[0, 32, 64]);
    assert_eq!(&*w.phases, &[0, 1, 2]);
    assert_eq!(w.channel_stride(), 112);
    // A stride of 4e9 and 8 taps (a fuzzed blob's; finding the phases by
    // scanning every residue below the stride took minutes): 8 phases.
    let w = Window::new(2, 8, 4_000_000_000, 1, 20, 16);
    assert_eq!(&*w.phases, &[0, 1, 2, 3, 4, 5, 6, 7]);
    assert_eq!((w.halo, w.offsets[7]), (0, 7 * w.pitch));
}

/// Channels read at one column land in distinct L1 sets: rows of 256
/// floats, 1 KiB apart (a pointwise conv over 256 frames), put all the
/// channels' reads into 4 of the 64 sets. Any 64 consecutive channels'
/// reads of one column must map to 64 different sets (of 64-byte lines).
#[test]
fn consecutive_channels_spread_over_the_cache_sets() {
    for (k, stride, dilation, chunk) in [
        (1, 1, 1, 256),
        (1, 1, 1, 512),
        (3, 1, 1, 1022),
        (2, 2, 1, 1024),
        (3, 4, 1, 20),
    ] {
        let w = Window::new(64, k, stride, dilation, chunk, 16);
        let cs = w.channel_stride();
        assert!(cs >= w.phases.len() * w.pitch && cs.is_multiple_of(16));
        let sets: std::collections::HashSet<usize> = w
            .reads
            .iter()
            .step_by(k)
            .map(|&at| (at / 16) % 64)
            .collect();
        assert_eq!(
            sets.len(),
            64,
            "k {k} stride {stride} chunk {chunk}: channel stride {cs}"
        );
    }
}

/// Windows of more rows than one line of each fits in L1 keep their rows'
/// own pitch: padding cannot spread reads that overflow L1 anyway, and it
/// only grew wav2letter's 2000-channel pointwise windows (2 lines a
/// channel, 3 padded), which ran slower for it (see `channel_stride`).
#[test]
fn windows_wider_than_l1_are_not_padded() {
    // (input channels, taps, stride, chunk, channel stride)
    for (cin, k, stride, chunk, want) in [
        (2000, 1, 1, 51, 64),
        (513, 1, 1, 512, 512),
        (512, 1, 1, 512, 528),
        (257, 2, 2, 64, 2 * 64),
        (256, 2, 2, 64, 2 * 64 + 16),
        (1024, 3, 1, 1022, 1024),
    ] {
        let w = Window::new(cin, k, stride, 1, chunk, 16);
        assert_eq!(
            w.channel_stride(),
            want,
            "{cin} channels, K {k}, stride {stride}"
        );
        assert_eq!(w.reads[k], w.channel_stride() + w.offsets[0]);
    }
}

/// Windows of more rows than [`windows_wider_than_l1_are_not_padded`]
/// pads compute what the reference does, on every backend: the random
/// shapes have too few channels to reach them.
#[test]
fn unpadded_wide_windows_match_reference_on_every_backend() {
    let mut rng = Rng::new(46);
    let cases = [
        params(1, (600, 24, 1), 51, 1, 1, (0, 0), 1),
        params(1, (300, 16, 1), 120, 2, 2, (1, 0), 1),
        params(2, (1040, 40, 2), 90, 3, 1, (1, 1), 1),
    ];
    for isa in Isa::all_available() {
        for max in &cases {
            let g = max.geometry().unwrap();
            let conv = GemmConv::new(&g, isa);
            let win = &conv.window;
            let rows = g.in_per_group * win.phases.len();
            assert!(rows > kernel::SPREAD_ROWS, "{max:?}: {rows} rows");
            assert_eq!(win.channel_stride(), win.phases.len() * win.pitch);
            let w = rng.vec(max.weight_elems(), -1.0, 1.0);
            let b = rng.vec(max.bias_elems(), -1.0, 1.0);
            for in_len in [max.in_len, max.in_len / 2] {
                let p = Conv1dParams { in_len, ..*max };
                let x = rng.vec(p.input_elems(), -1.0, 1.0);
                let got = run_gemm(&conv, &p, &x, &w, Some(&b));
                check_output(&p, &x, &w, Some(&b), &got, &format!("{isa:?}: {p:?}"));
            }
        }
    }
}

#[test]
fn few_outputs_take_the_narrow_block() {
    for backend in Backend::all_available() {
        let [regular, few] = kernel::blocks(backend);
        assert!(
            few.mr < regular.mr && few.cols() > regular.cols(),
            "{backend:?}"
        );
        assert_eq!(choose_block(backend, 1), few);
        assert_eq!(choose_block(backend, few.mr), few);
        // A tie (no padding rows either way) takes the regular block.
        assert_eq!(choose_block(backend, regular.mr * few.mr), regular);
        // Wide groups take the regular block, whose steps keep at least as
        // many accumulators, whatever their count's divisors (AVX2 ran
        // 128 to 512 channels on a narrow block that spilled).
        for out in [16, 32, 64, 128, 256, 512, 1000] {
            assert_eq!(choose_block(backend, out), regular, "{backend:?} {out}");
        }
        assert!(regular.mr * regular.cols() <= kernel::MAX_BLOCK_FLOATS);
        assert!(few.mr * few.cols() <= kernel::MAX_BLOCK_FLOATS);
    }
}

/// GFLOP/s of each of this CPU's blocks, forced, on one thread:
/// `cargo test --release -p rustconv-kernels calibrate_blocks -- --ignored --nocapture`.
/// `GEMM_SHAPES=cin:cout:n:k,...` replaces the shapes ("same" padding);
/// `GEMM_ISA=avx2` forces an instruction set.
#[test]
#[ignore]
fn calibrate_blocks() {
    let shapes = std::env::var("GEMM_SHAPES").unwrap_or_else(|_| {
        "2:2:40000:7,4:4:20000:7,8:8:10000:7,16:16:12800:7,32:32:3200:7,64:64:800:7,\
         128:256:256:1,256:256:1000:1,512:512:500:3"
            .into()
    });
    // `GEMM_ISA=avx2` (any `Isa::name`) forces one of the CPU's instruction sets.
    let isa = match std::env::var("GEMM_ISA") {
        Ok(name) => *Isa::all_available()
            .iter()
            .find(|isa| isa.name() == name)
            .unwrap_or_else(|| panic!("GEMM_ISA={name}: not an instruction set of this CPU")),
        Err(_) => Isa::detect(),
    };
    let blocks = kernel::blocks(isa.backend());
    println!("{:?}: blocks {blocks:?}", isa.backend());
    for shape in shapes.split(',') {
        let v: Vec<usize> = shape
            .split(':')
            .map(|x| x.trim().parse().unwrap())
            .collect();
        let (cin, cout, n, k) = (v[0], v[1], v[2], v[3]);
        let p = params(1, (cin, cout, 1), n, k, 1, ((k - 1) / 2, k / 2), 1);
        let g = p.geometry().unwrap();
        let mut rng = Rng::new(1);
        let x = rng.vec(p.input_elems(), -1.0, 1.0);
        let w = rng.vec(p.weight_elems(), -1.0, 1.0);
        let b = rng.vec(p.bias_elems(), -1.0, 1.0);
        let flops = 2.0 * crate::conv1d::cost::direct_macs(&g);
        let reps = (2e9 / flops).clamp(5.0, 300.0) as usize;
        let mut line = format!("{cin:4}->{cout:<4} N={n:5} K={k:2}:");
        for block in blocks {
            let conv = GemmConv::with_block(&g, isa, block);
            let scratch = Scratch::sized(
                crate::par::threads(),
                conv.scratch_per_thread(),
                conv.shared_scratch(),
            );
            let mut y = vec![0.0; g.output_elems];
            let s = time(1, reps, &mut || {
                conv.run(&g, &x, &w, Some(&b), &mut y, &scratch)
            });
            line += &format!(" {}x{} {:6.1}", block.mr, block.nr, flops / s / 1e9);
        }
        let chosen = choose_block(isa.backend(), cout);
        println!("{line}  (chosen {}x{})", chosen.mr, chosen.nr);
    }
}

#[test]
fn tiling_partitions_the_output() {
    let mut rng = Rng::new(3);
    for _ in 0..2000 {
        let groups = rng.range(1, 8);
        let p = Conv1dParams {
            batch: rng.range(0, 4),
            in_channels: groups,
            out_channels: groups * rng.range(1, 300),
            in_len: rng.range(1, 5000),
            kernel_size: 1,
            stride: 1,
            pad_left: 0,
            pad_right: 0,
            dilation: 1,
            groups,
        };
        let g = p.geometry().unwrap();
        for backend in Backend::all_available() {
            let block = choose_block(backend, g.out_per_group);
            let cols = block.cols();
            let t = Tiling::new(&g, block);
            let context = format!("{p:?} on {backend:?}: {t:?}");
            // Every chunk and block is non-empty and together they cover
            // exactly, in order.
            assert!(t.chunk >= 1 && t.rows >= 1 && t.chunks >= 1, "{context}");
            let ranges: Vec<_> = (0..t.chunks).map(|c| t.cols(c, g.out_len)).collect();
            assert_eq!(ranges[0].start, 0, "{context}");
            assert_eq!(ranges[t.chunks - 1].end, g.out_len, "{context}");
            for pair in ranges.windows(2) {
                assert_eq!(pair[0].end, pair[1].start, "{context}");
            }
            assert_eq!(t.row_blocks, g.out_per_group.div_ceil(t.rows), "{context}");
            // No chunk is longer than the window was sized for.
            let longest = ranges.iter().map(|r| r.len()).max().unwrap();
            assert!(longest <= max_chunk(&g, block), "{context}");
            assert!(t.chunk <= chunk_cap(&g, block).min(g.out_len), "{context}");
            assert!(chunk_cap(&g, block) <= CHUNK_MAX.next_multiple_of(cols));
            if t.chunks > 1 {
                assert!(t.chunk >= CHUNK_MIN.min(g.out_len), "{context}");
                assert_eq!(t.chunk % cols, 0, "{context}");
                // Every chunk holds at least one whole block.
                assert!(ranges.iter().all(|r| r.len() >= cols), "{context}");
            }
            if t.row_blocks > 1 {
                assert!(t.rows >= ROWS_MIN, "{context}");
                assert_eq!(t.rows % block.mr, 0, "{context}");
            }
        }
    }
}

#[test]
fn cost_is_finite_and_grows_with_work() {
    let small = params(1, (64, 64, 1), 1000, 3, 1, (1, 1), 1);
    let large = Conv1dParams {
        in_len: 4000,
        ..small
    };
    let (cs, cl) = (
        cost(&small.geometry().unwrap(), Backend::detect()),
        cost(&large.geometry().unwrap(), Backend::detect()),
    );
    assert!(cs.is_finite() && cs > 0.0 && cl > cs, "{cs} {cl}");
}

/// Best-of-`reps` seconds of `f` on a pool of `threads` threads.
fn time(threads: usize, reps: usize, f: &mut (dyn FnMut() + Send)) -> f64 {
    use std::time::Instant;
    let pool = rayon::ThreadPoolBuilder::new()
        .num_threads(threads)
        .build()
        .unwrap();
    pool.install(|| {
        f();
        let mut best = f64::INFINITY;
        for _ in 0..reps {
            let t = Instant::now();
            f();
            best = best.min(t.elapsed().as_secs_f64());
        }
        best
    })
}

/// GFLOP/s (2 flops per multiply-add) of `algorithm` at `p` on each
/// thread count, and the cost model's single-thread estimate.
pub(crate) fn gflops(p: &Conv1dParams, algorithm: Algorithm, threads: &[usize]) -> (Vec<f64>, f64) {
    let g = p.geometry().unwrap();
    let mut rng = Rng::new(1);
    let x = rng.vec(p.input_elems(), -1.0, 1.0);
    let w = rng.vec(p.weight_elems(), -1.0, 1.0);
    let b = rng.vec(p.bias_elems(), -1.0, 1.0);
    let conv = PreparedConv1d::new(p, &w, Choice::Force(algorithm)).unwrap();
    let mut y = vec![0.0; g.output_elems];
    let flops = 2.0 * crate::conv1d::cost::direct_macs(&g);
    let rates = threads
        .iter()
        .map(|&t| {
            let scratch = Scratch::sized(t, conv.scratch_per_thread(), conv.shared_scratch());
            let reps = std::env::var("GEMM_REPS")
                .map_or((2e9 / flops).clamp(5.0, 200.0) as usize, |r| {
                    r.parse().unwrap()
                });
            let s = time(t, reps, &mut || {
                conv.run(p, &x, Some(&w), Some(&b), &mut y, &scratch)
                    .unwrap()
            });
            flops / s / 1e9
        })
        .collect();
    (rates, algorithm.estimate(&g, Backend::detect()).unwrap())
}

/// The GFLOP/s table of the module docs, on 1 and 2 threads:
/// `cargo test --release -p rustconv-kernels calibrate_gemm -- --ignored --nocapture`.
/// `GEMM_REPEAT=n` repeats the table (take the best on a shared machine),
/// `GEMM_ONLY=text` keeps the shapes whose name contains `text`.
#[test]
#[ignore]
fn calibrate_gemm() {
    let shapes = [
        (
            "256->256 K=3",
            params(1, (256, 256, 1), 4096, 3, 1, (1, 1), 1),
        ),
        ("64->64 K=3", params(1, (64, 64, 1), 4096, 3, 1, (1, 1), 1)),
        ("64->64 K=7", params(1, (64, 64, 1), 4096, 7, 1, (3, 3), 1)),
        (
            "512/8 groups K=3",
            params(1, (512, 512, 8), 4096, 3, 1, (1, 1), 1),
        ),
        ("4->4 K=3", params(1, (4, 4, 1), 4096, 3, 1, (1, 1), 1)),
        (
            "64->64 K=3 stride 2",
            params(
                1,
                (64, 64, 1),
                std::env::var("GEMM_N").map_or(4096, |n| n.parse().unwrap()),
                3,
                2,
                (1, 1),
                1,
            ),
        ),
        (
            "64->64 K=3 dil 2",
            params(1, (64, 64, 1), 4096, 3, 1, (2, 2), 2),
        ),
    ];
    let repeat: usize = std::env::var("GEMM_REPEAT")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(1);
    for _ in 0..repeat {
        for (name, p) in &shapes {
            // GEMM_ONLY=text: only the shapes whose name contains it.
            if std::env::var("GEMM_ONLY").is_ok_and(|only| !name.contains(&only)) {
                continue;
            }
            let (rates, est) = gflops(p, Algorithm::Gemm, &[1, 2]);
            println!(
                "{name:22} N=4096: 1T {:6.1}  2T {:6.1} GFLOP/s (model {:.3} ms, 1T {:.3} ms)",
                rates[0],
                rates[1],
                est * 1e3,
                2.0 * crate::conv1d::cost::direct_macs(&p.geometry().unwrap()) / rates[0] / 1e6,
            );
        }
    }
}

/// Single-thread sweep of `in_per_group` and `out_per_group` (K = 3,
/// N = 2048, dense) against the direct loop, for the cost constants:
/// `cargo test --release -p rustconv-kernels calibrate_gemm_sweep -- --ignored --nocapture`.
#[test]
#[ignore]
fn calibrate_gemm_sweep() {
    let sizes = [1, 2, 4, 8, 16, 32, 64, 256];
    for &cin in &sizes {
        for &cout in &sizes {
            if cin == 1 && cout == 1 {
                continue; // depthwise
            }
            let p = params(1, (cin, cout, 1), 2048, 3, 1, (1, 1), 1);
            let (gemm, est) = gflops(&p, Algorithm::Gemm, &[1]);
            let (direct, direct_est) = gflops(&p, Algorithm::Direct, &[1]);
            let ratio = est / direct_est;
            println!(
                "cin {cin:3} cout {cout:3}: gemm {:6.1} direct {:5.1} GFLOP/s, \
                 measured/direct {:5.2}, model/direct {:5.2}",
                gemm[0],
                direct[0],
                direct[0] / gemm[0],
                ratio,
            );
        }
    }
    // Fixed cost per call and tile: tiny shapes, whose time is mostly that.
    for (ch, n) in [(4, 8), (4, 64), (16, 16), (16, 200), (64, 64)] {
        let p = params(1, (ch, ch, 1), n, 3, 1, (1, 1), 1);
        let g = p.geometry().unwrap();
        let tiling = Tiling::new(&g, choose_block(Backend::detect(), ch));
        let (gemm, est) = gflops(&p, Algorithm::Gemm, &[1]);
        let (direct, direct_est) = gflops(&p, Algorithm::Direct, &[1]);
        let flops = 2.0 * crate::conv1d::cost::direct_macs(&g);
        println!(
            "{ch}->{ch} N={n}: {} tiles, gemm {:6.2} us direct {:6.2} us, \
             model gemm/direct {:5.2}",
            tiling.chunks * tiling.row_blocks,
            flops / gemm[0] / 1e3,
            flops / direct[0] / 1e3,
            est / direct_est,
        );
    }
}

/// Runs `conv` directly (no `PreparedConv1d`) into a NaN-filled buffer.
fn run_gemm(
    conv: &GemmConv,
    p: &Conv1dParams,
    x: &[f32],
    w: &[f32],
    bias: Option<&[f32]>,
) -> Vec<f32> {
    let g = p.geometry().unwrap();
    let mut y = vec![f32::NAN; g.output_elems];
    let threads = rayon::current_num_threads();
    let scratch = Scratch::sized(threads, conv.scratch_per_thread(), conv.shared_scratch());
    conv.run(&g, x, w, bias, &mut y, &scratch);
    y
}

/// Checks `got` against the reference as [`check_at`] does.
fn check_output(
    p: &Conv1dParams,
    x: &[f32],
    w: &[f32],
    bias: Option<&[f32]>,
    got: &[f32],
    ctx: &str,
) {
    let terms = (p.in_channels / p.groups * p.kernel_size + 1) as f32;
    assert_conv_close(p, x, w, bias, got, 2.0 * terms * f32::EPSILON, ctx);
}

#[test]
fn backends_include_the_detected_one() {
    let all = Backend::all_available();
    assert!(all.contains(&Backend::detect()));
    let g = params(1, (4, 4, 1), 10, 3, 1, (1, 1), 1)
        .geometry()
        .unwrap();
    for isa in Isa::all_available() {
        let conv = GemmConv::new(&g, isa);
        assert_eq!(conv.kernel.backend(), isa.backend());
    }
}

#[test]
fn ragged_edges_match_reference_on_every_backend() {
    // Output lengths around each backend's vector width and block (4, 8,
    // 16 lanes; blocks of 8 to 96 positions), output channels per group
    // that are not multiples of MR (2 to 8), below and above one panel,
    // with groups, stride, dilation and padding, on each block.
    let mut rng = Rng::new(21);
    let out_lens = [
        1, 3, 4, 5, 7, 8, 9, 15, 16, 17, 31, 33, 47, 48, 49, 95, 97, 100, 143, 600,
    ];
    let channels = [
        (3, 5, 1),
        (2, 7, 1),
        (6, 9, 1),
        (8, 13, 1),
        (6, 22, 2),
        (9, 3, 3),
        (4, 34, 2),
        (5, 1, 1),
    ];
    let mut cases = 0;
    for isa in Isa::all_available() {
        let backend = isa.backend();
        for (i, &out_len) in out_lens.iter().enumerate() {
            for (j, &ch) in channels.iter().enumerate() {
                let kernel_size = [1, 2, 3, 5][(i + j) % 4];
                let stride = 1 + (i + 2 * j) % 3;
                let dilation = 1 + (2 * i + j) % 2;
                let span = (kernel_size - 1) * dilation;
                let pad = [(0, 0), (span / 2, span - span / 2), (span, 0), (1, 3)][(i + j) % 4];
                // in_len giving exactly out_len outputs.
                let in_len = ((out_len - 1) * stride + span + 1).saturating_sub(pad.0 + pad.1);
                let p = params(1 + j % 2, ch, in_len, kernel_size, stride, pad, dilation);
                let Ok(g) = p.geometry() else { continue };
                if !applies(&g) {
                    continue;
                }
                let w = rng.vec(p.weight_elems(), -1.0, 1.0);
                let b = rng.vec(p.bias_elems(), -1.0, 1.0);
                let x = rng.vec(p.input_elems(), -1.0, 1.0);
                // Both of the backend's blocks, whichever the shape takes.
                for block in kernel::blocks(backend) {
                    let conv = GemmConv::with_block(&g, isa, block);
                    assert_eq!(conv.kernel.backend(), backend);
                    for bias in [None, Some(&b[..])] {
                        let got = run_gemm(&conv, &p, &x, &w, bias);
                        let ctx = format!("{backend:?} {block:?}, bias {}: {p:?}", bias.is_some());
                        check_output(&p, &x, &w, bias, &got, &ctx);
                        cases += 1;
                    }
                }
            }
        }
    }
    assert!(cases >= 200, "{cases} cases");
}

#[test]
fn random_shapes_match_reference_on_every_backend() {
    let mut rng = Rng::new(99);
    for isa in Isa::all_available() {
        let backend = isa.backend();
        for trial in 0..120 {
            let groups = rng.range(1, 3);
            let max = Conv1dParams {
                batch: rng.range(1, 2),
                in_channels: groups * rng.range(1, 20),
                out_channels: groups * rng.range(1, 20),
                in_len: rng.range(1, 700),
                kernel_size: rng.range(1, 9),
                stride: rng.range(1, 4),
                pad_left: rng.range(0, 8),
                pad_right: rng.range(0, 8),
                dilation: rng.range(1, 3),
                groups,
            };
            let Ok(g) = max.geometry() else { continue };
            if !applies(&g) {
                continue;
            }
            let w = rng.vec(max.weight_elems(), -1.0, 1.0);
            let b = rng.vec(max.bias_elems(), -1.0, 1.0);
            let conv = GemmConv::new(&g, isa);
            // At the prepared shape and at a shorter input.
            for in_len in [max.in_len, rng.range(0, max.in_len)] {
                let p = Conv1dParams { in_len, ..max };
                if p.validate().is_err() {
                    continue;
                }
                let x = rng.vec(p.input_elems(), -1.0, 1.0);
                let got = run_gemm(&conv, &p, &x, &w, Some(&b));
                check_output(
                    &p,
                    &x,
                    &w,
                    Some(&b),
                    &got,
                    &format!("{backend:?} trial {trial}: {p:?}"),
                );
            }
        }
    }
}

#[test]
fn structured_inputs_match_reference_exactly_on_every_backend() {
    // Small integers: every partial sum is exact, fused or not.
    let cases = [
        params(2, (12, 8, 4), 31, 3, 2, (1, 2), 2),
        params(1, (3, 5, 1), 20, 7, 1, (6, 0), 1),
        params(2, (40, 128, 1), 90, 3, 1, (1, 1), 1),
        params(1, (16, 27, 1), 1100, 4, 3, (2, 5), 2),
    ];
    for isa in Isa::all_available() {
        let backend = isa.backend();
        for p in cases {
            let ramp = |n: usize, modulus: usize| (0..n).map(|i| (i % modulus) as f32).collect();
            let x: Vec<f32> = ramp(p.input_elems(), 17);
            let w: Vec<f32> = ramp(p.weight_elems(), 7);
            let bias: Vec<f32> = ramp(p.bias_elems(), 5);
            let conv = GemmConv::new(&p.geometry().unwrap(), isa);
            for bias in [None, Some(&bias[..])] {
                let want = reference::conv1d_f32(&p, &x, &w, bias).unwrap();
                assert_eq!(run_gemm(&conv, &p, &x, &w, bias), want, "{backend:?} {p:?}");
            }
        }
    }
}

#[test]
fn result_does_not_depend_on_pool_size_on_every_backend() {
    let mut rng = Rng::new(8);
    let p = params(2, (24, 30, 2), 900, 5, 2, (3, 1), 2);
    let g = p.geometry().unwrap();
    let x = rng.vec(p.input_elems(), -1.0, 1.0);
    let w = rng.vec(p.weight_elems(), -1.0, 1.0);
    let bias = rng.vec(p.bias_elems(), -1.0, 1.0);
    for isa in Isa::all_available() {
        let backend = isa.backend();
        let conv = GemmConv::new(&g, isa);
        let run_on = |threads| {
            let pool = rayon::ThreadPoolBuilder::new()
                .num_threads(threads)
                .build()
                .unwrap();
            pool.install(|| run_gemm(&conv, &p, &x, &w, Some(&bias)))
        };
        let single = run_on(1);
        for threads in [2, 3] {
            assert_eq!(run_on(threads), single, "{backend:?}, {threads} threads");
        }
    }
}

/// wav2vec2's feature encoder at a 1 s 16 kHz waveform (its conv stack:
/// 1->512 K=10 stride 5, four 512->512 K=3 stride 2, two K=2 stride 2),
/// each layer's input the previous one's output.
pub(crate) fn speech_front_end(n: usize) -> Vec<(String, Conv1dParams)> {
    let layers = [
        (1, 10, 5),
        (512, 3, 2),
        (512, 3, 2),
        (512, 3, 2),
        (512, 3, 2),
        (512, 2, 2),
        (512, 2, 2),
    ];
    let mut len = n;
    layers
        .iter()
        .enumerate()
        .map(|(i, &(cin, k, s))| {
            let p = params(1, (cin, 512, 1), len, k, s, (0, 0), 1);
            len = p.geometry().unwrap().out_len;
            (format!("conv{i} {cin}->512 K={k} s={s} N={}", p.in_len), p)
        })
        .collect()
}

/// GFLOP/s per layer of the speech front-end, 1 and 2 threads:
/// `cargo test --release -p rustconv-kernels calibrate_speech -- --ignored --nocapture`;
/// `SPEECH_N` (default 16000) the waveform's length, `GEMM_REPEAT` repeats.
#[test]
#[ignore]
fn calibrate_speech() {
    let n = std::env::var("SPEECH_N").map_or(16000, |n| n.parse().unwrap());
    let repeat: usize = std::env::var("GEMM_REPEAT").map_or(1, |s| s.parse().unwrap());
    for _ in 0..repeat {
        for (name, p) in speech_front_end(n) {
            let (rates, est) = gflops(&p, Algorithm::Gemm, &[1, 2]);
            println!(
                "{name:34}: 1T {:6.1}  2T {:6.1} GFLOP/s (model {:.3} ms)",
                rates[0],
                rates[1],
                est * 1e3
            );
        }
    }
}

/// Strided speech front-end shapes and their neighbours: strides 2 to 5,
/// K = 2 to 10, one, three, sixteen and 512 input channels, padding and
/// dilation, output lengths around each backend's blocks and vectors.
fn strided_cases(rng: &mut Rng) -> Vec<Conv1dParams> {
    let mut cases = vec![
        // wav2vec2's first layer and one of its 512-channel layers, short.
        params(1, (1, 512, 1), 4000, 10, 5, (0, 0), 1),
        params(1, (512, 512, 1), 131, 3, 2, (0, 0), 1),
        params(2, (512, 64, 1), 99, 2, 2, (0, 0), 1),
        // Ragged lengths, padding, dilation.
        params(2, (1, 24, 1), 1001, 10, 5, (4, 3), 1),
        params(1, (3, 40, 1), 777, 7, 3, (3, 3), 2),
        params(1, (16, 20, 1), 517, 4, 4, (0, 3), 1),
        params(2, (16, 9, 1), 63, 5, 2, (2, 2), 1),
    ];
    for _ in 0..24 {
        let stride = rng.range(2, 5);
        let kernel_size = rng.range(2, 10);
        let cin = [1, 3, 16, 64][rng.range(0, 3)];
        let dilation = if rng.range(0, 3) == 0 { 2 } else { 1 };
        cases.push(params(
            rng.range(1, 2),
            (cin, rng.range(1, 70), 1),
            rng.range(20, 900),
            kernel_size,
            stride,
            (rng.range(0, kernel_size), rng.range(0, kernel_size)),
            dilation,
        ));
    }
    cases.retain(|p| p.validate().is_ok());
    cases
}

#[test]
fn strided_shapes_match_reference_on_every_backend() {
    let mut rng = Rng::new(16);
    for p in thinned_under_emulation(strided_cases(&mut rng)) {
        let g = p.geometry().unwrap();
        let x = rng.vec(p.input_elems(), -1.0, 1.0);
        let w = rng.vec(p.weight_elems(), -1.0, 1.0);
        let b = rng.vec(p.bias_elems(), -1.0, 1.0);
        // The reference once per case (512 channels make it slow), then
        // every backend within tolerance of it.
        let want = reference::conv1d_f32(&p, &x, &w, Some(&b)).unwrap();
        let abs = |v: &[f32]| v.iter().map(|e| e.abs()).collect::<Vec<f32>>();
        let magnitude = reference::conv1d_f32(&p, &abs(&x), &abs(&w), Some(&abs(&b))).unwrap();
        let terms = (p.in_channels * p.kernel_size + 1) as f32;
        let tol: Vec<f32> = magnitude
            .iter()
            .map(|m| 2.0 * terms * f32::EPSILON * m)
            .collect();
        for isa in Isa::all_available() {
            let backend = isa.backend();
            let conv = GemmConv::new(&g, isa);
            let got = run_gemm(&conv, &p, &x, &w, Some(&b));
            crate::test_support::assert_close(&got, &want, &tol, &format!("{backend:?}: {p:?}"));
        }
    }
}

/// An epilogue that stores the conv's output transposed, `[B, N, C]`:
/// the identity program through a transposing view, which stores across
/// rows ([`crate::fused::RowSink::prefers_columns`]).
fn transposed_sink<'a>(
    program: &'a crate::fused::CompiledProgram,
    env: &'a dyn crate::fused::Env,
    views: &'a [crate::fused::StoreView],
    p: &Conv1dParams,
    out: &'a mut [f32],
) -> crate::fused::EpilogueSink<'a> {
    use crate::fused::{EpilogueSink, Shape};
    let out_len = p.geometry().unwrap().out_len;
    EpilogueSink::new(
        program,
        env,
        Shape::new(&[p.batch, p.out_channels, out_len]),
        views,
        out,
        Shape::new(&[p.batch, out_len, p.out_channels]),
    )
}

struct NoTensors;

impl crate::fused::Env for NoTensors {
    fn shape(&self, _: usize) -> crate::fused::Shape {
        unreachable!("the identity epilogue loads nothing")
    }
    fn data(&self, _: usize) -> &[f32] {
        unreachable!("the identity epilogue loads nothing")
    }
}

#[test]
fn fused_epilogues_get_the_stored_result() {
    // Through a row sink (ReLU, handed a panel of rows at a time) and a
    // transposing one (whole tiles, stored across rows): exactly the stored
    // result, finished; on 1 and 2 threads, with and without bias.
    use crate::fused::{Expr, Program, RowSink, RowsIn, RowsOut, StoreView};
    use crate::test_support::ReluSink;
    let mut rng = Rng::new(17);
    let mut identity = Program::default();
    identity.push(Expr::Anchor, 0);
    let identity = identity.compile();
    let views = [StoreView {
        map: [Some(0), Some(2), Some(1), None],
        rank: 3,
    }];
    let mut cases = strided_cases(&mut rng);
    cases.push(params(2, (24, 40, 2), 300, 3, 1, (1, 1), 1));
    for p in thinned_under_emulation(cases) {
        let g = p.geometry().unwrap();
        let x = rng.vec(p.input_elems(), -1.0, 1.0);
        let w = rng.vec(p.weight_elems(), -1.0, 1.0);
        let b = rng.vec(p.bias_elems(), -1.0, 1.0);
        let conv = prepare(&p, &w);
        for threads in [1, 2] {
            let pool = rayon::ThreadPoolBuilder::new()
                .num_threads(threads)
                .build()
                .unwrap();
            for bias in [None, Some(&b[..])] {
                let ctx = format!("{threads} threads, bias {}: {p:?}", bias.is_some());
                // Stored: checked against the reference where the shapes
                // test above does not (bias off); then the epilogues get
                // exactly this.
                let stored = pool.install(|| run(&conv, &p, &x, &w, bias));
                if threads == 1 && bias.is_none() {
                    check_output(&p, &x, &w, bias, &stored, &ctx);
                }

                let relu = ReluSink::new(stored.len(), g.out_len);
                let mut transposed = vec![f32::NAN; stored.len()];
                let across = transposed_sink(&identity, &NoTensors, &views, &p, &mut transposed);
                assert!(across.prefers_columns() && !relu.prefers_columns());
                let temps = relu.temporaries().max(across.temporaries());
                let scratch = Scratch::sized(
                    threads,
                    conv.rows_scratch_per_thread(0, temps),
                    conv.shared_scratch(),
                );
                for sink in [&relu as &dyn RowSink, &across] {
                    pool.install(|| {
                        conv.run_rows(
                            &p,
                            RowsIn::Slice(&x),
                            Some(&w),
                            bias,
                            RowsOut::Fused(sink),
                            0,
                            sink.temporaries(),
                            &scratch,
                        )
                    })
                    .unwrap();
                }
                let want: Vec<f32> = stored.iter().map(|v| v.max(0.0)).collect();
                assert_eq!(relu.into_values(), want, "ReLU: {ctx}");
                for bi in 0..p.batch {
                    for o in 0..p.out_channels {
                        for t in 0..g.out_len {
                            let got = transposed[(bi * g.out_len + t) * p.out_channels + o];
                            let want = stored[(bi * p.out_channels + o) * g.out_len + t];
                            assert_eq!(got, want, "transposed ({bi}, {o}, {t}): {ctx}");
                        }
                    }
                }
            }
        }
    }
}

#[test]
fn short_rows_split_channels_and_long_rows_keep_them_whole() {
    // A HiFi-GAN's first residual stage (128 channels, 200 outputs) and a
    // 256-channel layer of 50 outputs have too few chunks for a pool of 16
    // threads: their channels are split into blocks of 16 rows until there
    // are MIN_TILES tiles (blocks of 32 stopped them at 8). Where the chunks
    // already give half the tiles or more and the tiles are small (32
    // channels, 3200 outputs: 14 chunks), the channels stay whole: a split
    // would add a pass filling shared windows for little balance. Large
    // tiles still split (`ragged_ends_join_the_last_chunk`).
    let block = choose_block(Backend::detect(), 128);
    for (c, n) in [(128, 200), (256, 50)] {
        let g = params(1, (c, c, 1), n, 7, 1, (3, 3), 1).geometry().unwrap();
        let t = Tiling::new(&g, block);
        assert!(enough_tiles(&t, block, c), "{c}x{n}: {t:?}");
    }
    let g = params(1, (32, 32, 1), 3200, 7, 1, (3, 3), 1)
        .geometry()
        .unwrap();
    let t = Tiling::new(&g, choose_block(Backend::detect(), 32));
    assert!(2 * t.chunks > MIN_TILES, "{t:?}");
    assert_eq!(t.row_blocks, 1, "{t:?}");
}

#[test]
fn ragged_ends_join_the_last_chunk() {
    // wav2vec2's 512-channel layers at 1 s of audio: outputs 1599 .. 49.
    // No chunk is shorter than a block where there are several, and short
    // rows get channel blocks rather than a chunk of a few outputs.
    let block = choose_block(Backend::detect(), 512);
    for (out_len, k) in [(1599, 3), (799, 3), (399, 3), (199, 3), (99, 2), (49, 2)] {
        let in_len = (out_len - 1) * 2 + k;
        let g = params(1, (512, 512, 1), in_len, k, 2, (0, 0), 1)
            .geometry()
            .unwrap();
        let t = Tiling::new(&g, block);
        let lens: Vec<usize> = (0..t.chunks).map(|c| t.cols(c, out_len).len()).collect();
        assert!(
            t.chunks == 1 || lens.iter().all(|&l| l >= block.cols()),
            "{out_len}: {t:?}"
        );
        assert!(enough_tiles(&t, block, 512), "{out_len}: {t:?}");
    }
}

/// Whether `t` has [`MIN_TILES`] tiles, or blocks of rows no larger than
/// an even split into that many rounded up to `block.mr` (AVX2's 6-row
/// block cuts 256 channels into 15 blocks of 18, 512 into 15 of 36).
fn enough_tiles(t: &Tiling, block: Block, out_per_group: usize) -> bool {
    let even = (out_per_group * t.chunks).div_ceil(MIN_TILES);
    t.chunks * t.row_blocks >= MIN_TILES || t.rows <= even.next_multiple_of(block.mr)
}

/// Values by index for the prologue tests: stored ones with data, virtual
/// ones (computed) with a shape only.
struct Tensors(Vec<(crate::fused::Shape, Vec<f32>)>);

impl crate::fused::Env for Tensors {
    fn shape(&self, value: usize) -> crate::fused::Shape {
        self.0[value].0
    }
    fn data(&self, value: usize) -> &[f32] {
        &self.0[value].1
    }
}

/// Convs whose chunks are split into blocks of rows (short outputs, many
/// output channels), and ones whose are not.
fn split_and_whole_cases() -> Vec<Conv1dParams> {
    vec![
        // wav2vec2's last layers, fewer input channels.
        params(1, (64, 512, 1), 199, 2, 2, (0, 0), 1),
        params(2, (48, 256, 1), 401, 3, 2, (1, 1), 1),
        params(1, (16, 96, 2), 150, 4, 3, (2, 1), 2),
        params(1, (3, 64, 1), 1000, 10, 5, (0, 0), 1),
        // Split, but each tile fills its own window (64 rows, K = 7).
        params(1, (128, 128, 1), 800, 7, 1, (3, 3), 1),
        // Long: whole rows already.
        params(1, (32, 40, 1), 3000, 3, 2, (1, 1), 1),
    ]
}

#[test]
fn wide_pools_fill_their_own_windows_where_a_fill_is_cheap() {
    // (in, out, length, K, stride): whether a chunk's tiles fill their own
    // windows on a wide pool where its rows are split into blocks, and
    // whether some backend's block splits them. Pools of fewer than
    // OWN_WINDOW_THREADS always share.
    let cases = [
        // wav2vec2's 512-channel stride-2 layers, whatever their rows.
        ((512, 512), 1599, 3, 2, false, true),
        ((512, 512), 199, 2, 2, false, true),
        // A HiFi-GAN's first residual stage: blocks of 32 to 48 rows at
        // K = 7.
        ((256, 256), 200, 7, 1, true, true),
        // Pointwise: fewer multiply-adds per window float than its own
        // fill pays for.
        ((512, 512), 200, 1, 1, false, true),
        // Not split into blocks of rows at all.
        ((32, 32), 12800, 3, 1, false, false),
    ];
    for ((cin, cout), n, k, stride, own, split) in cases {
        let p = params(1, (cin, cout, 1), n, k, stride, (k / 2, k / 2), 1);
        let g = p.geometry().unwrap();
        let mut split_somewhere = false;
        for isa in Isa::all_available() {
            let tiling = Tiling::new(&g, choose_block(isa.backend(), g.out_per_group));
            let splits = tiling.row_blocks > 1;
            let ctx = format!("{isa:?} {p:?} {tiling:?}");
            assert_eq!(tiling.fills_own_windows(&g, 16), splits && own, "{ctx}");
            assert!(
                !tiling.fills_own_windows(&g, OWN_WINDOW_THREADS - 1),
                "{ctx}"
            );
            split_somewhere |= splits;
        }
        assert_eq!(split_somewhere, split, "{p:?}");
    }
}

#[test]
fn shared_windows_agree_with_windows_per_tile() {
    // The same calls with and without the shared region: one window per
    // chunk, or one per tile; bit for bit, on 1 and 2 threads and on a
    // pool wide enough for tiles to fill their own beside a shared region.
    let mut rng = Rng::new(23);
    let mut shared_somewhere = false;
    for p in split_and_whole_cases() {
        let g = p.geometry().unwrap();
        let x = rng.vec(p.input_elems(), -1.0, 1.0);
        let w = rng.vec(p.weight_elems(), -1.0, 1.0);
        let b = rng.vec(p.bias_elems(), -1.0, 1.0);
        let conv = GemmConv::new(&g, Isa::detect());
        let split = Tiling::new(&g, conv.kernel.block()).row_blocks > 1;
        assert_eq!(conv.shared_scratch() > 0, split, "{p:?}");
        shared_somewhere |= split;
        for threads in [1, 2, OWN_WINDOW_THREADS] {
            let pool = rayon::ThreadPoolBuilder::new()
                .num_threads(threads)
                .build()
                .unwrap();
            let run_with = |shared: usize| {
                let mut y = vec![f32::NAN; g.output_elems];
                let scratch = Scratch::sized(threads, conv.scratch_per_thread(), shared);
                pool.install(|| conv.run(&g, &x, &w, Some(&b), &mut y, &scratch));
                y
            };
            let per_tile = run_with(0);
            assert_eq!(run_with(conv.shared_scratch()), per_tile, "{p:?}");
            if threads == 1 {
                check_output(&p, &x, &w, Some(&b), &per_tile, &format!("{p:?}"));
            }
        }
    }
    assert!(shared_somewhere);
}

#[test]
fn fused_prologues_get_the_materialised_input() {
    // A prologue computing the input, ReLU(x) from a transposed [B, N, C]
    // tensor (read across channels) or x * x2 from [B, C, N] ones, with
    // windows shared, per tile, or per tile with whole rows (no shared
    // region); a ReLU epilogue or a stored output: exactly the stored
    // conv of the materialised input, on 1, 2 and OWN_WINDOW_THREADS
    // threads.
    use crate::fused::{
        materialise, BinaryOp, Expr, Program, ProgramRows, RowSource, RowsIn, RowsOut, Shape,
        UnaryOp,
    };
    use crate::test_support::ReluSink;
    let mut rng = Rng::new(29);
    let mut cases = split_and_whole_cases();
    cases.push(params(1, (1, 32, 1), 2003, 10, 5, (3, 3), 1));
    cases.push(params(2, (5, 7, 1), 40, 3, 2, (1, 1), 1));
    for p in cases {
        let g = p.geometry().unwrap();
        let (b, c, n) = (p.batch, p.in_channels, p.in_len);
        let dims_nc = [b, n, c];
        let dims_cn = [b, c, n];
        let env = Tensors(vec![
            (Shape::new(&dims_nc), rng.vec(b * n * c, -1.0, 1.0)), // 0: x, [B, N, C]
            (Shape::new(&dims_cn), vec![]),                        // 1: x^T (virtual)
            (Shape::new(&dims_cn), vec![]),                        // 2: relu(x^T) (virtual)
            (Shape::new(&dims_cn), rng.vec(b * c * n, -1.0, 1.0)), // 3: x1, [B, C, N]
            (Shape::new(&dims_cn), rng.vec(b * c * n, -1.0, 1.0)), // 4: x2
        ]);
        let mut transposed = Program::default();
        let l = transposed.push(Expr::Load, 0);
        let v = transposed.push(
            Expr::View {
                x: l,
                map: [Some(0), Some(2), Some(1), None],
            },
            1,
        );
        transposed.push(
            Expr::Unary {
                op: UnaryOp::Relu,
                x: v,
            },
            2,
        );
        let mut product = Program::default();
        let (l1, l2) = (product.push(Expr::Load, 3), product.push(Expr::Load, 4));
        product.push(
            Expr::Binary {
                op: BinaryOp::Mul,
                a: l1,
                b: l2,
            },
            2,
        );
        let w = rng.vec(p.weight_elems(), -1.0, 1.0);
        let bias = rng.vec(p.bias_elems(), -1.0, 1.0);
        let conv = prepare(&p, &w);
        assert!(conv.fuses_input());
        let (transposed, product) = (transposed.compile(), product.compile());
        for program in [&transposed, &product] {
            let source = ProgramRows::new(program, &env);
            let across = std::ptr::eq(program, &transposed) && c > 1;
            assert_eq!(source.prefers_columns(), across, "{p:?}");
            let xt = source.temporaries();
            let mut xm = vec![0.0; p.input_elems()];
            materialise(
                &source,
                &mut xm,
                n,
                &Scratch::new(crate::par::threads(), crate::fused::line_scratch(xt)),
            );
            for threads in [1, 2, OWN_WINDOW_THREADS] {
                let pool = rayon::ThreadPoolBuilder::new()
                    .num_threads(threads)
                    .build()
                    .unwrap();
                let want = pool.install(|| run(&conv, &p, &xm, &w, Some(&bias)));
                let ctx = format!("{threads} threads: {p:?}");
                let per = conv.rows_scratch_per_thread(xt, 0);
                for shared in [conv.shared_scratch(), 0] {
                    let scratch = Scratch::sized(threads, per, shared);
                    let relu = ReluSink::new(want.len(), g.out_len);
                    let mut stored = vec![f32::NAN; want.len()];
                    // With no shared region the call is refused (its
                    // scratch is short) where the conv needs one.
                    let r = pool.install(|| {
                        conv.run_rows(
                            &p,
                            RowsIn::Fused(&source),
                            Some(&w),
                            Some(&bias),
                            RowsOut::Slice(&mut stored),
                            xt,
                            0,
                            &scratch,
                        )
                    });
                    if shared < conv.shared_scratch() {
                        assert!(r.is_err(), "{ctx}");
                        continue;
                    }
                    r.unwrap();
                    assert_eq!(stored, want, "stored, shared {shared}: {ctx}");
                    pool.install(|| {
                        conv.run_rows(
                            &p,
                            RowsIn::Fused(&source),
                            Some(&w),
                            Some(&bias),
                            RowsOut::Fused(&relu),
                            xt,
                            0,
                            &scratch,
                        )
                    })
                    .unwrap();
                    let relu_want: Vec<f32> = want.iter().map(|v| v.max(0.0)).collect();
                    assert_eq!(
                        relu.into_values(),
                        relu_want,
                        "ReLU, shared {shared}: {ctx}"
                    );
                }
                // The kernel itself, without the shared region: each
                // chunk's rows in one block.
                let gemm = GemmConv::new(&g, Isa::detect());
                let mut y = vec![f32::NAN; want.len()];
                let scratch = Scratch::new(threads, gemm.rows_scratch(&g, xt, 0));
                pool.install(|| {
                    gemm.run_rows(
                        &g,
                        RowsIn::Fused(&source),
                        &w,
                        Some(&bias),
                        RowsOut::Slice(&mut y),
                        &scratch,
                    )
                });
                assert_eq!(y, want, "whole rows: {ctx}");
            }
        }
    }
}

/// GFLOP/s of a HiFi-GAN vocoder's residual-block convs (SpeechT5's with
/// 256 initial channels, 50 frames: each stage halves the channels and
/// quadruples the length) on the GEMM and the FFT-GEMM, on each thread
/// count of `GEMM_THREADS` (default `1,2`), with the cost model's choice
/// and estimates (`VOC_SHAPES=C:N,...` for other channel counts and
/// lengths; `K` = 3, 7, 11 at dilations 1, 3, 5; the choice is priced on
/// the test's rayon pool):
/// `GEMM_THREADS=1,4,16 cargo test --release -p rustconv-kernels calibrate_vocoder -- --ignored --nocapture`.
/// The serial fractions of `cost::on_threads` were fitted on SpeechT5's
/// released vocoder: `VOC_SHAPES=256:200,128:800,64:3200,32:12800`.
#[test]
#[ignore]
fn calibrate_vocoder() {
    let threads: Vec<usize> = std::env::var("GEMM_THREADS")
        .unwrap_or_else(|_| "1,2".into())
        .split(',')
        .map(|t| t.parse().unwrap())
        .collect();
    let shapes =
        std::env::var("VOC_SHAPES").unwrap_or_else(|_| "128:200,64:800,32:3200,16:12800".into());
    for (c, n) in shapes.split(',').map(|s| {
        let (c, n) = s.split_once(':').unwrap();
        (c.parse::<usize>().unwrap(), n.parse::<usize>().unwrap())
    }) {
        for (k, d) in [3, 7, 11]
            .into_iter()
            .flat_map(|k| [1, 3, 5].map(|d| (k, d)))
        {
            let pad = d * (k - 1) / 2;
            let p = params(1, (c, c, 1), n, k, 1, (pad, pad), d);
            let g = p.geometry().unwrap();
            let chosen = PreparedConv1d::new(&p, &vec![0.0; p.weight_elems()], Choice::Auto)
                .unwrap()
                .algorithm();
            let mut line = format!("C={c:3} N={n:5} K={k:2} d={d}: auto {:8}", chosen.name());
            for algorithm in [Algorithm::Gemm, Algorithm::FftGemm] {
                if !algorithm.applies(&g, Backend::detect()) {
                    continue;
                }
                let (rates, est) = gflops(&p, algorithm, &threads);
                line += &format!(" | {} (model {:.3} ms)", algorithm.name(), est * 1e3);
                for (t, r) in threads.iter().zip(&rates) {
                    line += &format!(" {t}T {r:6.1}");
                }
            }
            println!("{line}");
        }
    }
}
