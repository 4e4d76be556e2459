"""LSTM, GRU, LSTMCell and GRUCell: thin Modules over ``_recurrent``'s functions, with
torch's constructor arguments, parameter names (``weight_ih_l0``, ``bias_hh_l1_reverse``,
the cells' ``weight_ih``...), shapes and default initialisation (every parameter drawn
from U(-1/sqrt(hidden_size), 1/sqrt(hidden_size)) in torch's order), so a torch
state_dict loads as it is."""
from __future__ import annotations

import math
import warnings
from typing import Any

import numpy as np

from easyad import random as _random
from easyad.nn import _recurrent as R
from easyad.nn import init
from easyad.nn._module import Module
from easyad.nn._parameter import Parameter, float_dtype
from easyad.tensor import Tensor


def _is_state(hx: Any) -> bool:
    """Whether a second positional argument is a hidden state (else a Sequential passed
    its WengertList there)."""
    return hx is None or isinstance(hx, (tuple, list, np.ndarray)) or hasattr(hx, "shape")


class _Recurrent(Module):
    """What the four share: parameters made and initialised as torch's, and a call
    ``m(input, hx=None, tape=None)`` that turns data into tensors of the parameters'
    dtype and device."""

    kind = "lstm"

    def _make(self, names_and_shapes: list[tuple[str, tuple[int, ...]]], hidden: int,
              generator: Any, dtype: Any, device: Any) -> None:
        dt = float_dtype(dtype)
        rng = _random.resolve(generator)
        bound = 1.0 / math.sqrt(hidden) if hidden > 0 else 0.0
        for name, shape in names_and_shapes:     # torch's reset_parameters: in this order
            p = Parameter(np.zeros(shape), dt, device)
            init.uniform_(p, -bound, bound, generator=rng)
            setattr(self, name, p)

    def _tensor(self, name: str, tape: Any) -> Any:
        p = getattr(self, name, None)
        return None if p is None else p.tensor(tape)

    def __call__(self, input: Any, hx: Any = None, tape: Any = None) -> Any:  # type: ignore[override]
        if not _is_state(hx):
            hx, tape = None, hx
        if isinstance(input, Tensor):
            if tape is None:
                tape = input.tape
        elif isinstance(input, (np.ndarray, list, tuple, float, int)):
            input = self._as_input(input)
        return self.forward(input, self._state(hx), tape)

    def _state(self, hx: Any) -> Any:
        """Data in ``hx`` as constant tensors like the input."""
        if isinstance(hx, (tuple, list)):
            return tuple(self._state(s) for s in hx)
        if isinstance(hx, (np.ndarray, float, int)):
            return self._as_input(hx)
        return hx

    def forward(self, input: Any, hx: Any = None, tape: Any = None) -> Any:  # type: ignore[override]
        raise NotImplementedError


