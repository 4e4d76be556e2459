"""The rule table's float32 forms (``Rule.float32``, ``compiler/program/float32.py``): the
same functions as their rows in exact math, the error docs/record-replay.md states in
float32 ulps against the float64 result (a dense grid: tiny, ordinary and large |x|, ±0,
±inf, NaN), eager numpy and the fused C agreeing to it, gradients against torch in
float32, float64 programs' C unchanged to the byte, and rows that break the rules refused."""
from __future__ import annotations

import numpy as np
import pytest

import easyad as ad
from easyad import _expr, _expressions, _rules, nn
from easyad.compiler.program import float32
from easyad.compiler.tape import library

# docs/record-replay.md "float32 forms": the fused C's error against the float64 result,
# in float32 ulps (np.spacing of the float32 result; subnormal results included)
VALUE_ULPS, SLOPE_ULPS = 2.0, 6.0

ROWS = [r for r in _rules.RULES if r.float32]


def _grid() -> np.ndarray:
    rng = np.random.default_rng(7)
    parts = [np.linspace(0.0, 1e-4, 4001), np.geomspace(1e-45, 1e-4, 2000),
             np.linspace(0.5, 1.0, 4001), np.linspace(8.0, 20.0, 4001),
             np.linspace(20.0, 60.0, 4001), rng.uniform(-30.0, 30.0, 8000),
             np.array([1e-38, 9.0, 9.01, 44.4, 45.0, 51.9, 52.0, 88.0, 89.5, 100.0, 1e30,
                       3e38, np.inf])]
    x = np.concatenate(parts).astype(np.float32)
    return np.concatenate([x, -x, np.array([np.nan], np.float32)])


def _ulps(got: np.ndarray, want: np.ndarray) -> np.ndarray:
    """|got - want| in ulps of want rounded to float32 (0 where both are the same NaN,
    inf or number; inf where one is NaN and the other not)."""
    got = np.asarray(got, np.float64)
    with np.errstate(all="ignore"):
        d = np.abs(got - want) / np.spacing(np.abs(want.astype(np.float32))).astype(np.float64)
    d[(got == want) | (np.isnan(got) & np.isnan(want))] = 0.0
    d[np.isnan(got) != np.isnan(want)] = np.inf
    return d


@pytest.fixture(scope="module")
def tanh_runs(tmp_path_factory):
    """tanh's value and the gradient of sum(tanh(x) * c) on the grid, fused C float32,
    with the C sources built (to see that the float32 forms were used)."""
    sources: list[str] = []
    build = library.build

    def capture(text, *args, **kwargs):
        sources.append(text)
        return build(text, *args, **kwargs)
    x = _grid()
    c = np.random.default_rng(1).uniform(0.5, 2.0, x.size).astype(np.float32)
    c[-1] = 0.0            # an adjoint of 0 at x = NaN: the strong zero's +0, not NaN
    library.build = capture
    try:
        value = ad.record(ad.tanh, x, tensor=True)(x)
        _, grad = ad.record(lambda t: ad.sum(ad.tanh(t) * c), x, tensor=True
                            ).value_and_gradient(x)
    finally:
        library.build = build
    return x, c, np.asarray(value), np.asarray(grad), sources


def test_the_forms_are_their_rows_functions():
    """Each float32 form is its row's value or partial in exact math: evaluated in
    float64 at ordinary, tiny and large points they agree to float64 rounding (tanh's
    slope 4e/(1+e)^2 with e = exp(-2|x|) is 1/cosh^2 x)."""
    assert ROWS, "no row has float32 forms"
    ns = _expressions.numpy_namespace()
    x = np.concatenate([np.linspace(-30, 30, 6001), np.geomspace(1e-300, 1e-3, 50),
                        -np.geomspace(1e-300, 1e-3, 50), [0.0, -0.0]])
    y = np.linspace(0.3, 4.0, x.size)
    for rule in ROWS:
        z = _expressions.compile_expression(rule.value, ns, ("x", "y"))(x, y)
        for own, form in zip((rule.value, *rule.partials), rule.float32):
            want = _expressions.compile_expression(own, ns, ("x", "y", "z"))(x, y, z)
            got = _expressions.compile_expression(form, ns, ("x", "y", "z"))(x, y, z)
            np.testing.assert_allclose(got, want, rtol=4e-15, atol=0,
                                       err_msg=f"{rule.name}: {form!r} vs {own!r}")


def test_fused_c_uses_the_forms_for_float32(tanh_runs):
    *_, sources = tanh_runs
    assert any("easyad_f_tanh(" in s for s in sources)
    assert any("easyad_f_exp(" in s and "easyad_f_mul0(" in s for s in sources)


def test_fused_float32_tanh_error_in_ulps(tanh_runs):
    """The stated bounds, against float64 references, on the dense grid: the value <= 2
    ulps, the slope times c (one more rounding) <= 6 ulps, subnormal slopes included
    (0 past |x| ~ 52, as the float64 result rounded to float32 is)."""
    x, c, value, grad, _ = tanh_runs
    x64 = x.astype(np.float64)
    with np.errstate(all="ignore"):
        value_ulps = _ulps(value, np.tanh(x64))
        slope = c.astype(np.float64) / np.cosh(x64) ** 2
        grad_ulps = _ulps(grad, np.where(c == 0, 0.0, slope))
    assert value.dtype == grad.dtype == np.float32
    assert value_ulps.max() <= VALUE_ULPS, (value_ulps.max(), x[value_ulps.argmax()])
    assert grad_ulps.max() <= SLOPE_ULPS, (grad_ulps.max(), x[grad_ulps.argmax()])
    # the signs of zero and the special values as tanh's: tanh(-0) = -0, slope(±inf) = 0,
    # and mul0's strong zero in float (0 * the slope at NaN is +0)
    zero = x == 0
    assert np.array_equal(np.signbit(value[zero]), np.signbit(x[zero]))
    assert np.all(grad[np.isinf(x)] == 0) and not np.signbit(grad[-1]) and grad[-1] == 0


