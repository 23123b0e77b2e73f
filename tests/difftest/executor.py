"""``executorch.runtime`` in a child process, so a crash is a result, not the end.

The issue that started this harness saw a segfault inside ``execute``; one
such crash must not end a long run. The child (``python -m
difftest.executor``) loads ``rustconv.runtime`` once and then runs programs
sent over a pipe; if it dies (a signal, an abort) or hangs, the parent
reports ``crash``/``timeout`` for that program and starts a new child for the
next. Messages are length-prefixed pickles on the child's stdin and on a
duplicate of its stdout; its own stdout goes to stderr, so nothing the
runtime prints can corrupt them.
"""

from __future__ import annotations

import os
import pickle
import selectors
import struct
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np

__all__ = ["Executor"]

_HEADER = struct.Struct("<Q")


def _send(stream: Any, obj: Any) -> None:
    data = pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL)
    stream.write(_HEADER.pack(len(data)))
    stream.write(data)
    stream.flush()


def _read_exact(stream: Any, n: int) -> bytes:
    chunks = []
    while n:
        chunk = stream.read(n)
        if not chunk:
            raise EOFError
        chunks.append(chunk)
        n -= len(chunk)
    return b"".join(chunks)


def _recv(stream: Any) -> Any:
    (n,) = _HEADER.unpack(_read_exact(stream, _HEADER.size))
    return pickle.loads(_read_exact(stream, n))


def _serve() -> None:
    out = os.fdopen(os.dup(1), "wb")
    os.dup2(2, 1)  # whatever the runtime prints goes to stderr
    stdin = sys.stdin.buffer
    import rustconv.runtime  # noqa: F401  (registers RustConvBackend)
    import torch
    from executorch.runtime import Runtime

    runtime = Runtime.get()
    _send(out, "ready")
    while True:
        try:
            message = _recv(stdin)
        except EOFError:
            return
        if message is None:
            return
        path, calls = message
        try:
            method = runtime.load_program(path).load_method("forward")
            outputs = []
            for inputs in calls:
                # np.ascontiguousarray would make a 0-d array 1-d.
                tensors = [torch.from_numpy(np.require(a, requirements="C")) for a in inputs]
                result = method.execute(tensors)
                outputs.append([r.detach().numpy().copy() for r in result])
            del method
            _send(out, ("ok", outputs))
        except Exception as e:  # noqa: BLE001  (the error is the result)
            _send(out, ("error", f"{type(e).__name__}: {e}"))


class Executor:
    """Runs a .pte's calls in order in one loaded method (state carries over)."""

    def __init__(self) -> None:
        self._proc: subprocess.Popen | None = None

    def _start(self) -> None:
        here = Path(__file__).resolve().parent.parent
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join(
            [str(here), str(here.parent / "partitioner_py"), env.get("PYTHONPATH", "")]
        )
        self._proc = subprocess.Popen(
            [sys.executable, "-m", "difftest.executor"],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            env=env,
        )
        if self._wait(300) is None or _recv(self._proc.stdout) != "ready":
            raise RuntimeError("the executorch.runtime child did not start")

    def _wait(self, timeout: float) -> bool | None:
        assert self._proc is not None
        with selectors.DefaultSelector() as sel:
            sel.register(self._proc.stdout, selectors.EVENT_READ)
            return bool(sel.select(timeout)) or None

    def run(self, path: str, calls: list[list[np.ndarray]], timeout: float = 120.0):
        """("ok", outputs per call) | ("error" | "crash" | "timeout", message)."""
        if self._proc is None or self._proc.poll() is not None:
            self._start()
        assert self._proc is not None
        try:
            _send(self._proc.stdin, (str(path), calls))
            if self._wait(timeout) is None:
                self._kill()
                return "timeout", f"executorch.runtime: no result after {timeout:.0f} s"
            return _recv(self._proc.stdout)
        except (EOFError, BrokenPipeError, ConnectionResetError):
            code = self._proc.wait(10)
            self._proc = None
            return "crash", f"executorch.runtime process died (exit code {code})"

    def _kill(self) -> None:
        if self._proc is not None:
            self._proc.kill()
            self._proc.wait(10)
            self._proc = None

    def close(self) -> None:
        if self._proc is None:
            return
        try:
            _send(self._proc.stdin, None)
            self._proc.wait(10)
        except (BrokenPipeError, OSError, subprocess.TimeoutExpired):
            self._kill()
        self._proc = None


if __name__ == "__main__":
    _serve()
