"""The registry of issue 28's layers: one row per layer (or configuration), each built in
easyad and in torch 2.13.0 with the same weights.

``tests/test_nn_matrix.py`` is generated from it: one test per row and transform. A row's
``build(dtype)`` returns ``(ours, theirs)``: an easyad Module and a torch Module whose
``state_dict`` names agree, torch's weights (seeded, then redrawn from a normal so that
LayerNorm's ones and zeros, BatchNorm's unit running variance... are not special points)
loaded into ours. Both are wrapped so that ``module(x)`` returns one array: ``select`` picks
it from what the layer returns (an LSTM's output sequence, an LSTMCell's ``h + c``...).

``raises`` lists the transforms a row cannot run, each with the exception it must raise
and the reason: the matrix checks that the call raises exactly that, clearly, so a cell
is either validated or a checked refusal, never skipped.

The residual rows are ResNet's BasicBlock, written as a torch user writes it (a Module
whose forward adds the shortcut); docs/nn.md shows the same class.
"""
from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

import numpy as np
import torch
from torch.nn.attention import SDPBackend, sdpa_kernel

from easyad import nn
from easyad.nn import functional as F

TORCH_DTYPE = {np.float64: torch.float64, np.float32: torch.float32}
# torch's fused multi-head attention (its eval-mode fast path) has no forward-mode derivative
torch.backends.mha.set_fastpath_enabled(False)


class Wrapped(nn.Module):
    """An easyad layer as a function of one array: ``select(inner(x))``."""

    def __init__(self, inner: nn.Module, select: Callable[[Any], Any]) -> None:
        self.inner, self.select = inner, select

    def __call__(self, x: Any, tape: Any = None) -> Any:
        # the inner layer converts data itself (Embedding's indices stay integers)
        return self.select(self.inner(x) if tape is None else self.inner(x, tape=tape))


class TorchWrapped(torch.nn.Module):
    def __init__(self, inner: torch.nn.Module, select: Callable[[Any], Any]) -> None:
        super().__init__()
        self.inner, self.select = inner, select

    def forward(self, x: Any) -> Any:
        return self.select(self.inner(x))


class BasicBlock(nn.Module):
    """ResNet's basic block: two 3x3 convolutions with batch norm, the input added back
    (through a 1x1 convolution and batch norm when the shape changes)."""

    def __init__(self, cin: int, cout: int, stride: int = 1, dtype: Any = None) -> None:
        self.conv1 = nn.Conv2d(cin, cout, 3, stride=stride, padding=1, bias=False, dtype=dtype)
        self.bn1 = nn.BatchNorm2d(cout, dtype=dtype)
        self.conv2 = nn.Conv2d(cout, cout, 3, padding=1, bias=False, dtype=dtype)
        self.bn2 = nn.BatchNorm2d(cout, dtype=dtype)
        self.shortcut = nn.Identity() if stride == 1 and cin == cout else nn.Sequential(
            nn.Conv2d(cin, cout, 1, stride=stride, bias=False, dtype=dtype),
            nn.BatchNorm2d(cout, dtype=dtype))

    def forward(self, x: Any, tape: Any = None) -> Any:
        out = F.relu(self.bn1(self.conv1(x, tape)))
        out = self.bn2(self.conv2(out))
        return F.relu(out + self.shortcut(x, tape))


class TorchBasicBlock(torch.nn.Module):
    def __init__(self, cin: int, cout: int, stride: int = 1, dtype: Any = None) -> None:
        super().__init__()
        tn = torch.nn
        self.conv1 = tn.Conv2d(cin, cout, 3, stride=stride, padding=1, bias=False, dtype=dtype)
        self.bn1 = tn.BatchNorm2d(cout, dtype=dtype)
        self.conv2 = tn.Conv2d(cout, cout, 3, padding=1, bias=False, dtype=dtype)
        self.bn2 = tn.BatchNorm2d(cout, dtype=dtype)
        self.shortcut = tn.Identity() if stride == 1 and cin == cout else tn.Sequential(
            tn.Conv2d(cin, cout, 1, stride=stride, bias=False, dtype=dtype),
            tn.BatchNorm2d(cout, dtype=dtype))

    def forward(self, x: Any) -> Any:
        out = torch.relu(self.bn1(self.conv1(x)))
        out = self.bn2(self.conv2(out))
        return torch.relu(out + self.shortcut(x))


