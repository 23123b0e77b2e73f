"""What is compared, and how each alternative is run on one setting.

Run through pte_runner (a subprocess; same flags, warm-ups, repeats and
thread count for all):

* ``ours``: RustConvPartitioner, the runtime's cost model picks the kernel;
* ``ours:<algorithm>``: the same with ``compile_specs.algorithm(name)``, for
  every candidate the plan log line lists (conv only);
* ``xnnpack``: XnnpackPartitioner;
* ``et_cpu``: no delegate, ExecuTorch's optimized/portable CPU kernels;
* ``ours_traced`` (only when named): ours' program with an ETDump written
  (``-etdump_path``): what profiling costs when on;
* ``ours_baseline`` (only when named): ours' program in another pte_runner
  build (``--baseline-runner``, e.g. an earlier commit's): what a runtime
  change costs, such as profiling support when it is off;
* blocks only: ``ours`` is RustConvPartitioner then XnnpackPartitioner (the
  linears go to XNNPACK), ``ours_unfused`` the same with
  ``compile_specs.fusion(False)``.

Blocks also get an ``io_floor`` row, not a run: the bytes the block must read
and write once (inputs, output, weights, state buffers) / the copy bandwidth
measured in the same run.

Run in this process (time.perf_counter around each call, at
``torch.set_num_threads(T)``):

* ``eager``: the PyTorch module (for the scan, the custom op's eager kernel,
  a Python loop over time); its output is the accuracy reference;
* ``torch_fft`` (conv): rfft/irfft convolution at n = next fast size >=
  N+K-1 with the filter spectrum precomputed once outside the timed calls;
* ``c_scan`` (scan): the plain C loop of bench/native/scan.c, OpenMP over
  channels;
* ``onnxruntime`` (blocks, zoo): the model exported to ONNX
  (``torch.onnx.export(dynamo=True)``), an ONNX Runtime CPU session with
  ``intra_op_num_threads`` = the thread count (bench/zoo.py).

The zoo (bench/zoo.py) runs like the blocks; ExecuTorch's LFM2 recipes
there have no ``et_cpu`` or ``onnxruntime`` program, and their ``:decode``
settings time the decode steps after a prefill in one pte_runner sequence.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from bench import measure, projection
from bench.lowering import inputs_npz, lowered_pte, steps_npz
from bench.native import Native
from bench.projection import MEMORY_FRACTION, Projector
from bench.workload import DECODE_BLOCKS, Setting, SettingData

ACCURACY_ATOL = 1e-3

# Decode steps a zoo decode setting times in pte_runner (its last real step
# repeated: SettingBench._run_decode_in_runner).
DECODE_TIMED_STEPS = 64

#: Display names, in report order.
LABELS = {
    "ours": "RustConv (ours)",
    "ours_unfused": "RustConv, fusion off",
    "ours_traced": "RustConv, ETDump on",
    "ours_baseline": "RustConv, baseline runner",
    "xnnpack": "XNNPACK",
    "et_cpu": "ExecuTorch CPU kernels",
    "eager": "PyTorch eager",
    "torch_fft": "PyTorch FFT conv",
    "c_scan": "plain C scan",
    "onnxruntime": "ONNX Runtime",
    "io_floor": "I/O floor",
}
#: The alternatives ours is compared against, per workload.
BASELINES = {
    "conv": ("xnnpack", "et_cpu", "eager", "torch_fft"),
    "scan": ("xnnpack", "et_cpu", "eager", "c_scan"),
    "blocks": ("ours_unfused", "xnnpack", "et_cpu", "onnxruntime", "eager"),
    "zoo": ("xnnpack", "et_cpu", "onnxruntime", "eager"),
}
#: Run order within a setting: eager first, its output is the reference.
ORDER = (
    "eager",
    "ours",
    "ours_traced",
    "ours_baseline",
    "ours_unfused",
    "candidates",
    "xnnpack",
    "et_cpu",
    "onnxruntime",
    "torch_fft",
    "c_scan",
    "io_floor",
)
RUNS_IN_RUNNER = ("ours", "ours_traced", "ours_baseline", "ours_unfused", "xnnpack", "et_cpu")
#: Alternatives that run ours' program, differently.
SAME_PROGRAM_AS_OURS = ("ours_traced", "ours_baseline")
NOT_APPLICABLE = {
    ("xnnpack", "scan"): "XNNPACK has no kernel for the custom op rustconv::linear_scan",
    ("et_cpu", "scan"): "ExecuTorch has no kernel for the custom op rustconv::linear_scan",
    ("torch_fft", "scan"): None,  # not part of the scan comparison at all
    ("c_scan", "conv"): None,
    ("candidates", "scan"): None,
    ("ours_unfused", "conv"): None,
    ("ours_unfused", "scan"): None,
    ("io_floor", "conv"): None,
    ("io_floor", "scan"): None,
    ("candidates", "blocks"): None,
    ("torch_fft", "blocks"): None,
    ("c_scan", "blocks"): None,
    ("onnxruntime", "conv"): None,
    ("onnxruntime", "scan"): None,
    ("candidates", "zoo"): None,
    ("ours_unfused", "zoo"): None,
    ("torch_fft", "zoo"): None,
    ("c_scan", "zoo"): None,
    ("io_floor", "zoo"): None,
}
#: Why the zoo's ExecuTorch recipes have no row for an alternative.
RECIPE_NOT_APPLICABLE = {
    "et_cpu": "the recipe lowers to XNNPACK; its program has no CPU-kernel variant",
    "onnxruntime": "the recipe's KV cache and SDPA are ExecuTorch custom ops",
}
#: Conv algorithms the runtime knows, if the plan line does not list them.
KNOWN_ALGORITHMS = ("direct", "depthwise_simd", "fft", "gemm", "fft_gemm")


def work_model(alt: str, kind: str) -> str:
    if kind in ("blocks", "zoo"):
        return "block"
    if kind == "scan":
        return "scan_loop" if alt == "eager" else "stream"
    if alt in ("ours", *SAME_PROGRAM_AS_OURS):
        return "auto"
    if alt in ("torch_fft", "ours:fft"):
        return "fft"
    return "direct"


def steps_for(setting: Setting, alternatives: tuple[str, ...]) -> list[str]:
    """The alternatives run on this setting (those that make a row), in order."""
    steps = [
        a
        for a in ORDER
        if a in alternatives
        and not ((a, setting.kind) in NOT_APPLICABLE and NOT_APPLICABLE[(a, setting.kind)] is None)
    ]
    # Forced algorithms (`alt=ours:gemm`) run right after ours.
    forced = [a for a in alternatives if a.startswith("ours:")]
    at = steps.index("ours") + 1 if "ours" in steps else len(steps)
    return steps[:at] + forced + steps[at:]


@dataclass
class Context:
    runner: Path
    baseline_runner: Path | None
    threads: int
    warmup: int
    repeats: int
    time_limit_s: float
    budget_s: float
    seed: int
    cache_dir: Path
    work_dir: Path
    native: Native
    projector: Projector
    ram_bytes: int | None
    planned_inputs: bool = False
    bandwidth: float | None = None  # bytes/s, for the blocks' I/O floor
    rounds: int = 1  # interleaved rounds (bench/rounds.py): each gets budget_s / rounds

    @property
    def round_budget_s(self) -> float:
        """Seconds of timed calls for one round's measurement."""
        return self.budget_s / self.rounds


