//! `-concurrent N`: methods of one program run on threads of their own at
//! once, each output compared bit for bit with a single-threaded reference.
//!
//! Each name in `-method` (`forward,decode`, or `forward,forward` for two
//! loads of one method) is a *lane*: one load of that method, its own random
//! inputs (`-seed` plus the lane's index, so no two lanes compute the same
//! thing), run `N` times. The reference runs every lane from a fresh load on
//! this thread, one after another, and keeps every iteration's outputs (a
//! method with state gives a different output each iteration). Then every
//! lane is loaded again and run on its own thread, all started together,
//! and iteration `i` of each must give the reference's iteration `i`.
//!
//! With `-reset_concurrently`, another thread sets the backend option
//! `reset_state` at random moments while the lanes run. A delegate restores
//! its initial state at the start of its next call (delegate/src/state.rs),
//! so each iteration of a lane must give either the reference's next
//! iteration (the state carried on) or its first (the state restarted);
//! anything else is a mismatch.

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Barrier;
use std::thread;
use std::time::{Duration, Instant};

use rand::{rngs::SmallRng, Rng, SeedableRng};

use crate::args::Args;
use crate::ffi::bridge as et;
use crate::npz::Array;
use crate::tensors;

/// One load of one method and the inputs it reads in place.
struct Lane {
    // Declared before `_inputs`, so dropped before them: the session reads
    // them in place (tensors::bind_inputs) and nothing else does.
    session: cxx::UniquePtr<et::Session>,
    _inputs: Vec<Array>,
    method: String,
}

impl Lane {
    fn load(
        program: &cxx::SharedPtr<et::LoadedProgram>,
        method: &str,
        seed: u64,
    ) -> Result<Self, String> {
        let mut session = et::load_method(program, method, false)
            .map_err(|e| format!("method '{method}': {}", e.what()))?;
        let inputs = tensors::random_inputs(&session, seed)?;
        // SAFETY: `inputs` moves into the returned Lane with the session
        // (a move keeps the arrays' heap buffers where they are), is never
        // changed, and is dropped after the session (field order above).
        unsafe { tensors::bind_inputs(&mut session, &inputs) }
            .map_err(|e| format!("method '{method}': {e}"))?;
        Ok(Lane {
            session,
            _inputs: inputs,
            method: method.to_owned(),
        })
    }

    fn execute(&mut self) -> Result<(), String> {
        // The memory plan may reuse an input's buffer once it is dead.
        self.session
            .pin_mut()
            .reload_inputs()
            .map_err(|e| e.what().to_owned())?;
        self.session
            .pin_mut()
            .execute()
            .map_err(|e| format!("method '{}': {}", self.method, e.what()))
    }
}

/// What one lane saw on its thread.
#[derive(Debug, Default)]
pub struct LaneReport {
    pub iterations: usize,
    /// Iterations whose outputs were neither the reference's next ones nor
    /// (with resets) its first.
    pub mismatches: usize,
    /// Iterations that gave the reference's first outputs after a reset
    /// (not its next ones).
    pub restarts: usize,
    /// The first mismatch: its iteration and what was expected.
    pub first_mismatch: Option<String>,
}

/// The whole run.
#[derive(Debug)]
pub struct Report {
    pub lanes: Vec<LaneReport>,
    /// Calls that began while another lane's call was running: evidence that
    /// the lanes really overlapped.
    pub overlapping_calls: usize,
    pub resets: usize,
    pub elapsed: Duration,
}

impl Report {
    pub fn mismatches(&self) -> usize {
        self.lanes.iter().map(|l| l.mismatches).sum()
    }
}

