"""The benchmark's settings, the models they export, their inputs, and the
byte and flop counts that the roofline and the projections use.

Two workloads (batch 1, C channels, length N):

* ``conv``: causal depthwise conv1d, ``F.pad(x, (K-1, 0))`` then
  ``nn.Conv1d(C, C, K, groups=C, bias=False)``; x [1,C,N], weight [C,1,K].
* ``scan``: ``torch.ops.rustconv.linear_scan(x0 [1,C], a [1,C,N], u [1,C,N])``.
* ``blocks`` (only when asked): the reference blocks of ``rustconv.examples.blocks``
  (LFM2's short convolution, Hyena, a diagonal SSM, a conv stack) at the
  issue's sizes, ``C`` being the block's width and ``N`` its length.
* ``decode`` (only when asked): one-token calls with state carried across
  calls (a state buffer the call reads and updates): a depthwise conv step
  and a scan step at C in {1024, 2048, 4096}, the LFM2 short conv (between
  its projections, and whole) at 1024 and 2048, the streaming SSM at 2048.
  They run as blocks (``N`` = 1, the machinery and goals of blocks).
* ``zoo`` (only when asked): whole upstream models from tests/zoo
  (bench/zoo.py), ``block`` naming the model and ``size`` "full" (their
  real widths) or "small" (the tests' sizes).

Inputs and weights are drawn from a ``torch.Generator`` seeded from the
setting, so every run (and every cached .pte) sees the same numbers.
"""

from __future__ import annotations

import hashlib
import math
from dataclasses import dataclass
from itertools import product

import numpy as np
import rustconv  # noqa: F401  (registers torch.ops.rustconv.linear_scan)
import torch
import torch.nn.functional as F

FULL_C = (512, 2048)
FULL_N = (64, 256, 1024, 2048, 4096, 16384, 65536)
FULL_K = ("4", "32", "128", "N")  # "N": the filter is as long as the sequence

#: The quick subset: one channel count, two lengths, a short and a long
#: filter, and the scan at the same shapes (4 conv + 2 scan settings).
QUICK_C = (512,)
QUICK_N = (1024, 4096)
QUICK_K = ("4", "128")

KINDS = ("conv", "scan", "blocks", "decode", "zoo")
#: What runs when no workload is named: blocks run only when asked for.
DEFAULT_KINDS = ("conv", "scan")

#: The blocks workload: name -> (rustconv.examples.blocks class, width C, length N) at
#: the issue's sizes. ``C=``/``N=`` filters replace both for every block.
BLOCKS = {
    "lfm2_hf_core": ("Lfm2ShortConvHFCore", 1024, 2048),
    "lfm2_example_core": ("Lfm2ShortConvExampleCore", 1024, 2048),
    "lfm2_hf": ("Lfm2ShortConvHF", 1024, 2048),
    "lfm2_example": ("Lfm2ShortConvExample", 1024, 2048),
    "hyena": ("HyenaLongConv", 512, 8192),
    "ssm": ("DiagonalSSM", 2048, 4096),
    "conv_stack": ("ConvStack", 250, 4096),
}
#: The decode workload: name -> (class, widths C), one token (N = 1) per
#: call. Classes are ``rustconv.examples.blocks``' or this module's (the steps).
DECODE_BLOCKS = {
    "decode_conv": ("CausalDepthwiseConvStreaming", (1024, 2048, 4096)),
    "decode_scan": ("ScanStep", (1024, 2048, 4096)),
    "decode_lfm2_core": ("Lfm2ShortConvExampleCore", (1024, 2048)),
    "decode_lfm2": ("Lfm2ShortConvExample", (1024, 2048)),
    "decode_ssm": ("SsmStep", (2048,)),
    "decode_conv_stack": ("ConvStackStep", (250,)),
}
DECODE_K = 4  # the conv step's filter
#: A zoo model's work for the projections, which only guard against calls
#: over the time limit: a nominal GFLOP (a second a thread at the prior
#: rate). The timed calls are planned from a probe call instead
#: (SettingBench.run_in_runner).
ZOO_NOMINAL_FLOPS = 1e9
CONV_STACK_K, CONV_STACK_LAYERS, LFM2_K = 11, 12, 3
BYTES_PER_ELEMENT = 4  # float32


