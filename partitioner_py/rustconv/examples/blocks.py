"""Reference blocks built around 1-D convolutions and linear scans.

Each module is a faithful, readable rendition of a block found in real
sequence models; the tests lower them with :class:`rustconv.RustConvPartitioner`
and compare against eager, and the benchmark times them. Every block has a
``make_inputs(...)`` helper returning example inputs (a tuple) in the order
``forward`` takes them, and, where the sequence length may vary, a
``dynamic_shapes(...)`` helper for ``torch.export.export``.

Layouts follow the originals: the LFM2 short convolutions take
``[batch, seq, dim]`` (the projections' layout) and transpose to
``[batch, dim, seq]`` around the convolution; the others are written directly
in the convolution layout ``[batch, channels, seq]``.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn
from torch.export import Dim

import rustconv.ops  # noqa: F401  (registers torch.ops.rustconv.linear_scan)

__all__ = [
    "Lfm2ShortConvExample",
    "Lfm2ShortConvExampleCore",
    "Lfm2ShortConvHF",
    "Lfm2ShortConvHFCore",
    "HyenaLongConv",
    "DiagonalSSM",
    "DiagonalSSMStreaming",
    "ConvStack",
    "CausalConvStackStreaming",
    "CausalDepthwiseConvStreaming",
    "Lfm2LikeLM",
    "generate",
    "seq_dim",
]


def seq_dim(max_len: int = 1024, min_len: int = 4) -> Dim:
    # Streaming blocks use min_len=1: one method serves prefill (N tokens)
    # and decode (one token), so the state stays in one set of delegates.
    """The ``Dim`` the blocks' ``dynamic_shapes`` use for the sequence length."""
    return Dim("seq", min=min_len, max=max_len)


def _randn(shape: tuple[int, ...], seed: int, dtype: torch.dtype) -> torch.Tensor:
    gen = torch.Generator().manual_seed(seed)
    return torch.randn(shape, generator=gen).to(dtype)