pub fn run(args: &Args, iterations: usize) -> Result<Report, String> {
    let model = args
        .model_path
        .to_str()
        .ok_or("model path is not valid UTF-8")?;
    let program =
        et::open_program(model, args.minimal_verification).map_err(|e| e.what().to_owned())?;
    let methods: Vec<&str> = args.method.split(',').collect();
    let load_all = || -> Result<Vec<Lane>, String> {
        methods
            .iter()
            .enumerate()
            .map(|(k, m)| Lane::load(&program, m, args.seed.wrapping_add(k as u64)))
            .collect()
    };

    // The reference: the same loads, one lane after another on this thread.
    let mut references = Vec::with_capacity(methods.len());
    for mut lane in load_all()? {
        let mut outputs: Vec<Vec<Array>> = Vec::new();
        outputs
            .try_reserve_exact(iterations)
            .map_err(|e| format!("cannot keep {iterations} reference outputs: {e}"))?;
        for _ in 0..iterations {
            lane.execute()?;
            outputs.push(tensors::read_outputs(&lane.session)?);
        }
        references.push(outputs);
    }

    let lanes = load_all()?;
    let start = Barrier::new(lanes.len() + usize::from(args.reset_concurrently));
    let running = AtomicUsize::new(0);
    let overlapping = AtomicUsize::new(0);
    let done = AtomicBool::new(false);
    let begun = Instant::now();
    let (lane_reports, resets) = thread::scope(|scope| {
        let resetter = args.reset_concurrently.then(|| {
            let (start, done) = (&start, &done);
            let seed = args.seed;
            scope.spawn(move || reset_until(done, start, seed))
        });
        let handles: Vec<_> = lanes
            .into_iter()
            .zip(&references)
            .map(|(lane, reference)| {
                let (start, running, overlapping) = (&start, &running, &overlapping);
                let resets = args.reset_concurrently;
                scope.spawn(move || {
                    start.wait();
                    run_lane(lane, reference, resets, running, overlapping)
                })
            })
            .collect();
        let reports: Vec<Result<LaneReport, String>> = handles
            .into_iter()
            .map(|h| {
                h.join()
                    .unwrap_or_else(|_| Err("a lane's thread panicked".into()))
            })
            .collect();
        done.store(true, Ordering::Relaxed);
        let resets = resetter.map_or(Ok(0), |h| {
            h.join()
                .unwrap_or_else(|_| Err("the reset thread panicked".into()))
        });
        (reports, resets)
    });
    Ok(Report {
        lanes: lane_reports.into_iter().collect::<Result<_, _>>()?,
        overlapping_calls: overlapping.into_inner(),
        resets: resets?,
        elapsed: begun.elapsed(),
    })
}

fn run_lane(
    mut lane: Lane,
    reference: &[Vec<Array>],
    resets: bool,
    running: &AtomicUsize,
    overlapping: &AtomicUsize,
) -> Result<LaneReport, String> {
    let mut report = LaneReport::default();
    // The reference iteration this lane's state is at: with resets it
    // restarts from 0 whenever its delegates restored their initial state.
    let mut at = 0;
    for i in 0..reference.len() {
        if running.fetch_add(1, Ordering::SeqCst) > 0 {
            overlapping.fetch_add(1, Ordering::Relaxed);
        }
        let result = lane.execute();
        running.fetch_sub(1, Ordering::SeqCst);
        result.map_err(|e| format!("iteration {i}: {e}"))?;
        report.iterations += 1;
        if tensors::outputs_equal(&lane.session, &reference[at])? {
            at += 1;
        } else if resets && tensors::outputs_equal(&lane.session, &reference[0])? {
            report.restarts += 1;
            at = 1;
        } else {
            report.mismatches += 1;
            report.first_mismatch.get_or_insert_with(|| {
                format!(
                    "iteration {i} of method '{}' differs from the reference's iteration {at}",
                    lane.method
                )
            });
            at += 1;
        }
    }
    Ok(report)
}

/// Sets `reset_state` at random moments (0 to 2 ms apart) until `done`;
/// returns how many times.
fn reset_until(done: &AtomicBool, start: &Barrier, seed: u64) -> Result<usize, String> {
    let mut rng = SmallRng::seed_from_u64(seed);
    start.wait();
    let mut resets = 0;
    while !done.load(Ordering::Relaxed) {
        thread::sleep(Duration::from_micros(rng.gen_range(0..2000)));
        et::reset_state().map_err(|e| e.what().to_owned())?;
        resets += 1;
    }
    Ok(resets)
}

/// The report as pte_runner prints it.
pub fn describe(args: &Args, report: &Report) -> String {
    let mut text = format!(
        "pte_runner: {} concurrent: {} lane(s) on their own threads, {:.2} s\n",
        args.model_path.display(),
        report.lanes.len(),
        report.elapsed.as_secs_f64()
    );
    for (k, (lane, method)) in report.lanes.iter().zip(args.method.split(',')).enumerate() {
        text += &format!(
            "lane {k} '{method}': {} iteration(s), {} mismatch(es), {} restart(s)\n",
            lane.iterations, lane.mismatches, lane.restarts
        );
        if let Some(first) = &lane.first_mismatch {
            text += &format!("  first mismatch: {first}\n");
        }
    }
    text += &format!(
        "overlapping calls: {}\nresets from another thread: {}\nmismatches: {}",
        report.overlapping_calls,
        report.resets,
        report.mismatches()
    );
    text
}