@dataclass(frozen=True, order=True)
class Setting:
    kind: str  # "conv", "scan" or "blocks"
    C: int
    N: int
    K: int | None = None  # conv only: the actual filter length
    K_label: str | None = None  # conv only: "4", "32", "128" or "N"
    block: str | None = None  # blocks only: a key of BLOCKS; zoo: the model
    size: str | None = None  # zoo only: "full" or "small"

    @property
    def group(self) -> str:
        """What projections scale within: the workload, or the block."""
        if self.kind in ("blocks", "zoo"):
            return f"{self.kind}:{self.block}"
        return self.kind

    @property
    def name(self) -> str:
        if self.kind == "zoo":
            return f"{self.block}" + (" (small)" if self.size == "small" else "")
        if self.kind == "blocks":
            return f"{self.block} C={self.C} N={self.N}"
        if self.kind == "scan":
            return f"scan C={self.C} N={self.N}"
        return f"conv C={self.C} N={self.N} K={self.K_label_text}"

    @property
    def K_label_text(self) -> str:
        return f"N={self.K}" if self.K_label == "N" else str(self.K)

    @property
    def slug(self) -> str:
        if self.kind == "zoo":
            return f"zoo_{self.block.replace(':', '_')}_{self.size}"
        if self.kind == "blocks":
            return f"blocks_{self.block}_C{self.C}_N{self.N}"
        if self.kind == "scan":
            return f"scan_C{self.C}_N{self.N}"
        return f"conv_C{self.C}_N{self.N}_K{self.K}"

    # Sizes in bytes -------------------------------------------------------
    @property
    def input_bytes(self) -> int:
        if self.kind == "zoo":
            return 0  # whole models: no byte model (projections use a nominal work)
        if self.kind == "blocks":
            one = self.C * self.N * BYTES_PER_ELEMENT
            if self.block == "decode_scan":
                return 2 * one
            single = (
                "lfm2_hf",
                "lfm2_example",
                "conv_stack",
                "decode_conv",
                "decode_lfm2",
                "decode_conv_stack",
            )
            return one if self.block in single else 3 * one
        if self.kind == "scan":
            return (2 * self.C * self.N + self.C) * BYTES_PER_ELEMENT
        return self.C * self.N * BYTES_PER_ELEMENT

    @property
    def output_bytes(self) -> int:
        return self.C * self.N * BYTES_PER_ELEMENT  # 0 for zoo settings (C = N = 0)

    @property
    def weight_bytes(self) -> int:
        if self.kind == "zoo":
            return 0
        if self.kind == "blocks":
            return block_weight_elements(self.block, self.C, self.N) * BYTES_PER_ELEMENT
        return self.C * self.K * BYTES_PER_ELEMENT if self.kind == "conv" else 0

    @property
    def block_flops(self) -> float:
        """Blocks: a direct definition's flops (linears, convs as written,
        ~10 per element for the rest); what the projections scale by."""
        if self.kind == "zoo":
            return ZOO_NOMINAL_FLOPS
        c, n = self.C, self.N
        elementwise = 10.0 * c * n
        return {
            "lfm2_hf_core": 2 * c * n * LFM2_K + elementwise,
            "lfm2_example_core": 2 * c * n * LFM2_K + elementwise,
            "lfm2_hf": 2 * n * c * 4 * c + 2 * c * n * LFM2_K + elementwise,
            "lfm2_example": 2 * n * c * 4 * c + 2 * c * n * LFM2_K + elementwise,
            "hyena": 2.0 * c * n * n + elementwise,
            "ssm": 2 * elementwise,
            "conv_stack": 2.0 * CONV_STACK_LAYERS * c * c * CONV_STACK_K * n,
            "decode_conv": 2 * c * n * DECODE_K,
            "decode_scan": 2 * c * n,
            "decode_lfm2_core": 2 * c * n * LFM2_K + elementwise,
            "decode_lfm2": 2 * n * c * 4 * c + 2 * c * n * LFM2_K + elementwise,
            "decode_ssm": 2 * elementwise,
            "decode_conv_stack": 2.0 * CONV_STACK_LAYERS * c * c * CONV_STACK_K * n,
        }[self.block]

    @property
    def roofline_bytes(self) -> int:
        """Bytes that must move: conv reads x and w and writes y; the scan
        reads a, u and x0 and writes y."""
        return self.input_bytes + self.weight_bytes + self.output_bytes

    @property
    def direct_flops(self) -> int:
        """2*C*N*K: the direct definition's multiply-adds (conv only)."""
        return 2 * self.C * self.N * self.K if self.kind == "conv" else 0

    @property
    def fft_size(self) -> int:
        """Linear-convolution FFT length: next fast size >= N + K - 1."""
        return next_fast_len(self.N + (self.K or 1) - 1)

    def key(self, seed: int) -> str:
        """Stable name for cached inputs and programs of this setting."""
        return f"{self.slug}_seed{seed}"


