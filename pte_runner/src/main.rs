//! pte_runner: runs a `.pte` with RustConvBackend, XNNPACK, ExecuTorch's
//! optimized CPU kernels and the `rustconv::linear_scan.out` kernel (for scans
//! no delegate took) linked in, and ExecuTorch's LLM custom ops loaded when a
//! program needs them (kernel_libs.rs), times it, and optionally writes the
//! outputs (npz) and an ETDump trace for `executorch.devtools.Inspector`.
//!
//! Any failure exits non-zero with one line on stderr.

mod stats;

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::{Duration, Instant};

use rand::{rngs::SmallRng, Rng, SeedableRng};

use rustconv_pte_runner::args::{self, Args};
use rustconv_pte_runner::ffi::bridge as et;
use rustconv_pte_runner::kernel_libs::{self, LlmOps};
use rustconv_pte_runner::npz::{self, Array, ElemType};

fn main() -> ExitCode {
    match run(std::env::args().skip(1)) {
        Ok(()) => ExitCode::SUCCESS,
        Err(message) => {
            eprintln!("pte_runner: error: {message}");
            ExitCode::FAILURE
        }
    }
}

fn run(argv: impl IntoIterator<Item = String>) -> Result<(), String> {
    let args = args::parse(argv)?;
    if args.help {
        println!("{}", args::USAGE);
        return Ok(());
    }
    // Registers RustConvBackend and the `rustconv::linear_scan.out` kernel
    // that runs scans left outside any delegate (delegate/cpp/scan_kernel.cpp).
    // False also when ExecuTorch refused a registration because another copy
    // of this code got there first (librustconv_backend.so, preloaded): then
    // that copy's backend and kernel serve, so what is checked is that both
    // are registered.
    let registered_here = rustconv_backend::register();
    let failed_here = if registered_here {
        ""
    } else {
        "; registering it failed, see the log above"
    };
    let backends = et::registered_backends();
    for needed in ["RustConvBackend", "XnnpackBackend"] {
        if !backends.iter().any(|b| b == needed) {
            return Err(format!(
                "{needed} is not registered (have: {backends:?}){failed_here}"
            ));
        }
    }
    if !rustconv_backend::linear_scan_kernel_registered() {
        return Err(format!(
            "the rustconv::linear_scan.out kernel is not registered{failed_here}"
        ));
    }
    if !args.model_path.is_file() {
        return Err(format!(
            "model file {} does not exist",
            args.model_path.display()
        ));
    }
    kernel_libs::load_user_libraries(&args.kernel_libs)?;
    if args.llm_ops == LlmOps::On {
        kernel_libs::load_llm_ops()?;
    }
    if let Some(n) = args.num_threads {
        et::set_num_threads(n).map_err(|e| e.what().to_owned())?;
    }
    if let Some(n) = args.rustconv_threads {
        et::set_rustconv_threads(n).map_err(|e| e.what().to_owned())?;
    }
    let model = args
        .model_path
        .to_str()
        .ok_or("model path is not valid UTF-8")?;
    // Inputs are read before the high-water mark is reset, so the peak memory
    // reported is what running the model adds to the caller's inputs: the
    // program, its planned memory, delegate state and scratch.
    let npz_arrays = match &args.inputs_npz_path {
        Some(path) => Some((path, npz::read_all(path)?)),
        None => None,
    };
    let mut step_files: Vec<(PathBuf, std::collections::HashMap<usize, Array>)> = Vec::new();
    for path in &args.steps_npz_paths {
        if !step_files.iter().any(|(p, _)| p == path) {
            step_files.push((path.clone(), npz::read_all(path)?));
        }
    }
    let mut baseline = stats::reset_peak_rss();
    // Declared before `session`, so dropped after it: the session reads these
    // bytes in place (see `set_input`).
    #[expect(
        clippy::needless_late_init,
        reason = "declared here for its drop order"
    )]
    let inputs: Vec<Array>;
    let open = || {
        et::open_session(
            model,
            &args.method,
            args.etdump_path.is_some(),
            args.minimal_verification,
        )
    };
    let mut session = match open() {
        Ok(session) => session,
        Err(e) if args.llm_ops == LlmOps::Auto && e.what().contains("Error::OperatorMissing") => {
            // ExecuTorch logged the missing operators above. If loading the
            // LLM custom ops adds none (they were there), the error stands.
            let Some(library) =
                kernel_libs::load_llm_ops().map_err(|why| format!("{} (and {why})", e.what()))?
            else {
                return Err(e.what().to_owned());
            };
            eprintln!(
                "pte_runner: loaded ExecuTorch's LLM custom ops from {} for the missing \
                 operator(s); loading the method again",
                library.display()
            );
            // The libraries' memory is not the program's.
            baseline = stats::reset_peak_rss();
            open().map_err(|e| e.what().to_owned())?
        }
        Err(e) => return Err(e.what().to_owned()),
    };
    if !args.steps_npz_paths.is_empty() {
        // The calls' inputs, one set per distinct file, alive as long as the
        // session (set_input reads them in place).
        let sets: Vec<(PathBuf, Vec<Array>)> = step_files
            .into_iter()
            .map(|(path, arrays)| {
                let inputs = npz::select_inputs(arrays, &path, session.num_inputs())?;
                Ok((path, inputs))
            })
            .collect::<Result<_, String>>()?;
        return run_sequence(&mut session, &args, &sets, baseline);
    }
    inputs = match npz_arrays {
        Some((path, arrays)) => npz::select_inputs(arrays, path, session.num_inputs())?,
        None => random_inputs(&session, args.seed)?,
    };
    for (i, array) in inputs.iter().enumerate() {
        let expected = session.input_info(i).map_err(|e| e.what().to_owned())?;
        if expected.dtype != array.dtype.scalar_type() {
            return Err(format!(
                "input {i} is {:?} but the method expects {:?}",
                array.dtype,
                ElemType::from_scalar_type(expected.dtype)
            ));
        }
        let sizes: Vec<i32> = array.shape.iter().map(|&d| d as i32).collect();
        // SAFETY: `inputs` is never modified after this loop and is dropped
        // after `session` (declared before it).
        unsafe {
            session
                .pin_mut()
                .set_input(i, array.dtype.scalar_type(), &sizes, &array.data)
        }
        .map_err(|e| format!("input {i} with shape {:?}: {}", array.shape, e.what()))?;
    }

    let times = time_iterations(&mut session, &args)?;
    println!(
        "pte_runner: {} '{}': {} iteration(s), {} thread(s)",
        args.model_path.display(),
        args.method,
        args.iter,
        args.num_threads
            .map_or("default".to_owned(), |n| n.to_string())
    );
    println!("latency: {}", stats::summarize(&times));
    if let Some(kib) = stats::peak_rss_kib() {
        println!(
            "peak memory: {:.1} MiB above the inputs",
            kib.saturating_sub(baseline.unwrap_or(0)) as f64 / 1024.0
        );
    }

    let outputs = read_outputs(&session)?;
    for (i, out) in outputs.iter().enumerate() {
        println!("output {i}: {:?} {:?}", out.dtype, out.shape);
    }
    if let Some(path) = &args.output_npz_path {
        npz::write_outputs(path, &outputs)?;
    }
    write_etdump(&mut session, &args)
}

