"""Scaled dot-product attention as one table op, ``attention``: ``softmax(q kᵀ scale +
bias) v`` with ``q (..., L, E)``, ``k (..., S, E)``, ``v (..., S, Ev)`` sharing their
leading axes, an optional additive ``bias`` broadcasting to ``(..., L, S)`` (-inf where a
position may not attend) and ``causal`` (row i sees columns 0..i, torch's
``is_causal``). A row that may attend to nothing gives nan, as the composite
(``nn.functional``'s) does.

Who runs what:

- the value: ``_attention_cpu.forward`` (a few heads at a time, the scores in the cache;
  the numpy lowering, on every device through host copies);
- the first-order sweep on the numpy device, eager: ``AttentionStep`` runs
  ``_attention_cpu.backward`` on the buffers (the weights recomputed a block at a time
  from q and k, not kept: the forward keeps no ``(..., L, S)`` array alive);
- the sweep while ``ad.record`` records tensor code: the same kernel as one host call of
  the program (replay runs it again on the new values);
- everything else (create_graph, Hessians, forward mode, other devices' sweeps): the vjp
  and jvp below, written with easyad operations (matmul, softmax...), which every engine
  differentiates again: no derivative of any order goes through the kernels.
"""
from __future__ import annotations

import dataclasses
import math
from typing import TYPE_CHECKING, Any

import numpy as np

from easyad._levels import VMAPS, BatchedBase
from easyad.errors import ShapeError
from easyad.ops import _attention_cpu as cpu
from easyad.ops._apply import OpStep, apply
from easyad.ops._table import Op, host_kernel, register, register_kernel
from easyad.tensor import _functions
from easyad.tensor._base import TensorBase
from easyad.tensor._trace import TraceTensor

if TYPE_CHECKING:
    from easyad.tensor._backend import Backend


@dataclasses.dataclass(frozen=True)
class AttentionParams:
    """``causal``: row i attends to columns 0..i only; ``scale``: the scores' factor."""

    causal: bool = False
    scale: float = 1.0


def _rule(p: AttentionParams, q: tuple[int, ...], k: tuple[int, ...], v: tuple[int, ...],
          *bias: tuple[int, ...]) -> tuple[tuple[int, ...], AttentionParams]:
    if len(q) < 2 or len(k) < 2 or len(v) < 2:
        raise ShapeError(f"attention: query {q}, key {k} and value {v} need at least 2 axes "
                         f"(..., length, features)")
    if q[-1] != k[-1] or k[-2] != v[-2]:
        raise ShapeError(f"attention: query {q} and key {k} must share the last axis, key "
                         f"and value {v} the length axis (-2)")
    if not q[:-2] == k[:-2] == v[:-2]:
        raise ShapeError(f"attention: query {q}, key {k} and value {v} must have the same "
                         f"leading axes (broadcast them first)")
    if len(bias) > 1:
        raise TypeError("attention takes query, key, value and at most one bias")
    scores = q[:-1] + (k[-2],)
    if bias and (len(bias[0]) > len(scores) or any(
            b not in (1, s) for b, s in zip(bias[0][::-1], scores[::-1]))):
        raise ShapeError(f"attention: the bias of shape {bias[0]} does not broadcast to the "
                         f"scores' shape {scores}")
    if not math.isfinite(p.scale):
        raise ValueError(f"attention: scale must be finite, got {p.scale}")
    return q[:-1] + (v[-1],), p


# ---- host arrays as the kernels take them: (N, L, E) ----

def _flat(a: np.ndarray) -> np.ndarray:
    return a.reshape((-1,) + a.shape[-2:])


def _flat_bias(bias: np.ndarray, lead: tuple[int, ...], dtype: Any) -> np.ndarray:
    """bias as (1 or N, L or 1, S or 1): one block for every head when it has no leading
    axis longer than 1, else broadcast over the leading axes (a copy only then)."""
    bias = np.asarray(bias, dtype=dtype)
    bias = bias.reshape((1,) * (len(lead) + 2 - bias.ndim) + bias.shape)
    if all(n == 1 for n in bias.shape[:-2]):
        return bias.reshape((1,) + bias.shape[-2:])
    return np.broadcast_to(bias, lead + bias.shape[-2:]).reshape((-1,) + bias.shape[-2:])


