//! Target `init`: a delegate blob through `Delegate::init` (framing, graph,
//! fused kernels, plan, kernel preparation, constants), then, if accepted,
//! one call at its declared bounds.
//!
//! Input: an option byte (the `conv1d_algorithm` compile spec, see
//! [`algorithm_spec`]), a placement byte (below 0x80 the blob starts 64-byte
//! aligned, so its constants are used in place; from 0x80 it starts 1 to 63
//! bytes past that, so they are copied), then the blob.

use rustconv_backend::blob::{BlobBytes, BlobLayout, CONSTANT_ALIGNMENT};
use rustconv_backend::graph::GraphDesc;
use rustconv_backend::memory::AlignedBuf;
use rustconv_backend::Delegate;
use rustconv_kernels::Algorithm;

use crate::call_args::HostArgs;
use crate::input::Input;

pub fn run(data: &[u8]) {
    accepted(data);
}

/// [`run`], saying whether init accepted the blob.
pub fn accepted(data: &[u8]) -> bool {
    let mut input = Input::new(data);
    let option = input.byte();
    let place = input.byte();
    let blob = input.rest();
    let offset = if place < 0x80 {
        0
    } else {
        1 + usize::from(place) % (CONSTANT_ALIGNMENT - 1)
    };
    let mut buf = AlignedBuf::zeroed(offset + blob.len());
    buf.as_mut_slice()[offset..].copy_from_slice(blob);
    // Declared after `buf`, so dropped before it.
    let mut delegate = Delegate::default();
    // One thread: the fuzzer's job is one core.
    delegate.add_compile_spec("num_threads", &1u32.to_le_bytes());
    if let Some(spec) = algorithm_spec(option) {
        delegate.add_compile_spec("conv1d_algorithm", spec.as_bytes());
    }
    // SAFETY: `buf` is not written after this and outlives `delegate`
    // (declared before it), the only holder of the bytes.
    let bytes = unsafe { BlobBytes::new(buf.as_ptr().add(offset), blob.len()) };
    if delegate.init(bytes).is_err() {
        return false;
    }
    // Accepted: what init validated decodes again, and a call at the bounds
    // the blob declares runs or fails with an error.
    let layout = BlobLayout::parse(blob).expect("init accepted the framing");
    let graph = GraphDesc::decode(blob, &layout).expect("init accepted the graph");
    let mut args = HostArgs::at_bounds(&graph);
    let _ = delegate.execute(&mut args);
    true
}

/// The `conv1d_algorithm` spec option `choice` selects: none, `auto`,
/// `measure`, each algorithm forced, and a name no algorithm has.
pub fn algorithm_spec(choice: u8) -> Option<String> {
    let names = Algorithm::ALL.map(|a| a.name().to_owned());
    let options = ["auto", "measure"]
        .into_iter()
        .map(String::from)
        .chain(names)
        .chain(["no_such_algorithm".to_owned()]);
    let options: Vec<String> = options.collect();
    match usize::from(choice) % (options.len() + 1) {
        0 => None,
        i => Some(options[i - 1].clone()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_algorithm_option_has_a_byte() {
        let specs: Vec<_> = (0..=u8::MAX).map(algorithm_spec).collect();
        assert_eq!(specs[0], None);
        for option in ["auto", "measure", "direct", "no_such_algorithm"] {
            assert!(specs.contains(&Some(option.to_owned())), "{option}");
        }
        for a in Algorithm::ALL {
            assert!(specs.contains(&Some(a.name().to_owned())), "{a:?}");
        }
    }
}