@dataclasses.dataclass(frozen=True)
class Row:
    name: str
    ours: Callable[[Any], Any]           # dtype -> the easyad layer (its own init)
    theirs: Callable[[Any], Any]         # torch dtype -> the torch layer
    shape: tuple[int, ...]               # the input's shape (uniform in (-1, 1))
    select: Callable[[Any], Any] = lambda y: y     # the one array of the layer's result
    integer: int = 0                     # > 0: the input is indices below this (Embedding)
    train: bool = False                  # in training mode (batch statistics)
    # transform -> (exception, a regex of its message, why): the transform raises that
    raises: dict[str, tuple[type, str, str]] = dataclasses.field(default_factory=dict)
    torch_vmap: bool = True              # torch.func.vmap batches the layer (else a loop)
    # transform -> reason: a known bug of easyad's, run as a strict expected failure
    xfail: dict[str, str] = dataclasses.field(default_factory=dict)
    # torch's jvp disagrees with its own gradient (see the row): the jvp is checked
    # against <torch's gradient, v> instead
    jvp_from_grad: str = ""

    def build(self, dtype: Any) -> tuple[nn.Module, torch.nn.Module]:
        torch.manual_seed(sum(map(ord, self.name)))
        theirs = TorchWrapped(self.theirs(TORCH_DTYPE[dtype]), self.select)
        with torch.no_grad():
            for p in theirs.parameters():
                p.copy_(0.5 * torch.randn_like(p))
            for name, b in theirs.named_buffers():
                if name.endswith("running_mean"):
                    b.copy_(0.3 * torch.randn_like(b))
                elif name.endswith("running_var"):
                    b.copy_(0.5 + torch.rand_like(b))
        ours = Wrapped(self.ours(dtype), self.select)
        state = {k: v.detach().numpy() for k, v in theirs.state_dict().items()}
        # in training mode torch's reference keeps no running statistics (torch.func
        # refuses their in-place update); ours keeps them, which must not change the output
        ours.load_state_dict(state, strict=not self.train)
        if not self.train:
            assert sorted(ours.state_dict()) == sorted(state), (self.name, list(state))
        ours.train(self.train)
        theirs.train(self.train)
        return ours, theirs


ROWS: list[Row] = []


def _add(*rows: Row) -> None:
    ROWS.extend(rows)


def _same(ours_cls: Any, torch_cls: Any, *args: Any, typed: bool = True, **kw: Any
          ) -> tuple[Callable[[Any], Any], Callable[[Any], Any]]:
    """Both builders of a layer that takes the same arguments in easyad and torch."""
    if not typed:
        return lambda dt: ours_cls(*args, **kw), lambda dt: torch_cls(*args, **kw)
    return (lambda dt: ours_cls(*args, dtype=dt, **kw),
            lambda dt: torch_cls(*args, dtype=dt, **kw))


T = torch.nn
# (exception, what its message must say, why)
_VMAP_BN = (ValueError, "running statistics cannot be updated under vmap",
            "which example's statistics would update them? torch.func.vmap refuses too")
_INDICES = (TypeError, "indices have no derivative",
            "the input of Embedding is indices: no per-example gradient in it")
_PADDING_JVP = ("torch 2.13's forward AD of embedding counts the padding row's tangent while "
                "its backward gives that row no gradient; ours agrees with both gradients")

