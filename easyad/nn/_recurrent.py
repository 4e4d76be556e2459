"""Recurrent networks with torch's mathematics: ``lstm_cell`` and ``gru_cell`` (one step,
torch's ``torch.lstm_cell`` / ``torch.gru_cell``), and ``lstm`` and ``gru`` (layers over a
sequence, stacked and bidirectional, as ``torch.nn.LSTM`` / ``GRU`` compute them).

Each is a composition of tensor operations (linear, slicing, sigmoid, tanh, stack,
concatenate), so every mode (reverse, forward, create_graph, record and replay, vmap)
differentiates it with no rule of its own. As cuDNN does, the input's projection
``x W_ih^T + b`` is one matrix product for every time step of a layer, before the loop;
each step adds one product ``h W_hh^T``. Gates are in torch's order: the LSTM's (i, f, g,
o), the GRU's (r, z, n), so torch's weights load as they are.
"""
from __future__ import annotations

from typing import Any

import numpy as np

from easyad import tensor as _tensor
from easyad.errors import ShapeError
from easyad.nn import functional as F

__all__ = ["gru", "gru_cell", "lstm", "lstm_cell"]

_GATES = {"lstm": 4, "gru": 3}


def _shape(x: Any) -> tuple[int, ...]:
    return tuple(x.shape) if hasattr(x, "shape") else np.shape(x)


# ---- one step: the gates' arithmetic, shared by the cells and the layers ----

def _lstm_update(gates: Any, c: Any, hidden: int) -> tuple[Any, Any]:
    """(h, c) of the step whose pre-activations are ``gates`` (..., 4H); ``c`` None is the
    zero state (then ``f c`` is left out: exactly zero)."""
    i = F.sigmoid(gates[..., :hidden])
    g = F.tanh(gates[..., 2 * hidden:3 * hidden])
    o = F.sigmoid(gates[..., 3 * hidden:])
    c_new = i * g
    if c is not None:
        c_new = F.sigmoid(gates[..., hidden:2 * hidden]) * c + c_new
    return o * F.tanh(c_new), c_new


def _gru_update(gi: Any, gh: Any, h: Any, hidden: int) -> Any:
    """The GRU's next state from the input's part ``gi`` (..., 3H) and the hidden state's
    ``gh = h W_hh^T + b_hh`` (None when both are absent); ``h`` None is the zero state."""
    pre = gi[..., :2 * hidden] if gh is None else gi[..., :2 * hidden] + gh[..., :2 * hidden]
    rz = F.sigmoid(pre)
    n_pre = gi[..., 2 * hidden:]
    if gh is not None:
        n_pre = n_pre + rz[..., :hidden] * gh[..., 2 * hidden:]
    n = F.tanh(n_pre)
    z = rz[..., hidden:]
    return n - z * n if h is None else n + z * (h - n)     # (1 - z) n + z h


