//! The fuzz targets' code: each module's `run` takes one fuzz input and must
//! return for every input, without a panic, an abort or undefined behaviour
//! (ASan finds the last under scripts/fuzz.sh). `fuzz_targets/*.rs` hand
//! libFuzzer's inputs to them; `tests/corpus.rs` replays `corpus/<target>/`
//! through them on stable Rust.
//!
//! * [`init`]: a delegate blob, validated and planned (`Delegate::init`)
//!   with every `conv1d_algorithm` option, in place and misaligned, then
//!   called once at its declared bounds if accepted.
//! * [`execute`]: calls of valid plans (`plans/`) with adversarial
//!   arguments: shapes inside and outside the declared bounds, dtypes,
//!   layouts, byte counts, misaligned and overlapping buffers.
//! * [`npz`]: pte_runner's npz reader, and what it reads written back.
//! * [`runner_args`]: pte_runner's command-line parser.

pub mod call_args;
pub mod execute;
pub mod init;
pub mod input;
pub mod npz;
pub mod runner_args;