_add(
    Row("Linear", *_same(nn.Linear, T.Linear, 3, 4), (2, 3)),
    Row("Conv1d-stride-pad", *_same(nn.Conv1d, T.Conv1d, 2, 3, 3, stride=2, padding=1), (2, 2, 7)),
    Row("Conv2d", *_same(nn.Conv2d, T.Conv2d, 2, 3, 3, padding=1), (2, 2, 5, 5)),
    Row("Conv2d-stride-dilation", *_same(nn.Conv2d, T.Conv2d, 2, 3, 3, stride=2, padding=2,
                                         dilation=2), (1, 2, 6, 6)),
    Row("Conv2d-groups", *_same(nn.Conv2d, T.Conv2d, 4, 4, 3, groups=2, bias=False),
        (1, 4, 5, 5)),
    Row("ConvTranspose2d", *_same(nn.ConvTranspose2d, T.ConvTranspose2d, 2, 3, 3, stride=2,
                                  padding=1, output_padding=1), (1, 2, 3, 3)),
    Row("MaxPool2d", *_same(nn.MaxPool2d, T.MaxPool2d, 2, typed=False), (1, 2, 4, 4)),
    Row("MaxPool2d-stride-pad", *_same(nn.MaxPool2d, T.MaxPool2d, 3, stride=2, padding=1,
                                       typed=False), (1, 2, 5, 5)),
    Row("AvgPool2d", *_same(nn.AvgPool2d, T.AvgPool2d, 2, typed=False), (1, 2, 4, 4)),
    Row("AvgPool2d-stride-pad", *_same(nn.AvgPool2d, T.AvgPool2d, 3, stride=2, padding=1,
                                       typed=False), (1, 2, 5, 5)),
    Row("AdaptiveAvgPool2d", *_same(nn.AdaptiveAvgPool2d, T.AdaptiveAvgPool2d, (2, 3),
                                    typed=False), (1, 2, 4, 6)),
    Row("Flatten", *_same(nn.Flatten, T.Flatten, typed=False), (2, 3, 2, 2)),
    Row("BatchNorm1d-eval", *_same(nn.BatchNorm1d, T.BatchNorm1d, 4), (3, 4)),
    Row("BatchNorm2d-eval", *_same(nn.BatchNorm2d, T.BatchNorm2d, 3), (2, 3, 2, 2)),
    Row("BatchNorm1d-train", lambda dt: nn.BatchNorm1d(4, dtype=dt),
        lambda dt: T.BatchNorm1d(4, dtype=dt, track_running_stats=False), (3, 4), train=True,
        raises={"vmap_params": _VMAP_BN, "vmap_input": _VMAP_BN}),
    Row("BatchNorm2d-train", lambda dt: nn.BatchNorm2d(3, dtype=dt),
        lambda dt: T.BatchNorm2d(3, dtype=dt, track_running_stats=False), (2, 3, 2, 2),
        train=True, raises={"vmap_params": _VMAP_BN, "vmap_input": _VMAP_BN}),
    Row("LayerNorm", *_same(nn.LayerNorm, T.LayerNorm, (3, 4)), (2, 3, 4)),
    Row("GroupNorm", *_same(nn.GroupNorm, T.GroupNorm, 2, 4), (2, 4, 3)),
    Row("Embedding", *_same(nn.Embedding, T.Embedding, 5, 3), (2, 3), integer=5,
        raises={"vmap_input": _INDICES}),
    Row("Embedding-padding-idx", *_same(nn.Embedding, T.Embedding, 5, 3, padding_idx=1),
        (2, 4), integer=5, raises={"vmap_input": _INDICES},
        jvp_from_grad=_PADDING_JVP),
    Row("sdpa-causal", lambda dt: nn.Function(lambda x: F.scaled_dot_product_attention(
        x[0], x[1], x[2], is_causal=True)), lambda dt: _TorchFunction(
        lambda x: T.functional.scaled_dot_product_attention(x[0], x[1], x[2], is_causal=True)),
        (3, 2, 2, 4, 3)),
)

_MASK = np.tril(np.ones((4, 5), dtype=bool), 1) | (np.arange(5) == 4)


class _TorchFunction(torch.nn.Module):
    def __init__(self, f: Callable[[Any], Any]) -> None:
        super().__init__()
        self.f = f

    def forward(self, x: Any) -> Any:
        # torch's math kernel: its flash kernel has no forward-mode derivative
        with sdpa_kernel(SDPBackend.MATH):
            return self.f(x)


