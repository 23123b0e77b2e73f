//! Delegate-owned state: a depthwise conv whose left context is a state
//! buffer (`cat([state, x])`, the state updated from the cat's last k - 1
//! steps), fed in pieces, matches the whole sequence; a reset replays it;
//! bad state links are refused at init.

use super::*;

const C: usize = 3;
const KW: usize = 3;
const NMAX: usize = 8;

/// x [1, C, <=8]; xs = cat([state, x]); state <- xs[..., -2:]; y = dwconv(xs)
fn stream_blob(update: i32) -> Vec<u8> {
    build_blob(
        &[
            input("x", 0, &[s(1), s(C as i64), dynamic(NMAX as i64)]),
            state("st", &[1, C as i64, 2], init_state(), update),
            inter("xs", &[s(1), s(C as i64), dynamic(NMAX as i64 + 2)]),
            inter("upd", &[s(1), s(C as i64), s(2)]),
            constant("w", &[C as i64, 1, KW as i64], ramp(C * KW, 0.2)),
            output("y", 0, &[s(1), s(C as i64), dynamic(NMAX as i64)]),
        ],
        &[0],
        &[5],
        &[
            N::Cat {
                inputs: &[1, 0],
                output: 2,
                dim: 2,
            },
            N::Slice {
                input: 2,
                output: 3,
                dim: 2,
                start: -2,
                end: i64::MAX,
            },
            N::Conv {
                input: 2,
                weight: 4,
                bias: -1,
                output: 5,
                stride: 1,
                pad: (0, 0),
                dilation: 1,
                groups: C as u32,
            },
        ],
    )
}

fn init_state() -> Vec<f32> {
    ramp(C * 2, 0.3)
}

/// The conv over the whole sequence with the initial state in front.
fn whole(x: &[f32], n: usize) -> Vec<f32> {
    let w = ramp(C * KW, 0.2);
    let s0 = init_state();
    let mut y = vec![0.0; C * n];
    for c in 0..C {
        let row: Vec<f32> = s0[c * 2..c * 2 + 2]
            .iter()
            .chain(&x[c * n..(c + 1) * n])
            .copied()
            .collect();
        for t in 0..n {
            y[c * n + t] = (0..KW).map(|k| w[c * KW + k] * row[t + k]).sum();
        }
    }
    y
}

fn run_pieces(d: &Delegate, x: &[f32], n: usize, pieces: &[(usize, usize)]) -> Vec<f32> {
    let mut y = vec![0.0; C * n];
    for &(a, b) in pieces {
        let len = b - a;
        let xi: Vec<f32> = (0..C)
            .flat_map(|c| x[c * n + a..c * n + b].to_vec())
            .collect();
        let mut args = Args(vec![
            tensor(&[1, C as i32, len as i32], xi),
            out_tensor(&[1, C as i32, NMAX as i32]),
        ]);
        d.execute(&mut args).unwrap();
        for c in 0..C {
            y[c * n + a..c * n + b].copy_from_slice(&args.0[1].data[c * len..(c + 1) * len]);
        }
    }
    y
}

#[test]
fn state_carries_across_calls_and_resets_to_its_initial_value() {
    let blob = stream_blob(3);
    let d = init(&blob).unwrap();
    let plan = d.plan().unwrap();
    assert_eq!(plan.states.len(), 1);
    assert_eq!(plan.locations[1], Location::State(0));
    // The update is written into the state buffer's other half, not the
    // arena: no copy at the end of a call, the halves trade places.
    assert!(plan.states[0].swaps);
    assert_eq!(plan.locations[3], Location::NextState(0));
    assert_eq!(plan.state_bytes(), 2 * 4 * plan.state_init.len());
    assert_eq!(plan.state_init, init_state());
    let n = 9;
    let x = ramp(C * n, 0.1);
    let want = whole(&x, n);
    // A prefill of 5, then one token at a time (shorter than the state).
    let pieces = [(0, 5), (5, 6), (6, 7), (7, 8), (8, 9)];
    assert_close(&run_pieces(&d, &x, n, &pieces), &want);
    // Carried on: the same calls now see the last state, not the first.
    let again = run_pieces(&d, &x, n, &pieces);
    assert!(again.iter().zip(&want).any(|(a, b)| (a - b).abs() > 1e-3));
    crate::state::request_reset();
    assert_close(&run_pieces(&d, &x, n, &pieces), &want);
    // Two tokens, then a prefill longer than the state.
    crate::state::request_reset();
    assert_close(&run_pieces(&d, &x, n, &[(0, 1), (1, 2), (2, 9)]), &want);
}

#[test]
fn bad_state_links_are_invalid_programs() {
    for update in [-1, 0, 5, 42] {
        // no update, an input, an output, out of range
        let blob = stream_blob(update);
        let err = init(&blob).err().expect("refused");
        assert_eq!(
            err.status(),
            crate::host::Status::InvalidProgram,
            "{update}: {err}"
        );
    }
}
