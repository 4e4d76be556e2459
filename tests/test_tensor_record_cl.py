"""ad.record of tensor code on an OpenCL device: the recorded program replayed as fused
OpenCL kernels (easyad/compiler/program/fused_cl.py) against the numpy device's fused C replay,
the kernel-by-kernel replay and eager execution (ad.value_and_grad, ad.hvp)."""
from __future__ import annotations

import numpy as np
import pytest

import easyad as ad
from easyad.errors import DeviceError
from easyad.compiler.program import fused_cl

from test_tensor_record import (PROGRAMS, _opencl_usable, _random_program, branchy, close,
                                rosen, rosen_gradient)

pytestmark = pytest.mark.skipif(not _opencl_usable(), reason="no usable OpenCL device")

RNG = np.random.default_rng(11)


def _leaves(tree):
    return ad._trees.flatten(tree)[0]


def _fused(F, what="gradient"):
    return F._bound[what]


@pytest.mark.parametrize("name", sorted(PROGRAMS))
def test_programs_against_numpy_and_eager(name):
    f, make = PROGRAMS[name]
    args = make()
    F = ad.record(f, *args, device="opencl", tensor=True)
    G = ad.record(f, *args, tensor=True)
    eager = ad.value_and_grad(f)
    for _ in range(2):
        new = make()
        value, g = F.value_and_gradient(*new)
        np_value, np_g = G.value_and_gradient(*new)
        ref_value, ref_g = eager(*new)
        close(value, ref_value, 1e-10)
        close(value, np_value, 1e-10)
        for a, b, c in zip(_leaves(g), _leaves(np_g), _leaves(ref_g)):
            close(a, c, 1e-10)
            close(a, b, 1e-10)
        close(F(*new), ref_value, 1e-10)
    assert isinstance(_fused(F), fused_cl.FusedCLProgram)
    assert isinstance(_fused(F, "value"), fused_cl.FusedCLProgram)


@pytest.mark.parametrize("seed", range(6))
def test_random_elementwise_programs(seed):
    f = _random_program(seed)
    F = ad.record(f, np.zeros(300), device="opencl", tensor=True)
    for _ in range(2):
        x = RNG.normal(size=300)
        value, g = F.value_and_gradient(x)
        ref_value, ref_g = ad.value_and_grad(f)(x)
        close(value, ref_value, 1e-10)
        close(g, ref_g, 1e-10)
    # forward, the sum and the backward sweep in one kernel
    assert _fused(F).source.count("__kernel void easyad_group") == 1


@pytest.mark.parametrize("seed", range(3))
def test_random_programs_in_float32(seed):
    f = _random_program(seed)
    x0 = np.zeros(1000, dtype=np.float32)
    F = ad.record(f, x0, device="opencl", tensor=True)
    x = RNG.normal(size=1000).astype(np.float32)
    value, g = F.value_and_gradient(x)
    ref_value, ref_g = ad.value_and_grad(f)(x.astype(np.float64))
    assert g.dtype == np.float32
    assert "typedef float real_t;" in _fused(F).source
    np.testing.assert_allclose(value, ref_value, rtol=1e-4)
    np.testing.assert_allclose(g, ref_g, rtol=1e-3, atol=1e-3 * np.abs(ref_g).max())