class _TorchSelfAttention(torch.nn.MultiheadAttention):
    """torch's layer as ours is called in a Sequential: self-attention, the output only."""

    def forward(self, x: Any) -> Any:   # type: ignore[override]
        # the math kernel: torch's fused ones have no forward-mode derivative
        with sdpa_kernel(SDPBackend.MATH):
            return super().forward(x, x, x, need_weights=False)[0]


def _sdpa_masked(x: Any) -> Any:
    return F.scaled_dot_product_attention(x[0][..., :4, :], x[1], x[2], attn_mask=_MASK)


def _torch_sdpa_masked(x: Any) -> Any:
    return T.functional.scaled_dot_product_attention(x[0][..., :4, :], x[1], x[2],
                                                     attn_mask=torch.tensor(_MASK))


def _lstm_cell_out(y: Any) -> Any:
    return y[0] + y[1] * y[1]


_add(
    Row("sdpa-masked", lambda dt: nn.Function(_sdpa_masked),
        lambda dt: _TorchFunction(_torch_sdpa_masked), (3, 2, 2, 5, 3)),
    Row("MultiheadAttention", lambda dt: nn.MultiheadAttention(6, 2, batch_first=True, dtype=dt),
        lambda dt: _TorchSelfAttention(6, 2, batch_first=True, dtype=dt), (2, 4, 6)),
    Row("LSTM", *_same(nn.LSTM, T.LSTM, 3, 4), (4, 2, 3), select=lambda y: y[0],
        torch_vmap=False),
    Row("GRU-two-layers", *_same(nn.GRU, T.GRU, 3, 4, num_layers=2), (4, 2, 3),
        select=lambda y: y[0], torch_vmap=False),
    Row("LSTMCell", *_same(nn.LSTMCell, T.LSTMCell, 3, 4), (2, 3), select=_lstm_cell_out,
        torch_vmap=False),
    Row("GRUCell", *_same(nn.GRUCell, T.GRUCell, 3, 4), (2, 3), torch_vmap=False),
    Row("BasicBlock-identity", lambda dt: BasicBlock(2, 2, dtype=dt),
        lambda dt: TorchBasicBlock(2, 2, dtype=dt), (2, 2, 4, 4)),
    Row("BasicBlock-projection", lambda dt: BasicBlock(2, 3, stride=2, dtype=dt),
        lambda dt: TorchBasicBlock(2, 3, stride=2, dtype=dt), (2, 2, 4, 4)),
    Row("ReLU", *_same(nn.ReLU, T.ReLU, typed=False), (2, 5)),
    Row("Tanh", *_same(nn.Tanh, T.Tanh, typed=False), (2, 5)),
    Row("Sigmoid", *_same(nn.Sigmoid, T.Sigmoid, typed=False), (2, 5)),
    Row("GELU", *_same(nn.GELU, T.GELU, typed=False), (2, 5)),
    Row("GELU-tanh", *_same(nn.GELU, T.GELU, approximate="tanh", typed=False), (2, 5)),
    Row("Softmax", *_same(nn.Softmax, T.Softmax, dim=-1, typed=False), (2, 5)),
    Row("LogSoftmax", *_same(nn.LogSoftmax, T.LogSoftmax, dim=-1, typed=False), (2, 5)),
    Row("Dropout-eval", *_same(nn.Dropout, T.Dropout, 0.5, typed=False), (2, 5)),
    Row("Sequential-MLP", lambda dt: nn.Sequential(nn.Linear(3, 5, dtype=dt), nn.Tanh(),
                                                   nn.Linear(5, 2, dtype=dt)),
        lambda dt: T.Sequential(T.Linear(3, 5, dtype=dt), T.Tanh(), T.Linear(5, 2, dtype=dt)),
        (4, 3)),
)


def row_ids() -> list[str]:
    return [row.name for row in ROWS]