class Lfm2ShortConvExampleCore(nn.Module):
    """LFM2's gated short convolution between its projections, ExecuTorch's form.

    What :class:`Lfm2ShortConvExample` computes between ``B_proj``/``C_proj``/
    ``x_proj`` and ``out_proj``, i.e. the part RustConv runs while the linears
    go to another backend: ``forward(B, C, x)`` takes the three projected
    tensors ``[1, seq, dim]`` and returns ``y [1, seq, dim]``.

    Follows ``examples/models/lfm2/short_conv.py`` in the executorch repository
    (``ShortConv.forward``): ``Bx = B * x``, the convolution state prepended
    with ``torch.cat`` instead of padding, the state updated in place from the
    last ``k - 1`` steps, an unpadded depthwise convolution, ``C * conv_out``.
    The state is a registered buffer ``conv_state [1, dim, k - 1]``; in an
    exported program it is a mutated buffer (ExecuTorch copies the new value
    back after the call). Batch size 1, as in the original.
    """

    def __init__(self, dim: int, k: int = 3) -> None:
        super().__init__()
        if k < 2:
            raise ValueError(f"k must be at least 2 (the state holds k - 1 steps), got {k}")
        self.dim, self.k = dim, k
        self.conv = nn.Conv1d(dim, dim, kernel_size=k, padding=0, groups=dim, bias=False)
        self.register_buffer("conv_state", torch.zeros(1, dim, k - 1))

    def forward(self, B: torch.Tensor, C: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
        B = B.transpose(-1, -2)  # [1, dim, seq]
        C = C.transpose(-1, -2)
        x = x.transpose(-1, -2)

        Bx = B * x
        Bx = torch.cat([self.conv_state, Bx], dim=-1)  # [1, dim, seq + k - 1]
        new_conv_state = Bx[..., -(self.k - 1) :]
        with torch.no_grad():
            self.conv_state.copy_(new_conv_state)

        conv_out = self.conv(Bx)[..., : x.size(-1)]  # [1, dim, seq]
        y = C * conv_out
        return y.transpose(-1, -2).contiguous()  # [1, seq, dim]

    def reset_cache(self) -> None:
        self.conv_state.zero_()

    def make_inputs(
        self, seq: int = 16, seed: int = 0, dtype: torch.dtype = torch.float32
    ) -> tuple[torch.Tensor, ...]:
        return tuple(_randn((1, seq, self.dim), seed + i, dtype) for i in range(3))

    def dynamic_shapes(self, seq: Dim | None = None) -> tuple:
        seq = seq or seq_dim()
        return ({1: seq}, {1: seq}, {1: seq})


class Lfm2ShortConvExample(Lfm2ShortConvExampleCore):
    """The whole ExecuTorch LFM2 ``ShortConv``: projections around the core.

    Three separate ``Linear(dim, dim, bias=False)`` projections (the example
    notes they run faster in ExecuTorch than one fused projection), the
    :class:`Lfm2ShortConvExampleCore` computation, and ``out_proj``.
    ``forward(x)`` maps ``[1, seq, dim]`` to ``[1, seq, dim]``.
    """

    def __init__(self, dim: int, k: int = 3) -> None:
        super().__init__(dim, k)
        self.B_proj = nn.Linear(dim, dim, bias=False)
        self.C_proj = nn.Linear(dim, dim, bias=False)
        self.x_proj = nn.Linear(dim, dim, bias=False)
        self.out_proj = nn.Linear(dim, dim, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # type: ignore[override]
        y = super().forward(self.B_proj(x), self.C_proj(x), self.x_proj(x))
        return self.out_proj(y)

    def make_inputs(
        self, seq: int = 16, seed: int = 0, dtype: torch.dtype = torch.float32
    ) -> tuple[torch.Tensor, ...]:
        return (_randn((1, seq, self.dim), seed, dtype),)

    def dynamic_shapes(self, seq: Dim | None = None) -> tuple:
        return ({1: seq or seq_dim()},)


class Lfm2ShortConvHFCore(nn.Module):
    """LFM2's gated short convolution between its projections, transformers' form.

    Follows ``Lfm2ShortConv.slow_forward`` (``transformers/models/lfm2/
    modeling_lfm2.py``) without a cache, from the ``in_proj`` output
    ``[1, seq, 3 * dim]`` to the ``out_proj`` input ``[1, seq, dim]``:
    transpose, chunk into ``B, C, x``, ``Bx = B * x``, a depthwise convolution
    padded by ``k - 1`` on both sides and cut back to the sequence length (a
    causal convolution), ``C * conv_out``, transpose back.
    """

    def __init__(self, dim: int, k: int = 3) -> None:
        super().__init__()
        self.dim, self.k = dim, k
        self.conv = nn.Conv1d(dim, dim, kernel_size=k, groups=dim, bias=False, padding=k - 1)

    def forward(self, BCx: torch.Tensor) -> torch.Tensor:
        seqlen = BCx.shape[1]
        B, C, x = BCx.transpose(-1, -2).chunk(3, dim=-2)
        Bx = B * x
        conv_out = self.conv(Bx)[..., :seqlen]
        y = C * conv_out
        return y.transpose(-1, -2).contiguous()

    def make_inputs(
        self, seq: int = 16, seed: int = 0, dtype: torch.dtype = torch.float32
    ) -> tuple[torch.Tensor, ...]:
        return (_randn((1, seq, 3 * self.dim), seed, dtype),)

    def dynamic_shapes(self, seq: Dim | None = None) -> tuple:
        return ({1: seq or seq_dim()},)


class Lfm2ShortConvHF(Lfm2ShortConvHFCore):
    """The whole transformers ``Lfm2ShortConv`` (no cache): ``in_proj`` to
    ``3 * dim``, the :class:`Lfm2ShortConvHFCore` computation, ``out_proj``.
    ``forward(x)`` maps ``[1, seq, dim]`` to ``[1, seq, dim]``."""

    def __init__(self, dim: int, k: int = 3) -> None:
        super().__init__(dim, k)
        self.in_proj = nn.Linear(dim, 3 * dim, bias=False)
        self.out_proj = nn.Linear(dim, dim, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.out_proj(super().forward(self.in_proj(x)))

    def make_inputs(
        self, seq: int = 16, seed: int = 0, dtype: torch.dtype = torch.float32
    ) -> tuple[torch.Tensor, ...]:
        return (_randn((1, seq, self.dim), seed, dtype),)


class HyenaLongConv(nn.Module):
    """Hyena's gated long convolution, with a filter as long as the sequence.

    ``u = v * x`` is convolved causally with a per-channel filter of length
    ``n`` (``F.pad`` by ``n - 1`` on the left, then a depthwise ``Conv1d``),
    plus the per-channel skip ``D * u``; the sum is gated by ``gate`` and goes
    through GELU. Inputs ``x, v, gate`` are ``[1, dim, n]``; the filter length
    fixes the sequence length, so the block is static.
    """

    def __init__(self, dim: int, n: int) -> None:
        super().__init__()
        self.dim, self.n = dim, n
        self.filter = nn.Conv1d(dim, dim, kernel_size=n, groups=dim, bias=False)
        self.D = nn.Parameter(torch.randn(dim, 1))

    def forward(self, x: torch.Tensor, v: torch.Tensor, gate: torch.Tensor) -> torch.Tensor:
        u = v * x
        y = self.filter(F.pad(u, (self.n - 1, 0))) + self.D * u
        return F.gelu(y * gate)

    def make_inputs(
        self, seed: int = 0, dtype: torch.dtype = torch.float32
    ) -> tuple[torch.Tensor, ...]:
        return tuple(_randn((1, self.dim, self.n), seed + i, dtype) for i in range(3))


class DiagonalSSM(nn.Module):
    """A diagonal selective state-space layer (Mamba-style discretisation).

    ``dt = softplus(p)`` is the per-step time scale, ``a = exp(-dt * A)`` the
    decay (``A > 0`` per channel, a ``[dim, 1]`` parameter), ``u = dt * x`` the
    input; the linear recurrence ``h[t] = a[t] * h[t-1] + u[t]`` from a zero
    state is ``rustconv.linear_scan``, and the output is gated by ``silu(z)``.
    The zero initial state is a buffer (a constant of the program), so the
    scan's ``x0`` needs no op outside the delegate.

    Inputs ``p, x, z`` are ``[1, dim, seq]``.
    """

    def __init__(self, dim: int) -> None:
        super().__init__()
        self.dim = dim
        self.A = nn.Parameter(torch.linspace(0.5, 2.0, dim).reshape(dim, 1))
        self.register_buffer("x0", torch.zeros(1, dim), persistent=False)

    def forward(self, p: torch.Tensor, x: torch.Tensor, z: torch.Tensor) -> torch.Tensor:
        dt = F.softplus(p)
        a = torch.exp(-dt * self.A)
        u = dt * x
        y = torch.ops.rustconv.linear_scan(self.x0, a, u)
        return y * F.silu(z)

    def make_inputs(
        self, seq: int = 16, seed: int = 0, dtype: torch.dtype = torch.float32
    ) -> tuple[torch.Tensor, ...]:
        return tuple(_randn((1, self.dim, seq), seed + i, dtype) for i in range(3))

    def dynamic_shapes(self, seq: Dim | None = None) -> tuple:
        seq = seq or seq_dim()
        return ({2: seq}, {2: seq}, {2: seq})


class ConvStack(nn.Module):
    """``layers`` same-padded ``Conv1d(c, c, k)`` + ReLU pairs (a plain CNN trunk).

    Input ``[1, c, seq]``; ``k`` should be odd so each layer keeps the length.
    """

    def __init__(self, c: int, k: int, layers: int = 12) -> None:
        super().__init__()
        self.c = c
        self.layers = nn.Sequential(
            *(m for _ in range(layers) for m in (nn.Conv1d(c, c, k, padding=k // 2), nn.ReLU()))
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.layers(x)

    def make_inputs(
        self, seq: int = 32, seed: int = 0, dtype: torch.dtype = torch.float32
    ) -> tuple[torch.Tensor, ...]:
        return (_randn((1, self.c, seq), seed, dtype),)

    def dynamic_shapes(self, seq: Dim | None = None) -> tuple:
        return ({2: seq or seq_dim()},)


class DiagonalSSMStreaming(DiagonalSSM):
    """:class:`DiagonalSSM` that carries its state across calls.

    The scan starts from a registered buffer ``state [1, dim]`` and the last
    step of the (ungated) recurrence is copied back into it, so a sequence fed
    in pieces (a prefill, then one token at a time) gives the same outputs as
    fed whole. Exported, ``state`` is a mutated buffer the RustConv delegate
    owns. ``reset_cache()`` zeroes it.
    """

    def __init__(self, dim: int) -> None:
        super().__init__(dim)
        del self.x0
        self.register_buffer("state", torch.zeros(1, dim))

    def forward(self, p: torch.Tensor, x: torch.Tensor, z: torch.Tensor) -> torch.Tensor:
        dt = F.softplus(p)
        a = torch.exp(-dt * self.A)
        u = dt * x
        h = torch.ops.rustconv.linear_scan(self.state, a, u)
        with torch.no_grad():
            self.state.copy_(h[:, :, -1])
        return h * F.silu(z)

    def reset_cache(self) -> None:
        self.state.zero_()


class CausalConvStackStreaming(nn.Module):
    """A stack of causal ``Conv1d(c, c, k)`` + ReLU layers that stream.

    Each layer keeps its last ``k - 1`` inputs in a registered buffer
    ``state{i} [1, c, k - 1]`` and prepends them with ``torch.cat`` (the LFM2
    example's pattern, for a dense convolution): a sequence fed in pieces
    gives the outputs of the whole sequence left-padded with zeros. Input
    ``[1, c, seq]``. ``reset_cache()`` zeroes the states.
    """

    def __init__(self, c: int, k: int = 3, layers: int = 3) -> None:
        super().__init__()
        if k < 2:
            raise ValueError(f"k must be at least 2, got {k}")
        self.c, self.k = c, k
        self.convs = nn.ModuleList(nn.Conv1d(c, c, k) for _ in range(layers))
        for i in range(layers):
            self.register_buffer(f"state{i}", torch.zeros(1, c, k - 1))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for i, conv in enumerate(self.convs):
            state = getattr(self, f"state{i}")
            xs = torch.cat([state, x], dim=-1)
            with torch.no_grad():
                state.copy_(xs[..., -(self.k - 1) :])
            x = F.relu(conv(xs))
        return x

    def reset_cache(self) -> None:
        for i in range(len(self.convs)):
            getattr(self, f"state{i}").zero_()

    def make_inputs(
        self, seq: int = 16, seed: int = 0, dtype: torch.dtype = torch.float32
    ) -> tuple[torch.Tensor, ...]:
        return (_randn((1, self.c, seq), seed, dtype),)

    def dynamic_shapes(self, seq: Dim | None = None) -> tuple:
        return ({2: seq or seq_dim()},)


class CausalDepthwiseConvStreaming(nn.Module):
    """A causal depthwise ``Conv1d(c, c, k, groups=c)`` that streams: its last
    ``k - 1`` inputs in a registered buffer ``state [1, c, k - 1]`` (zero at
    first) prepended with ``torch.cat`` (LFM2's pattern, no gating). Input
    ``[1, c, seq]``; a decode step is ``seq`` = 1."""

    def __init__(self, c: int, k: int = 4) -> None:
        super().__init__()
        self.k = k
        self.conv = nn.Conv1d(c, c, k, groups=c, bias=False)
        self.register_buffer("state", torch.zeros(1, c, k - 1))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        xs = torch.cat([self.state, x], dim=-1)
        with torch.no_grad():
            self.state.copy_(xs[..., -(self.k - 1) :])
        return self.conv(xs)

    def make_inputs(
        self, seq: int = 1, seed: int = 0, dtype: torch.dtype = torch.float32
    ) -> tuple[torch.Tensor, ...]:
        return (_randn((1, self.conv.in_channels, seq), seed, dtype),)


class _RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float = 1e-5) -> None:
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps) * self.weight


class _WindowAttention(nn.Module):
    """Causal multi-head attention over a KV cache of the last ``window`` steps.

    The cache slides: the new keys and values are appended with ``torch.cat``
    and the last ``window`` kept (``copy_`` into the buffers), with a buffer
    ``valid`` marking filled slots, so a call of any length exports without
    data-dependent indexing. Exact as long as the sequence fits the window.
    """

    def __init__(self, dim: int, heads: int, window: int) -> None:
        super().__init__()
        self.heads, self.head_dim, self.window = heads, dim // heads, window
        self.qkv = nn.Linear(dim, 3 * dim, bias=False)
        self.out = nn.Linear(dim, dim, bias=False)
        self.register_buffer("k_cache", torch.zeros(1, heads, window, self.head_dim))
        self.register_buffer("v_cache", torch.zeros(1, heads, window, self.head_dim))
        self.register_buffer("valid", torch.zeros(1, 1, 1, window))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        n = x.shape[1]
        q, k, v = self.qkv(x).view(1, n, 3, self.heads, self.head_dim).permute(2, 0, 3, 1, 4)
        keys = torch.cat([self.k_cache, k], dim=2)[:, :, -self.window :]
        values = torch.cat([self.v_cache, v], dim=2)[:, :, -self.window :]
        valid = torch.cat([self.valid, torch.ones_like(self.valid[..., :1]).expand(1, 1, 1, n)], -1)
        valid = valid[..., -self.window :]
        with torch.no_grad():
            self.k_cache.copy_(keys)
            self.v_cache.copy_(values)
            self.valid.copy_(valid)
        # Query i (of n) sits at slot window - n + i: it sees slots up to there.
        slot = torch.arange(self.window).view(1, -1)
        own = (self.window - n + torch.arange(n)).view(-1, 1)
        allowed = (slot <= own) & (valid[0, 0] > 0)
        scores = q @ keys.transpose(-1, -2) / self.head_dim**0.5
        scores = scores.masked_fill(~allowed, float("-inf"))
        y = torch.softmax(scores, dim=-1) @ values
        return self.out(y.transpose(1, 2).reshape(1, n, -1))

    def reset_cache(self) -> None:
        self.k_cache.zero_()
        self.v_cache.zero_()
        self.valid.zero_()


class Lfm2LikeLM(nn.Module):
    """A small LFM2-like language model for generation tests (random weights).

    Embedding, then layers alternating as in LFM2: gated short-conv blocks
    (:class:`Lfm2ShortConvExample`, ExecuTorch's form with its ``conv_state``)
    and attention blocks (:class:`_WindowAttention`), each pre-normed
    (RMSNorm) with a residual and a SwiGLU feed-forward, then a final norm
    and the LM head. ``forward(tokens [1, n]) -> logits [1, n, vocab]``
    continues from the state left by the previous call: a prompt of any
    length, then one token at a time. ``reset_cache()`` starts over.
    """

    def __init__(
        self,
        vocab: int = 64,
        dim: int = 64,
        layers: str = "ccacca",
        heads: int = 4,
        window: int = 64,
    ) -> None:
        super().__init__()
        self.vocab, self.window = vocab, window
        self.embed = nn.Embedding(vocab, dim)
        self.kinds = layers
        self.mixers = nn.ModuleList(
            Lfm2ShortConvExample(dim) if kind == "c" else _WindowAttention(dim, heads, window)
            for kind in layers
        )
        self.norms = nn.ModuleList(_RMSNorm(dim) for _ in layers)
        self.ff_norms = nn.ModuleList(_RMSNorm(dim) for _ in layers)
        self.ff = nn.ModuleList(
            nn.ModuleDict(
                {
                    "w1": nn.Linear(dim, 2 * dim, bias=False),
                    "w3": nn.Linear(dim, 2 * dim, bias=False),
                    "w2": nn.Linear(2 * dim, dim, bias=False),
                }
            )
            for _ in layers
        )
        self.norm = _RMSNorm(dim)
        self.head = nn.Linear(dim, vocab, bias=False)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        h = self.embed(tokens)
        layers = zip(self.mixers, self.norms, self.ff_norms, self.ff, strict=True)
        for mixer, norm, ff_norm, ff in layers:
            h = h + mixer(norm(h))
            g = ff_norm(h)
            h = h + ff["w2"](F.silu(ff["w1"](g)) * ff["w3"](g))
        return self.head(self.norm(h))

    def reset_cache(self) -> None:
        for mixer in self.mixers:
            mixer.reset_cache()

    def make_inputs(self, seq: int = 8, seed: int = 0) -> tuple[torch.Tensor, ...]:
        gen = torch.Generator().manual_seed(seed)
        return (torch.randint(0, self.vocab, (1, seq), generator=gen),)

    def dynamic_shapes(self, seq: Dim | None = None) -> tuple:
        return ({1: seq or seq_dim(self.window, min_len=1)},)

    @staticmethod
    def mutable_buffers() -> list[str]:
        """Buffers ExecuTorch must initialise (not delegate-owned): the
        attention caches (see ``InitializedMutableBufferPass``)."""
        return ["k_cache", "v_cache", "valid"]


def generate(step, prompt: torch.Tensor, new_tokens: int) -> tuple[list[int], list[torch.Tensor]]:
    """Greedy generation: ``step(tokens) -> logits`` on the prompt (the
    prefill), then on each new token. Returns the tokens and each call's
    last logits."""
    logits = step(prompt)[:, -1]
    tokens, all_logits = [], [logits]
    for _ in range(new_tokens):
        token = int(logits.argmax(-1))
        tokens.append(token)
        logits = step(torch.tensor([[token]]))[:, -1]
        all_logits.append(logits)
    return tokens, all_logits
