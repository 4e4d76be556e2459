"""An LSTM layer's recurrence as two table ops, so a sequence is one node (and one
instruction of a recorded program) instead of some fifteen operations per time step.

- ``lstm_scan(xproj, h0, c0, w_hh; reverse)``: ``xproj`` (T, B, 4H) is the input's
  projection with both biases (one GEMM for all steps, made by the caller), ``h0``,
  ``c0`` (B, H) the initial state, ``w_hh`` (4H, H) in torch's gate order (i, f, g, o).
  Step t (t = 0..T-1, or T-1..0 with ``reverse``) computes::

      a = xproj[t] + h_prev w_hh^T;  i, f, o = σ(a_i), σ(a_f), σ(a_o);  g = tanh(a_g)
      c_t = f c_prev + i g;          h_t = o tanh(c_t)

  The result packs, per step, ``(i, f, g, o, c_t, h_t)``: (T, 6, B, H), gate-major (each
  block contiguous: numpy's loops run 2-3x faster than on column slices). The layer's
  outputs, h_n and c_n are slices of it; the gate activations are what the backward
  needs, saved by being part of the result (an op has one result).
- ``lstm_scan_vjp(gy, y, h0, c0, w_hh; reverse)``: the recurrence of the cotangents,
  (T+1, B, 4H): rows 0..T-1 the cotangents of the pre-activations ``a`` (which are
  ``xproj``'s), row T ``(dc0, dh0, 0, 0)`` (left out with ``initial=False``: the initial
  state is constant). ``w_hh``'s cotangent is then ONE GEMM over every step
  (``da^T h_prev``), made by the node's step with the backend's ``linear_vjp``.

The numpy lowerings loop over time with preallocated buffers: per step the product
written into the result, the activations in place. Where easyad's AVX-512 GEMM runs
(``_own_gemm``: one BLAS thread, not EASYAD_MATMUL=blas) each step's product is ONE
(B, 4H) GEMM on it (~20% faster than OpenBLAS's at (64, 256) @ (256, 1024)), read gate-major
by the pass adding xproj; numpy's matmul per gate otherwise. In float32 there, each
lowering is ONE call into the core (``easyad/_lstm.h``: W_hh packed once for all the
steps' products, then one vectorised pass over each step's cells, whose float32
sigmoid and tanh are within 3 ulp; ``tests/test_lstm_kernel.py``). The node's step
(``_ScanStep``) runs ``lstm_scan_vjp`` and the weight's GEMM on the backend's buffers (a
recording records those few instructions; operands of mixed dtypes take ``_fast_vjp``,
the same with tensor operations, which cast). ``lstm_scan_vjp``'s own vjp sweeps a
recording of its per-step form (as ``ad.checkpoint``'s node does). Everything the fast
kernels do not serve decomposes into easyad operations per step, so no derivative is
lost: the scan's ``vjp`` (create_graph, hvp, any order) is the backward recurrence
written with easyad operations (``_backward``); both ops' ``jvp`` run the per-step forms
on TraceTensors.
There is no OpenCL kernel (a device runs the numpy lowering on host copies) and no
batching rule: ``nn.lstm`` takes this path only for tensors of the numpy device outside
vmap, and the per-step composite otherwise.
"""
from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING, Any

import numpy as np

from easyad import _core
from easyad.errors import ShapeError
from easyad.ops._apply import OpStep, _buffer, _value, apply
from easyad.ops._table import Op, register
from easyad.tensor import _blas
from easyad.tensor._base import TensorBase, wrap

if TYPE_CHECKING:
    from easyad.tensor._backend import Backend


@dataclasses.dataclass(frozen=True)
class ScanParams:
    """``reverse``: the recurrence runs from the last step to the first; ``initial``
    (lstm_scan_vjp): a last row holds the initial state's cotangents (dc0, dh0)."""
    reverse: bool = False
    initial: bool = True


def _order(p: ScanParams, steps: int) -> range:
    return range(steps - 1, -1, -1) if p.reverse else range(steps)


def _scan_rule(p: ScanParams, xs: Any, h0: Any, c0: Any, w: Any) -> Any:
    if len(xs) != 3 or len(w) != 2 or w[0] != 4 * w[1] or xs[2] != w[0]:
        raise ShapeError(f"lstm_scan: xproj {xs} and w_hh {w} must be (T, B, 4H) and "
                         f"(4H, H)")
    if h0 != (xs[1], w[1]) or c0 != h0:
        raise ShapeError(f"lstm_scan: h0 {h0} and c0 {c0} must be (B, H) = "
                         f"{(xs[1], w[1])}")
    if xs[0] == 0:
        raise ShapeError("lstm_scan: the sequence is empty (T = 0)")
    return (xs[0], 6, xs[1], w[1]), p