def test_mlp_in_float32():
    f, make = PROGRAMS["mlp by a dict"]
    p, X = make()
    p32 = {k: v.astype(np.float32) for k, v in p.items()}
    X32 = X.astype(np.float32)
    F = ad.record(f, p32, X32, device="opencl", tensor=True)
    value, g = F.value_and_gradient(p32, X32)
    ref_value, ref_g = ad.value_and_grad(f)(p32, X32)
    assert g["W1"].dtype == np.float32
    np.testing.assert_allclose(value, ref_value, rtol=1e-5)
    for k in p:
        np.testing.assert_allclose(g[k], ref_g[k], rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("name", ["outer product", "matmul chain", "axis reductions",
                                  "softmax family", "unary functions", "mlp by a dict",
                                  "slices with steps", "where, comparisons, maximum"])
def test_hvp_against_the_transforms(name):
    f, make = PROGRAMS[name]
    args = make()
    F = ad.record(f, *args, device="opencl", tensor=True)
    leaves, tree = ad._trees.flatten(args[0])
    v = ad._trees.unflatten(tree, [RNG.normal(size=np.shape(a)) for a in leaves])
    new = make()
    got = F.hvp(new[0], v, *new[1:])
    ref = ad.hvp(f, new[0], v, *new[1:])
    for a, b in zip(_leaves(got), _leaves(ref)):
        close(a, b, 1e-10)
    assert isinstance(_fused(F, "hvp"), fused_cl.FusedCLProgram)


@pytest.mark.parametrize("n", [2, 255, 256, 257, 5000])
def test_rosenbrock_at_sizes_around_a_work_group(n):
    F = ad.record(rosen, np.zeros(n), device="opencl", tensor=True)
    for _ in range(2):
        x = RNG.normal(size=n)
        value, g = F.value_and_gradient(x)
        a = x[1:] - x[:-1] ** 2
        close(value, np.sum(100 * a ** 2 + (1 - x[:-1]) ** 2), 1e-10)
        close(g, rosen_gradient(x), 1e-10)


@pytest.mark.parametrize("n", [600, 100003])     # partials in lanes, and a rest
def test_reductions_to_one_number_propagate_nan_and_infinity(n):
    def f(x):
        return ad.amax(x) + ad.amin(x) * 2 + ad.sum(x * x)
    F = ad.record(f, np.ones(n), device="opencl", tensor=True)
    x = RNG.normal(size=n)
    value, g = F.value_and_gradient(x)
    ref_value, ref_g = ad.value_and_grad(f)(x)
    close(value, ref_value, 1e-10)
    close(g, ref_g, 1e-10)
    for k in (0, 300, n // 2 + 3, n - 1):
        y = x.copy()
        y[k] = np.nan
        assert np.isnan(F(y))
        y[k] = np.inf
        assert F(y) == np.inf
        y[k] = -np.inf            # amin -inf, sum of squares inf
        assert np.isnan(F(y))


def test_guards_raise_and_retape():
    F = ad.record(branchy, np.ones(3), device="opencl", tensor=True)
    x = np.array([0.5, 1.0, -0.2])
    close(F.gradient(x), 2 * x)
    with pytest.raises(ad.BranchChangedError, match="record again"):
        F.gradient(-x)
    close(F.gradient(x), 2 * x)
    R = ad.record(branchy, np.ones(3), device="opencl", tensor=True,
                  on_branch_change="retape")
    close(R.gradient(-x), np.cos(-x))
    close(R.gradient(x), 2 * x)


def _chain(x):
    return ad.sum((ad.exp(-x) * ad.sin(x) + ad.sqrt(x) * 2.0) / (1.0 + x * x))


def test_a_chain_is_one_kernel_with_no_host_reads(monkeypatch):
    x0 = RNG.uniform(0.1, 2.0, 100003)
    F = ad.record(_chain, x0, device="opencl", tensor=True)
    value, g = F.value_and_gradient(x0)
    bound = _fused(F)
    assert bound.source.count("__kernel void easyad_group") == 1
    be = F._backend
    reads = []
    monkeypatch.setattr(type(be), "to_numpy", lambda self, buf: reads.append(buf))
    inputs = [be.asarray(x0, x0.dtype)]
    bound.run(inputs)
    assert reads == []
    monkeypatch.undo()
    ref_value, ref_g = ad.value_and_grad(_chain)(x0)
    close(value, ref_value, 1e-10)
    close(g, ref_g, 1e-10)


def test_workspace_is_kept_and_results_are_new_buffers():
    f, make = PROGRAMS["broadcast rows and columns"]
    args = make()
    F = ad.record(f, *args, device="opencl", tensor=True)
    first = F.value_and_gradient(*args)
    be = F._backend
    bound = _fused(F)
    inputs = [be.asarray(a, a.dtype) for a in args]
    a = bound.run(inputs)
    live, compiles = be.live_buffers, be.compiles
    b = bound.run(inputs)
    assert be.compiles == compiles           # built once, with the program
    assert all(x.data.int_ptr != y.data.int_ptr for x, y in zip(a, b))
    del a, b
    for _ in range(3):
        bound.run(inputs)
    assert be.live_buffers <= live
    close(F.value_and_gradient(*args)[0], first[0], 1e-12)


def test_unfused_on_request_and_when_kernels_do_not_build(monkeypatch):
    F = ad.record(rosen, np.zeros(6), device="opencl", tensor=True, fuse=False)
    x = RNG.normal(size=6)
    close(F.gradient(x), rosen_gradient(x), 1e-10)
    assert type(_fused(F)).__name__ == "BoundProgram"
    G = ad.record(rosen, np.zeros(6), device="opencl", tensor=True)
    real_kernel = type(G._backend).kernel

    def failing(self, source, name, scalar_dtypes):
        if "GENERATED by easyad/compiler/program/cstyle.py" in source:
            raise DeviceError("building the OpenCL kernel failed: test")
        return real_kernel(self, source, name, scalar_dtypes)
    monkeypatch.setattr(type(G._backend), "kernel", failing)
    with pytest.warns(ad.CompilerWarning, match="did not build"):
        close(G.gradient(x), rosen_gradient(x), 1e-10)
    assert type(_fused(G)).__name__ == "BoundProgram"


def test_linear_stays_a_backend_step_beside_cross_entropy():
    model = ad.nn.Linear(6, 3, generator=1)
    params = {k: p.data.copy() for k, p in model.named_parameters()}

    def loss(p, X, Y):
        z = ad.tanh(ad.nn.functional_call(model, p, X)) * 2
        return ad.nn.functional.cross_entropy(z, Y)
    X, Y = RNG.normal(size=(5, 6)), np.eye(3)[RNG.integers(0, 3, 5)]
    F = ad.record(loss, params, X, Y, device="opencl")
    value, g = F.value_and_gradient(params, X + 1, Y)
    ref_value, ref_g = ad.value_and_grad(loss)(params, X + 1, Y)
    close(value, ref_value, 1e-10)
    for k in params:
        close(g[k], ref_g[k], 1e-10)
    steps = {item.op for kind, item in _fused(F).plan.schedule if kind == "py"}
    assert "linear" in steps


class _AsIfAGPU:
    """The backend, but its device says GPU: the kernels a GPU would get (reductions over
    every global-size'th element), run on this device."""

    def __init__(self, be):
        import dataclasses
        self._be = be
        self.device = dataclasses.replace(be.device, is_gpu=True)

    def __getattr__(self, name):
        return getattr(self._be, name)


@pytest.mark.parametrize("f", [_chain, rosen])
def test_the_kernels_for_a_gpu(f):
    x0 = RNG.uniform(0.1, 2.0, 3001)
    F = ad.record(f, x0, device="opencl", tensor=True)
    rec = F._recordings["first"]
    be = _AsIfAGPU(F._backend)
    bound = fused_cl.fused(rec.program, rec.outputs + rec.gradient, be,
                              F._guard_failed)
    assert "i += get_global_size(0)" in bound.source
    value, g = bound.run([be.asarray(x0, x0.dtype)])
    ref_value, ref_g = ad.value_and_grad(f)(x0)
    close(be.to_numpy(value), ref_value, 1e-10)
    close(be.to_numpy(g), ref_g, 1e-10)


def _unique_gathers(x):
    return ad.sum(ad.sin(x[np.array([4, 0, 2])]) * x[np.array([1, 3, 5])]) + ad.sum(x * x)


@pytest.mark.parametrize("name, kernels, steps", [
    ("where, comparisons, maximum", 1, []),
    ("unary functions", 1, []),
    ("gathers with repeats", 1, ["scatter_add"]),     # repeated indices: the backend's
    ("slices with steps", None, []),
    ("concatenate and stack", None, ["assemble", "assemble"]),   # of several parts
])
def test_what_runs_in_kernels(name, kernels, steps):
    f, make = PROGRAMS[name]
    F = ad.record(f, *make(), device="opencl", tensor=True)
    F.value_and_gradient(*make())
    bound = _fused(F)
    if kernels is not None:
        assert bound.source.count("__kernel void easyad_group") == kernels
    assert [item.op for kind, item in bound.plan.schedule if kind == "py"] == steps


def test_gathers_without_repeats_scatter_in_the_kernel():
    F = ad.record(_unique_gathers, np.zeros(6), device="opencl", tensor=True)
    x = RNG.normal(size=6)
    value, g = F.value_and_gradient(x)
    ref_value, ref_g = ad.value_and_grad(_unique_gathers)(x)
    close(value, ref_value, 1e-10)
    close(g, ref_g, 1e-10)
    ops = {i.op for kind, item in _fused(F).plan.schedule if kind == "c" for i in item}
    assert {"take", "scatter_add"} <= ops


@pytest.mark.parametrize("n", [3, 1000])
def test_slice_adjoints_are_pads_in_the_kernels(n):
    """Rosenbrock's gradient: the three slice adjoints are read as pads (zero outside the
    slice, under a condition) in one kernel that sums them; nothing zeroed, no host step."""
    F = ad.record(rosen, np.zeros(n), device="opencl", tensor=True)
    x = RNG.normal(size=n)
    close(F.gradient(x), rosen_gradient(x), 1e-10)
    bound = _fused(F)
    assert bound.source.count("__kernel void easyad_group") == 2
    assert [kind for kind, _ in bound.plan.schedule] == ["c"]
    assert all(not step.zero for step in bound.steps if isinstance(step, fused_cl.Launch))
    assert not bound.plan.margins


def test_sine_and_cosine_of_one_value_come_from_one_sincos():
    """The sine's gradient needs the cosine of the same value: a kernel that calls both
    calls sincos once (on PoCL the price of one of them); the value alone calls sin."""
    def f(x):
        return ad.sum(ad.sin(x) * x)
    F = ad.record(f, np.ones(50), device="opencl", tensor=True)
    x = RNG.normal(size=50)
    value, g = F.value_and_gradient(x)
    close(value, np.sum(np.sin(x) * x), 1e-10)
    close(g, np.cos(x) * x + np.sin(x), 1e-10)
    close(F(x), value, 1e-10)
    kernels = _fused(F).source.split("__kernel void easyad_group")[1:]
    assert len(kernels) == 1 and "sincos(" in kernels[0] and " cos(" not in kernels[0]
    assert "sincos(" not in _fused(F, "value").source.split("__kernel", 1)[1]


def test_array_primitives_are_backend_steps_between_kernels():
    cube = ad.primitive(vjp=lambda g, x, out: 3 * x * x * g, differentiable=True)(
        lambda x: x ** 3)

    def f(x):
        return ad.sum(ad.sin(cube(x)) * x)
    F = ad.record(f, np.ones(6), device="opencl", tensor=True)
    x, v = RNG.normal(size=6), RNG.normal(size=6)
    value, g = F.value_and_gradient(x)
    close(value, np.sum(np.sin(x ** 3) * x), 1e-10)
    close(g, np.cos(x ** 3) * 3 * x ** 2 * x + np.sin(x ** 3), 1e-10)
    assert "host" in [item.op for kind, item in _fused(F).plan.schedule if kind == "py"]
    close(F.hvp(x, v), ad.hvp(f, x, v), 1e-10)


def test_recordings_do_not_keep_their_backends_alive():
    """The rule plans' prepared kernels are kept by each backend, not by the plans: a
    recording's ProgramBackend (its program and device buffers) goes when it does."""
    import gc

    def alive():
        gc.collect()
        return sum(1 for o in gc.get_objects() if type(o).__name__ == "ProgramBackend")
    x = RNG.uniform(0.1, 1.0, 50)
    before = alive()
    for _ in range(4):
        F = ad.record(lambda t: ad.sum(ad.sin(t) * t + ad.exp(-t)), x, device="opencl",
                      tensor=True)
        close(F.gradient(x), np.cos(x) * x + np.sin(x) - np.exp(-x), 1e-12)
        del F
    assert alive() <= before + 1