class LSTM(_Recurrent):
    """torch's ``LSTM``: ``LSTM(input_size, hidden_size, num_layers=1, bias=True,
    batch_first=False, dropout=0.0, bidirectional=False)``; called as ``lstm(input,
    hx=None, tape=None)`` with input (L, N, input_size) ((N, L, input_size) with
    ``batch_first``, or unbatched (L, input_size)) and ``hx = (h_0, c_0)``, each
    (num_layers * num_directions, N, hidden_size); returns ``(output, (h_n, c_n))``.
    ``dropout`` acts between layers in training mode only. Parameters ``weight_ih_l{k}``
    (4 hidden_size, in), ``weight_hh_l{k}`` (4 hidden_size, hidden_size), ``bias_ih_l{k}``,
    ``bias_hh_l{k}`` (4 hidden_size,), and ``..._reverse`` when bidirectional. With
    ``proj_size`` P > 0, torch's projected LSTM: ``weight_hr_l{k}`` (P, hidden_size) maps
    each step's ``o tanh(c)`` to the state h (and the output) of size P, ``weight_hh``
    is (4 hidden_size, P) and h_0 (..., P).

    >>> import numpy as np, easyad as ad
    >>> lstm = ad.nn.LSTM(3, 5, num_layers=2, batch_first=True, generator=0)
    >>> out, (h, c) = lstm(np.ones((4, 7, 3)))
    >>> out.shape, h.shape, c.shape
    ((4, 7, 5), (2, 4, 5), (2, 4, 5))
    """

    kind = "lstm"
    gates = 4

    def __init__(self, input_size: int, hidden_size: int, num_layers: int = 1,
                 bias: bool = True, batch_first: bool = False, dropout: float = 0.0,
                 bidirectional: bool = False, proj_size: int = 0, generator: Any = None,
                 dtype: Any = None, device: Any = None) -> None:
        name = type(self).__name__
        if proj_size < 0 or proj_size and proj_size >= hidden_size:
            raise ValueError(f"{name}: proj_size={proj_size} must be 0 (none) or between 1 "
                             f"and hidden_size={hidden_size} - 1 (torch's rule)")
        if int(num_layers) < 1 or int(hidden_size) < 1 or int(input_size) < 1:
            raise ValueError(f"{name}: input_size, hidden_size and num_layers must be "
                             f"positive, not {input_size}, {hidden_size}, {num_layers}")
        if not 0.0 <= dropout <= 1.0:
            raise ValueError(f"{name}: dropout is a probability in [0, 1], not {dropout}")
        if dropout > 0.0 and int(num_layers) == 1:
            warnings.warn(f"{name}: dropout={dropout} acts between layers, so with "
                          f"num_layers=1 it does nothing (as torch's)", UserWarning,
                          stacklevel=3 if name == "GRU" else 2)
        self.input_size, self.hidden_size = int(input_size), int(hidden_size)
        self.num_layers, self.bias, self.batch_first = int(num_layers), bool(bias), batch_first
        self.dropout, self.bidirectional = float(dropout), bool(bidirectional)
        self.proj_size = int(proj_size)
        self.generator = None if generator is None else _random.resolve(generator)
        g, h = self.gates * self.hidden_size, self.hidden_size
        p = self.proj_size or h         # the state's size
        shapes: list[tuple[str, tuple[int, ...]]] = []
        for layer in range(self.num_layers):
            size = self.input_size if layer == 0 else p * (2 if bidirectional else 1)
            for suffix in self._suffixes():
                shapes += [(f"weight_ih_l{layer}{suffix}", (g, size)),
                           (f"weight_hh_l{layer}{suffix}", (g, p))]
                if bias:
                    shapes += [(f"bias_ih_l{layer}{suffix}", (g,)),
                               (f"bias_hh_l{layer}{suffix}", (g,))]
                if self.proj_size:
                    shapes += [(f"weight_hr_l{layer}{suffix}", (p, h))]
        self._make(shapes, h, self.generator, dtype, device)

    def _suffixes(self) -> tuple[str, ...]:
        return ("", "_reverse") if self.bidirectional else ("",)

    def _weights(self, tape: Any) -> list[tuple[Any, ...]]:
        names = ("weight_ih", "weight_hh") + (("bias_ih", "bias_hh") if self.bias else ()) + \
            (("weight_hr",) if self.proj_size else ())
        return [tuple(self._tensor(f"{n}_l{layer}{suffix}", tape) for n in names)
                for layer in range(self.num_layers) for suffix in self._suffixes()]

    def forward(self, input: Any, hx: Any = None, tape: Any = None) -> Any:  # type: ignore[override]
        function = R.lstm if self.kind == "lstm" else R.gru
        return function(input, self._weights(tape), hx, self.bidirectional,
                        self.batch_first, self.dropout, self.training, self.generator)

    def extra_repr(self) -> str:
        extra = "".join(f", {k}={v}" for k, v, default in (
            ("num_layers", self.num_layers, 1), ("bias", self.bias, True),
            ("batch_first", self.batch_first, False), ("dropout", self.dropout, 0.0),
            ("bidirectional", self.bidirectional, False),
            ("proj_size", getattr(self, "proj_size", 0), 0)) if v != default)
        return f"{self.input_size}, {self.hidden_size}{extra}"


