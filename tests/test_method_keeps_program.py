"""A method keeps its program alive: ``import rustconv.runtime`` makes every
``executorch.runtime`` ``Method`` hold its ``Program``. In ExecuTorch 1.5.1 a
method is freed with its program, so the one-expression form
``Runtime.get().load_program(path).load_method("forward")`` (the README's
example, and ExecuTorch's) returned a method whose ``execute`` read freed
memory: the segfault in ``Method::inputs_size`` reported for transformers'
LFM2 model (its wrong output was the fed-weight bug), or garbage, depending
on what reused the memory, for any program, delegated or not."""

import gc
import weakref

import torch
from executorch.exir import to_edge
from executorch.runtime import Runtime
from rustconv import RustConvPartitioner
from torch.export import export


def test_a_method_keeps_its_program_alive_and_runs(tmp_path):
    torch.manual_seed(0)
    model = torch.nn.Sequential(
        torch.nn.Conv1d(16, 16, 3, padding=1, groups=16), torch.nn.Conv1d(16, 8, 1)
    ).eval()
    x = torch.randn(1, 16, 64)
    buffer = to_edge(export(model, (x,))).to_backend(RustConvPartitioner()).to_executorch().buffer
    pte = tmp_path / "m.pte"
    pte.write_bytes(buffer)
    with torch.no_grad():
        want = model(x)
    for source in (str(pte), bytes(buffer)):
        program = Runtime.get().load_program(source)
        alive = weakref.ref(program)
        method = program.load_method("forward")
        del program
        gc.collect()
        assert alive() is not None, "the method's program was collected"
        # Memory a freed program would have left behind, reused.
        junk = [bytearray(b"\xff" * 65536) for _ in range(1000)]
        for _ in range(2):
            got = method.execute([x])[0]
            assert (got - want).abs().max().item() < 1e-4
        del junk
        del method
        gc.collect()
        assert alive() is None, "the program outlived its last method"
