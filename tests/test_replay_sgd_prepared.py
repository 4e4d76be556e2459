"""``TensorFunction.sgd_step``'s prepared call (a training loop passing the same dict of
Parameters at each step: only what can change is checked) and the fused C's 512-bit
vectors: the same bits as the general path and as the 256-bit build, every change the
general path would see still seen (and explained by it), the loss and update checked
against torch.func."""
from __future__ import annotations

import numpy as np
import pytest

import easyad as ad
from easyad import nn
from easyad.compiler.program import fused_c

torch = pytest.importorskip("torch")

SIZES, BATCH, LR = (7, 5, 4), 9, 0.3


def _setup(dtype, seed=0):
    ad.random.seed(seed)
    model = nn.Sequential(nn.Linear(SIZES[0], SIZES[1], dtype=dtype), nn.Tanh(),
                          nn.Linear(SIZES[1], SIZES[2], dtype=dtype))
    rng = np.random.default_rng(seed + 1)
    x = rng.standard_normal((BATCH, SIZES[0])).astype(dtype)
    y = rng.integers(0, SIZES[2], BATCH)

    def loss(params, x, y):
        return nn.functional.cross_entropy(nn.functional_call(model, params, x), y)
    named = dict(model.named_parameters())
    F = ad.record(loss, {k: p.data for k, p in named.items()}, x, y)
    return F, model, named, x, y


def _torch_step(state, x, y):
    """One SGD step in float64 by torch.func: (loss, new parameters)."""
    t = {k: torch.tensor(np.asarray(v), dtype=torch.float64) for k, v in state.items()}

    def loss(p):
        h = torch.tanh(torch.tensor(x, dtype=torch.float64) @ p["0.weight"].T + p["0.bias"])
        return torch.nn.functional.cross_entropy(h @ p["2.weight"].T + p["2.bias"],
                                                 torch.tensor(y))
    grad, value = torch.func.grad_and_value(loss)(t)
    return float(value), {k: (t[k] - LR * grad[k]).numpy() for k in t}


def _counting_inputs(F):
    calls = []
    general = F._inputs

    def counted(*a):
        calls.append(1)
        return general(*a)
    F._inputs = counted
    return calls


@pytest.mark.parametrize("dtype, rtol", [(np.float64, 1e-12), (np.float32, 2e-6)])
def test_prepared_steps_give_the_general_paths_bits_and_torchs_values(dtype, rtol):
    F, model, named, x, y = _setup(dtype)
    G, model_g, _, _, _ = _setup(dtype)
    calls = _counting_inputs(F)
    for step in range(5):
        before = {k: np.array(p.data) for k, p in named.items()}
        want_loss, want = _torch_step(before, x, y)
        loss = F.sgd_step(named, x, y, lr=LR)                 # the same dict: prepared
        # a new dict each step: the general path (4 misses, then it stops preparing)
        loss_g = G.sgd_step(dict(model_g.named_parameters()), x, y, lr=LR)
        assert loss == loss_g and loss == pytest.approx(want_loss, rel=rtol)
        for k, p in named.items():
            assert np.array_equal(p.data, model_g.state_dict()[k]), (step, k)
            np.testing.assert_allclose(p.data, want[k], rtol=rtol, atol=rtol)
    assert len(calls) == 1, "steps after the first skip the general path's checks"
    assert G._sgd_ready is None and G._sgd_misses == 4


