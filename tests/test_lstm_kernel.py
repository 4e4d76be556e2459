"""The float32 LSTM kernels of the core (``easyad/_lstm.h``, through ``_core._lstm_*``):
their exp, sigmoid and tanh against float64 references to the ulp bounds the header
states (random points, -0, inf, nan, overflow, gradual underflow), and the recurrences
against torch.func.vjp in float64 and against easyad's per-step form, at ordinary and
saturating pre-activations, forward and reversed, with and without the result's
cotangent."""
from __future__ import annotations

import numpy as np
import pytest
import torch
from torch import func

from easyad import _core
from easyad.ops import _lstm

pytestmark = pytest.mark.skipif(not _core.GEMM_SUPPORTED,
                                reason="the kernels run where _gemm's AVX-512 ones do")

F32 = np.float32


def _ulps(got: np.ndarray, want: np.ndarray) -> np.ndarray:
    """|got - want| in units of the float32 spacing at want (the subnormals' spacing at
    least), for the points where float32 holds want finitely."""
    with np.errstate(over="ignore"):
        rounded = want.astype(F32)
    finite = np.isfinite(rounded)
    spacing = np.maximum(np.spacing(np.abs(rounded[finite])).astype(np.float64),
                         float(np.spacing(F32(0))))
    return np.abs(got[finite].astype(np.float64) - want[finite]) / spacing


def _points() -> np.ndarray:
    rng = np.random.default_rng(3)
    return np.concatenate([
        rng.normal(size=20000) * 4, rng.uniform(-110, 95, 20000),
        rng.uniform(-1, 1, 5000) * 1e-3, rng.uniform(-0.6, 0.6, 5000),
        [0.55, -0.55, 0.5499999, 88.7, 88.72, -87.3, -100.0, -103.9, 1e-30, -1e-30,
         1e-40, 20.5, -20.5, 1e4, -1e4]]).astype(F32)


REFERENCES = {0: ("exp", np.exp, 2), 1: ("sigmoid", lambda x: 1 / (1 + np.exp(-x)), 3),
              2: ("tanh", np.tanh, 3)}


@pytest.mark.parametrize("which", [0, 1, 2], ids=["exp", "sigmoid", "tanh"])
def test_functions_within_their_stated_ulps(which):
    name, ref, bound = REFERENCES[which]
    x = _points()
    with np.errstate(over="ignore"):
        want = ref(x.astype(np.float64))
    got = _core._lstm_apply_f32(which, x)
    assert got.dtype == F32 and got.shape == x.shape
    worst = _ulps(got, want).max()
    assert worst <= bound, f"{name}: {worst:.2f} ulp"
    # where float32 overflows, inf (exp) or the limit (sigmoid, tanh)
    with np.errstate(over="ignore"):
        over = ~np.isfinite(want.astype(F32))
    assert np.all(np.isinf(got[over]))


def test_special_values():
    x = np.array([0.0, -0.0, np.inf, -np.inf, np.nan, -np.nan], F32)
    e, s, t = (_core._lstm_apply_f32(k, x) for k in range(3))
    assert e[:4].tolist() == [1.0, 1.0, np.inf, 0.0] and np.isnan(e[4:]).all()
    assert s[:4].tolist() == [0.5, 0.5, 1.0, 0.0] and np.isnan(s[4:]).all()
    assert t[:4].tolist() == [0.0, 0.0, 1.0, -1.0] and np.isnan(t[4:]).all()
    assert not np.signbit(t[0]) and np.signbit(t[1])          # tanh(-0) = -0
    # gradual underflow: exp(-100) and sigmoid(-100) are subnormals, not zero
    tiny = _core._lstm_apply_f32(0, np.array([-100.0, -104.5], F32))
    assert 0 < tiny[0] < np.finfo(F32).tiny
    assert abs(float(tiny[0]) - np.exp(-100.0)) <= float(np.spacing(F32(0)))
    assert tiny[1] == 0.0
    assert _core._lstm_apply_f32(1, np.array([-100.0], F32))[0] > 0


def _torch_packed(xproj, h0, c0, w, reverse):
    """(T, 6, B, H): i, f, g, o, c, h per step, by torch's operations."""
    steps, hd = xproj.shape[0], w.shape[1]
    h, c, rows = h0, c0, [None] * steps
    for t in (range(steps - 1, -1, -1) if reverse else range(steps)):
        a = xproj[t] + h @ w.T
        i, f, g, o = (a[:, k * hd:(k + 1) * hd] for k in range(4))
        i, f, g, o = torch.sigmoid(i), torch.sigmoid(f), torch.tanh(g), torch.sigmoid(o)
        c = f * c + i * g
        h = o * torch.tanh(c)
        rows[t] = torch.stack([i, f, g, o, c, h])
    return torch.stack(rows)


def _operands(scale, t=6, b=5, hd=37, seed=0):
    """H = 37: whole 16-lane vectors and a remainder; ``scale`` sets the pre-activations'
    size (20: the gates saturate, the exp's clamps and both tanh branches run)."""
    rng = np.random.default_rng(seed)
    xproj = (rng.normal(size=(t, b, 4 * hd)) * scale).astype(F32)
    h0, c0 = (rng.normal(size=(b, hd)).astype(F32) for _ in range(2))
    w = (rng.normal(size=(4 * hd, hd)) * 0.3).astype(F32)
    return xproj, h0, c0, w