def _vjp_rule(p: ScanParams, gy: Any, y: Any, h0: Any, c0: Any, w: Any) -> Any:
    if gy != y or len(y) != 4 or y[1] != 6 or len(w) != 2 or w[0] != 4 * w[1] or \
            y[3] != w[1] or h0 != y[2:] or c0 != h0:
        raise ShapeError(f"lstm_scan_vjp: shapes {gy}, {y}, {h0}, {c0}, {w} must be "
                         f"(T, 6, B, H) twice, (B, H) twice and (4H, H)")
    return (y[0] + p.initial, y[2], 4 * w[1]), p


# ---- numpy lowerings ----

def _sigmoid_(v: np.ndarray) -> None:
    """σ in place, as 1/2 tanh(v/2) + 1/2: no overflow for any v."""
    v *= 0.5
    np.tanh(v, out=v)
    v *= 0.5
    v += 0.5


def _own_gemm(dtype: Any, batch: int, hd: int) -> bool:
    """Whether the per-step products (B, H) @ (H, 4H) run on easyad's AVX-512 kernels: at
    (64, 256) @ (256, 1024) on one thread they take ~265 us where OpenBLAS's take ~330
    (float64: 585 and 690; auto mode keeps OpenBLAS for the large products, where they
    are even). EASYAD_MATMUL=blas, a multi-threaded OpenBLAS, another dtype or a product
    below _blas's smallest keep numpy's."""
    threads = _blas.blas_threads()
    return _core.GEMM_SUPPORTED and _blas._MODE != "blas" and threads in (None, 1) \
        and np.dtype(dtype) in (np.float32, np.float64) \
        and batch * hd * 4 * hd >= _blas._SMALLEST


def _c32(a: Any) -> np.ndarray:
    return np.ascontiguousarray(a, np.float32)


def _scan_numpy(p: ScanParams, xproj: np.ndarray, h0: np.ndarray, c0: np.ndarray,
                w: np.ndarray) -> np.ndarray:
    steps, batch, four = xproj.shape
    hd = four // 4
    dtype = np.result_type(xproj, h0, c0, w)
    own = _own_gemm(dtype, batch, hd)
    if own and dtype == np.float32:      # every step in C (easyad/_lstm.h)
        c32 = _c32
        return _core._lstm_scan_f32(c32(xproj), c32(h0), c32(c0), c32(w), p.reverse)
    y = np.empty((steps, 6, batch, hd), dtype)
    # gate-major: each gate's (B, H) block contiguous (numpy's loops run 2-3x faster on
    # them than on column slices); the product as 4 GEMMs h W_k^T, one per gate
    xs = xproj.reshape(steps, batch, 4, hd).transpose(0, 2, 1, 3)
    if own:       # one (B, 4H) product a step, added to xproj gate-major in one pass
        wt = np.ascontiguousarray(w.T, dtype=dtype)
    else:
        wt = np.ascontiguousarray(w.reshape(4, hd, hd).transpose(0, 2, 1), dtype=dtype)
    h, c = np.asarray(h0, dtype), np.asarray(c0, dtype)
    for t in _order(p, steps):
        a, cn, hn = y[t, :4], y[t, 4], y[t, 5]
        if own:
            np.add(_core._gemm(h, wt).reshape(batch, 4, hd).transpose(1, 0, 2), xs[t],
                   out=a)
        else:
            np.matmul(h, wt, out=a)
            a += xs[t]
        _sigmoid_(a[:2])
        np.tanh(a[2], out=a[2])
        _sigmoid_(a[3])
        np.multiply(a[0], a[2], out=cn)
        np.multiply(a[1], c, out=hn)         # (hn as scratch)
        cn += hn
        np.tanh(cn, out=hn)
        hn *= a[3]
        h, c = hn, cn
    return y