def _cotangent_of_bias(db: np.ndarray, shape: tuple[int, ...], lead: tuple[int, ...]
                       ) -> np.ndarray:
    """The kernel's dbias (1 or N, L or 1, S or 1) summed into the bias's own shape."""
    full = db.reshape((lead if db.shape[0] > 1 else (1,) * len(lead)) + db.shape[1:])
    padded = (1,) * (len(full.shape) - len(shape)) + tuple(shape)
    axes = tuple(i for i, (f, s) in enumerate(zip(full.shape, padded)) if s == 1 and f != 1)
    return full.sum(axis=axes, keepdims=True).reshape(shape) if axes else full.reshape(shape)


def _numpy(p: AttentionParams, q: np.ndarray, k: np.ndarray, v: np.ndarray,
           *bias: np.ndarray) -> np.ndarray:
    if q.dtype.kind != "f" or q.dtype.itemsize < 4:
        raise TypeError(f"attention computes in float32 or float64, got {q.dtype}")
    lead = q.shape[:-2]
    b = _flat_bias(bias[0], lead, q.dtype) if bias else None
    with np.errstate(invalid="ignore", divide="ignore", over="ignore"):
        o = cpu.forward(_flat(q), _flat(k), _flat(v), b, p.scale, p.causal)[0]
    return o.reshape(lead + o.shape[1:])


def host_vjp(p: AttentionParams, g: np.ndarray, q: np.ndarray, k: np.ndarray,
             v: np.ndarray, out: np.ndarray, bias: np.ndarray | None,
             needs: tuple[bool, ...], saved: Any = None) -> list[np.ndarray | None]:
    """The cotangents of q, k, v (and the bias) on host arrays, by the kernels, from the
    forward's saved weights ``(p, l)`` (recomputed by the forward kernel when None)."""
    dtype = q.dtype
    lead = q.shape[:-2]
    q3, k3, v3 = _flat(q), _flat(k), _flat(v)
    b = _flat_bias(bias, lead, dtype) if bias is not None else None
    with np.errstate(invalid="ignore", divide="ignore", over="ignore"):
        if saved is None:
            _, pw, lsum = cpu.forward(q3, k3, v3, b, p.scale, p.causal)
        else:
            pw, lsum = (np.asarray(a) for a in saved)
        cts = cpu.backward(_flat(np.asarray(g, dtype=dtype)), q3, k3, v3,
                           _flat(np.asarray(out, dtype=dtype)), pw, lsum,
                           p.scale, p.causal, needs, None if b is None else b.shape)
    found: list[np.ndarray | None] = [None if c is None else c.reshape(x.shape)
                                      for c, x in zip(cts[:3], (q, k, v))]
    if bias is not None:
        found.append(None if cts[3] is None else
                     _cotangent_of_bias(cts[3], np.shape(bias), lead))
    return found


def _host_forward(p: AttentionParams, q: np.ndarray, k: np.ndarray, v: np.ndarray,
                  bias: np.ndarray | None) -> list[np.ndarray]:
    """``[o, p, l]``: the value and the weights' numerators and row sums (kept for the
    backward), the leading axes as the operands'."""
    lead = q.shape[:-2]
    b = _flat_bias(bias, lead, q.dtype) if bias is not None else None
    with np.errstate(invalid="ignore", divide="ignore", over="ignore"):
        o, pw, lsum = cpu.forward(_flat(q), _flat(k), _flat(v), b, p.scale, p.causal)
    return [o.reshape(lead + o.shape[1:]), pw, lsum]      # (p and l: the kernels' own)


def _lowered(be: Backend, p: AttentionParams, *bufs: Any) -> Any:
    """The op on a backend's buffers, with what its step keeps (``saves``): the weights'
    numerators p and row sums l, so the backward need not compute them again. The numpy
    device runs the kernels on its arrays; a recording runs them as one host call of the
    program (the three results its slots: replay calls the kernels again); another
    device (OpenCL) runs them on host copies and keeps nothing (its sweep takes the vjp
    in easyad operations, on the device)."""
    if be.kind == "numpy":
        o, pw, lsum = _host_forward(p, *bufs[:3], bufs[3] if len(bufs) > 3 else None)
        return be.adopt(o), [pw, lsum]
    if be.interpreter.replays and hasattr(be, "host_call"):
        o, pw, lsum = be.host_call("attention", host_kernel("attention", p), list(bufs))
        return o, [pw, lsum]
    hosts = [np.asarray(be.to_numpy(b)) for b in bufs]
    o = _numpy(p, *hosts)
    return be.asarray(o, o.dtype), None