def new_row(setting: Setting, alt: str) -> dict:
    return {
        "kind": setting.kind,
        "C": setting.C,
        "N": setting.N,
        "K": setting.K,
        "K_label": setting.K_label,
        "block": setting.block,
        "size": setting.size,
        "threads": None,
        "setting": setting.name,
        "alternative": alt,
        "status": "ok",
        "median_ms": None,
        "p10_ms": None,
        "p90_ms": None,
        "warmup": None,
        "iters": None,
        "peak_mib": None,
        "max_abs_err": None,
        "reference": None,
        "chosen_kernel": None,
        "estimate_ms": None,
        "prepared_mib": None,
        "estimates": None,
        "delegated": None,
        "rustconv_calls": None,
        "xnnpack_calls": None,
        "io_bytes": None,
        "projected_s": None,
        "projection_basis": None,
        "lower_s": None,
        "note": "",
    }


def one_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    msg = text[-1] if text else ""
    return f"{type(exc).__name__}: {msg}"[:300]


def max_abs_diff(got, want: np.ndarray) -> float:
    """max |got - want| in float64, a block of elements at a time (outputs of
    any rank, a vocoder's 1-D waveform included)."""
    got = np.asarray(got)
    if got.shape != want.shape:
        raise ValueError(f"output shape {got.shape} != reference {want.shape}")
    got, want = got.reshape(-1), want.reshape(-1)
    worst = 0.0
    step = 1 << 24
    for start in range(0, want.size, step):
        diff = np.abs(got[start : start + step].astype(np.float64) - want[start : start + step])
        worst = max(worst, float(np.max(diff)) if diff.size else 0.0)
        if np.isnan(diff).any():
            return float("nan")
    return worst