def _check_cell(name: str, input: Any, w_ih: Any, w_hh: Any, b_ih: Any, b_hh: Any,
                gates: int) -> int:
    sw, sh = _shape(w_ih), _shape(w_hh)
    if len(sw) != 2 or sw[0] % gates or len(sh) != 2 or sh != (sw[0], sw[0] // gates):
        raise ShapeError(f"{name}: weights of shapes {sw} and {sh} must be ({gates} H, "
                         f"input_size) and ({gates} H, H) (torch's weight_ih, weight_hh)")
    hidden = sh[1]
    for what, b in (("b_ih", b_ih), ("b_hh", b_hh)):
        if b is not None and _shape(b) != (gates * hidden,):
            raise ShapeError(f"{name}: {what} of shape {_shape(b)} must be "
                             f"({gates * hidden},), one per gate row")
    s = _shape(input)
    if len(s) not in (1, 2) or s[-1] != sw[1]:
        raise ShapeError(f"{name}: input of shape {s} must be (N, {sw[1]}) or ({sw[1]},)")
    return hidden


def _check_state(name: str, what: str, state: Any, expected: tuple[int, ...]) -> None:
    if state is not None and _shape(state) != expected:
        raise ShapeError(f"{name}: {what} of shape {_shape(state)} must be {expected} for "
                         f"this input")


def lstm_cell(input: Any, hx: Any, w_ih: Any, w_hh: Any, b_ih: Any = None,
              b_hh: Any = None) -> tuple[Any, Any]:
    """One LSTM step, torch's ``lstm_cell``: ``input`` (N, I) or (I,), ``hx = (h, c)``
    (each (N, H) or (H,); None: zeros), weights ``w_ih`` (4H, I), ``w_hh`` (4H, H) and
    biases (4H,) in torch's gate order (i, f, g, o). Returns ``(h', c')``::

        i, f, g, o = σ(W_ii x + b_ii + W_hi h + b_hi), σ(...), tanh(...), σ(...)
        c' = f c + i g,   h' = o tanh(c')

    >>> import numpy as np, easyad as ad
    >>> h, c = ad.nn.lstm_cell(np.ones(3), None, np.zeros((8, 3)), np.zeros((8, 2)))
    >>> h.value.tolist(), c.value.tolist()     # i = f = o = 1/2, g = 0
    ([0.0, 0.0], [0.0, 0.0])
    """
    hidden = _check_cell("lstm_cell", input, w_ih, w_hh, b_ih, b_hh, 4)
    h, c = (None, None) if hx is None else hx
    expected = _shape(input)[:-1] + (hidden,)
    _check_state("lstm_cell", "h", h, expected)
    _check_state("lstm_cell", "c", c, expected)
    gates = F.linear(input, w_ih, b_ih)
    if h is not None:
        gates = gates + F.linear(h, w_hh, b_hh)
    elif b_hh is not None:
        gates = gates + b_hh
    return _lstm_update(gates, c, hidden)


def gru_cell(input: Any, hx: Any, w_ih: Any, w_hh: Any, b_ih: Any = None,
             b_hh: Any = None) -> Any:
    """One GRU step, torch's ``gru_cell``: ``input`` (N, I) or (I,), ``hx`` (N, H) or (H,)
    (None: zeros), weights ``w_ih`` (3H, I), ``w_hh`` (3H, H), biases (3H,) in torch's
    gate order (r, z, n). Returns ``h'``::

        r = σ(W_ir x + b_ir + W_hr h + b_hr),   z = σ(W_iz x + b_iz + W_hz h + b_hz)
        n = tanh(W_in x + b_in + r (W_hn h + b_hn)),   h' = (1 - z) n + z h

    >>> import numpy as np, easyad as ad
    >>> ad.nn.gru_cell(np.ones(3), np.ones(2), np.zeros((6, 3)), np.zeros((6, 2))).value.tolist()
    [0.5, 0.5]
    """
    hidden = _check_cell("gru_cell", input, w_ih, w_hh, b_ih, b_hh, 3)
    _check_state("gru_cell", "hx", hx, _shape(input)[:-1] + (hidden,))
    gi = F.linear(input, w_ih, b_ih)
    gh = F.linear(hx, w_hh, b_hh) if hx is not None else b_hh
    return _gru_update(gi, gh, hx, hidden)


# ---- a layer over a sequence ----

def _direction(kind: str, x: Any, h: Any, c: Any, w: tuple[Any, ...],
               reverse: bool) -> tuple[Any, Any, Any]:
    """One layer in one direction over ``x`` (L, N, I): (outputs (L, N, P), h, c), P the
    state's size (the projection's with ``w_hr``, else H)."""
    w_ih, w_hh, b_ih, b_hh, w_hr = w
    hidden = _shape(w_hh)[0] // _GATES[kind]
    steps = _shape(x)[0]
    if kind == "lstm":      # both biases outside the loop; the GRU keeps b_hn inside r (...)
        bias = b_ih if b_hh is None else b_hh if b_ih is None else b_ih + b_hh
        gi = F.linear(x, w_ih, bias)
    else:
        gi = F.linear(x, w_ih, b_ih)
    if kind == "lstm" and w_hr is None and FUSED and _fusable(gi, w_hh, h, c):
        return _fused_direction(gi, h, c, w_hh, hidden, reverse)
    outputs: list[Any] = [None] * steps
    for t in (range(steps - 1, -1, -1) if reverse else range(steps)):
        if kind == "lstm":
            gates = gi[t] if h is None else gi[t] + F.linear(h, w_hh)
            h, c = _lstm_update(gates, c, hidden)
            if w_hr is not None:
                h = F.linear(h, w_hr)       # proj_size: h_t = W_hr (o tanh(c_t))
        else:
            gh = b_hh if h is None else F.linear(h, w_hh, b_hh)
            h = _gru_update(gi[t], gh, h, hidden)
        outputs[t] = h
    return _tensor.stack(outputs, axis=0), h, c


FUSED = True      # False: every LSTM layer as per-step operations (the tests' reference)


def _fusable(gi: Any, *others: Any) -> bool:
    """Whether ``ops.lstm_scan`` serves this layer: float tensors of the numpy device (or
    a recording on it) or float arrays, outside vmap; TraceTensors, object arrays of
    scalars, vmap's batches, eval_shape and other devices take the per-step composite."""
    from easyad._levels import VMAPS
    if VMAPS[0]:
        return False
    for a in (gi, *others):
        if a is None:
            continue
        if isinstance(a, _tensor.Tensor):
            if getattr(a.device, "kind", None) != "numpy":   # (a recording reports its own)
                return False
        elif not (isinstance(a, np.ndarray) and a.dtype.kind == "f"):
            return False
    return True


def _fused_direction(gi: Any, h: Any, c: Any, w_hh: Any, hidden: int,
                     reverse: bool) -> tuple[Any, Any, Any]:
    """One LSTM direction as one ``lstm_scan`` (docs/internals.md, the op table)."""
    from easyad.ops._lstm import lstm_scan
    steps, batch = _shape(gi)[:2]
    zeros = np.zeros((batch, hidden), dtype=gi.dtype)
    y = lstm_scan(gi, zeros if h is None else h, zeros if c is None else c, w_hh,
                  reverse=reverse)
    out = y[:, 5]                                   # y: (T, 6, B, H), gate-major
    last = 0 if reverse else steps - 1
    return out, out[last], y[last, 4]


def _check_weights(name: str, weights: list[tuple[Any, ...]], directions: int,
                   input_size: int, gates: int) -> tuple[list[tuple[Any, ...]], int, int]:
    """Each (w_ih, w_hh, b_ih, b_hh, w_hr) (None where absent), H and the state's size P."""
    sizes = (2, 3, 4, 5) if gates == 4 else (2, 4)
    if not weights or len(weights) % directions:
        raise ValueError(f"{name}: weights hold one (w_ih, w_hh[, b_ih, b_hh]) per layer "
                         f"and direction ({directions} a layer), not {len(weights)}")
    first = _shape(weights[0][1]) if len(weights[0]) > 1 else ()
    hidden, state = (first[0] // gates, first[1]) if len(first) == 2 else (0, 0)
    out = []
    for k, w in enumerate(weights):
        if len(w) not in sizes:
            raise ValueError(f"{name}: weights[{k}] holds {len(w)} arrays, not (w_ih, w_hh) "
                             f"or (w_ih, w_hh, b_ih, b_hh)" + (", with w_hr after them "
                                                              "(proj_size)" if gates == 4
                                                              else ""))
        biased = len(w) >= 4
        w_hr = w[-1] if len(w) in (3, 5) else None
        size = input_size if k < directions else directions * state
        expected = [(gates * hidden, size), (gates * hidden, state)] + \
            [(gates * hidden,)] * (2 if biased else 0) + \
            ([(state, hidden)] if w_hr is not None else [])
        got = [_shape(a) for a in w]
        if got != expected or (w_hr is None and state != hidden):
            raise ShapeError(f"{name}: weights[{k}] (layer {k // directions}) of shapes "
                             f"{got} must be {expected} (torch's weight_ih, weight_hh, "
                             f"bias_ih, bias_hh{', weight_hr' if w_hr is not None else ''})")
        out.append((w[0], w[1]) + (tuple(w[2:4]) if biased else (None, None)) + (w_hr,))
    return out, hidden, state


def _layers(kind: str, input: Any, weights: Any, hx: Any, bidirectional: bool,
            batch_first: bool, dropout: float, training: bool, generator: Any) -> Any:
    name = kind
    directions = 2 if bidirectional else 1
    shape = _shape(input)
    if len(shape) not in (2, 3):
        raise ShapeError(f"{name}: input of shape {shape} must be (L, N, input_size), "
                         f"(N, L, input_size) with batch_first, or unbatched (L, input_size)")
    gates = _GATES[kind]
    weights = [tuple(w) for w in weights]
    first = _shape(weights[0][0]) if weights and weights[0] else ()
    if len(first) == 2 and first[1] != shape[-1]:
        raise ShapeError(f"{name}: input of shape {shape} has {shape[-1]} features; the "
                         f"layer takes input_size={first[1]} (the last axis)")
    ws, hidden, size = _check_weights(name, weights, directions, shape[-1], gates)
    layers = len(ws) // directions
    unbatched = len(shape) == 2
    if unbatched:
        x = input.reshape((shape[0], 1, shape[1]))
    else:
        x = input.transpose((1, 0, 2)) if batch_first else input
    steps, batch = _shape(x)[:2]
    if steps == 0:
        raise ValueError(f"{name}: the sequence is empty (length 0); give at least one step")
    states = _initial_states(name, kind, hx, layers * directions, batch, hidden, size,
                             unbatched)
    last_h, last_c = [], []
    for layer in range(layers):
        outs = []
        for d in range(directions):
            k = layer * directions + d
            h0, c0 = states[k]
            out, h, c = _direction(kind, x, h0, c0, ws[k], reverse=d == 1)
            outs.append(out)
            last_h.append(h)
            last_c.append(c)
        x = outs[0] if directions == 1 else _tensor.concatenate(outs, axis=-1)
        if dropout and training and layer < layers - 1:
            x = F.dropout(x, dropout, True, generator)
    h_n = _tensor.stack(last_h, axis=0)
    c_n = _tensor.stack(last_c, axis=0) if kind == "lstm" else None
    if unbatched:
        x = x.reshape((steps, directions * size))
        h_n = h_n.reshape((layers * directions, size))
        c_n = None if c_n is None else c_n.reshape((layers * directions, hidden))
    elif batch_first:
        x = x.transpose((1, 0, 2))
    return x, ((h_n, c_n) if kind == "lstm" else h_n)


def _initial_states(name: str, kind: str, hx: Any, count: int, batch: int, hidden: int,
                    size: int, unbatched: bool) -> list[tuple[Any, Any]]:
    """Per layer and direction (h0, c0), None standing for zeros; h0 of the state's
    ``size`` (proj_size, or H), c0 of H."""
    if hx is None:
        return [(None, None)] * count
    if kind == "lstm":
        if not isinstance(hx, (tuple, list)) or len(hx) != 2:
            raise TypeError(f"{name}: hx is a pair (h_0, c_0), not {type(hx).__name__}")
        pair = list(hx)
    else:
        pair = [hx]
    lead = (count,) if unbatched else (count, batch)
    for what, s, n in zip(("h_0", "c_0"), pair, (size, hidden)):
        if _shape(s) != lead + (n,):
            raise ShapeError(f"{name}: {what} of shape {_shape(s)} must be {lead + (n,)} "
                             f"(num_layers * num_directions{'' if unbatched else ', N'}, "
                             f"{'proj_size' if n != hidden else 'hidden_size'})")
    if unbatched:
        pair = [s.reshape((count, 1, n)) if hasattr(s, "reshape") else
                np.reshape(s, (count, 1, n)) for s, n in zip(pair, (size, hidden))]
    if kind == "lstm":
        return [(pair[0][k], pair[1][k]) for k in range(count)]
    return [(pair[0][k], None) for k in range(count)]


def lstm(input: Any, weights: Any, hx: Any = None, bidirectional: bool = False,
         batch_first: bool = False, dropout: float = 0.0, training: bool = True,
         generator: Any = None) -> tuple[Any, tuple[Any, Any]]:
    """A stacked LSTM over a sequence, as ``torch.nn.LSTM`` computes it.

    ``input`` is (L, N, I), (N, L, I) with ``batch_first``, or unbatched (L, I); ``weights``
    one tuple ``(w_ih, w_hh[, b_ih, b_hh])`` per layer and direction (layer 0, layer 0
    reversed, layer 1...: torch's ``weight_ih_l0``, ``weight_ih_l0_reverse``...); ``hx``
    ``(h_0, c_0)``, each (layers * directions, N, H) (None: zeros). With torch's
    ``proj_size``, each tuple ends in ``w_hr`` (P, H): the state ``h`` is ``W_hr (o
    tanh(c))``, of size P (h_0 and the outputs too). ``dropout`` applies to
    every layer's output but the last, when ``training``, with masks from ``generator``.
    Returns ``(output, (h_n, c_n))``: output (L, N, directions * H) (batch first when the
    input is), the reversed direction's outputs after the forward one's.

    >>> import numpy as np, easyad as ad
    >>> w = [(np.zeros((8, 3)), np.zeros((8, 2)))]
    >>> out, (h, c) = ad.nn.lstm(np.ones((5, 4, 3)), w)
    >>> out.shape, h.shape, c.shape
    ((5, 4, 2), (1, 4, 2), (1, 4, 2))
    """
    return _layers("lstm", input, weights, hx, bidirectional, batch_first, dropout,
                   training, generator)  # type: ignore[no-any-return]


def gru(input: Any, weights: Any, hx: Any = None, bidirectional: bool = False,
        batch_first: bool = False, dropout: float = 0.0, training: bool = True,
        generator: Any = None) -> tuple[Any, Any]:
    """A stacked GRU over a sequence, as ``torch.nn.GRU`` computes it: arguments as
    ``lstm``'s (weights (3H, I), (3H, H), (3H,), (3H,)), ``hx`` one array (layers *
    directions, N, H). Returns ``(output, h_n)``.

    >>> import numpy as np, easyad as ad
    >>> out, h = ad.nn.gru(np.ones((4, 3)), [(np.zeros((6, 3)), np.zeros((6, 2)))])
    >>> out.shape, h.shape
    ((4, 2), (1, 2))
    """
    return _layers("gru", input, weights, hx, bidirectional, batch_first, dropout,
                   training, generator)  # type: ignore[no-any-return]
