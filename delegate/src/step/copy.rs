//! A reshape that splits or merges dimensions (`OpDesc::Regroup`): its
//! stored input copied, in row-major order, into its stored output, in
//! parallel on the call's pool.

use rustconv_kernels::{par, KernelError};

use super::call::Call;
use super::kind::StepKind;

#[derive(Debug)]
pub struct CopyStep {
    input: usize,
    output: usize,
}

impl CopyStep {
    pub fn new(input: usize, output: usize) -> Self {
        CopyStep { input, output }
    }
}

impl StepKind for CopyStep {
    fn algorithm(&self) -> &'static str {
        "copy"
    }

    fn loads(&self) -> Vec<usize> {
        vec![self.input]
    }

    fn scratch_per_thread(&self) -> usize {
        0
    }

    fn summary(&self) -> String {
        String::new()
    }

    fn run(&self, call: &Call) -> Result<(), KernelError> {
        let (from, to) = (call.view(self.input), call.out(self.output));
        // Shape inference gives both the same number of elements; a broken
        // plan is an error, not a panic across the FFI.
        if from.len() != to.len() {
            return Err(KernelError::InvalidParam {
                what: "elements of a reshape's output",
                value: to.len(),
                requirement: "must equal its input's",
            });
        }
        par::copy(to, from);
        Ok(())
    }
}