class GRU(LSTM):
    """torch's ``GRU``: arguments as ``LSTM``'s; ``hx`` one array (num_layers *
    num_directions, N, hidden_size); returns ``(output, h_n)``. Parameters as the LSTM's
    with 3 hidden_size rows (gates r, z, n).

    >>> import numpy as np, easyad as ad
    >>> gru = ad.nn.GRU(3, 5, bidirectional=True, generator=0)
    >>> out, h = gru(np.ones((7, 3)))          # unbatched: (L, input_size)
    >>> out.shape, h.shape, gru.weight_hh_l0_reverse.shape
    ((7, 10), (2, 5), (15, 5))
    """

    kind = "gru"
    gates = 3

    def __init__(self, input_size: int, hidden_size: int, num_layers: int = 1,
                 bias: bool = True, batch_first: bool = False, dropout: float = 0.0,
                 bidirectional: bool = False, generator: Any = None, dtype: Any = None,
                 device: Any = None) -> None:
        super().__init__(input_size, hidden_size, num_layers, bias, batch_first, dropout,
                         bidirectional, 0, generator, dtype, device)


class LSTMCell(_Recurrent):
    """torch's ``LSTMCell(input_size, hidden_size, bias=True)``: one step, called as
    ``cell(input, hx=None, tape=None)`` with input (N, input_size) or (input_size,) and
    ``hx = (h, c)``; returns ``(h', c')``. Parameters ``weight_ih`` (4 hidden_size,
    input_size), ``weight_hh`` (4 hidden_size, hidden_size), ``bias_ih``, ``bias_hh``.

    >>> import numpy as np, easyad as ad
    >>> cell = ad.nn.LSTMCell(3, 5, generator=0)
    >>> h, c = cell(np.ones((2, 3)))
    >>> h, c = cell(np.ones((2, 3)), (h, c))       # the next step
    >>> h.shape, c.shape
    ((2, 5), (2, 5))
    """

    kind = "lstm"
    gates = 4

    def __init__(self, input_size: int, hidden_size: int, bias: bool = True,
                 generator: Any = None, dtype: Any = None, device: Any = None) -> None:
        if int(hidden_size) < 1 or int(input_size) < 1:
            raise ValueError(f"{type(self).__name__}: input_size and hidden_size must be "
                             f"positive, not {input_size}, {hidden_size}")
        self.input_size, self.hidden_size, self.bias = int(input_size), int(hidden_size), bias
        g, h = self.gates * self.hidden_size, self.hidden_size
        shapes: list[tuple[str, tuple[int, ...]]] = [("weight_ih", (g, self.input_size)),
                                                     ("weight_hh", (g, h))]
        if bias:
            shapes += [("bias_ih", (g,)), ("bias_hh", (g,))]
        self._make(shapes, h, generator, dtype, device)

    def forward(self, input: Any, hx: Any = None, tape: Any = None) -> Any:  # type: ignore[override]
        w = [self._tensor(n, tape) for n in ("weight_ih", "weight_hh", "bias_ih", "bias_hh")]
        if self.kind == "lstm":
            if hx is not None and (not isinstance(hx, tuple) or len(hx) != 2):
                raise TypeError(f"LSTMCell: hx is a pair (h, c), not {type(hx).__name__}")
            return R.lstm_cell(input, hx, *w)
        return R.gru_cell(input, hx, *w)

    def extra_repr(self) -> str:
        return f"{self.input_size}, {self.hidden_size}, bias={self.bias}"


class GRUCell(LSTMCell):
    """torch's ``GRUCell(input_size, hidden_size, bias=True)``: one step, ``cell(input,
    hx=None, tape=None)`` returns ``h'``; parameters as LSTMCell's with 3 hidden_size rows
    (gates r, z, n).

    >>> import numpy as np, easyad as ad
    >>> cell = ad.nn.GRUCell(3, 5, generator=0)
    >>> cell(np.ones(3), np.zeros(5)).shape
    (5,)
    """

    kind = "gru"
    gates = 3