/// Streaming: every iteration runs the calls of `-steps_npz_paths` in order,
/// the model's state carried between them; times per call position.
fn run_sequence(
    session: &mut cxx::UniquePtr<et::Session>,
    args: &Args,
    sets: &[(PathBuf, Vec<Array>)],
    baseline: Option<u64>,
) -> Result<(), String> {
    let calls: Vec<&[Array]> = args
        .steps_npz_paths
        .iter()
        .map(|p| {
            let (_, inputs) = sets.iter().find(|(q, _)| q == p).expect("read above");
            inputs.as_slice()
        })
        .collect();
    let mut times = vec![Vec::with_capacity(args.iter); calls.len()];
    let mut outputs = Vec::new();
    for i in 0..args.warmup + args.iter {
        if i > 0 && args.reset_state {
            et::reset_state().map_err(|e| e.what().to_owned())?;
        }
        let last = i + 1 == args.warmup + args.iter;
        for (k, inputs) in calls.iter().enumerate() {
            set_inputs(session, inputs)?;
            let start = Instant::now();
            session
                .pin_mut()
                .execute()
                .map_err(|e| format!("call {k}: {}", e.what()))?;
            if i >= args.warmup {
                times[k].push(start.elapsed());
            }
            if last && args.output_npz_path.is_some() {
                outputs.push(read_outputs(session)?);
            }
        }
    }
    println!(
        "pte_runner: {} '{}': {} iteration(s) of {} call(s), {} thread(s)",
        args.model_path.display(),
        args.method,
        args.iter,
        calls.len(),
        args.num_threads
            .map_or("default".to_owned(), |n| n.to_string())
    );
    // "latency:" is the decode steps' (every call after the first), the
    // line the benchmark reads; the first call (the prefill) apart.
    let decode: Vec<Duration> = times[1..].iter().flatten().copied().collect();
    let steady = if decode.is_empty() {
        &times[0]
    } else {
        &decode
    };
    println!("latency: {}", stats::summarize(steady));
    println!("first call latency: {}", stats::summarize(&times[0]));
    if let Some(kib) = stats::peak_rss_kib() {
        println!(
            "peak memory: {:.1} MiB above the inputs",
            kib.saturating_sub(baseline.unwrap_or(0)) as f64 / 1024.0
        );
    }
    if let Some(path) = &args.output_npz_path {
        for (k, out) in outputs.iter().enumerate() {
            npz::write_outputs(&step_path(path, k), out)?;
        }
    }
    write_etdump(session, args)
}