# ---- the derivatives, in easyad operations (any order, any engine) ----

def _swap(t: Any) -> Any:
    n = len(t.shape)
    return t.transpose(tuple(range(n - 2)) + (n - 1, n - 2))


def _weights(p: AttentionParams, q: Any, k: Any, bias: tuple[Any, ...]) -> Any:
    s = (q @ _swap(k)) * p.scale
    if p.causal:
        length, source = q.shape[-2], k.shape[-2]
        s = s + np.where(np.tril(np.ones((length, source), dtype=bool)), 0.0,
                         -np.inf).astype(s.dtype)
    if bias:
        s = s + bias[0]
    return _functions.softmax(s, axis=-1)


def _reduced(t: Any, shape: tuple[int, ...]) -> Any:
    """t summed over the axes a bias of ``shape`` was broadcast along."""
    extra = len(t.shape) - len(shape)
    axes = tuple(range(extra)) + tuple(extra + i for i, n in enumerate(shape)
                                       if n == 1 and t.shape[extra + i] != 1)
    if axes:
        t = _functions.sum(t, axis=axes, keepdims=True)
    return t.reshape(shape) if tuple(t.shape) != tuple(shape) else t


def _vjp(p: AttentionParams, g: Any, q: Any, k: Any, v: Any, *rest: Any) -> tuple[Any, ...]:
    bias, out = rest[:-1], rest[-1]
    w = _weights(p, q, k, bias)
    dw = g @ _swap(v)
    ds = w * (dw - _functions.sum(g * out, axis=-1, keepdims=True))
    cts = (ds @ k * p.scale, _swap(ds) @ q * p.scale, _swap(w) @ g)
    return cts + ((_reduced(ds, tuple(bias[0].shape)),) if bias else ())


def _jvp(p: AttentionParams, tangents: tuple[Any, ...], q: Any, k: Any, v: Any,
         *rest: Any) -> Any:
    bias = rest[:-1]
    w = _weights(p, q, k, bias)
    dq, dk, dv = tangents[:3]
    ds = (dq @ _swap(k) + q @ _swap(dk)) * p.scale
    if bias:
        ds = ds + tangents[3]
    dw = w * (ds - _functions.sum(w * ds, axis=-1, keepdims=True))
    return dw @ v + w @ dv


class AttentionStep(OpStep):
    """attention's node: on the numpy device's buffers the kernels' backward
    (``host_vjp``); while ``ad.record`` records, the same as one host call of the program;
    elsewhere (OpenCL) and for create_graph the vjp in easyad operations (``OpStep``)."""

    __slots__ = ("saved",)

    def __init__(self, p: AttentionParams, cls: type, be: Backend, ops: list[Any], saved: Any,
                 out: Any, shape: tuple[int, ...], dtype: Any) -> None:
        super().__init__(ATTENTION, p, cls, be, ops, out, shape, dtype)
        self.saved = saved

    def _needs(self) -> tuple[bool, ...]:
        return tuple(index >= 0 for *_, index in self.operands)

    def __call__(self, g: Any) -> tuple[Any, ...]:
        datas = [d for d, *_ in self.operands]
        if isinstance(g, np.ndarray) and isinstance(self.data, np.ndarray) and \
                all(isinstance(d, np.ndarray) for d in datas):
            return self._host(g, datas)
        if self.be.interpreter.replays and hasattr(self.be, "host_call"):
            return self._recorded(g)
        return super().__call__(g)

    def _host(self, g: np.ndarray, datas: list[np.ndarray]) -> tuple[Any, ...]:
        dtype = self.dtype
        q, k, v = (np.asarray(d, dtype=dtype) for d in datas[:3])
        bias = datas[3] if len(datas) > 3 else None
        saved = self.saved if self.saved is not None and all(
            isinstance(a, np.ndarray) for a in self.saved) else None
        cts = host_vjp(self.params, g.reshape(self.shape), q, k, v, self.data, bias,
                       self._needs(), saved)
        return tuple(None if c is None else
                     self.be.adopt(np.ascontiguousarray(c, dtype=dt))
                     for c, (_, _, dt, _) in zip(cts, self.operands))

    def _recorded(self, g: Any) -> tuple[Any, ...]:
        needs = self._needs()
        vp = AttentionVjpParams(self.params, needs, np.dtype(self.dtype),
                                tuple(np.dtype(dt) for _, _, dt, _ in self.operands))
        kept = list(self.saved) if self.saved is not None else []
        outs = iter(self.be.host_call("attention vjp", host_kernel("attention_vjp", vp),
                                      [g, self.data, *(d for d, *_ in self.operands),
                                       *kept]))
        return tuple(next(outs) if need else None for need in needs)


