"""Fused kernels written with a backend's own primitives, for backends that have no
dedicated kernel for them (OpenCL, meta). The numpy backend overrides them with direct
numpy code; each is checked against the other by the tests (``tests/test_tensor.py``).

A mixin: it calls ``self.map``, ``self.reduce``, ``self.take``... of the Backend Protocol
(``_backend.py``; its methods' ``self: Backend`` says so to mypy) and imports nothing of
easyad at run time.
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np

if TYPE_CHECKING:
    from easyad.tensor._backend import Backend


class ComposedKernels:
    """``linear``, ``linear_vjp``, ``cross_entropy`` and ``cross_entropy_vjp`` from matmul,
    map, reduce, take and scatter_add."""

    def linear(self: Backend, x: Any, w: Any, b: Any) -> Any:
        """``x @ w.T + b``: x (N, K), w (O, K), b a buffer of shape (O,) or (), a float, or
        None; (N, O)."""
        be = self
        (n, k), o = x.shape, w.shape[0]
        out = be.matmul(be.reshape(x, (1, n, k)), be.reshape(w, (1, o, k)), transpose_b=True)
        out = be.reshape(out, (n, o))
        if b is not None:
            (out,) = be.map("linear_bias", ("x + b",), {"x": out, "b": b}, (n, o),
                            (x.dtype,))
        return out

    def linear_vjp(self: Backend, g: Any, x: Any, w: Any, needs: tuple[bool, bool, bool]
                   ) -> tuple[Any, Any, Any]:
        """(g w, gᵀ x, Σₙ g) for g (N, O), each None where ``needs`` says so; x, w may be
        None where their partner's adjoint is not needed."""
        be = self
        n, o = g.shape
        g3 = be.reshape(g, (1, n, o))
        gx = gw = gb = None
        if needs[0]:
            k = w.shape[1]
            gx = be.reshape(be.matmul(g3, be.reshape(w, (1, o, k))), (n, k))
        if needs[1]:
            k = x.shape[1]
            gw = be.reshape(be.matmul(g3, be.reshape(x, (1, n, k)), transpose_a=True), (o, k))
        if needs[2]:
            gb = be.reduce("sum", g, (0,))
        return gx, gw, gb

    def cross_entropy(self: Backend, z: Any, target: np.ndarray, divisor: float) -> tuple[Any, Any]:
        """(the 0-d buffer ``sum_n (logsumexp(z[n]) - z[n, target[n]]) / divisor``, what
        ``cross_entropy_vjp`` reads)."""
        be = self
        n, c = z.shape
        dtype = z.dtype
        m = be.reshape(be.reduce("max", z, (1,)), (n, 1))
        # shifted by the maximum where it is finite (as logsumexp is)
        (m,) = be.map("ce_shift", ("choose(m - m == 0.0, m, 0.0)",), {"m": m}, (n, 1),
                      (dtype,))
        (e,) = be.map("ce_exp", ("exp(x - m)",), {"x": z, "m": m}, (n, c), (dtype,))
        s = be.reshape(be.reduce("sum", e, (1,)), (n, 1))
        picked = be.reshape(be.take(z, np.arange(n) * c + target), (n, 1))
        (rows,) = be.map("ce_rows", ("log(s) + m - p",), {"s": s, "m": m, "p": picked},
                         (n, 1), (dtype,))
        total = be.reshape(be.reduce("sum", rows, (0, 1)), ())
        (loss,) = be.map("ce_mean", ("t / d",), {"t": total, "d": float(divisor)}, (),
                         (dtype,))
        return loss, (e, s)

    def cross_entropy_vjp(self: Backend, saved: Any, target: np.ndarray, scale: float) -> Any:
        """``(softmax(z) - onehot(target)) * scale``, of z's shape."""
        be = self
        e, s = saved
        n, c = e.shape
        ones = be.full((n,), 1.0, e.dtype)
        onehot = be.scatter_add((n, c), e.dtype, np.arange(n) * c + target, ones, True)
        (out,) = be.map("ce_vjp", ("(e / s - h) * k",), {"e": e, "s": s, "h": onehot,
                                                          "k": float(scale)}, (n, c),
                        (e.dtype,))
        return out
