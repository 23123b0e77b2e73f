"""Interleaved rounds: each alternative of a setting (at one thread count) is
measured once per round, the alternatives in turn (A B C, A B C, ...), and
the round with the lowest median is the row reported.

This machine's noise comes in episodes of seconds in which everything runs
1.3-1.7x slower (a throttled VM, other sessions' work). Measured one after
the other, two alternatives fall in different episodes and their ratio flips
by chance; interleaved, each gets R chances at a quiet moment, and since
throttling only ever slows a run down, the least disturbed round (the lowest
median) is the closest to the machine's speed. Every round's median is kept
in the row (``round_medians_ms``) with their ``spread`` (max / min), so a
reader sees which ratios are within the noise measured.

Only timing picks the round. What must hold in every round does: the
largest output error of any round, the largest peak memory and the first
non-ok status of any round are the row's (an error in one round is never
hidden by another round that passed).
"""

from __future__ import annotations

import math

#: Default rounds per setting kind: three for the blocks, decode steps and
#: the zoo, whose goals are ratios near 1 (at least as fast as XNNPACK,
#: within 5%) that a single throttled episode flips; one for the conv and
#: scan matrix, whose goals sit far from the noise (1.5x and 3x) and whose
#: full run already takes 18 minutes. ``--rounds`` sets every kind.
DEFAULT_ROUNDS = {"conv": 1, "scan": 1, "blocks": 3, "zoo": 3}


def rounds_for(kind: str, rounds: int | None) -> int:
    return rounds if rounds is not None else DEFAULT_ROUNDS.get(kind, 1)


def repeatable(rows: list[dict], budget_s: float) -> bool:
    """Whether an alternative's first-round rows are measured again in later
    rounds: only when every row is a timed run that finished (errors, DNF,
    n/a and computed rows stand as they are) and its calls are no longer
    than the whole budget (one call only, over the budget or the time limit,
    stays one call: later rounds would multiply the run's time)."""
    return bool(rows) and all(
        row["status"] == "ok"
        and row.get("median_ms") is not None
        and row.get("iters") is not None
        and row["median_ms"] <= budget_s * 1e3
        for row in rows
    )


def merge(rounds: list[list[dict]]) -> list[dict]:
    """One alternative's rows from each round (``rounds[k]``: round k's rows,
    one per alternative name, ``candidates`` giving several) -> one row per
    alternative name: the round with the lowest median, with
    ``round_medians_ms`` (every round's median, None where it had none),
    ``rounds`` (how many rounds ran) and ``spread`` (max / min of the round
    medians). The largest ``max_abs_err`` and ``peak_mib`` of any round and
    the first non-ok status are kept; a plan that chose differently in two
    rounds is noted."""
    if len(rounds) == 1:
        return [
            dict(row, rounds=1, round_medians_ms=[row.get("median_ms")], spread=None)
            for row in rounds[0]
        ]
    by_name: dict[str, list[dict]] = {}  # in the first round's order
    for rows in rounds:
        for row in rows:
            by_name.setdefault(row["alternative"], []).append(row)
    merged = []
    for runs in by_name.values():
        timed = [row for row in runs if row["status"] == "ok" and row.get("median_ms")]
        row = dict(min(timed, key=lambda r: r["median_ms"]) if timed else runs[0])
        medians = [r.get("median_ms") for r in runs]
        finished = [m for m in medians if m]
        row["rounds"] = len(runs)
        row["round_medians_ms"] = medians
        row["spread"] = max(finished) / min(finished) if len(finished) > 1 else None
        notes = [row.get("note") or ""]
        failed = next(((k, r) for k, r in enumerate(runs) if r["status"] != "ok"), None)
        if failed is not None and row["status"] == "ok":
            k, bad = failed
            row["status"] = bad["status"]
            notes += [f"round {k + 1} of {len(runs)}: {bad['status']}", bad.get("note") or ""]
        checked = [r for r in runs if r.get("max_abs_err") is not None]
        if checked:
            worst = max(checked, key=lambda r: _error_rank(r["max_abs_err"]))
            row["max_abs_err"], row["reference"] = worst["max_abs_err"], worst.get("reference")
        peaks = [r["peak_mib"] for r in runs if r.get("peak_mib") is not None]
        row["peak_mib"] = max(peaks) if peaks else None
        chosen = sorted({r["chosen_kernel"] for r in runs if r.get("chosen_kernel")})
        if len(chosen) > 1:
            notes.append(f"plans differ between rounds: {', '.join(chosen)}")
        row["note"] = "; ".join(dict.fromkeys(n for n in notes if n))
        merged.append(row)
    return merged


def _error_rank(err: float) -> float:
    """NaN (a broken output) ranks above every finite error."""
    return math.inf if math.isnan(err) else err
