//! A reshape that splits or merges dimensions (`OpDesc::Regroup`): its
//! stored input copied, in row-major order, into its stored output.

use rustconv_kernels::KernelError;

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
        // Shape inference gave both the same number of elements.
        call.out(self.output).copy_from_slice(call.view(self.input));
        Ok(())
    }
}
