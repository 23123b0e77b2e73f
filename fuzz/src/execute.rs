//! Target `execute`: calls of valid plans with adversarial arguments.
//!
//! Input: a plan byte (an index into [`PLANS`]; others are skipped), a
//! count byte (1 to 3 calls, the plan's state carried from one to the next),
//! then each call's arguments (`HostArgs::adversarial`). Every call must
//! succeed or fail with an error; a call that succeeds on a plan without
//! state is made again with the same arguments and must write the same
//! bytes (nothing read from memory the call did not write).

use std::cell::RefCell;

use rustconv_backend::blob::{BlobBytes, BlobLayout};
use rustconv_backend::graph::{GraphDesc, Role};
use rustconv_backend::memory::AlignedBuf;
use rustconv_backend::{state, Delegate};

use crate::call_args::HostArgs;
use crate::input::Input;

/// The plans, written by scripts/fuzz_seeds.py (its `PLANS`, in the same
/// order): append only, as inputs name a plan by its index.
pub const PLANS: [&[u8]; 9] = [
    include_bytes!("../plans/v1_causal_conv_scan.blob"),
    include_bytes!("../plans/difftest_0.blob"),
    include_bytes!("../plans/difftest_2_0.blob"),
    include_bytes!("../plans/difftest_2_1.blob"),
    include_bytes!("../plans/difftest_3.blob"),
    include_bytes!("../plans/difftest_5.blob"),
    include_bytes!("../plans/difftest_10.blob"),
    include_bytes!("../plans/difftest_15_0.blob"),
    include_bytes!("../plans/difftest_15_1.blob"),
];

/// A plan initialised once per thread and reused by every input.
struct Loaded {
    // Fields drop in order: the delegate before the blob it may read.
    delegate: Delegate,
    graph: GraphDesc,
    stateful: bool,
    _blob: AlignedBuf,
}

impl Loaded {
    fn new(plan: &[u8]) -> Self {
        let layout = BlobLayout::parse(plan).expect("a plan of PLANS frames");
        let graph = GraphDesc::decode(plan, &layout).expect("a plan of PLANS decodes");
        let stateful = graph
            .values
            .iter()
            .any(|v| matches!(v.role, Role::State { .. }));
        // Aligned, so the constants are read in place as ExecuTorch's
        // aligned segments are.
        let blob = AlignedBuf::from_bytes(plan);
        let mut delegate = Delegate::default();
        delegate.add_compile_spec("num_threads", &1u32.to_le_bytes());
        // SAFETY: `blob` is never written and is dropped after `delegate`
        // (declared after it in `Loaded`); moving the buffer moves no bytes.
        let bytes = unsafe { BlobBytes::new(blob.as_ptr(), blob.len()) };
        delegate.init(bytes).expect("a plan of PLANS initialises");
        Loaded {
            delegate,
            graph,
            stateful,
            _blob: blob,
        }
    }
}

thread_local! {
    static LOADED: RefCell<Vec<Option<Loaded>>> = RefCell::new(PLANS.map(|_| None).into());
}

pub fn run(data: &[u8]) {
    let mut input = Input::new(data);
    let index = usize::from(input.byte());
    let Some(blob) = PLANS.get(index) else {
        return;
    };
    let calls = 1 + input.byte() % 3;
    LOADED.with_borrow_mut(|loaded| {
        let plan = loaded[index].get_or_insert_with(|| Loaded::new(blob));
        // Every input starts from the initial state, so it replays alone.
        state::request_reset();
        for _ in 0..calls {
            let mut args = HostArgs::adversarial(&plan.graph, &mut input);
            if plan.delegate.execute(&mut args).is_ok() && !plan.stateful {
                let first = args.outputs();
                plan.delegate
                    .execute(&mut args)
                    .expect("the same call succeeds again");
                assert!(
                    args.outputs() == first,
                    "the same call wrote different outputs"
                );
            }
        }
    });
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_plan_runs_at_its_bounds_and_as_an_empty_input_declares() {
        for (i, blob) in PLANS.iter().enumerate() {
            let plan = Loaded::new(blob);
            let mut args = HostArgs::at_bounds(&plan.graph);
            plan.delegate.execute(&mut args).unwrap();
            let mut args = HostArgs::adversarial(&plan.graph, &mut Input::new(&[]));
            plan.delegate.execute(&mut args).unwrap();
            assert!(!args.outputs().is_empty(), "plan {i}");
        }
    }

    #[test]
    fn wrong_arguments_are_refused() {
        let plan = Loaded::new(PLANS[0]);
        // Flags: the last argument dropped; one added; the first output
        // inside the first input; resizes refused.
        for flags in [1, 2, 4, 8] {
            let mut args = HostArgs::adversarial(&plan.graph, &mut Input::new(&[flags]));
            assert!(plan.delegate.execute(&mut args).is_err(), "flags {flags}");
        }
        // The first input: another dtype, unsupported, not a tensor, not
        // contiguous, misaligned, a byte short, rank 0, a size over its bound.
        for kind in [
            &[1][..],
            &[2],
            &[3],
            &[4],
            &[8],
            &[16],
            &[32, 0],
            &[0, 0x80],
        ] {
            let data: Vec<u8> = [0].iter().chain(kind).copied().collect();
            let mut args = HostArgs::adversarial(&plan.graph, &mut Input::new(&data));
            assert!(plan.delegate.execute(&mut args).is_err(), "{kind:?}");
        }
    }
}
