"""``python -m rustconv.inspect model.pte [--json]``: what the runtime will do.

For every RustConvBackend delegate call of every method, it lists the fused
kernels in execution order, the model's ops each absorbed, the algorithm the
runtime chose on this machine, the arena's size and every stored value's
offset and lifetime, and the state the delegate keeps across calls. The
plan comes from the Rust runtime itself (``rustconv_inspect_plan`` in
``librustconv_backend.so``), built by the code
``init`` runs, so it is exactly what loading the program would do here.
"""

from __future__ import annotations

import argparse
import ctypes
import json
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rustconv.backend_id import BACKEND_ID

__all__ = ["DelegateCall", "delegate_calls", "plan_blob", "main"]


@dataclass(frozen=True)
class DelegateCall:
    """One RustConvBackend delegate call of a program."""

    method: str
    index: int
    blob: bytes
    compile_specs: list[tuple[str, bytes]]


def delegate_calls(pte: bytes) -> list[DelegateCall]:
    """The RustConvBackend delegate calls of a serialized program, in order."""
    from executorch.exir._serialize._program import deserialize_pte_binary
    from executorch.exir.schema import DataLocation

    program = deserialize_pte_binary(pte).program
    calls = []
    for plan in program.execution_plan:
        index = 0
        for delegate in plan.delegates:
            if delegate.id != BACKEND_ID:
                continue
            processed = delegate.processed
            if processed.location != DataLocation.INLINE:
                raise ValueError(
                    f"{plan.name}: delegate data at {processed.location} is not supported"
                )
            blob = bytes(program.backend_delegate_data[processed.index].data)
            specs = [(spec.key, bytes(spec.value)) for spec in delegate.compile_specs]
            calls.append(DelegateCall(plan.name, index, blob, specs))
            index += 1
    return calls


def _library() -> ctypes.CDLL:
    import rustconv.runtime as runtime

    lib = ctypes.CDLL(str(runtime.library_path()))
    lib.rustconv_inspect_plan.restype = ctypes.c_void_p
    lib.rustconv_inspect_plan.argtypes = [
        ctypes.c_char_p,
        ctypes.c_size_t,
        ctypes.c_char_p,
        ctypes.c_size_t,
    ]
    lib.rustconv_free_string.argtypes = [ctypes.c_void_p]
    return lib


def plan_blob(blob: bytes, compile_specs: list[tuple[str, bytes]] = ()) -> dict[str, Any]:
    """The runtime's plan for one delegate blob, as a dict (see inspect.rs).

    Raises ``ValueError`` with the runtime's message for a blob it refuses.
    """
    lib = _library()
    specs = json.dumps([[key, value.hex()] for key, value in compile_specs]).encode()
    raw = lib.rustconv_inspect_plan(blob, len(blob), specs, len(specs))
    if not raw:
        raise RuntimeError("rustconv_inspect_plan returned no document")
    try:
        doc = json.loads(ctypes.string_at(raw).decode())
    finally:
        lib.rustconv_free_string(raw)
    if "error" in doc:
        raise ValueError(doc["error"])
    return doc["plan"]


def _mib(n: int) -> str:
    return f"{n / (1 << 20):.2f} MiB" if n >= 1 << 16 else f"{n} B"


def _format(call: DelegateCall, plan: dict[str, Any]) -> str:
    shared = plan["shared_scratch_bytes"]
    lines = [
        f"{call.method}: RustConvBackend call {call.index}: {len(plan['kernels'])} fused "
        f"kernel(s), arena {_mib(plan['arena_bytes'])}, scratch "
        f"{_mib(plan['scratch_bytes_per_thread'])} per thread x {plan['threads']} thread(s)"
        + (f" + {_mib(shared)} shared" if shared else "")
    ]
    for position, kernel in enumerate(plan["kernels"]):
        fusion = f" ({kernel['fusion']})" if kernel["fusion"] else ""
        lines.append(f"  [{position}] kernel {kernel['kernel']}: {kernel['algorithm']}{fusion}")
        ops = ", ".join(f"{op['op']} {op['name']}" for op in kernel["absorbed"])
        lines.append(f"      absorbs {len(kernel['absorbed'])} op(s): {ops}")
        lines.append(
            f"      reads {', '.join(kernel['reads']) or '-'}; "
            f"writes {', '.join(kernel['writes']) or '-'}"
        )
    stored = [v for v in plan["values"] if v["location"] == "arena"]
    if stored:
        lines.append("  arena:")
        for v in sorted(stored, key=lambda v: v["arena_offset"]):
            first, last = v["lifetime"]
            lines.append(
                f"    {v['arena_offset']:>10}  {_mib(v['bytes']):>10}  kernels {first}..{last}  "
                f"{v['name']} [{', '.join(v['dims'])}] {v['dtype']}"
            )
    states = [v for v in plan["values"] if v["location"] == "state"]
    if states:
        lines.append(
            f"  state kept across calls: {_mib(plan['state_bytes'])} "
            "(and as much again for its initial value, restored by reset_state)"
        )
        for v in states:
            lines.append(
                f"    {_mib(v['bytes']):>10}  {v['name']} [{', '.join(v['dims'])}] {v['dtype']}"
            )
    virtual = sum(1 for v in plan["values"] if v["location"] == "virtual")
    lines.append(f"  {virtual} value(s) computed in the kernels' loops, never stored")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m rustconv.inspect", description=__doc__)
    parser.add_argument("pte", type=Path, help="the .pte program to inspect")
    parser.add_argument("--json", action="store_true", help="print the plans as JSON")
    args = parser.parse_args(argv)
    try:
        calls = delegate_calls(args.pte.read_bytes())
    except OSError as e:
        print(f"rustconv.inspect: error: {e}", file=sys.stderr)
        return 1
    results = []
    for call in calls:
        try:
            plan = plan_blob(call.blob, call.compile_specs)
        except ValueError as e:
            print(f"rustconv.inspect: error: {call.method} call {call.index}: {e}", file=sys.stderr)
            return 1
        results.append((call, plan))
    if args.json:
        doc = [{"method": c.method, "call": c.index, "plan": p} for c, p in results]
        print(json.dumps(doc, indent=2))
    elif not results:
        print(f"{args.pte}: no RustConvBackend delegate calls")
    else:
        print("\n\n".join(_format(c, p) for c, p in results))
    return 0


if __name__ == "__main__":
    sys.exit(main())