def _vjp_numpy(p: ScanParams, gy: np.ndarray, y: np.ndarray, h0: np.ndarray,
               c0: np.ndarray, w: np.ndarray) -> np.ndarray:
    steps, _, batch, hd = y.shape
    dtype = np.result_type(gy, y, w)
    own = _own_gemm(dtype, batch, hd)
    if own and dtype == np.float32:
        c32 = _c32
        return _core._lstm_scan_vjp_f32(c32(gy), c32(y), c32(c0), c32(w), p.reverse,
                                        p.initial)
    d = np.empty((steps + p.initial, batch, 4 * hd), dtype)
    dh = np.zeros((batch, hd), dtype)
    dc = np.zeros((batch, hd), dtype)
    tc = np.empty((batch, hd), dtype)
    s = np.empty((4, batch, hd), dtype)          # the gates' cotangents, gate-major
    q = np.empty((4, batch, hd), dtype)          # the gates' derivatives
    order = list(_order(p, steps))
    wc = np.ascontiguousarray(w, dtype=dtype) if own else w
    for k in range(steps - 1, -1, -1):
        t = order[k]
        yt, gt = y[t], gy[t]
        i, f, g, o = yt[0], yt[1], yt[2], yt[3]
        c_prev = c0 if k == 0 else y[order[k - 1], 4]
        dh += gt[5]
        np.tanh(yt[4], out=tc)
        np.multiply(dh, tc, out=s[3])
        s[3] += gt[3]
        np.multiply(tc, tc, out=tc)              # dc += gy_c + dh o (1 - tanh(c)^2)
        np.subtract(1.0, tc, out=tc)
        tc *= o
        tc *= dh
        dc += tc
        dc += gt[4]
        np.multiply(dc, g, out=s[0])
        np.multiply(dc, c_prev, out=s[1])
        np.multiply(dc, i, out=s[2])
        s[:3] += gt[:3]
        np.multiply(yt[:4], yt[:4], out=q)       # the gates' squares in one pass, then
        np.subtract(yt[:2], q[:2], out=q[:2])    # σ' = s - s^2 (i, f),
        np.subtract(1.0, q[2], out=q[2])         # tanh' = 1 - g^2,
        np.subtract(o, q[3], out=q[3])           # σ'(o)
        dc *= f
        dt = d[t]                                # written in xproj's layout (B, 4H)
        np.multiply(s, q, out=dt.reshape(batch, 4, hd).transpose(1, 0, 2))
        if own:
            dh = _core._gemm(dt, wc)
        else:
            np.matmul(dt, w, out=dh)
    if p.initial:
        d[steps, :, :hd] = dc
        d[steps, :, hd:2 * hd] = dh
        d[steps, :, 2 * hd:] = 0.0
    return d


# ---- the same mathematics with easyad operations (every transform's form) ----

class _F:
    """σ and tanh for Tensors (the fused, stable σ nn uses) and TraceTensors alike (not
    easyad.nn.functional: ops sit below nn)."""

    @staticmethod
    def sigmoid(x: Any) -> Any:
        from easyad.tensor import Tensor, sigmoid
        return sigmoid(x) if isinstance(x, Tensor) else x.expit()

    @staticmethod
    def tanh(x: Any) -> Any:
        return x.tanh()


def _tensor_ops() -> Any:
    from easyad import tensor
    return tensor, _F


def _forward(p: ScanParams, xproj: Any, h0: Any, c0: Any, w: Any) -> Any:
    """``lstm_scan`` as per-step easyad operations (its jvp runs it on TraceTensors)."""
    tensor, F = _tensor_ops()
    steps, hd = xproj.shape[0], w.shape[1]
    wt = w.T
    h, c = h0, c0
    rows: list[Any] = [None] * steps
    for t in _order(p, steps):
        a = xproj[t] + h @ wt
        i, f = F.sigmoid(a[:, :hd]), F.sigmoid(a[:, hd:2 * hd])
        g, o = F.tanh(a[:, 2 * hd:3 * hd]), F.sigmoid(a[:, 3 * hd:])
        c = f * c + i * g
        h = o * F.tanh(c)
        rows[t] = tensor.stack([i, f, g, o, c, h], axis=0)
    return tensor.stack(rows, axis=0)


def _backward(p: ScanParams, gy: Any, y: Any, h0: Any, c0: Any,
              w: Any) -> tuple[Any, Any, Any, Any]:
    """The cotangents (xproj, h0, c0, w_hh) by the backward recurrence, with easyad
    operations on the saved result ``y`` (so recorded tensors record: any order)."""
    tensor, F = _tensor_ops()
    steps = y.shape[0]
    order = list(_order(p, steps))
    dh: Any = 0.0
    dc: Any = 0.0
    rows: list[Any] = [None] * steps
    dw: Any = None
    for k in range(steps - 1, -1, -1):
        t = order[k]
        yt, gt = y[t], gy[t]
        i, f, g, o = yt[0], yt[1], yt[2], yt[3]
        c_prev = c0 if k == 0 else y[order[k - 1], 4]
        h_prev = h0 if k == 0 else y[order[k - 1], 5]
        dh = dh + gt[5]
        tc = F.tanh(yt[4])
        dc = dc + gt[4] + dh * o * (1.0 - tc * tc)
        da = tensor.concatenate([
            (dc * g + gt[0]) * (i - i * i),
            (dc * c_prev + gt[1]) * (f - f * f),
            (dc * i + gt[2]) * (1.0 - g * g),
            (dh * tc + gt[3]) * (o - o * o)], axis=-1)
        rows[t] = da
        step_dw = da.T @ h_prev
        dw = step_dw if dw is None else dw + step_dw
        dc = dc * f
        dh = da @ w
    return tensor.stack(rows, axis=0), dh, dc, dw