/// The ETDump of every execute so far (warm-ups included), if asked for.
fn write_etdump(session: &mut cxx::UniquePtr<et::Session>, args: &Args) -> Result<(), String> {
    if let Some(path) = &args.etdump_path {
        let path = path.to_str().ok_or("ETDump path is not valid UTF-8")?;
        session
            .pin_mut()
            .write_etdump(path)
            .map_err(|e| e.what().to_owned())?;
    }
    Ok(())
}

/// `out.npz` -> `out.3.npz` for call 3.
fn step_path(path: &std::path::Path, k: usize) -> PathBuf {
    let stem = path.file_stem().and_then(|s| s.to_str()).unwrap_or("out");
    path.with_file_name(format!("{stem}.{k}.npz"))
}

fn set_inputs(session: &mut cxx::UniquePtr<et::Session>, inputs: &[Array]) -> Result<(), String> {
    for (i, array) in inputs.iter().enumerate() {
        let sizes: Vec<i32> = array.shape.iter().map(|&d| d as i32).collect();
        // SAFETY: the input sets (`sets` in `run`) are never modified and
        // outlive every execute of the session: `run` returns right after
        // the sequence, and dropping the session reads no input.
        unsafe {
            session
                .pin_mut()
                .set_input(i, array.dtype.scalar_type(), &sizes, &array.data)
        }
        .map_err(|e| format!("input {i} with shape {:?}: {}", array.shape, e.what()))?;
    }
    Ok(())
}

fn time_iterations(
    session: &mut cxx::UniquePtr<et::Session>,
    args: &Args,
) -> Result<Vec<Duration>, String> {
    let mut times = Vec::with_capacity(args.iter);
    for i in 0..args.warmup + args.iter {
        // Untimed: the memory plan may have reused input buffers last time.
        session
            .pin_mut()
            .reload_inputs()
            .map_err(|e| e.what().to_owned())?;
        let start = Instant::now();
        session
            .pin_mut()
            .execute()
            .map_err(|e| e.what().to_owned())?;
        if i >= args.warmup {
            times.push(start.elapsed());
        }
    }
    Ok(times)
}