@dataclasses.dataclass(frozen=True)
class AttentionVjpParams:
    """The recorded backward's parameters: the op's, which operands need a cotangent, the
    result's dtype and the operands' (their cotangents')."""

    attention: AttentionParams
    needs: tuple[bool, ...]
    dtype: np.dtype[Any]
    dtypes: tuple[np.dtype[Any], ...]


def _host_backward(vp: AttentionVjpParams, g: Any, out: Any, *xs: Any) -> list[np.ndarray]:
    """The recorded backward: the cotangents of the operands that need one."""
    n, dtype = len(vp.dtypes), vp.dtype
    q, k, v = (np.asarray(x, dtype=dtype) for x in xs[:3])
    rest = xs[3:n]
    # the kept numerators and row sums, one row per head (a batch's points give them
    # with a leading axis of their own: the heads of point b are rows b*N...)
    saved = tuple(a.reshape((-1,) + a.shape[-s:]) for a, s in zip(xs[n:], (1, 2))) or None
    cts = host_vjp(vp.attention, np.asarray(g, dtype=dtype).reshape(out.shape), q, k, v,
                   out, rest[0] if rest else None, vp.needs, saved)
    return [np.ascontiguousarray(c, dtype=dt) for c, dt in zip(cts, vp.dtypes)
            if c is not None]


# (both take any leading axes, a batch's points too)
register_kernel("attention", lambda p, q, k, v, *bias: _host_forward(
    p, q, k, v, bias[0] if bias else None), AttentionParams, batches=True)
register_kernel("attention_vjp", _host_backward, AttentionVjpParams, batches=True)
ATTENTION: Op = register(Op(
    name="attention", params=AttentionParams, rule=_rule, numpy=_numpy, vjp=_vjp, jvp=_jvp,
    composite=_lowered, composite_first=True, saves=True,
    step=lambda p, cls, be, ops, bufs, out, shape, dtype: AttentionStep(
        p, cls, be, ops, bufs, out, shape, dtype),
    doc="softmax(q kᵀ scale + bias) v, causal or not, as one op"))


def fused(query: Any, key: Any, value: Any, bias: Any, causal: bool, scale: float,
          dropout_p: float) -> Any:
    """``attention`` of these operands when the op serves them, else NotImplemented (the
    caller composes the attention of easyad operations): tensors on the numpy device
    (eager or recorded) with the same leading axes, no dropout, outside ``ad.vmap``, no
    forward-mode or object operands."""
    operands = (query, key, value) + (() if bias is None else (bias,))
    if dropout_p > 0.0 or VMAPS[0] and any(isinstance(a, BatchedBase) for a in operands):
        return NotImplemented
    tensors = [a for a in operands if isinstance(a, TensorBase)]
    if not tensors or any(isinstance(a, TraceTensor) or not isinstance(
            a, (TensorBase, np.ndarray)) or a.dtype.kind != "f" for a in operands):
        return NotImplemented
    if any(t.device.kind != "numpy" for t in tensors):
        return NotImplemented
    shapes = [tuple(a.shape) for a in operands[:3]]
    if not shapes[0][:-2] == shapes[1][:-2] == shapes[2][:-2] or len(shapes[0]) < 2:
        return NotImplemented
    scores = shapes[0][:-1] + shapes[1][-2:-1]
    if bias is not None and (len(bias.shape) > len(scores) or any(
            b not in (1, n) for b, n in zip(tuple(bias.shape)[::-1], scores[::-1]))):
        return NotImplemented        # a mask that broadcasts the result: the composite
    return apply(ATTENTION, AttentionParams(bool(causal), float(scale)), operands)