@pytest.mark.parametrize("scale", [1.0, 20.0], ids=["ordinary", "saturating"])
@pytest.mark.parametrize("reverse", [False, True], ids=["forward", "reversed"])
def test_recurrences_against_torch_func(scale, reverse):
    xproj, h0, c0, w = _operands(scale)
    y = _core._lstm_scan_f32(xproj, h0, c0, w, reverse)
    tx = [torch.tensor(a, dtype=torch.float64) for a in (xproj, h0, c0, w)]
    want, pullback = func.vjp(lambda *a: _torch_packed(*a, reverse), *tx)
    np.testing.assert_allclose(y, want.numpy(), rtol=0, atol=1e-5)
    gy = np.random.default_rng(1).normal(size=y.shape).astype(F32)
    # the cotangents at torch's own y (float64): the backward alone is compared
    d = _core._lstm_scan_vjp_f32(gy, want.numpy().astype(F32), c0, w, reverse, True)
    dx, dh0, dc0, _ = pullback(torch.tensor(gy, dtype=torch.float64))
    steps, hd = xproj.shape[0], w.shape[1]
    scale_d = max(1.0, float(dx.abs().max()))
    np.testing.assert_allclose(d[:steps], dx.numpy(), rtol=0, atol=2e-5 * scale_d)
    np.testing.assert_allclose(d[steps, :, :hd], dc0.numpy(), rtol=0, atol=2e-5 * scale_d)
    np.testing.assert_allclose(d[steps, :, hd:2 * hd], dh0.numpy(), rtol=0,
                               atol=2e-5 * scale_d)
    assert not d[steps, :, 2 * hd:].any()


def test_recurrences_against_the_per_step_form():
    """The kernels against easyad's own per-step operations (the form every transform
    differentiates), float32, at random operands."""
    from easyad import Tensor
    xproj, h0, c0, w = _operands(2.0, seed=4)
    p = _lstm.ScanParams(False, False)
    y = _core._lstm_scan_f32(xproj, h0, c0, w, False)
    want = _lstm._forward(p, *(Tensor.constant(a) for a in (xproj, h0, c0, w)))
    np.testing.assert_allclose(y, want.value, rtol=0, atol=1e-5)
    gy = np.random.default_rng(5).normal(size=y.shape).astype(F32)
    d = _core._lstm_scan_vjp_f32(gy, y, c0, w, False, False)
    dx = _lstm._backward(p, *(Tensor.constant(a) for a in (gy, y, h0, c0, w)))[0]
    np.testing.assert_allclose(d, dx.value, rtol=0,
                               atol=1e-5 * max(1.0, float(np.abs(dx.value).max())))


def test_no_cotangent_is_zeros():
    """gy None is a cotangent of zeros; one h cotangent at the last step gives that
    step's output gate the hand-derived tanh(c) o (1 - o)."""
    xproj, h0, c0, w = _operands(1.0, seed=6)
    y = _core._lstm_scan_f32(xproj, h0, c0, w, False)
    d0 = _core._lstm_scan_vjp_f32(None, y, c0, w, False, True)
    assert d0.shape == (y.shape[0] + 1, y.shape[2], 4 * y.shape[3]) and not d0.any()
    gy = np.zeros_like(y)
    gy[-1, 5] = 1.0
    d1 = _core._lstm_scan_vjp_f32(gy, y, c0, w, False, True)
    o, c = y[-1, 3].astype(np.float64), y[-1, 4].astype(np.float64)
    hd = y.shape[3]
    np.testing.assert_allclose(d1[-2, :, 3 * hd:], np.tanh(c) * o * (1 - o), rtol=0,
                               atol=1e-6)
    assert np.abs(d1[0]).max() > 0          # the cotangent reaches the first step


def test_bad_operands_name_the_problem():
    xproj, h0, c0, w = _operands(1.0)
    wt = np.ascontiguousarray(w.T)       # (H, 4H): not W_hh's shape
    with pytest.raises(TypeError, match="h0 must be a float32"):
        _core._lstm_scan_f32(xproj, h0.astype(np.float64), c0, w, False)
    with pytest.raises(ValueError, match="w must be C-contiguous of shape"):
        _core._lstm_scan_f32(xproj, h0, c0, wt, False)
    with pytest.raises(ValueError, match="c0 must be C-contiguous"):
        _core._lstm_scan_f32(xproj, h0, np.asfortranarray(np.ones((5, 37), F32)), w,
                             False)
    y = _core._lstm_scan_f32(xproj, h0, c0, w, False)
    with pytest.raises(ValueError, match="gy must be C-contiguous of shape"):
        _core._lstm_scan_vjp_f32(y[:, :5], y, c0, w, False, True)
    with pytest.raises(ValueError, match="which is 0"):
        _core._lstm_apply_f32(3, h0)
