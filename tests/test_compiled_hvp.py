"""The compiled HVP's two forms (``compiler/tape/second_order_renderer``): a small program's
entry by entry, a bigger one's through step calls and row tables; both the VM's bits."""
import numpy as np
import pytest

import easyad as ad
from easyad import _core
from easyad.compiler import tape as tape_compiler
from easyad.compiler.tape import second_order_renderer
from test_compiled import compiled_second, needs_cc, same


@pytest.fixture(scope="module", autouse=True)
def cache(module_cache):
    return module_cache


@needs_cc
def test_a_small_hvp_entry_by_entry_and_by_steps_gives_the_vms_bits(monkeypatch):
    """The HVP of a program with few entries outside affine runs (<= INLINE_HVP) is written
    entry by entry (no step call per entry: faster per call), a bigger one's through the
    step functions and row loops (gcc's time): both give the VM's bits, and H v agrees
    with central differences of the gradient."""

    def f(x):
        y = ad.sin(x[0]) * ad.exp(x[1]) + ad.log(x[2]) / x[0] + ad.tanh(x[0] * x[1] * x[2])
        return y + ad.where(x[1] > 0.3, x[1] ** 3, ad.hypot(x[0], x[2])) + x[2] ** 0.5

    rng = np.random.default_rng(7)
    x0 = np.array([0.7, 0.9, 1.3])
    F = ad.record(f, x0)
    layout = _core._Replayer(F.tape, list(F.inputs), list(F.outputs))._layout()
    forms = {}
    for limit in (second_order_renderer.INLINE_HVP, 0):
        monkeypatch.setattr(second_order_renderer, "INLINE_HVP", limit)
        source = tape_compiler.render(layout, "test", None, hvp=True)
        hvp = source[source.index("static EASYAD_CUT void hvp0("):]
        assert ("hvp_t" in source) == (limit == 0)      # step calls only when not inline
        assert "hvp_t" not in hvp or limit == 0
        forms[limit] = compiled_second(f, x0)
    for x in [x0, np.array([1.1, 0.1, 0.4]), np.array([-0.6, 2.0, 3.0])]:
        v = rng.normal(size=3)
        reference = F.hvp(x, v)
        for C in forms.values():
            assert C._native.hvp_point(x, v) is not None
            assert same(C.hvp(x, v), reference), x
        h = 1e-5
        difference = (F.gradient(x + h * v) - F.gradient(x - h * v)) / (2 * h)
        np.testing.assert_allclose(reference, difference, rtol=1e-6, atol=1e-7)