def next_fast_len(n: int) -> int:
    """Smallest 2^a 3^b 5^c 7^d >= n (sizes pocketfft and MKL handle fast)."""
    best = 1 << max(0, (n - 1).bit_length())
    p7 = 1
    while p7 < best:
        p5 = p7
        while p5 < best:
            p3 = p5
            while p3 < best:
                m = p3
                while m < n:
                    m *= 2
                best = min(best, m)
                p3 *= 3
            p5 *= 5
        p7 *= 7
    return best


def block_weight_elements(block: str, c: int, n: int) -> int:
    """Parameters and buffers of a block (float32 elements)."""
    return {
        "lfm2_hf_core": c * LFM2_K,
        "lfm2_example_core": c * LFM2_K + c * (LFM2_K - 1),
        "lfm2_hf": c * LFM2_K + 4 * c * c,
        "lfm2_example": c * LFM2_K + c * (LFM2_K - 1) + 4 * c * c,
        "hyena": c * n + c,
        "ssm": 2 * c,
        "conv_stack": CONV_STACK_LAYERS * (c * c * CONV_STACK_K + c),
        "decode_conv": c * DECODE_K + c * (DECODE_K - 1),
        "decode_scan": c,
        "decode_lfm2_core": c * LFM2_K + c * (LFM2_K - 1),
        "decode_lfm2": c * LFM2_K + c * (LFM2_K - 1) + 4 * c * c,
        "decode_ssm": 2 * c,
        "decode_conv_stack": CONV_STACK_LAYERS * (c * c * CONV_STACK_K + c * CONV_STACK_K),
    }[block]


def make_settings(
    kinds: tuple[str, ...],
    cs: tuple[int, ...],
    ns: tuple[int, ...],
    ks: tuple[str, ...],
    blocks: tuple[str, ...] = tuple(BLOCKS),
    block_c: tuple[int, ...] | None = None,
    block_n: tuple[int, ...] | None = None,
    decode: tuple[str, ...] = tuple(DECODE_BLOCKS),
    zoo: tuple[str, ...] = (),
    zoo_size: str = "full",
) -> list[Setting]:
    """The product of the given values, deduplicated, small work first (so
    projections of large settings can use measured smaller ones). Blocks run
    at their own sizes unless ``block_c``/``block_n`` replace them; decode
    steps (run as blocks) likewise, at N = 1."""
    settings = set()
    for kind in kinds:
        if kind == "zoo":
            settings.update(Setting("zoo", 0, 0, block=b, size=zoo_size) for b in zoo)
            continue
        if kind == "decode":
            for b in decode:
                for c, n in product(block_c or DECODE_BLOCKS[b][1], block_n or (1,)):
                    settings.add(Setting("blocks", c, n, block=b))
            continue
        if kind == "blocks":
            for b in blocks:
                _, c0, n0 = BLOCKS[b]
                for c, n in product(block_c or (c0,), block_n or (n0,)):
                    settings.add(Setting("blocks", c, n, block=b))
            continue
        if kind == "scan":
            settings.update(Setting("scan", c, n) for c, n in product(cs, ns))
            continue
        for c, n, k in product(cs, ns, ks):
            settings.add(Setting("conv", c, n, n if k == "N" else int(k), k))
    # Two labels for one filter length (K=N=64 and K=64) are one setting.
    unique = {}
    for s in sorted(settings, key=lambda s: s.K_label != "N"):
        unique.setdefault((s.kind, s.C, s.N, s.K, s.block), s)
    blocks_order = list(BLOCKS) + list(DECODE_BLOCKS) + list(zoo)
    return sorted(
        unique.values(),
        key=lambda s: (
            KINDS.index(s.kind),
            blocks_order.index(s.block) if s.block else 0,
            s.C * s.N * (s.K or 1),
            s.N,
            s.C,
        ),
    )