/// Uniform in [-1, 1) for floats, small non-negative values for integers (0
/// to 4), of the shapes the method declares (the upper bounds for dynamic
/// dimensions).
fn random_inputs(session: &et::Session, seed: u64) -> Result<Vec<Array>, String> {
    let mut rng = SmallRng::seed_from_u64(seed);
    (0..session.num_inputs())
        .map(|i| {
            let info = session.input_info(i).map_err(|e| e.what().to_owned())?;
            let dtype = ElemType::from_scalar_type(info.dtype).ok_or_else(|| {
                format!(
                    "input {i} has ScalarType {}, unsupported for random inputs",
                    info.dtype
                )
            })?;
            random_array(dtype, &info.sizes, &mut rng).map_err(|e| format!("input {i}: {e}"))
        })
        .collect()
}

/// An array of `sizes`, which come from the program: checked, and its
/// buffer reserved fallibly, so corrupt sizes are an error, not an abort.
/// (ExecuTorch refuses the corrupt sizes tried so far when it loads the
/// method; this does not rely on it.)
fn random_array(dtype: ElemType, sizes: &[i32], rng: &mut SmallRng) -> Result<Array, String> {
    let bad_sizes = || format!("sizes {sizes:?} do not make an array");
    let shape = sizes
        .iter()
        .map(|&d| usize::try_from(d))
        .collect::<Result<Vec<usize>, _>>()
        .map_err(|_| bad_sizes())?;
    let numel = shape
        .iter()
        .try_fold(1usize, |n, &d| n.checked_mul(d))
        .ok_or_else(bad_sizes)?;
    let bytes = numel.checked_mul(dtype.size()).ok_or_else(bad_sizes)?;
    let mut data = Vec::new();
    data.try_reserve_exact(bytes)
        .map_err(|e| format!("sizes {sizes:?}: cannot allocate {bytes} bytes: {e}"))?;
    for _ in 0..numel {
        let x: f64 = rng.gen_range(-1.0..1.0);
        match dtype {
            ElemType::F32 => data.extend_from_slice(&(x as f32).to_le_bytes()),
            ElemType::F64 => data.extend_from_slice(&x.to_le_bytes()),
            ElemType::F16 => data.extend_from_slice(&half::f16::from_f64(x).to_le_bytes()),
            ElemType::Bool => data.push((x > 0.0) as u8),
            // Non-negative: integer inputs are mostly indices
            // (token ids, positions), and a negative one is refused.
            int => {
                let v = (x.abs() * 4.0).round() as i64;
                data.extend_from_slice(&v.to_le_bytes()[..int.size()]);
            }
        }
    }
    Ok(Array { dtype, shape, data })
}

fn read_outputs(session: &et::Session) -> Result<Vec<Array>, String> {
    (0..session.num_outputs())
        .map(|i| {
            let info = session.output_info(i).map_err(|e| e.what().to_owned())?;
            let dtype = ElemType::from_scalar_type(info.dtype)
                .ok_or_else(|| format!("output {i} has unsupported ScalarType {}", info.dtype))?;
            let data = session
                .output_data(i)
                .map_err(|e| e.what().to_owned())?
                .to_vec();
            Ok(Array {
                dtype,
                shape: info.sizes.iter().map(|&d| d as usize).collect(),
                data,
            })
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn random_arrays_refuse_sizes_that_make_no_array() {
        let mut rng = SmallRng::seed_from_u64(0);
        let a = random_array(ElemType::I64, &[2, 3], &mut rng).unwrap();
        assert_eq!((a.shape, a.data.len()), (vec![2, 3], 48));
        for sizes in [&[-1, 4][..], &[i32::MAX, i32::MAX, i32::MAX]] {
            let err = random_array(ElemType::F32, sizes, &mut rng).unwrap_err();
            assert!(err.contains("do not make an array"), "{err}");
        }
        // Representable but not allocatable: an error, not an abort.
        let err = random_array(ElemType::F64, &[i32::MAX, 1 << 20], &mut rng).unwrap_err();
        assert!(err.contains("cannot allocate"), "{err}");
    }
}