def test_what_changes_between_steps_is_still_seen():
    F, model, named, x, y = _setup(np.float32)
    F.sgd_step(named, x, y, lr=LR)
    assert F._sgd_ready is not None
    with pytest.raises(ValueError, match="part of the recording and changed"):
        F.sgd_step(named, x, (y + 1) % SIZES[2], lr=LR)      # other labels
    with pytest.raises(ValueError, match="recorded for an argument of shape"):
        F.sgd_step(named, x[:3], y, lr=LR)
    with pytest.raises(ValueError, match="finite"):
        F.sgd_step(named, x, y, lr=float("nan"))
    # an entry of the dict replaced: the new Parameter is updated, the old one is not
    F.sgd_step(named, x, y, lr=LR)
    old = named["2.bias"]
    kept = np.array(old.data)
    named["2.bias"] = nn.Parameter(np.array(old.data))
    F.sgd_step(named, x, y, lr=LR)
    assert np.array_equal(old.data, kept) and not np.array_equal(named["2.bias"].data, kept)
    # new values loaded into the model: the step starts from them
    state = {k: np.asarray(v) * 0.5 for k, v in model.state_dict().items()}
    model.load_state_dict(state)
    named = dict(model.named_parameters())
    F.sgd_step(named, x, y, lr=LR)
    F.sgd_step(named, x, y, lr=LR)
    want = _torch_step(state, x, y)[1]
    want = _torch_step(want, x, y)[1]
    for k, p in named.items():
        np.testing.assert_allclose(p.data, want[k], rtol=2e-6, atol=2e-6)
    # a read-only array: the general path's refusal, nothing written
    plain = {k: np.array(p.data) for k, p in named.items()}
    F.sgd_step(plain, x, y, lr=LR)
    plain["0.bias"].flags.writeable = False
    frozen = {k: np.array(v) for k, v in plain.items()}
    with pytest.raises(ValueError, match="writable"):
        F.sgd_step(plain, x, y, lr=LR)
    assert all(np.array_equal(plain[k], frozen[k]) for k in plain)


def test_recording_again_drops_the_prepared_call_and_guards_keep_the_general_path():
    F, model, named, x, y = _setup(np.float64)
    F.sgd_step(named, x, y, lr=LR)
    assert F._sgd_ready is not None
    xs, statics = F._inputs(named, (x, y))
    F._record("sgd_step", xs, statics)
    assert F._sgd_ready is None

    def guarded(params, x, y):
        z = nn.functional_call(model, params, x)
        z = z * 2.0 if bool(z.sum() > -1e9) else z       # a guard on a branch
        return nn.functional.cross_entropy(z, y)
    G = ad.record(guarded, {k: p.data for k, p in named.items()}, x, y,
                  on_branch_change="retape")
    G.sgd_step(named, x, y, lr=LR)
    assert G._sgd_ready is None


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_512_bit_vectors_give_the_same_bits(monkeypatch, dtype):
    """The fused C built with and without -mprefer-vector-width=512 (tanh, its
    derivative, the update, at ordinary and saturated pre-activations)."""
    if not fused_c._WIDE:
        pytest.skip("not an x86-64 machine: no 512-bit build to compare")
    results = []
    for wide in (fused_c._WIDE, ()):
        monkeypatch.setattr(fused_c, "_WIDE", wide)
        monkeypatch.setattr(fused_c, "_WIDE_FROM", 0)     # every loop, short ones too
        F, model, named, x, y = _setup(dtype)
        losses = []
        for scale in (1.0, 30.0, 1e3):
            for p in named.values():
                p.data[...] = p.data * dtype(scale)
            losses.append(F.sgd_step(named, x, y, lr=LR))
        results.append((losses, [np.array(p.data) for p in named.values()]))
    assert np.array_equal(results[0][0], results[1][0], equal_nan=True)
    assert all(np.array_equal(a, b, equal_nan=True) for a, b in zip(results[0][1], results[1][1]))


def _rosen(x):
    return (100.0 * (x[1:] - x[:-1] ** 2) ** 2 + (1.0 - x[:-1]) ** 2).sum()


def _rosen_grad(x):            # by hand: the reference
    g = np.zeros_like(x)
    d = x[1:] - x[:-1] ** 2
    g[:-1] = -400.0 * x[:-1] * d - 2.0 * (1.0 - x[:-1])
    g[1:] += 200.0 * d
    return g


@pytest.mark.parametrize("n", [100, fused_c._WIDE_FROM + 1])
def test_only_long_loops_are_built_512_bits_wide(n):
    """Short 512-bit loops cost more than they save (issue 25 item 6): a segment is built
    wide only where its longest loop has _WIDE_FROM elements; either way the gradient is
    the hand-written one, and a batch of such points gives it at each."""
    if not fused_c._WIDE:
        pytest.skip("not an x86-64 machine: no 512-bit build")
    x = np.random.default_rng(n).uniform(-1.0, 1.5, n)
    F = ad.record(_rosen, x, tensor=True)
    np.testing.assert_allclose(F.gradient(x), _rosen_grad(x), rtol=1e-13, atol=1e-12)
    wide = "EASYAD_WIDE void easyad_segment" in F._bound["gradient"].source
    assert wide == (n >= fused_c._WIDE_FROM)
    X = np.stack([x, x[::-1]])
    values, grads = F.value_and_gradient(X)
    np.testing.assert_allclose(grads, [_rosen_grad(x), _rosen_grad(x[::-1])],
                               rtol=1e-13, atol=1e-12)
    np.testing.assert_allclose(values, [_rosen(x), _rosen(x[::-1])], rtol=1e-13)