# Models ------------------------------------------------------------------------


class CausalDepthwiseConv(torch.nn.Module):
    def __init__(self, weight: torch.Tensor):
        super().__init__()
        channels, _, k = weight.shape
        self.k = k
        self.conv = torch.nn.Conv1d(channels, channels, k, groups=channels, bias=False)
        with torch.no_grad():
            self.conv.weight.copy_(weight)

    def forward(self, x):
        return self.conv(F.pad(x, (self.k - 1, 0)))


class LinearScan(torch.nn.Module):
    def forward(self, x0, a, u):
        return torch.ops.rustconv.linear_scan(x0, a, u)


@dataclass
class SettingData:
    """A setting's inputs (in model input order) and, for conv, its weight."""

    setting: Setting
    inputs: list[np.ndarray]
    weight: np.ndarray | None
    module_seed: int = 0  # blocks: the seed their parameters are drawn from
    zoo: object = None  # zoo: the bench.zoo.ZooCase

    def model(self) -> torch.nn.Module:
        """A fresh module each call (blocks with state start from zero state;
        a zoo model is built once)."""
        if self.setting.kind == "zoo":
            return self.zoo.module
        if self.setting.kind == "blocks":
            return make_block(self.setting, self.module_seed)
        if self.setting.kind == "scan":
            return LinearScan().eval()
        return CausalDepthwiseConv(torch.from_numpy(self.weight)).eval()

    def torch_inputs(self) -> tuple[torch.Tensor, ...]:
        if self.setting.kind == "zoo":
            return tuple(self.zoo.inputs)
        return tuple(torch.from_numpy(a) for a in self.inputs)

    def io_bytes(self) -> int:
        """The bytes a block must read and write once: its inputs, its output
        (C*N floats for every block), its parameters and buffers once, and
        its state buffers (persistent buffers, updated in place) once more."""
        s = self.setting
        model = self.model()
        total = sum(a.nbytes for a in self.inputs) + s.C * s.N * BYTES_PER_ELEMENT
        total += sum(p.numel() * p.element_size() for p in model.parameters())
        persistent = set(model.state_dict())
        for name, b in model.named_buffers():
            total += b.numel() * b.element_size() * (2 if name in persistent else 1)
        return total


class ScanStep(torch.nn.Module):
    """A linear scan from a state buffer, its last step copied back."""

    def __init__(self, c: int):
        super().__init__()
        self.register_buffer("state", torch.zeros(1, c))

    def forward(self, a, u):
        h = torch.ops.rustconv.linear_scan(self.state, a, u)
        with torch.no_grad():
            self.state.copy_(h[:, :, -1])
        return h

    def make_inputs(self, seq: int = 1, seed: int = 0) -> tuple[torch.Tensor, ...]:
        # Decays below 1/4: every alternative, whatever its number of calls
        # with the same input, has reached the same state (to 1e-5).
        gen = torch.Generator().manual_seed(seed)
        c = self.state.shape[1]
        return (
            torch.rand(1, c, seq, generator=gen) / 4,
            torch.randn(1, c, seq, generator=gen),
        )