def _traced(values: Any, tangents: Any) -> list[Any]:
    from easyad.tensor._trace import TraceTensor
    return [TraceTensor._of(v, t) for v, t in zip(values, tangents)]


def _scan_jvp(p: ScanParams, tangents: Any, *xs_out: Any) -> Any:
    return _forward(p, *_traced(xs_out[:4], tangents))._tangent


def _packed_backward(p: ScanParams, gy: Any, y: Any, h0: Any, c0: Any, w: Any) -> Any:
    """``lstm_scan_vjp`` with easyad operations: ``_backward`` packed as the op packs."""
    tensor, _ = _tensor_ops()
    dx, dh0, dc0, _ = _backward(p, gy, y, h0, c0, w)
    if not p.initial:
        return dx
    zeros = dh0 * 0.0
    last = tensor.concatenate([dc0, dh0, zeros, zeros], axis=-1)
    return tensor.concatenate([dx, last[None]], axis=0)


def _vjp_vjp(p: ScanParams, g: Any, *xs_out: Any) -> Any:
    """lstm_scan_vjp's cotangents: ``<g, _packed_backward(xs)>`` differentiated once by a
    sweep over its recording alone (as ``ad.checkpoint``'s node). Recorded operands
    (create_graph) record it on their list, so every order follows; constant ones on a
    list of its own, dropped after. (nn.lstm never makes this node: its step applies
    lstm_scan_vjp to buffers and create_graph takes ``_backward`` directly.)"""
    from easyad._core import WengertList
    from easyad._higher import backward_graph
    from easyad.tensor._base import Node, _no_vjp
    xs = xs_out[:5]
    tape = next((x.tape for x in (*xs, g) if recorded(x)), None)
    if tape is not None:
        start = len(tape)
        total = (_packed_backward(p, *xs) * g).sum()
        if isinstance(total, TensorBase):     # (a recording keeps numbers as tensors)
            total = total.handle
        d = backward_graph(total, 1.0, stop=start)
        return tuple(d._adjoint(x._index) if recorded(x) and x.tape is tape else None
                     for x in xs)
    inner: Any = WengertList()
    leaves = [wrap(type(x), x._backend, x._data, x.shape, x.dtype, inner,
                   inner._push_node(Node("variable", (), _no_vjp))) for x in xs]
    d = (_packed_backward(p, *leaves) * g).sum().derivatives()
    cts = [d._node_adjoint(v._index) for v in leaves]
    return tuple(None if c is None else wrap(type(v), v._backend, c, v.shape, v.dtype)
                 for c, v in zip(cts, leaves))


def recorded(v: Any) -> bool:
    return isinstance(v, TensorBase) and v.tape is not None


def _vjp_jvp(p: ScanParams, tangents: Any, *xs_out: Any) -> Any:
    return _packed_backward(p, *_traced(xs_out[:5], tangents))._tangent


def _scan_vjp(p: ScanParams, g: Any, xproj: Any, h0: Any, c0: Any, w: Any,
              out: Any) -> Any:
    return _backward(p, g, out, h0, c0, w)


# ---- the node's step: the fast backward ----

def _fast_vjp(p: ScanParams, g: Any, xproj: Any, h0: Any, c0: Any, w: Any,
              y: Any) -> tuple[Any, Any, Any, Any]:
    """The step's cotangents with tensor operations (operands of mixed dtypes)."""
    tensor, _ = _tensor_ops()
    steps, batch, hd = y.shape[0], y.shape[2], w.shape[1]
    d = apply(LSTM_SCAN_VJP, p, (g, y, h0, c0, w))
    da = d[:steps]
    hs = y[:, 5]
    h_prev = tensor.concatenate([hs[1:], h0[None]] if p.reverse else [h0[None], hs[:-1]],
                                axis=0) if steps > 1 else h0[None]
    dw = da.reshape((steps * batch, 4 * hd)).T @ h_prev.reshape((steps * batch, hd))
    return da, d[steps, :, hd:2 * hd], d[steps, :, :hd], dw