# ---- the descent step folded into the weight gradient's GEMM (blas_steps.fold_updates) ----

WIDE = (160, 128, 10)        # the first weight 128 x 160 = 20,480 >= FOLD_FROM elements


def _wide_setup(dtype, loss_extra=None):
    ad.random.seed(2)
    model = nn.Sequential(nn.Linear(WIDE[0], WIDE[1], dtype=dtype), nn.Tanh(),
                          nn.Linear(WIDE[1], WIDE[2], dtype=dtype))
    rng = np.random.default_rng(3)
    x = rng.standard_normal((16, WIDE[0])).astype(dtype)
    y = rng.integers(0, WIDE[2], 16)

    def loss(params, x, y):
        value = nn.functional.cross_entropy(nn.functional_call(model, params, x), y)
        return value if loss_extra is None else value + loss_extra(params)
    named = dict(model.named_parameters())
    return ad.record(loss, {k: p.data for k, p in named.items()}, x, y), named, x, y


def _steps(F) -> list[str]:
    return [getattr(run, "__name__", "") for fn, run, *_ in F._bound["sgd_step"].steps
            if fn is None]


def _unfolded(monkeypatch):
    real = fused_c.blas_steps.fold_updates

    def none(plan):
        real(plan)
        plan.folded = []
        return {}
    monkeypatch.setattr(fused_c.blas_steps, "fold_updates", none)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_folded_update_is_within_one_rounding_of_the_update(monkeypatch, dtype):
    from easyad.tensor import _blas
    if _blas.cblas_gemm(dtype) is None:
        pytest.skip("numpy's BLAS is not an OpenBLAS easyad can call")
    F, named, x, y = _wide_setup(dtype)
    start = {k: np.array(p.data) for k, p in named.items()}
    _, grad = F.value_and_gradient({k: p.data for k, p in named.items()}, x, y)
    loss = F.sgd_step(named, x, y, lr=LR)
    assert _steps(F) == ["run_linear", "run_linear", "run_linear_vjp",
                         "run_linear_vjp_folded"], "the 128x160 weight's update is folded"
    folded = {k: np.array(p.data) for k, p in named.items()}
    _unfolded(monkeypatch)                 # today's loop: the update in double, rounded once
    G, named_g, _, _ = _wide_setup(dtype)
    G.sgd_step(named_g, x, y, lr=LR)
    assert "run_linear_vjp_folded" not in _steps(G)
    for k, p in named_g.items():
        want = p.data
        # |folded - loop| <= ulp(w') + 2 ulp(lr * |g|): one rounding of the update term
        # and lr's rounding to the dtype, apart from w's own
        bound = np.spacing(np.abs(want)) + 2 * np.spacing(np.abs(LR * grad[k]).astype(dtype))
        assert np.all(np.abs(folded[k].astype(np.float64) - want) <= bound), k
        if k != "0.weight":
            assert np.array_equal(folded[k], want), k      # only the folded weight differs
    want_loss, want = _torch_step(start, x, y)
    assert loss == pytest.approx(want_loss, rel=1e-5 if dtype == np.float32 else 1e-12)
    for k in named:
        np.testing.assert_allclose(folded[k], want[k], rtol=1e-5, atol=1e-6)


def test_no_fold_where_the_weight_or_its_gradient_is_read_elsewhere(monkeypatch):
    # an L2 term reads w (and makes its gradient a sum): the update stays a C loop
    F, named, x, y = _wide_setup(np.float32, lambda p: 1e-3 * ad.sum(p["0.weight"] ** 2))
    F.sgd_step(named, x, y, lr=LR)
    assert "run_linear_vjp_folded" not in _steps(F)
    # no OpenBLAS to call: numpy's matmul and the loop, as before
    from easyad.tensor import _blas
    monkeypatch.setattr(_blas, "cblas_gemm", lambda dtype: None)
    G, named_g, _, _ = _wide_setup(np.float32)
    G.sgd_step(named_g, x, y, lr=LR)
    assert "run_linear_vjp_folded" not in _steps(G)
