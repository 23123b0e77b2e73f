//! An elementwise pass: each materialised result computed by its program,
//! in one pass over memory.

use rustconv_kernels::fused::{line_scratch, materialise, CompiledProgram, ProgramRows};
use rustconv_kernels::KernelError;

use super::call::Call;
use super::kind::StepKind;

#[derive(Debug)]
pub struct PassStep {
    /// Each result and the program computing it.
    results: Vec<(usize, CompiledProgram)>,
}

impl PassStep {
    pub fn new(results: Vec<(usize, CompiledProgram)>) -> Self {
        PassStep { results }
    }
}

impl StepKind for PassStep {
    fn algorithm(&self) -> &'static str {
        "elementwise"
    }

    fn loads(&self) -> Vec<usize> {
        self.results.iter().flat_map(|(_, p)| p.loads()).collect()
    }

    fn scratch_per_thread(&self) -> usize {
        line_scratch(
            self.results
                .iter()
                .map(|(_, p)| p.temporaries())
                .max()
                .unwrap_or(0),
        )
    }

    fn summary(&self) -> String {
        String::new()
    }

    fn run(&self, call: &Call) -> Result<(), KernelError> {
        for (v, program) in &self.results {
            materialise(
                &ProgramRows::new(program, call),
                call.out(*v),
                call.row_len(*v),
                call.scratch,
            );
        }
        Ok(())
    }
}