def test_eager_numpy_and_fused_c_agree(tanh_runs):
    """Eager float32 tensors (numpy's float32 tanh, the row's own slope in float32) and
    the fused C: within the sum of the stated bounds where the slope is a normal float32,
    within float32's smallest normal where eager's cosh^2 overflows (|x| > 44.4)."""
    x, c, value, grad, _ = tanh_runs
    lst = ad.WengertList()
    t = ad.Tensor.variable(x, lst)
    with np.errstate(all="ignore"):
        loss = ad.sum(ad.tanh(t) * c)
        eager_grad = np.asarray(loss.derivatives()[t])
        eager_value = np.asarray(ad.tanh(ad.Tensor.constant(x)).value)
    assert np.max(_ulps(value, eager_value.astype(np.float64))) <= 2 * VALUE_ULPS
    tiny = float(np.finfo(np.float32).tiny)
    normal = np.abs(eager_grad) >= tiny
    assert np.max(_ulps(grad[normal], eager_grad[normal].astype(np.float64))) <= 2 * SLOPE_ULPS
    assert np.array_equal(np.isnan(grad), np.isnan(eager_grad))
    rest = ~normal & ~np.isnan(eager_grad)
    assert np.all(np.abs(grad[rest] - eager_grad[rest]) <= tiny)


def test_mlp_step_gradients_match_torch_float32():
    """A float32 tanh MLP's sgd_step (the fused C, float32 forms) against torch.func in
    float32: loss and updated parameters to 1e-5."""
    torch = pytest.importorskip("torch")
    ad.random.seed(3)
    model = nn.Sequential(nn.Linear(12, 16, dtype=np.float32), nn.Tanh(),
                          nn.Linear(16, 5, dtype=np.float32))
    rng = np.random.default_rng(4)
    x = (3.0 * rng.standard_normal((11, 12))).astype(np.float32)   # tanh's tails too
    y = rng.integers(0, 5, 11)
    named = dict(model.named_parameters())
    start = {k: np.array(p.data) for k, p in named.items()}

    def loss(params, x, y):
        return nn.functional.cross_entropy(nn.functional_call(model, params, x), y)
    F = ad.record(loss, {k: p.data for k, p in named.items()}, x, y)
    got = F.sgd_step(named, x, y, lr=0.2)

    def torch_loss(p):
        h = torch.tanh(torch.tensor(x) @ p["0.weight"].T + p["0.bias"])
        return torch.nn.functional.cross_entropy(h @ p["2.weight"].T + p["2.bias"],
                                                 torch.tensor(y))
    t = {k: torch.tensor(v) for k, v in start.items()}
    grads, value = torch.func.grad_and_value(torch_loss)(t)
    assert got == pytest.approx(float(value), rel=1e-5)
    for k, p in named.items():
        want = (t[k] - 0.2 * grads[k]).numpy()
        np.testing.assert_allclose(np.asarray(p.data), want, rtol=1e-5, atol=1e-6,
                                   err_msg=k)


def _sources(dtype, monkeypatch, forms=None):
    """The fused C of tanh's value and gradient in ``dtype`` (float32.FORMS replaced by
    ``forms`` when given), by the text handed to the compiler."""
    if forms is not None:
        monkeypatch.setattr(float32, "FORMS", forms)
    sources: list[str] = []
    build = library.build

    def capture(text, *args, **kwargs):
        sources.append(text)
        return build(text, *args, **kwargs)
    monkeypatch.setattr(library, "build", capture)
    x = np.linspace(-3, 3, 64).astype(dtype)
    ad.record(lambda t: ad.sum(ad.tanh(t) * ad.exp(t)), x, tensor=True).value_and_gradient(x)
    monkeypatch.undo()
    return sources


def test_float64_programs_keep_their_c(monkeypatch):
    """The float32 forms change no byte of a float64 program's C (the same text as with
    no row giving float32 forms), and only float32 programs get them."""
    with_forms = _sources(np.float64, monkeypatch)
    without = _sources(np.float64, monkeypatch, forms={})
    assert with_forms == without and not any("easyad_f_" in s for s in with_forms)
    assert _sources(np.float32, monkeypatch) != _sources(np.float32, monkeypatch, forms={})


def test_rows_that_break_the_rules_are_refused(monkeypatch):
    """A float32 partial reading what the recording does not save, or forms of the wrong
    number, fail when the forms are read, naming the row and the fix."""
    bad = _rules.Rule("tanh", "tanh(x)", ("1.0 / (cosh(x) * cosh(x))",),
                      float32=("tanh(x)", "1.0 - z * z"))
    with pytest.raises(ValueError, match=r"'tanh'.*reads \['z'\].*saves only \['x'\]"):
        float32._forms([bad])
    short = _rules.Rule("atan2", "atan2(x, y)", ("1.0", "1.0"), float32=("atan2(x, y)", "1.0"))
    with pytest.raises(ValueError, match="'atan2': float32 forms"):
        float32._forms([short])
    odd = _rules.Rule("sinc", "sin(x) / x", ("1.0",), float32=("nosuch(x)", "1.0"))
    forms = float32._forms([odd])
    assert _expr.calls(forms[(("sin(x) / x",), ("x",))][0]) == {"nosuch"}
    monkeypatch.setattr(float32, "FORMS", forms)
    with pytest.raises(ValueError, match=r"nosuch\(\), which compiler/libm.py does not list"):
        float32.header()