def _conv_stack_step(c: int) -> torch.nn.Module:
    """The conv stack block's layers, causal and streaming (each layer's last
    ``K - 1`` inputs in a state buffer): a speech model's trunk decoding one
    frame at a time."""
    from rustconv.examples import blocks

    return blocks.CausalConvStackStreaming(c, CONV_STACK_K, CONV_STACK_LAYERS)


def _ssm_step(c: int) -> torch.nn.Module:
    from rustconv.examples import blocks

    class SsmStep(blocks.DiagonalSSMStreaming):
        """The streaming SSM with ``p`` shifted by +4 (``dt`` about 4, decays
        below ``exp(-2)``), so repeated calls with one input settle."""

        def make_inputs(self, seq: int = 1, seed: int = 0, dtype=torch.float32):
            p, x, z = super().make_inputs(seq=seq, seed=seed, dtype=dtype)
            return (p + 4.0, x, z)

    return SsmStep(c)


def make_block(setting: Setting, seed: int) -> torch.nn.Module:
    from rustconv.examples import blocks

    if setting.block in DECODE_BLOCKS:
        cls_name = DECODE_BLOCKS[setting.block][0]
        with torch.random.fork_rng():
            torch.manual_seed(seed)
            if cls_name == "SsmStep":
                return _ssm_step(setting.C).eval()
            if cls_name == "ConvStackStep":
                return _conv_stack_step(setting.C).eval()
            if cls_name == "CausalDepthwiseConvStreaming":
                return blocks.CausalDepthwiseConvStreaming(setting.C, DECODE_K).eval()
            cls = globals().get(cls_name) or getattr(blocks, cls_name)
            return cls(setting.C).eval()
    cls_name, _, _ = BLOCKS[setting.block]
    cls = getattr(blocks, cls_name)
    with torch.random.fork_rng():
        torch.manual_seed(seed)
        if setting.block == "hyena":
            return cls(setting.C, setting.N).eval()
        if setting.block == "conv_stack":
            return cls(setting.C, CONV_STACK_K, CONV_STACK_LAYERS).eval()
        return cls(setting.C).eval()


def _seed_for(setting: Setting, seed: int) -> int:
    digest = hashlib.sha256(f"{setting.slug}/{seed}".encode()).digest()
    return int.from_bytes(digest[:8], "little") & ((1 << 63) - 1)


def make_data(setting: Setting, seed: int) -> SettingData:
    """Random inputs with O(1) outputs so 1e-3 absolute error is meaningful:
    conv x ~ N(0,1) and w ~ U(-1/sqrt(K), 1/sqrt(K)) (nn.Conv1d's own init
    range); scan x0, u ~ N(0,1) and decays a ~ U(0, 1) (a stable recurrence)."""
    gen = torch.Generator().manual_seed(_seed_for(setting, seed))
    c, n = setting.C, setting.N
    if setting.kind == "zoo":
        # The zoo's own seeds: the tests' inputs and weights.
        from bench import zoo

        case = zoo.case(setting.block, setting.size == "full")
        arrays = [t.contiguous().numpy() for t in case.inputs]
        return SettingData(setting, arrays, None, zoo=case)
    if setting.kind == "blocks":
        # Parameters: the modules' own initialisation (O(1) outputs); inputs:
        # the block's make_inputs, N(0,1).
        module_seed = _seed_for(setting, seed) % (1 << 31)
        model = make_block(setting, module_seed)
        if setting.block == "hyena":
            inputs = model.make_inputs(seed=module_seed)
        else:
            inputs = model.make_inputs(seq=n, seed=module_seed)
        arrays = [t.contiguous().numpy() for t in inputs]
        return SettingData(setting, arrays, None, module_seed)
    if setting.kind == "scan":
        x0 = torch.randn(1, c, generator=gen)
        a = torch.rand(1, c, n, generator=gen)
        u = torch.randn(1, c, n, generator=gen)
        return SettingData(setting, [x0.numpy(), a.numpy(), u.numpy()], None)
    x = torch.randn(1, c, n, generator=gen)
    bound = 1.0 / math.sqrt(setting.K)
    w = (torch.rand(c, 1, setting.K, generator=gen) * 2 - 1) * bound
    return SettingData(setting, [x.numpy()], w.numpy())
