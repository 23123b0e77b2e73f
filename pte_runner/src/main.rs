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

use rustconv_pte_runner::args::{self, Args};
use rustconv_pte_runner::concurrent;
use rustconv_pte_runner::ffi::bridge as et;
use rustconv_pte_runner::kernel_libs::{self, LlmOps};
use rustconv_pte_runner::npz::{self, Array};
use rustconv_pte_runner::tensors::{self, random_inputs, read_outputs};

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
    if let Some(iterations) = args.concurrent {
        let report = concurrent::run(&args, iterations)?;
        println!("{}", concurrent::describe(&args, &report));
        return match report.mismatches() {
            0 => Ok(()),
            n => Err(format!("{n} output(s) differ from the single-threaded run")),
        };
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
        let program = et::open_program(model, args.minimal_verification)?;
        et::load_method(&program, &args.method, args.etdump_path.is_some())
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
    if args.reset_state {
        session.pin_mut().keep_initial_memory();
    }
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
    // SAFETY: `inputs` is never modified after this and is dropped after
    // `session` (declared before it).
    unsafe { tensors::bind_inputs(&mut session, &inputs) }?;

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
    let mut times = (0..calls.len())
        .map(|_| iteration_times(args.iter))
        .collect::<Result<Vec<_>, _>>()?;
    let mut outputs = Vec::new();
    let mut check = OutputCheck::new(args, calls.len());
    for i in 0..args.warmup + args.iter {
        if i > 0 && args.reset_state {
            reset_state(session)?;
        }
        let last = i + 1 == args.warmup + args.iter;
        for (k, inputs) in calls.iter().enumerate() {
            // SAFETY: the input sets (`sets` in `run`) are never modified
            // and outlive every execute of the session: `run` returns right
            // after the sequence, and dropping the session reads no input.
            unsafe { tensors::bind_inputs(session, inputs) }?;
            let start = Instant::now();
            session
                .pin_mut()
                .execute()
                .map_err(|e| format!("call {k}: {}", e.what()))?;
            if i >= args.warmup {
                times[k][i - args.warmup] = start.elapsed();
            }
            if last && args.output_npz_path.is_some() {
                outputs.push(read_outputs(session)?);
            }
            check.check(session, i, k)?;
        }
    }
    check.report();
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

/// `-reset_state`: RustConv's delegate-owned state restarts at its next
/// call (the backend option), and ExecuTorch's own (mutable buffers in
/// planned memory, which XNNPACK and the portable kernels update) is put
/// back as the method loaded it.
fn reset_state(session: &mut cxx::UniquePtr<et::Session>) -> Result<(), String> {
    et::reset_state().map_err(|e| e.what().to_owned())?;
    session
        .pin_mut()
        .restore_initial_memory()
        .map_err(|e| e.what().to_owned())
}

fn time_iterations(
    session: &mut cxx::UniquePtr<et::Session>,
    args: &Args,
) -> Result<Vec<Duration>, String> {
    let mut times = iteration_times(args.iter)?;
    let mut check = OutputCheck::new(args, 1);
    for i in 0..args.warmup + args.iter {
        if i > 0 && args.reset_state {
            reset_state(session)?;
        }
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
            times[i - args.warmup] = start.elapsed();
        }
        check.check(session, i, 0)?;
    }
    check.report();
    Ok(times)
}

/// Room for `n` iterations' times, every page written now: a vector filled
/// as the iterations go touches new pages as it grows, which made a long
/// run's resident memory climb 16 bytes an iteration (scripts/soak.py took it
/// for a leak). Reserved fallibly: a huge `-iter` is an error, not an abort.
fn iteration_times(n: usize) -> Result<Vec<Duration>, String> {
    let mut times = Vec::new();
    times
        .try_reserve_exact(n)
        .map_err(|e| format!("cannot keep the times of {n} iterations: {e}"))?;
    times.resize(n, Duration::ZERO);
    Ok(times)
}

/// `-check_outputs`: every iteration's outputs (of each call position)
/// against the first iteration's, bit for bit.
struct OutputCheck {
    first: Option<Vec<Option<Vec<Array>>>>,
    iterations: usize,
}

impl OutputCheck {
    fn new(args: &Args, calls: usize) -> Self {
        OutputCheck {
            first: args.check_outputs.then(|| vec![None; calls]),
            iterations: 0,
        }
    }

    fn check(
        &mut self,
        session: &et::Session,
        iteration: usize,
        call: usize,
    ) -> Result<(), String> {
        let Some(first) = &mut self.first else {
            return Ok(());
        };
        match &first[call] {
            None => first[call] = Some(read_outputs(session)?),
            Some(want) => {
                if !tensors::outputs_equal(session, want)? {
                    return Err(format!(
                        "-check_outputs: iteration {iteration} (call {call}) gave other outputs \
                         than the first iteration"
                    ));
                }
            }
        }
        if call == 0 {
            self.iterations += 1;
        }
        Ok(())
    }

    fn report(&self) {
        if self.first.is_some() {
            println!(
                "outputs checked: {} iteration(s), warm-ups included, all equal to the first",
                self.iterations
            );
        }
    }
}