class SettingBench:
    """Runs the alternatives on one setting; keeps the reference output and
    our plan line for the candidates."""

    def __init__(self, ctx: Context, data: SettingData):
        self.ctx = ctx
        self.data = data
        self.s = data.setting
        self.npz = inputs_npz(data, ctx.seed, ctx.cache_dir)
        self.reference: np.ndarray | None = None
        self.reference_name: str | None = None
        self.reference_tried = False
        self.ours_plan: measure.PlanLine | None = None
        self.ours_row: dict | None = None
        # This setting's own last measured call per alternative (s), at any
        # thread count: what plans the timed calls where the projection was
        # not measured on this setting at this count.
        self.call_s: dict[str, float] = {}

    # Entry point --------------------------------------------------------------
    def run(self, alt: str) -> list[dict]:
        if alt == "candidates":
            return self.run_candidates()
        if alt == "io_floor":
            return [self.io_floor_row()]
        reason = NOT_APPLICABLE.get((alt, self.s.kind)) or self._not_applicable(alt)
        if reason:
            row = new_row(self.s, alt)
            row.update(status="n/a", note=reason)
            return [row]
        if alt in RUNS_IN_RUNNER or alt.startswith("ours:"):
            row = self.run_in_runner(alt)
            if alt == "ours":
                self.ours_row = row
            return [row]
        return [self.run_in_process(alt)]

    def _not_applicable(self, alt: str) -> str | None:
        from bench import zoo

        if self.s.kind == "zoo" and zoo.is_recipe(self.s.block):
            return RECIPE_NOT_APPLICABLE.get(alt)
        if alt == "onnxruntime" and self.s.kind in ("blocks", "zoo"):
            if zoo.has_state_buffers_module(self.data.model(), self.data.torch_inputs()):
                return "its state lives in mutated buffers; an ONNX model keeps none across calls"
        return None

    # Guards ---------------------------------------------------------------------
    def _guard(self, row: dict, alt: str, needs_bytes: float, estimate_s: float | None = None):
        """Fills DNF / skipped rows; returns the projection or None if not to run."""
        model = work_model(alt, self.s.kind)
        proj = self.ctx.projector.project(alt, model, self.s)
        if not proj.measured and estimate_s is not None:
            proj = projection.Projection(estimate_s, "cost model")
        row["projected_s"] = proj.seconds
        row["projection_basis"] = proj.basis
        if proj.seconds > self.ctx.time_limit_s:
            row["status"] = "DNF"
            row["note"] = f"projected {proj.seconds:.3g} s per call (from {proj.basis})"
            self.ctx.projector.record(alt, model, self.s, proj.seconds, measured=False)
            return None
        if self.ctx.ram_bytes:
            limit = MEMORY_FRACTION * self.ctx.ram_bytes
            total = measure.rss_bytes() + needs_bytes
            if total > limit:
                row["status"] = "skipped: memory"
                row["note"] = (
                    f"projected {total / 2**30:.1f} GiB > {MEMORY_FRACTION:.0%} of "
                    f"{self.ctx.ram_bytes / 2**30:.1f} GiB RAM"
                )
                return None
        return proj

    def _check(self, row: dict, output) -> None:
        if self.s.kind == "zoo" and self.data.zoo.module is None and not self.data.zoo.decode:
            # A recipe's prefill, repeated: its conv states carry from call to
            # call (the program's own buffers, never reset), so only the first
            # call would match eager; the decode setting (one clean pass) and
            # tests/zoo/test_lfm2_recipe.py compare outputs.
            note = "outputs not compared (state carried across repeated prefills)"
            row["note"] = (row["note"] + "; " if row["note"] else "") + note
            return
        ref = self._reference()
        if ref is None:
            row["note"] = (row["note"] + "; " if row["note"] else "") + "no reference output"
            return
        row["max_abs_err"] = max_abs_diff(output, ref)
        row["reference"] = self.reference_name

    def _reference(self) -> np.ndarray | None:
        """Eager's output if eager finished; else a float64 reference (numpy
        FFT convolution, or the C scan in double) if memory allows."""
        if self.reference is not None or self.reference_tried:
            return self.reference
        self.reference_tried = True
        s = self.s
        if s.kind in ("blocks", "zoo"):
            return None  # eager is the blocks' only reference
        if self.ctx.ram_bytes and (
            measure.rss_bytes() + projection.reference_f64_bytes(s)
            > MEMORY_FRACTION * self.ctx.ram_bytes
        ):
            return None
        if s.kind == "scan":
            x0, a, u = self.data.inputs
            self.reference = self.ctx.native.linear_scan_f64(x0, a, u, self.ctx.threads)
            self.reference_name = "float64 C scan"
        else:
            n, y = s.fft_size, np.empty((1, s.C, s.N))
            step = max(1, (1 << 22) // n)  # channels per block: ~100 MiB of temporaries
            for c in range(0, s.C, step):
                h = self.data.weight[c : c + step, 0, ::-1].astype(np.float64)
                x = self.data.inputs[0][0, c : c + step].astype(np.float64)
                prod = np.fft.rfft(x, n=n) * np.fft.rfft(h, n=n)
                y[0, c : c + step] = np.fft.irfft(prod, n=n)[:, : s.N]
            self.reference = y
            self.reference_name = "float64 numpy FFT"
        return self.reference

    # pte_runner ----------------------------------------------------------------
    def run_in_runner(self, alt: str, estimate_s: float | None = None) -> dict:
        ctx, s = self.ctx, self.s
        row = new_row(s, alt)
        program = "ours" if alt in SAME_PROGRAM_AS_OURS else alt
        runner = ctx.baseline_runner if alt == "ours_baseline" else ctx.runner
        fft = program in ("ours", "ours:fft")
        needs = max(projection.export_bytes(s), projection.runner_bytes(s, fft))
        proj = self._guard(row, alt, needs, estimate_s)
        if proj is None:
            return row
        try:
            lowered = lowered_pte(program, self.data, ctx.seed, ctx.cache_dir, ctx.planned_inputs)
        except Exception as e:  # any failure is recorded; the run goes on
            row["status"] = f"error: lowering: {one_line(e)}"
            return row
        row["lower_s"] = lowered.lower_s
        row["delegated"] = lowered.describe()
        row["rustconv_calls"] = lowered.calls("RustConvBackend")
        row["xnnpack_calls"] = lowered.calls("XnnpackBackend")
        if s.kind == "zoo":
            if alt.startswith("ours") and not row["rustconv_calls"]:
                row["status"] = f"error: not delegated to RustConvBackend ({lowered.describe()})"
                return row
        elif s.kind == "blocks":
            row["io_bytes"] = self.io_bytes
            if alt.startswith("ours") and not row["rustconv_calls"]:
                row["status"] = f"error: not delegated to RustConvBackend ({lowered.describe()})"
                return row
        elif alt.startswith("ours") and not lowered.delegated_to("RustConvBackend"):
            row["status"] = f"error: not delegated to RustConvBackend ({lowered.describe()})"
            return row
        elif alt == "xnnpack" and not lowered.delegated_to("XnnpackBackend"):
            row["note"] = "XNNPACK did not take the conv; it ran on ExecuTorch's kernels"

        out_npz = ctx.work_dir / f"out-{s.slug}-{alt.replace(':', '-')}.npz"
        etdump = out_npz.with_suffix(".etdump") if alt == "ours_traced" else None
        projected = proj.seconds
        if s.kind == "zoo" and self.data.zoo.decode:
            return self._run_decode_in_runner(row, alt, runner, lowered, out_npz, etdump)
        known = self.call_s.get(alt)
        if known is not None and not proj.measured:
            # Measured at another thread count: a far better guess than a
            # projection from other settings or the prior (the zoo's is a
            # nominal 0.5 s at 2 threads, which planned 4 timed calls of 1 ms).
            projected = known
        try:
            if known is None and not proj.measured and (projected > 0.5 or s.kind == "zoo"):
                # A rough projection (a zoo model's is only a nominal guard
                # against the time limit): time one call before planning the
                # repeats.
                probe = measure.run_pte(
                    runner, lowered.pte, self.npz, out_npz, 0, 1, ctx.threads,
                    timeout_s=2 * ctx.time_limit_s + 120, etdump=etdump,
                )  # fmt: skip
                projected = probe.timing.median_ms / 1e3
                if projected > ctx.time_limit_s:
                    self._fill_runner_row(row, alt, probe)
                    row["note"] = f"one call only: it took {projected:.1f} s (> time limit)"
                    return row
                if s.kind == "blocks" and projected > ctx.budget_s:
                    # A block call longer than the budget (Hyena's K=N direct
                    # conv): the probe is the one timed call.
                    self._fill_runner_row(row, alt, probe)
                    row["note"] = f"one call only: it took {projected:.1f} s (> budget)"
                    return row
            warm, reps = measure.plan_repeats(
                projected, ctx.warmup, ctx.repeats, ctx.round_budget_s
            )
            timeout = 4 * (warm + reps) * max(projected, 0.05) + 120
            result = measure.run_pte(
                runner, lowered.pte, self.npz, out_npz, warm, reps, ctx.threads, timeout, etdump
            )
        except measure.RunnerTimeout as e:
            row["status"] = "DNF"
            row["note"] = f"pte_runner {e}"
            self.ctx.projector.record(alt, work_model(alt, s.kind), s, e.seconds, measured=False)
            return row
        except Exception as e:
            row["status"] = f"error: {one_line(e)}"
            return row
        row["iters"] = reps
        self._fill_runner_row(row, alt, result)
        if self._carries_state() and row["status"] == "ok":
            # The timed calls carried the state through warm-ups and repeats
            # whose count the plan chose: check a fresh process's first call.
            first = measure.run_pte(
                runner, lowered.pte, self.npz, out_npz, 0, 1, ctx.threads, timeout_s=120
            )
            self._check(row, first.output)
        return row

    def _carries_state(self) -> bool:
        """A decode block: each call reads and updates a state, so the
        output of the last timed call depends on how many calls ran."""
        return self.s.kind == "blocks" and self.s.block in DECODE_BLOCKS

    def _run_decode_in_runner(self, row, alt, runner, lowered, out_npz, etdump) -> dict:
        """A zoo decode setting: one pass over the prefill and its decode
        steps (state carried; a second pass would start from the first's
        state, which the recipe's own buffers never reset), timed per step.
        The last step is repeated up to ``DECODE_TIMED_STEPS`` steps: the
        median of a setting's few steps alone (8 for the small LFM2 recipe)
        moved by 25% between runs. The output checked is the last real
        step's."""
        ctx = self.ctx
        steps = steps_npz(self.data, ctx.seed, ctx.cache_dir)
        try:
            result = measure.run_pte(
                runner, lowered.pte, self.npz, out_npz, 0, 1, ctx.threads,
                timeout_s=ctx.time_limit_s * len(steps) + 120, etdump=etdump, steps=steps,
                decode_steps=max(len(steps) - 1, DECODE_TIMED_STEPS),
            )  # fmt: skip
        except measure.RunnerTimeout as e:
            row.update(status="DNF", note=f"pte_runner {e}")
            return row
        except Exception as e:
            row["status"] = f"error: {one_line(e)}"
            return row
        row["iters"] = max(len(steps) - 1, DECODE_TIMED_STEPS)
        self._fill_runner_row(row, alt, result)
        row["note"] = (
            f"decode steps after a prefill of {self.data.zoo.calls[0][0].shape[-1]} "
            f"({len(steps) - 1} distinct, the last repeated)"
        )
        return row

    def _fill_runner_row(self, row: dict, alt: str, result: measure.RunnerResult) -> None:
        s = self.s
        row["median_ms"] = result.timing.median_ms
        row["p10_ms"], row["p90_ms"] = result.p10_ms, result.p90_ms
        row["warmup"] = result.timing.warmup
        row["iters"] = row["iters"] or 1
        row["peak_mib"] = result.peak_mib
        self.call_s[alt] = result.timing.median_ms / 1e3
        self.ctx.projector.record(
            alt, work_model(alt, s.kind), s, result.timing.median_ms / 1e3, measured=True
        )
        if alt.startswith("ours") and result.plans:
            plan = result.plans[0]
            row["chosen_kernel"] = plan.chosen
            row["prepared_mib"] = plan.prepared_mib
            row["estimates"] = json.dumps(plan.estimates_ms) if plan.estimates_ms else None
            row["estimate_ms"] = plan.estimates_ms.get(plan.chosen)
            if len(result.plans) > 1:
                row["note"] = f"{len(result.plans)} plan lines; the first is recorded"
            if alt == "ours":
                self.ours_plan = plan
            elif alt.startswith("ours:") and plan.chosen != alt.split(":", 1)[1]:
                row["status"] = (
                    f"error: forced {alt.split(':', 1)[1]} but the plan chose {plan.chosen}"
                )
        if not self._carries_state():
            self._check(row, result.output)

    # Blocks ---------------------------------------------------------------------
    @property
    def io_bytes(self) -> int:
        if getattr(self, "_io_bytes", None) is None:
            self._io_bytes = self.data.io_bytes()
        return self._io_bytes

    def io_floor_row(self) -> dict:
        """Not a run: the block's bytes read and written once / copy bandwidth."""
        row = new_row(self.s, "io_floor")
        row["io_bytes"] = self.io_bytes
        if not self.ctx.bandwidth:
            row.update(status="n/a", note="copy bandwidth not measured")
            return row
        row["median_ms"] = self.io_bytes / self.ctx.bandwidth * 1e3
        row["note"] = (
            f"not a run: {self.io_bytes / 1e6:.3g} MB (inputs, output, weights, state) / "
            f"{self.ctx.bandwidth / 1e9:.1f} GB/s copy bandwidth"
        )
        return row

    # Candidates ------------------------------------------------------------------
    def run_candidates(self) -> list[dict]:
        """Each applicable conv algorithm, forced; the cost model's pick reuses
        the ``ours`` measurement."""
        from rustconv import compile_specs

        if not hasattr(compile_specs, "algorithm"):
            row = new_row(self.s, "ours:*")
            row.update(status="n/a", note="rustconv.compile_specs.algorithm is not available")
            return [row]
        plan = self.ours_plan
        if plan is not None and plan.estimates_ms:
            names = list(plan.estimates_ms)
        else:
            names = [
                a
                for a in KNOWN_ALGORITHMS
                if a in getattr(compile_specs, "CONV1D_ALGORITHMS", KNOWN_ALGORITHMS)
            ]
        rows = []
        for name in names:
            alt = f"ours:{name}"
            estimate_ms = plan.estimates_ms.get(name) if plan else None
            if plan is not None and name == plan.chosen and self.ours_row is not None:
                row = dict(self.ours_row, alternative=alt)
                row["note"] = "the cost model's choice: same measurement as ours"
                rows.append(row)
                continue
            estimate_s = estimate_ms / 1e3 if estimate_ms is not None else None
            row = self.run_in_runner(alt, estimate_s)
            if row["estimate_ms"] is None:
                row["estimate_ms"] = estimate_ms
            rows.append(row)
        return rows

    # In process -------------------------------------------------------------------
    def _memory_model(self, alt: str) -> float:
        s = self.s
        if s.kind in ("blocks", "zoo"):
            return projection.runner_bytes(s, fft=False)
        if alt == "eager":
            return projection.eager_conv_bytes(s) if s.kind == "conv" else projection.scan_bytes(s)
        if alt == "torch_fft":
            return projection.torch_fft_bytes(s)
        return projection.scan_bytes(s)

    def _build(self, alt: str):
        """Allocates the alternative's state (weights, spectra, output buffers)
        and returns the call to time."""
        s, data, threads = self.s, self.data, self.ctx.threads
        if s.kind == "zoo" and alt == "eager":
            from bench import zoo

            return zoo.eager_call(data.zoo, self.ctx.cache_dir / "zoo-recipes" / str(s.size))
        if alt == "onnxruntime":
            from bench import zoo
            from bench.lowering import onnx_path

            model, inputs = data.model(), data.torch_inputs()
            return zoo.onnx_call(
                model, inputs, threads, onnx_path(data, self.ctx.seed, self.ctx.cache_dir)
            )
        if alt == "eager":
            model = data.model()
            inputs = data.torch_inputs()

            def call():
                with torch.inference_mode():
                    return model(*inputs)

            return call
        if alt == "torch_fft":
            n, length = s.fft_size, s.N
            # Conv1d is a cross-correlation: the causal filter is the reversed weight.
            h = torch.from_numpy(np.ascontiguousarray(data.weight[:, 0, ::-1]))
            spectrum = torch.fft.rfft(h, n=n)
            x = data.torch_inputs()[0]

            def call():
                with torch.inference_mode():
                    return torch.fft.irfft(torch.fft.rfft(x, n=n) * spectrum, n=n)[..., :length]

            return call
        if alt == "c_scan":
            x0, a, u = data.inputs
            out = np.empty(a.shape, dtype=np.float32)
            native = self.ctx.native
            return lambda: native.linear_scan(x0, a, u, out, threads)
        raise ValueError(alt)

    def run_in_process(self, alt: str) -> dict:
        ctx, s = self.ctx, self.s
        row = new_row(s, alt)
        if self._guard(row, alt, self._memory_model(alt)) is None:
            return row
        try:
            with measure.PeakMemory() as mem:
                call = self._build(alt)
                timing, output = measure.time_calls(
                    call, ctx.warmup, ctx.repeats, ctx.time_limit_s, ctx.round_budget_s
                )
                del call
        except Exception as e:
            row["status"] = f"error: {one_line(e)}"
            return row
        output = output.numpy() if torch.is_tensor(output) else np.asarray(output)
        row.update(
            median_ms=timing.median_ms,
            p10_ms=timing.pct(10),
            p90_ms=timing.pct(90),
            warmup=timing.warmup,
            iters=len(timing.samples_ms),
            peak_mib=mem.mib,
            note=timing.note,
        )
        ctx.projector.record(alt, work_model(alt, s.kind), s, timing.median_ms / 1e3, True)
        if s.kind == "blocks":
            row["io_bytes"] = self.io_bytes
        if alt == "onnxruntime":
            row["note"] = (row["note"] + "; " if row["note"] else "") + (
                f"intra_op_num_threads={ctx.threads}"
            )
        if self._carries_state():
            # As in the runner: the first call from a fresh state, not the
            # last of however many calls were timed.
            first = self._build(alt)()
            output = first.numpy() if torch.is_tensor(first) else np.asarray(first)
        if alt == "eager":
            self.reference = np.ascontiguousarray(output)
            self.reference_name = "eager"
        self._check(row, output)
        return row
