//! Command-line flags, in the style of ExecuTorch's executor_runner (gflags):
//! `-flag value`, `-flag=value`, and the same with a double dash.

use std::path::PathBuf;

use rustconv_backend::threads::MAX_THREADS_PER_CORE;

use crate::kernel_libs::LlmOps;

pub const USAGE: &str = "\
usage: pte_runner -model_path FILE [options]

  -model_path FILE        the .pte to run (required)
  -method NAME            method to run (default: forward); with -concurrent,
                          a list A,B,.. (a name twice: two loads of it)
  -inputs_npz_path FILE   inputs as arrays named \"0\", \"1\", ... in input order;
                          without it, random inputs of the method's shapes
  -iter N                 timed iterations (default: 1)
  -warmup N               untimed iterations before them (default: 0)
  -etdump_path FILE       write an ETDump with one Method::execute event per iteration
  -output_npz_path FILE   write the outputs of the last iteration
  -num_threads N          threads for RustConvBackend, XNNPACK and the CPU kernels
                          (at most 8 per core this machine has)
  -rustconv_threads N     threads for RustConvBackend alone (after -num_threads),
                          e.g. to compare its pool's size at XNNPACK's fixed
  -minimal_verification   check only the program's header at load, not the
                          whole flatbuffer (ExecuTorch's InternalConsistency,
                          the default): faster loads of trusted programs;
                          a corrupt one may then crash the runner
  -seed N                 seed for random inputs (default: 0)
  -steps_npz_paths A,B,.. a streaming sequence: each iteration runs the method
                          once per file, in order (inputs named as for
                          -inputs_npz_path), the model's state carried from call
                          to call (a prefill, then decode steps); latency is
                          reported per call position; -output_npz_path writes
                          call k's outputs to FILE with .k before .npz
  -decode_steps N         repeat the last of -steps_npz_paths until there are
                          N + 1 calls per iteration (a prefill and N decode steps)
  -reset_state            before every iteration but the first, reset
                          RustConv's delegate-owned state (the backend option
                          reset_state) and put ExecuTorch's planned memory (its
                          mutable buffers) back as loaded, so each iteration
                          replays the call or the sequence from the start
  -check_outputs          fail unless every iteration's outputs equal the first's
                          bit for bit (with -steps_npz_paths, call k's those of
                          the first iteration's call k): a method without state,
                          or any with -reset_state
  -concurrent N           run each method of -method (A,B,.. ; a name twice is two
                          loads of it) N times on its own thread, all at once,
                          with random inputs (-seed plus its position), and fail
                          unless every iteration's outputs equal those of a
                          single-threaded run of the same loads, bit for bit
  -reset_concurrently     with -concurrent: another thread sets the backend option
                          reset_state at random moments meanwhile; each iteration
                          must then give the single-threaded run's next outputs
                          or its first (the state restarted)
  -kernel_lib A,B,..      shared libraries to load before the program, whose
                          static initialisers register ExecuTorch kernels
                          (a model's own custom operators)
  -llm_ops auto|on|off    ExecuTorch's LLM custom ops (llama::custom_sdpa.out,
                          update_cache.out, ...) that its LLM recipes' programs
                          call, from the executorch wheel's
                          libcustom_ops_aot_lib.so (which brings libtorch and
                          a shared libpython: about a second): auto (default)
                          loads them when the method fails to load for a
                          missing operator, then loads it again; on, before
                          the program; off, never
  -help                   show this text";

#[derive(Debug, Default, PartialEq)]
pub struct Args {
    pub model_path: PathBuf,
    pub method: String,
    pub inputs_npz_path: Option<PathBuf>,
    pub iter: usize,
    pub warmup: usize,
    pub etdump_path: Option<PathBuf>,
    pub output_npz_path: Option<PathBuf>,
    pub num_threads: Option<u32>,
    pub rustconv_threads: Option<u32>,
    pub seed: u64,
    pub steps_npz_paths: Vec<PathBuf>,
    pub decode_steps: Option<usize>,
    pub reset_state: bool,
    pub check_outputs: bool,
    pub concurrent: Option<usize>,
    pub reset_concurrently: bool,
    pub minimal_verification: bool,
    pub kernel_libs: Vec<PathBuf>,
    pub llm_ops: LlmOps,
    pub help: bool,
}

pub fn parse(argv: impl IntoIterator<Item = String>) -> Result<Args, String> {
    let mut args = Args {
        method: "forward".into(),
        iter: 1,
        ..Args::default()
    };
    let mut model_path = None;
    let mut it = argv.into_iter();
    while let Some(arg) = it.next() {
        let Some(flag) = arg.strip_prefix("--").or_else(|| arg.strip_prefix('-')) else {
            return Err(format!("unexpected argument '{arg}'"));
        };
        let (name, inline) = match flag.split_once('=') {
            Some((n, v)) => (n, Some(v.to_owned())),
            None => (flag, None),
        };
        if name == "help" || name == "h" {
            args.help = true;
            continue;
        }
        if name == "reset_state" {
            args.reset_state = true;
            continue;
        }
        if name == "minimal_verification" {
            args.minimal_verification = true;
            continue;
        }
        if name == "check_outputs" {
            args.check_outputs = true;
            continue;
        }
        if name == "reset_concurrently" {
            args.reset_concurrently = true;
            continue;
        }
        let mut value = || {
            inline
                .clone()
                .or_else(|| it.next())
                .ok_or_else(|| format!("flag -{name} needs a value"))
        };
        match name {
            "model_path" => model_path = Some(PathBuf::from(value()?)),
            "method" => args.method = value()?,
            "inputs_npz_path" => args.inputs_npz_path = Some(value()?.into()),
            "iter" => args.iter = number(name, &value()?)?,
            "warmup" => args.warmup = number(name, &value()?)?,
            "etdump_path" => args.etdump_path = Some(value()?.into()),
            "output_npz_path" => args.output_npz_path = Some(value()?.into()),
            "num_threads" => args.num_threads = Some(threads(name, &value()?)?),
            "rustconv_threads" => args.rustconv_threads = Some(threads(name, &value()?)?),
            "seed" => args.seed = number(name, &value()?)?,
            "steps_npz_paths" => {
                args.steps_npz_paths = value()?.split(',').map(PathBuf::from).collect()
            }
            "decode_steps" => args.decode_steps = Some(number(name, &value()?)?),
            "concurrent" => args.concurrent = Some(number(name, &value()?)?),
            "kernel_lib" => args.kernel_libs.extend(
                value()?
                    .split(',')
                    .filter(|p| !p.is_empty())
                    .map(PathBuf::from),
            ),
            "llm_ops" => args.llm_ops = LlmOps::parse(&value()?)?,
            _ => return Err(format!("unknown flag '{arg}' (see -help)")),
        }
    }
    if args.help {
        return Ok(args);
    }
    args.model_path = model_path.ok_or("-model_path is required (see -help)")?;
    if args.iter == 0 {
        return Err("-iter must be at least 1".into());
    }
    if args.decode_steps.is_some() && args.steps_npz_paths.is_empty() {
        return Err("-decode_steps needs -steps_npz_paths".into());
    }
    if !args.steps_npz_paths.is_empty() && args.inputs_npz_path.is_some() {
        return Err("-steps_npz_paths and -inputs_npz_path exclude each other".into());
    }
    check_concurrent(&args)?;
    if let Some(n) = args.decode_steps {
        if n > MAX_DECODE_STEPS {
            return Err(format!("-decode_steps must be at most {MAX_DECODE_STEPS}"));
        }
        let last = args.steps_npz_paths.last().cloned().unwrap_or_default();
        while args.steps_npz_paths.len() < n + 1 {
            args.steps_npz_paths.push(last.clone());
        }
    }
    Ok(args)
}

/// What `-concurrent` runs with: random inputs, nothing written, at most
/// [`max_threads`] lanes; and a list of methods needs it.
fn check_concurrent(args: &Args) -> Result<(), String> {
    let lanes = args.method.split(',').count();
    let Some(n) = args.concurrent else {
        if lanes > 1 {
            return Err(format!(
                "-method {} names {lanes} methods: only -concurrent runs several",
                args.method
            ));
        }
        if args.reset_concurrently {
            return Err("-reset_concurrently needs -concurrent".into());
        }
        return Ok(());
    };
    if n == 0 {
        return Err("-concurrent must be at least 1".into());
    }
    if args.method.split(',').any(str::is_empty) {
        return Err(format!("-method {} has an empty name", args.method));
    }
    if lanes > max_threads() as usize {
        return Err(format!(
            "-concurrent runs at most {} methods at once, -method names {lanes}",
            max_threads()
        ));
    }
    let excluded = [
        ("-inputs_npz_path", args.inputs_npz_path.is_some()),
        ("-steps_npz_paths", !args.steps_npz_paths.is_empty()),
        ("-output_npz_path", args.output_npz_path.is_some()),
        ("-etdump_path", args.etdump_path.is_some()),
        ("-check_outputs", args.check_outputs),
        ("-reset_state", args.reset_state),
    ];
    match excluded.iter().find(|(_, set)| *set) {
        Some((flag, _)) => Err(format!(
            "-concurrent makes its own random inputs and compares every output: {flag} does not apply"
        )),
        None => Ok(()),
    }
}

/// The most decode steps `-decode_steps` accepts: each is a path kept for
/// the run (a fuzzed count of 10^12 exhausted memory while they were
/// listed, and `usize::MAX` overflowed the count of calls).
const MAX_DECODE_STEPS: usize = 1_000_000;

/// The most threads `-num_threads` and `-rustconv_threads` accept: the
/// backend's own cap ([`rustconv_backend::threads::max_threads`], 8 per
/// core). More only slows a run down, and counts in the tens of thousands
/// exhaust the process's threads or memory inside the pools (ExecuTorch's
/// pthreadpool then crashes at exit), so they are refused before any pool
/// is created.
pub fn max_threads() -> u32 {
    u32::try_from(rustconv_backend::threads::max_threads()).unwrap_or(u32::MAX)
}

fn threads(flag: &str, s: &str) -> Result<u32, String> {
    let n: u32 = number(flag, s)?;
    let max = max_threads();
    if n == 0 || n > max {
        return Err(format!(
            "-{flag} must be between 1 and {max} ({MAX_THREADS_PER_CORE} per core), got {n}"
        ));
    }
    Ok(n)
}

fn number<T: std::str::FromStr>(flag: &str, s: &str) -> Result<T, String> {
    s.parse()
        .map_err(|_| format!("-{flag} expects a non-negative integer, got '{s}'"))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse_str(s: &str) -> Result<Args, String> {
        parse(s.split_whitespace().map(String::from))
    }

    #[test]
    fn accepts_single_double_dash_and_equals() {
        let a = parse_str("-model_path m.pte --iter 5 -num_threads=2 --etdump_path=e.bin").unwrap();
        assert_eq!(a.model_path, PathBuf::from("m.pte"));
        assert_eq!(a.iter, 5);
        assert_eq!(a.num_threads, Some(2));
        assert_eq!(a.etdump_path, Some(PathBuf::from("e.bin")));
        assert_eq!(a.method, "forward");
    }

    #[test]
    fn rejects_bad_flags_with_a_reason() {
        assert!(parse_str("-iter 3")
            .unwrap_err()
            .contains("-model_path is required"));
        assert!(parse_str("-model_path m -iter x")
            .unwrap_err()
            .contains("-iter expects"));
        assert!(parse_str("-model_path m -iter 0")
            .unwrap_err()
            .contains("at least 1"));
        assert!(parse_str("-model_path m -bogus 1")
            .unwrap_err()
            .contains("unknown flag"));
        assert!(parse_str("-model_path")
            .unwrap_err()
            .contains("needs a value"));
        assert!(parse_str("-model_path m -num_threads 0").is_err());
        assert!(parse_str("-model_path m -rustconv_threads 0").is_err());
        assert!(parse_str("-model_path m -num_threads 4294967296")
            .unwrap_err()
            .contains("-num_threads expects"));
        let a = parse_str("-model_path m -num_threads 2 -rustconv_threads=1").unwrap();
        assert_eq!((a.num_threads, a.rustconv_threads), (Some(2), Some(1)));
        assert!(parse_str("stray").is_err());
        assert!(parse_str("-model_path m -decode_steps 3")
            .unwrap_err()
            .contains("needs -steps_npz_paths"));
        assert!(parse_str("-model_path m -llm_ops maybe")
            .unwrap_err()
            .contains("auto, on or off"));
    }

    #[test]
    fn thread_counts_are_capped_per_core() {
        let max = max_threads();
        assert!(max as usize >= MAX_THREADS_PER_CORE);
        for flag in ["num_threads", "rustconv_threads"] {
            let a = parse_str(&format!("-model_path m -{flag} {max}")).unwrap();
            assert_eq!(a.num_threads.or(a.rustconv_threads), Some(max));
            for n in [max + 1, 20_000, 100_000, u32::MAX] {
                let err = parse_str(&format!("-model_path m -{flag} {n}")).unwrap_err();
                assert!(
                    err.contains(&format!("-{flag} must be between 1 and {max}")),
                    "{err}"
                );
            }
        }
    }

    #[test]
    fn verification_is_full_unless_asked_otherwise() {
        assert!(!parse_str("-model_path m").unwrap().minimal_verification);
        assert!(
            parse_str("-model_path m --minimal_verification")
                .unwrap()
                .minimal_verification
        );
    }

    #[test]
    fn kernel_libraries_and_llm_ops() {
        let a = parse_str("-model_path m -kernel_lib a.so,b.so --kernel_lib=c.so -llm_ops off")
            .unwrap();
        assert_eq!(
            a.kernel_libs,
            [PathBuf::from("a.so"), "b.so".into(), "c.so".into()]
        );
        assert_eq!(a.llm_ops, LlmOps::Off);
        assert_eq!(parse_str("-model_path m").unwrap().llm_ops, LlmOps::Auto);
    }

    #[test]
    fn concurrent_runs_take_method_lists_and_nothing_they_do_not_use() {
        let a =
            parse_str("-model_path m -concurrent 100 -method a,b,a -reset_concurrently").unwrap();
        assert_eq!((a.concurrent, a.method.as_str()), (Some(100), "a,b,a"));
        assert!(a.reset_concurrently);
        for (line, why) in [
            ("-method a,b", "only -concurrent runs several"),
            ("-reset_concurrently", "needs -concurrent"),
            ("-concurrent 0", "at least 1"),
            ("-concurrent 5 -method a,,b", "has an empty name"),
            (
                "-concurrent 5 -inputs_npz_path x.npz",
                "-inputs_npz_path does not apply",
            ),
            (
                "-concurrent 5 -check_outputs",
                "-check_outputs does not apply",
            ),
            ("-concurrent 5 -reset_state", "-reset_state does not apply"),
        ] {
            let err = parse_str(&format!("-model_path m {line}")).unwrap_err();
            assert!(err.contains(why), "{line}: {err}");
        }
        let many = vec!["a"; max_threads() as usize + 1].join(",");
        let err = parse_str(&format!("-model_path m -concurrent 5 -method {many}")).unwrap_err();
        assert!(err.contains("at most"), "{err}");
        assert!(
            parse_str("-model_path m -check_outputs")
                .unwrap()
                .check_outputs
        );
    }

    #[test]
    fn decode_steps_beyond_a_million_are_refused() {
        for n in ["1000001", "1000000000000", "18446744073709551615"] {
            let line = format!("-model_path m -steps_npz_paths p.npz -decode_steps {n}");
            assert!(parse_str(&line).is_err(), "{n}");
        }
        let a = parse_str("-model_path m -steps_npz_paths p.npz -decode_steps 1000000").unwrap();
        assert_eq!(a.steps_npz_paths.len(), 1_000_001);
    }

    #[test]
    fn decode_steps_repeat_the_last_call() {
        let a =
            parse_str("-model_path m -steps_npz_paths p.npz,t.npz -decode_steps 3 -reset_state")
                .unwrap();
        let names: Vec<_> = a
            .steps_npz_paths
            .iter()
            .map(|p| p.to_str().unwrap())
            .collect();
        assert_eq!(names, ["p.npz", "t.npz", "t.npz", "t.npz"]);
        assert!(a.reset_state);
    }
}
