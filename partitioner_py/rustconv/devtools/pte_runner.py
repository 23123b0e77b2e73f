"""Running ``pte_runner`` and reading what it prints: the one driver.

``python -m rustconv.profile``, profile-guided partitioning
(:mod:`rustconv.guided`: the runs here and the script written for the
target) and the benchmark (``bench/measure.py``) all build the runner's
flags with :func:`runner_args`, start it with :func:`run` and parse its
output with :func:`parse_latency`, :func:`parse_peak_mib` and
:func:`parse_plan_lines`, so a flag or an output line changes in one place.
The runner's own flags and output are described in the README (pte_runner).
"""

from __future__ import annotations

import os
import re
import subprocess
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from rustconv import native

__all__ = [
    "WARMUP",
    "Latency",
    "PlanLine",
    "RunnerError",
    "RunnerTimeout",
    "command",
    "parse_latency",
    "parse_peak_mib",
    "parse_plan_lines",
    "run",
    "run_pte",
    "runner_args",
]

#: Untimed iterations before the timed ones in a profiled run.
WARMUP = 2


class RunnerError(RuntimeError):
    """pte_runner failed (its exit status and last error line), or printed
    less than the caller reads."""


class RunnerTimeout(RunnerError):
    def __init__(self, seconds: float):
        super().__init__(f"timed out after {seconds:.0f} s")
        self.seconds = seconds


def command() -> list[str]:
    """How to start pte_runner here (:func:`rustconv.native.pte_runner_command`)."""
    return native.pte_runner_command()


def runner_args(
    pte: Path | str,
    *,
    iters: int,
    warmup: int,
    threads: int | None = None,
    inputs: Path | str | None = None,
    steps: Sequence[Path | str] | None = None,
    outputs: Path | str | None = None,
    etdump: Path | str | None = None,
    extra: Sequence[str] = (),
) -> list[str]:
    """pte_runner's flags: ``iters`` timed iterations after ``warmup`` untimed
    ones; inputs from the npz ``inputs``, or with ``steps`` one call per npz
    in that order, state carried (``-steps_npz_paths``); outputs written to
    ``outputs``; a trace to ``etdump``; then ``extra`` flags. Paths are
    written as given (the target's script passes ones with shell variables)."""
    args = ["-model_path", str(pte)]
    if steps:
        args += ["-steps_npz_paths", ",".join(map(str, steps))]
    elif inputs is not None:
        args += ["-inputs_npz_path", str(inputs)]
    if outputs is not None:
        args += ["-output_npz_path", str(outputs)]
    args += ["-iter", str(iters), "-warmup", str(warmup)]
    if etdump is not None:
        args += ["-etdump_path", str(etdump)]
    if threads is not None:
        args.append(f"-num_threads={threads}")
    return [*args, *extra]


def run(
    args: Sequence[str],
    *,
    runner: Sequence[str] | None = None,
    timeout_s: float | None = None,
    env: dict[str, str] | None = None,
) -> subprocess.CompletedProcess[str]:
    """Runs pte_runner (``runner``, else :func:`command`) with ``args``;
    ``env``: more environment variables. Raises :class:`RunnerError` with
    its exit status and last error line if it fails, :class:`RunnerTimeout`
    after ``timeout_s``."""
    cmd = [*(runner if runner is not None else command()), *args]
    try:
        done = subprocess.run(
            cmd,
            capture_output=True,
            text=True,
            timeout=timeout_s,
            env={**os.environ, **env} if env else None,
        )
    except subprocess.TimeoutExpired as e:
        raise RunnerTimeout(timeout_s or 0.0) from e
    if done.returncode != 0:
        text = done.stderr + done.stdout
        lines = [ln for ln in text.splitlines() if "error" in ln.lower()]
        last = (lines or text.strip().splitlines() or ["no output"])[-1]
        raise RunnerError(f"pte_runner exit {done.returncode}: {last.strip()}")
    return done


def run_pte(
    pte: Path,
    etdump: Path,
    inputs: Path | None = None,
    iters: int = 20,
    threads: int | None = None,
    warmup: int = 0,
) -> str:
    """Runs ``pte`` writing the trace ``etdump``; returns the runner's
    output. The ETDump holds the warm-up iterations too (first)."""
    return run(
        runner_args(pte, iters=iters, warmup=warmup, threads=threads, inputs=inputs, etdump=etdump)
    ).stdout


_LATENCY = re.compile(
    r"latency:\s*p10\s+([\d.]+)\s*ms,\s*p50\s+([\d.]+)\s*ms,\s*p90\s+([\d.]+)\s*ms,"
    r"\s*min\s+([\d.]+)\s*ms"
)
_PEAK = re.compile(r"peak memory:\s*([\d.]+)\s*MiB above the inputs")
_PLAN = re.compile(r"plan:\s*node\s+(\d+)\s+'([^']*)'\s+(\S+)\s*->\s*([\w-]+)\s*(?:\((.*)\))?")
_NUMBER = r"[-+]?(?:\d+\.?\d*(?:[eE][-+]?\d+)?|inf|nan)"


@dataclass
class Latency:
    """pte_runner's latency line: percentiles by nearest rank over the timed calls."""

    p10_ms: float
    p50_ms: float
    p90_ms: float
    min_ms: float


def parse_latency(stdout: str) -> Latency | None:
    m = _LATENCY.search(stdout)
    return Latency(*(float(g) for g in m.groups())) if m else None


def parse_peak_mib(stdout: str) -> float | None:
    """The memory running the program added above its inputs, in MiB."""
    m = _PEAK.search(stdout)
    return float(m.group(1)) if m else None


@dataclass
class PlanLine:
    """One ``RustConvBackend: plan: ...`` line: the kernel chosen for a node
    and the cost model's per-candidate estimates in ms."""

    node: int
    name: str
    op: str
    chosen: str
    estimates_ms: dict[str, float] = field(default_factory=dict)
    prepared_mib: float | None = None


def parse_plan_lines(text: str) -> list[PlanLine]:
    """Parses every plan line; tolerant of prefixes and missing parts."""
    plans = []
    for line in text.splitlines():
        m = _PLAN.search(line)
        if not m:
            continue
        plan = PlanLine(int(m.group(1)), m.group(2), m.group(3), m.group(4))
        details = m.group(5) or ""
        for part in details.split(";"):
            part = part.strip()
            est = re.match(r"estimated\s+ms\s*:\s*(.*)", part)
            if est:
                for item in est.group(1).split(","):
                    kv = re.match(rf"\s*([\w-]+)\s*[:=]?\s*({_NUMBER})\s*$", item)
                    if kv:
                        plan.estimates_ms[kv.group(1)] = float(kv.group(2))
            prep = re.match(rf"prepared\s+({_NUMBER})\s*MiB", part)
            if prep:
                plan.prepared_mib = float(prep.group(1))
        plans.append(plan)
    return plans