class _ScanStep(OpStep):
    """lstm_scan's node. The sweep runs ``lstm_scan_vjp`` and, for ``w_hh``, ONE GEMM over
    every step (the backend's ``linear_vjp``: ``da^T h_prev``), on the buffers, so a
    recording records these few instructions; ``graph`` (create_graph) runs the op's vjp,
    the per-step easyad form."""

    __slots__ = ()

    def __call__(self, g: Any) -> tuple[Any, ...]:
        be, dtype, p = self.be, self.dtype, self.params
        if any(dt != dtype for _, _, dt, _ in self.operands) or not hasattr(g, "shape"):
            return self._mixed(g)          # (operands of other dtypes: cast as tensors)
        (_, _, _, xi), (h0, _, _, hi), (c0, _, _, ci), (w, _, _, wi) = self.operands
        y = self.data
        steps, _, batch, hd = self.shape
        initial = hi >= 0 or ci >= 0
        rows = steps + initial
        d = be.op(LSTM_SCAN_VJP, ScanParams(p.reverse, initial), [g, y, h0, c0, w],
                  (rows, batch, 4 * hd), dtype)
        da = d if not initial else be.strided(d, 0, (steps, batch, 4 * hd),
                                              (batch * 4 * hd, 4 * hd, 1))
        dw = None
        if wi >= 0:
            dw = be.linear_vjp(be.reshape(da, (steps * batch, 4 * hd)),
                               be.reshape(_previous(be, p, y, h0, steps, batch, hd, dtype),
                                          (steps * batch, hd)),
                               None, (False, True, False))[1]
        last = steps * batch * 4 * hd
        return (da if xi >= 0 else None,
                be.strided(d, last + hd, (batch, hd), (4 * hd, 1)) if hi >= 0 else None,
                be.strided(d, last, (batch, hd), (4 * hd, 1)) if ci >= 0 else None, dw)

    def _mixed(self, g: Any) -> tuple[Any, ...]:
        cls, be = self.cls, self.be
        if not hasattr(g, "shape"):
            g = be.full(self.shape, float(g), self.dtype)
        gt = wrap(cls, be, g, self.shape, self.dtype)
        xs = [_value(cls, be, d, s, dt) for d, s, dt, _ in self.operands]
        out = _value(cls, be, self.data, self.shape, self.dtype)
        cts = _fast_vjp(self.params, gt, *xs, out)
        return tuple(None if index < 0 else _buffer(ct, cls, be, shape, dt)
                     for ct, (_, shape, dt, index) in zip(cts, self.operands))


def _previous(be: Backend, p: ScanParams, y: Any, h0: Any, steps: int, batch: int,
              hd: int, dtype: Any) -> Any:
    """(T, B, H): the state each step started from (h0 for the first), as one buffer."""
    block = (batch * hd, hd, 1)
    first = (steps - 1) * batch * hd if p.reverse else 0
    parts = [(first, (1, batch, hd), block, h0)]
    if steps > 1:
        start = 6 * batch * hd if p.reverse else 0        # y is (T, 6, B, H)
        hs = be.strided(y, start + 5 * batch * hd, (steps - 1, batch, hd),
                        (6 * batch * hd, hd, 1))
        parts.append((0 if p.reverse else batch * hd, (steps - 1, batch, hd), block, hs))
    return be.assemble((steps, batch, hd), dtype, parts)


LSTM_SCAN: Op = register(Op(
    name="lstm_scan", params=ScanParams, rule=_scan_rule, numpy=_scan_numpy,
    vjp=_scan_vjp, jvp=_scan_jvp,
    step=lambda p, cls, be, ops, bufs, out, shape, dtype: _ScanStep(
        LSTM_SCAN, p, cls, be, ops, out, shape, dtype),
    doc="an LSTM layer's recurrence over a sequence (packed i, f, g, o, c, h per step)"))

LSTM_SCAN_VJP: Op = register(Op(
    name="lstm_scan_vjp", params=ScanParams, rule=_vjp_rule, numpy=_vjp_numpy,
    vjp=_vjp_vjp, jvp=_vjp_jvp,
    doc="lstm_scan's backward recurrence (the pre-activations' cotangents, dc0, dh0)"))


def lstm_scan(xproj: Any, h0: Any, c0: Any, w_hh: Any, reverse: bool = False) -> Any:
    """The packed result (T, 6, B, H) of one LSTM layer's recurrence (module docstring)."""
    for name, v in (("xproj", xproj), ("h0", h0), ("c0", c0), ("w_hh", w_hh)):
        if not isinstance(v, (TensorBase, np.ndarray)):
            raise TypeError(f"lstm_scan: {name} must be a Tensor or numpy array, not "
                            f"{type(v).__name__}")
    return apply(LSTM_SCAN, ScanParams(bool(reverse)), (xproj, h0, c0, w_hh))
