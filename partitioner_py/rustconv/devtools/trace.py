"""Reading RustConv's profiling events back from an ETDump.

With an event tracer attached (``pte_runner -etdump_path``, or any runtime
built with ETDump), the RustConv delegate reports one event per fused kernel
per call, identified by the kernel's index (``Node.kernel``, the key of the
debug-handle map ``preprocess`` returned), with metadata
``algorithm=...;bytes=...;flops=...`` (``delegate/src/profiling.rs``).
``executorch.devtools.Inspector`` shows them under each RustConv
``DELEGATE_CALL``; given the ETRecord saved at export, with the model's
original ops (``op_types``). :func:`parse_delegate_metadata` is the
Inspector's ``delegate_metadata_parser`` for them; :func:`read_profile`
gathers the whole trace per delegate call and kernel, which
``python -m rustconv.profile`` reports.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rustconv.backend_id import BACKEND_ID

__all__ = [
    "BACKEND_ID",
    "CallProfile",
    "KernelProfile",
    "lower_with_etrecord",
    "OpProfile",
    "Profile",
    "parse_delegate_metadata",
    "read_profile",
]

_INT_KEYS = ("bytes", "flops")


def parse_delegate_metadata(metadatas: list[bytes | str]) -> dict[str, list[Any]]:
    """Parses a RustConv kernel event's metadata, one entry per iteration.

    Returns ``{"algorithm": [...], "bytes": [...], "flops": [...]}`` (lists in
    iteration order; ``flops`` holds None where a kernel has none, as
    elementwise passes). Pass it to ``Inspector(delegate_metadata_parser=...)``.
    """
    parsed: dict[str, list[Any]] = {"algorithm": [], "bytes": [], "flops": []}
    for raw in metadatas:
        text = raw.decode("ascii") if isinstance(raw, bytes | bytearray) else str(raw)
        fields = dict(part.split("=", 1) for part in text.split(";") if "=" in part)
        parsed["algorithm"].append(fields.get("algorithm"))
        for key in _INT_KEYS:
            parsed[key].append(int(fields[key]) if key in fields else None)
    return parsed


@dataclass
class KernelProfile:
    """One RustConv fused kernel of one delegate call, over the iterations."""

    kernel: int
    times_ms: list[float]
    op_types: list[str]
    algorithm: str | None
    bytes: list[int | None]
    flops: list[int | None]


@dataclass
class CallProfile:
    """One delegate call (``DELEGATE_CALL``) of the method, over the iterations."""

    index: int
    backend: str
    instruction_id: int | None
    times_ms: list[float]
    op_types: list[str]
    #: RustConv's fused kernels (empty for other backends).
    kernels: list[KernelProfile] = field(default_factory=list)
    #: Other backends' own events inside the call (e.g. XNNPACK operators).
    inner: list[OpProfile] = field(default_factory=list)


@dataclass
class OpProfile:
    """An event outside RustConv: a non-delegated op, or another delegate's op."""

    name: str
    times_ms: list[float]
    op_types: list[str]


@dataclass
class Profile:
    """A method's trace: its total time and what ran inside it, in order."""

    method_ms: list[float]
    calls: list[CallProfile]
    ops: list[OpProfile]
    #: Execution order of `calls` and `ops`: ("call", i) or ("op", i).
    order: list[tuple[str, int]]

    def drop_first(self, n: int) -> None:
        """Drops the first ``n`` iterations of every event (warm-up runs)."""
        if n <= 0:
            return
        self.method_ms = self.method_ms[n:]
        for call in self.calls:
            call.times_ms = call.times_ms[n:]
            for k in call.kernels:
                k.times_ms, k.bytes, k.flops = k.times_ms[n:], k.bytes[n:], k.flops[n:]
            for inner in call.inner:
                inner.times_ms = inner.times_ms[n:]
        for op in self.ops:
            op.times_ms = op.times_ms[n:]


def read_profile(etdump: str | Path, etrecord: str | Path | None = None) -> Profile:
    """Reads an ETDump (and optionally the ETRecord saved at export) into a
    :class:`Profile`. Only the ``Execute`` event blocks are read."""
    import warnings

    from executorch.devtools import Inspector

    with warnings.catch_warnings():
        # "Output Buffer not found": no intermediate outputs were traced.
        warnings.simplefilter("ignore", UserWarning)
        inspector = Inspector(
            etdump_path=str(etdump),
            etrecord=str(etrecord) if etrecord is not None else None,
            delegate_metadata_parser=parse_delegate_metadata,
        )
    method_ms: list[float] = []
    calls: list[CallProfile] = []
    ops: list[OpProfile] = []
    order: list[tuple[str, int]] = []
    for block in inspector.event_blocks:
        if block.name != "Execute":
            continue
        pending: list[Any] = []  # delegated events precede their DELEGATE_CALL
        for event in block.events:
            times = list(event.perf_data.raw) if event.perf_data is not None else []
            if event.name == "Method::execute":
                method_ms = times
            elif event.is_delegated_op:
                pending.append(event)
            elif event.name == "DELEGATE_CALL":
                backend = event.delegate_backend_name or ""
                call = CallProfile(
                    index=len(calls),
                    backend=backend,
                    instruction_id=event._instruction_id,
                    times_ms=times,
                    op_types=list(event.op_types),
                )
                for inner in pending:
                    if (
                        inner._instruction_id is not None
                        and event._instruction_id is not None
                        and inner._instruction_id != event._instruction_id
                    ):
                        continue
                    inner_times = list(inner.perf_data.raw) if inner.perf_data else []
                    meta = inner.delegate_debug_metadatas
                    algorithms = [a for a in (meta or {}).get("algorithm", []) if a is not None]
                    # Without an ETRecord the Inspector names no backend: our
                    # kernels are the events whose metadata names an algorithm.
                    ours = backend == BACKEND_ID or (not backend and algorithms)
                    if ours and isinstance(inner.delegate_debug_identifier, int):
                        call.backend = BACKEND_ID
                        call.kernels.append(
                            KernelProfile(
                                kernel=inner.delegate_debug_identifier,
                                times_ms=inner_times,
                                op_types=list(inner.op_types),
                                algorithm=algorithms[0] if algorithms else None,
                                bytes=meta["bytes"],
                                flops=meta["flops"],
                            )
                        )
                    else:
                        call.inner.append(
                            OpProfile(str(inner.name), inner_times, list(inner.op_types))
                        )
                pending = []
                call.kernels.sort(key=lambda k: k.kernel)
                order.append(("call", len(calls)))
                calls.append(call)
            else:
                order.append(("op", len(ops)))
                ops.append(OpProfile(str(event.name), times, list(event.op_types)))
    return Profile(method_ms=method_ms, calls=calls, ops=ops, order=order)


def lower_with_etrecord(
    exported_program,
    partitioners: list,
    pte_path: str | Path,
    etrecord_path: str | Path,
):
    """Lowers ``exported_program`` with ``partitioners`` (RustConv first, as
    usual), writes the ``.pte`` and the ETRecord the Inspector needs to name
    the model's ops under each kernel; returns the ExecuTorch program."""
    from executorch.exir import to_edge_transform_and_lower

    edge = to_edge_transform_and_lower(
        exported_program, partitioner=partitioners, generate_etrecord=True
    )
    program = edge.to_executorch()
    Path(pte_path).write_bytes(program.buffer)
    program.get_etrecord().save(str(etrecord_path))
    return program
