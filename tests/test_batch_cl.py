"""TensorFunction batches on an OpenCL device (easyad/tensor/batch_cl.py): every fused
kernel launched once for all the points, against one replay per point on the same device
and the numpy device's batch (one C loop)."""
from __future__ import annotations

import dataclasses
import re

import numpy as np
import pytest

import easyad as ad
import easyad.nn.functional as nf
from easyad.compiler.program import batch_cl, fused_cl
from easyad.tensor import _devices

from test_tensor_record import _opencl_usable, rosen, rosen_hvp

pytestmark = pytest.mark.skipif(not _opencl_usable(), reason="no usable OpenCL device")

W = np.linspace(0.5, 2.0, 7)        # a constant of the recorded program


def chain(x):
    return ad.sum(ad.exp(ad.sin(x)) * ad.sqrt(x * x + 1.0) + ad.cos(x) * ad.tanh(x))


def extremes(x):
    # reductions to one number read again by later kernels (the max's gradient compares)
    return ad.amax(x * x) - ad.amin(ad.sin(x)) + ad.sum(x / ad.sum(x * x + 1.0))


def weighted(x):
    return ad.sum(W * x ** 2) + ad.sum(ad.where(x > 0.0, x, 0.5 * x))


def guarded(x):        # float() reads a value on the host: a guard, a backend step
    return ad.sum(x * x) if float(ad.sum(x * 0.0)) == 0.0 else ad.sum(x)


def with_argument(x, w):
    return ad.sum(w * x ** 2) + ad.sum(ad.exp(x * 0.1))


# name: (f, n, points' range)
PROGRAMS = {"rosenbrock": (rosen, 100, (0.5, 1.5)), "chain": (chain, 257, (-2.0, 2.0)),
            "extremes": (extremes, 31, (-2.0, 2.0)), "weighted": (weighted, 7, (-1.0, 1.0)),
            "one element": (chain, 1, (-2.0, 2.0))}


def _kernels(fused):
    """The group kernels (as rendered) of a fused program's launches."""
    return [step.spec for step in fused.steps if isinstance(step, fused_cl.Launch)]


def _check(got, want, dtype):
    got, want = np.asarray(got), np.asarray(want)
    assert got.shape == want.shape and got.dtype == want.dtype
    tol = 1e-12 if dtype == np.float64 else 1e-5
    scale = np.abs(want).max() if want.size else 1.0
    np.testing.assert_allclose(got, want, rtol=tol, atol=tol * scale)


@pytest.fixture
def launches(monkeypatch):
    """Counts of the batched kernels' launches, by kernel name."""
    counts: dict[str, int] = {}
    original = batch_cl._enqueue

    def counting(kernel, *args):
        counts[kernel.function_name] = counts.get(kernel.function_name, 0) + 1
        original(kernel, *args)
    monkeypatch.setattr(batch_cl, "_enqueue", counting)
    return counts


def _fake_gpu(device_name):
    """The device as a GPU for easyad: the kernels and launch shapes chosen for a GPU
    (a work-item per element, strided reductions, work-groups of several points), run on
    this device."""
    device = _devices.find_device(device_name)
    return dataclasses.replace(device, is_gpu=True, name=device.name + "-as-gpu")


# every program in float64, two in float32 (each case builds six OpenCL programs)
CASES = [(name, np.float64) for name in sorted(PROGRAMS)] + [
    (name, np.float32) for name in ("rosenbrock", "extremes")]


@pytest.mark.parametrize("name, dtype", CASES)
def test_batches_match_points_and_numpy(opencl_device, name, dtype, launches):
    f, n, (lo, hi) = PROGRAMS[name]
    x0 = np.ones(n, dtype=dtype)
    F = ad.record(f, x0, tensor=True, device=opencl_device)
    G = ad.record(f, x0, tensor=True)
    rng = np.random.default_rng(5)
    for count in (1, 3, 200):
        X = rng.uniform(lo, hi, (count, n)).astype(dtype)
        V = rng.normal(size=(count, n)).astype(dtype)
        launches.clear()
        values, grads = F.value_and_gradient(X)
        fused = F._bound["gradient"]
        # one launch of each fused kernel for the whole batch
        assert launches == {k.name: 1 for k in _kernels(fused)}, launches
        np_values, np_grads = G.value_and_gradient(X)
        _check(values, np_values, dtype)
        _check(grads, np_grads, dtype)
        _check(F(X), G(X), dtype)
        _check(F.gradient(X), np_grads, dtype)
        _check(F.hvp(X, V), G.hvp(X, V), dtype)            # a direction per point
        _check(F.hvp(X, V[0]), G.hvp(X, V[0]), dtype)      # one for all points
        assert launches["easyad_group_0"] == 5
        for b in sorted({0, count // 2, count - 1}):
            value, g = F.value_and_gradient(X[b])
            _check(values[b], np.asarray(value, dtype=values.dtype), dtype)
            _check(grads[b], g, dtype)
            _check(F.hvp(X, V)[b], F.hvp(X[b], V[b]), dtype)


def test_rosenbrock_against_its_formulas(opencl_device):
    F = ad.record(rosen, np.ones(100), tensor=True, device=opencl_device)
    X = np.random.default_rng(1).uniform(0.5, 1.5, (200, 100))
    V = np.random.default_rng(2).normal(size=(200, 100))
    values, grads = F.value_and_gradient(X)
    want = np.sum(100 * (X[:, 1:] - X[:, :-1] ** 2) ** 2 + (1 - X[:, :-1]) ** 2, axis=1)
    np.testing.assert_allclose(values, want, rtol=1e-12)
    hv = F.hvp(X, V)
    for b in (0, 77, 199):
        np.testing.assert_allclose(hv[b], rosen_hvp(X[b], V[b]), rtol=1e-10, atol=1e-9)
    assert batch_cl.batched(F._bound["gradient"]) is not None


# the lines the points option adds to a kernel: its head's and each pointer's move
_OVER_POINTS = re.compile(r"(?m)^    (const long B_ = get_global_id\(1\);|if \(B_ >= NB_\) "
                          r"return;|[PQ]\d+ \+= B_ \* [^;]+;)\n")


@pytest.mark.parametrize("name", ["rosenbrock", "extremes", "weighted"])
def test_kernels_over_points_are_the_point_kernels(opencl_device, name):
    """The batched source is the program's kernels rendered again with the points option:
    each is the one point's kernel with the batch's arguments after N_ and the pointer
    moves before the body, nothing else changed; inputs move by a stride argument."""
    f, n, _ = PROGRAMS[name]
    F = ad.record(f, np.ones(n), tensor=True, device=opencl_device)
    F.value_and_gradient(np.ones(n))
    fused = F._bound["gradient"]
    batch = batch_cl.batched(fused)
    point = re.sub(r", const long NB_(, const long S\d+)*\)", ")",
                   _OVER_POINTS.sub("", batch.source))
    assert point == fused.source
    assert batch.source.count("if (B_ >= NB_) return;") == len(batch.launches) == \
        len(_kernels(fused))
    inputs = set(fused.inputs)
    for step in batch.launches:
        k = step.spec
        assert k.strides == [key for kind, key in k.params if kind == "slot" and key in inputs]
        assert all(f"P{s} += B_ * S{s};" in batch.source for s in k.strides)


@pytest.mark.parametrize("name", ["rosenbrock", "extremes"])
def test_gpu_launch_shapes(opencl_device, name, launches):
    """The GPU kernels and work-group shapes (several points a group, points past the
    batch's end in the last group) on this device, against the numpy device."""
    f, n, (lo, hi) = PROGRAMS[name]
    F = ad.record(f, np.ones(n), tensor=True, device=_fake_gpu(opencl_device))
    G = ad.record(f, np.ones(n), tensor=True)
    X = np.random.default_rng(7).uniform(lo, hi, (203, n))
    values, grads = F.value_and_gradient(X)
    assert F._backend.device.is_gpu
    assert launches == {k.name: 1 for k in _kernels(F._bound["gradient"])}
    np_values, np_grads = G.value_and_gradient(X)
    _check(values, np_values, np.float64)
    _check(grads, np_grads, np.float64)
    _check(F.hvp(X, X[0]), G.hvp(X, X[0]), np.float64)


def test_shared_argument_and_constant(opencl_device, launches):
    """An argument after x is the same at every point: uploaded once, not moved."""
    w = np.linspace(-1.0, 1.0, 13)
    F = ad.record(with_argument, np.ones(13), w, tensor=True, device=opencl_device)
    G = ad.record(with_argument, np.ones(13), w, tensor=True)
    X = np.random.default_rng(3).normal(size=(50, 13))
    for args in ((w,), (2 * w,)):
        values, grads = F.value_and_gradient(X, *args)
        np_values, np_grads = G.value_and_gradient(X, *args)
        _check(values, np_values, np.float64)
        _check(grads, np_grads, np.float64)
    assert sum(launches.values()) == 2 * len(F._bound["gradient"].steps)
    # the argument as a Tensor on the device
    values, grads = F.value_and_gradient(X, ad.Tensor.constant(w, device=opencl_device))
    np_values, np_grads = G.value_and_gradient(X, w)
    _check(values, np_values, np.float64)
    _check(grads, np_grads, np.float64)
    assert sum(launches.values()) == 3 * len(F._bound["gradient"].steps)


def test_empty_points(opencl_device):
    """Points of no elements: reductions give their identity, gradients are empty."""
    F = ad.record(lambda x: ad.sum(x * x), np.ones(0), tensor=True, device=opencl_device)
    values, grads = F.value_and_gradient(np.ones((4, 0)))
    np.testing.assert_array_equal(values, np.zeros(4))
    assert grads.shape == (4, 0)
    np.testing.assert_array_equal(F(np.ones((4, 0))), np.zeros(4))


def test_chunks_of_a_large_batch(opencl_device, monkeypatch, launches):
    """A batch larger than the buffers one launch may take runs in chunks: the same
    numbers, one launch per kernel and chunk."""
    F = ad.record(chain, np.ones(9), tensor=True, device=opencl_device)
    X = np.random.default_rng(4).normal(size=(30, 9))
    whole = F.value_and_gradient(X)
    program = batch_cl.batched(F._bound["gradient"])
    monkeypatch.setattr(batch_cl, "_BUDGET", 7 * 9 * 8 * 4)    # a few points a chunk
    launches.clear()
    chunked = F.value_and_gradient(X)
    _check(chunked[0], whole[0], np.float64)
    _check(chunked[1], whole[1], np.float64)
    assert program is batch_cl.batched(F._bound["gradient"])
    assert max(launches.values()) > 1
    rows = F.value_and_gradient(ad.Tensor.constant(X, device=opencl_device))
    _check(rows[0], whole[0], np.float64)      # device rows cut into the same chunks
    _check(rows[1], whole[1], np.float64)


def signed(x):         # a guard whose value is the same wherever the sum keeps its sign
    return ad.sum(x * x) if bool(ad.sum(x) > 0.0) else ad.sum(ad.exp(x))


def test_guards_checked_at_every_point(opencl_device, launches):
    """A guard (a value read on the host) is checked for all points at once; where one
    point reads another value the batch goes point by point: each retapes or raises."""
    F = ad.record(guarded, np.ones(5), tensor=True, device=opencl_device)
    X = np.random.default_rng(6).normal(size=(30, 5))
    values, grads = F.value_and_gradient(X)
    np.testing.assert_allclose(values, np.sum(X * X, axis=1), rtol=1e-12)
    np.testing.assert_allclose(grads, 2 * X, rtol=1e-12)
    assert launches == {k.name: 1 for k in _kernels(F._bound["gradient"])}
    X = np.abs(X)
    X[7] *= -1.0                       # the one point down the other branch
    want_values = np.where(X.sum(axis=1) > 0, np.sum(X * X, axis=1), np.exp(X).sum(axis=1))
    want_grads = np.where((X.sum(axis=1) > 0)[:, None], 2 * X, np.exp(X))
    S = ad.record(signed, np.ones(5), tensor=True, device=opencl_device)
    with pytest.raises(ad.BranchChangedError):
        S.value_and_gradient(X)
    values, grads = S.value_and_gradient(np.delete(X, 7, axis=0))    # all one branch
    np.testing.assert_allclose(values, np.delete(want_values, 7), rtol=1e-12)
    batch = batch_cl.batched(S._bound["gradient"])
    assert len(batch.launches) < len(batch.steps) == len(S._bound["gradient"].steps)
    # the guard is one of its steps
    R = ad.record(signed, np.ones(5), tensor=True, device=opencl_device,
                  on_branch_change="retape")
    values, grads = R.value_and_gradient(X)
    np.testing.assert_allclose(values, want_values, rtol=1e-12)
    np.testing.assert_allclose(grads, want_grads, rtol=1e-12)


INDEX = np.array([2, 0, 4, 2, 1])     # a repeated index: the gradient's scatter-add


def test_backend_steps_replay_per_point(opencl_device, launches):
    """A program with a backend step that works on one point (cross-entropy) keeps one
    replay per point, with the right numbers (matmul, reduce, scatter-add and assemble
    steps batch: test_batch_cl_matmul.py, test_batch_engines.py)."""
    X = np.random.default_rng(6).normal(size=(3, 5))
    M = ad.record(lambda x: nf.cross_entropy(ad.tanh(x).reshape((1, 5)), np.array([2])),
                  np.ones(5), tensor=True, device=opencl_device)
    values, grads = M.value_and_gradient(X)
    t = np.tanh(X)
    np.testing.assert_allclose(values, np.log(np.exp(t).sum(axis=1)) - t[:, 2], rtol=1e-12)
    soft = np.exp(t) / np.exp(t).sum(axis=1, keepdims=True)
    soft[:, 2] -= 1.0
    np.testing.assert_allclose(grads, soft * (1 - t * t), rtol=1e-12, atol=1e-15)
    assert batch_cl.batched(M._bound["gradient"]) is None
    assert launches == {}


def test_scatter_add_batches(opencl_device, launches):
    """A gather's adjoint of repeated indices (a scatter-add the host adds up) runs once
    for all the points: one launch per kernel, the right numbers."""
    X = np.random.default_rng(6).normal(size=(3, 5))
    M = ad.record(lambda x: ad.sum(ad.tanh(x[INDEX])), np.ones(5), tensor=True,
                  device=opencl_device)
    values, grads = M.value_and_gradient(X)
    np.testing.assert_allclose(values, np.tanh(X[:, INDEX]).sum(axis=1), rtol=1e-12)
    want = np.zeros_like(X)
    np.add.at(want, (slice(None), INDEX), 1 - np.tanh(X[:, INDEX]) ** 2)
    np.testing.assert_allclose(grads, want, rtol=1e-12)
    assert batch_cl.batched(M._bound["gradient"]) is not None
    assert launches == {k.name: 1 for k in _kernels(M._bound["gradient"])}


def test_bad_batches(opencl_device):
    F = ad.record(rosen, np.ones(4), tensor=True, device=opencl_device)
    first = F.value_and_gradient(np.full((2, 4), 2.0))
    with pytest.raises(ValueError, match="no points"):
        F.value_and_gradient(np.ones((0, 4)))
    with pytest.raises(ValueError):
        F.value_and_gradient(np.ones((3, 5)))
    with pytest.raises(ValueError, match="shape"):
        F.hvp(np.ones((3, 4)), np.ones((2, 4)))
    program = batch_cl.batched(F._bound["gradient"])
    with pytest.raises(ValueError, match="inputs"):
        program.run([np.ones((3, 4))], 3)
    with pytest.raises(ValueError, match="shape"):
        program.run([np.ones((3, 5)), np.zeros(())], 3)
    # a failed call leaves the function working
    values, _ = F.value_and_gradient(np.ones((2, 4)))
    np.testing.assert_array_equal(values, np.zeros(2))
    np.testing.assert_array_equal(first[0], np.full(2, 1203.0))


def test_rows_already_on_the_device(opencl_device, launches, monkeypatch):
    """x's rows as a Tensor on the device or a pyopencl array of its context: used where
    they are (no upload of x), the same numbers as from the host; other dtypes refused."""
    F = ad.record(rosen, np.ones(16), tensor=True, device=opencl_device)
    X = np.random.default_rng(9).uniform(0.5, 1.5, (40, 16))
    values, grads = F.value_and_gradient(X)
    want_values, want_hvp = F(X), F.hvp(X, X[0])
    rows = ad.Tensor.constant(X, device=opencl_device)
    uploads = []
    original = F._backend.asarray
    monkeypatch.setattr(F._backend, "asarray",
                        lambda a, dtype: uploads.append(np.shape(a)) or original(a, dtype))
    for x in (rows, rows._data):
        got_values, got_grads = F.value_and_gradient(x)
        _check(got_values, values, np.float64)
        _check(got_grads, grads, np.float64)
        _check(F(x), want_values, np.float64)
        _check(F.hvp(x, X[0]), want_hvp, np.float64)
    assert uploads and (40, 16) not in uploads
    with pytest.raises(ValueError, match="dtype"):
        F.value_and_gradient(rows._data.astype(np.float32))
    # a program with a backend step that works on one point replays the rows point by
    # point; one with a matmul batches them
    M = ad.record(lambda x: ad.sum(ad.tanh(x[INDEX])), np.ones(16), tensor=True,
                  device=opencl_device)
    np.testing.assert_allclose(M.value_and_gradient(rows)[0],
                               np.tanh(X[:, INDEX]).sum(axis=1), rtol=1e-12)
    A = np.random.default_rng(8).normal(size=(3, 16))
    M = ad.record(lambda x: ad.sum(ad.tanh(x @ A.T)), np.ones(16), tensor=True,
                  device=opencl_device)
    np.testing.assert_allclose(M(rows), np.tanh(X @ A.T).sum(axis=1), rtol=1e-12)
    assert batch_cl.batched(M._bound["value"]) is not None


def test_structures_vector_outputs_and_unit_batches(opencl_device, launches):
    """x a dict (a 2-d leaf, a leaf f does not use), f with a vector output: the batch,
    the Hessian and the Jacobian (batches of unit directions) as on the numpy device."""
    def f(d):
        return ad.sum(ad.sin(d["a"][1:, :] * d["a"][:-1, :])) + 2.0

    def g(x):
        return ad.exp(x) * x[::-1]
    x0 = {"a": np.ones((4, 5)), "b": np.ones(3)}
    rng = np.random.default_rng(12)
    X = {"a": rng.normal(size=(9, 4, 5)), "b": rng.normal(size=(9, 3))}
    F = ad.record(f, x0, tensor=True, device=opencl_device)
    G = ad.record(f, x0, tensor=True)
    (values, grads), (np_values, np_grads) = F.value_and_gradient(X), G.value_and_gradient(X)
    _check(values, np_values, np.float64)
    for key in x0:
        _check(grads[key], np_grads[key], np.float64)
    point = {"a": X["a"][0], "b": X["b"][0]}
    H, np_H = F.hessian(point), G.hessian(point)
    for a in x0:
        for b in x0:
            _check(H[a][b], np_H[a][b], np.float64)
    V = ad.record(g, np.ones(6), tensor=True, device=opencl_device)
    np_V = ad.record(g, np.ones(6), tensor=True)
    Y = rng.normal(size=(5, 6))
    _check(V(Y), np_V(Y), np.float64)
    _check(V.jacobian(Y[0]), np_V.jacobian(Y[0]), np.float64)
    assert launches        # (the batched path ran)


def test_batched_kernels_that_do_not_build(opencl_device, monkeypatch, launches):
    """Batched kernels the driver refuses: a CompilerWarning, then point by point."""
    original = batch_cl.render_kernels

    def broken(*args, **kwargs):     # every kernel over points with a line that is not C
        kernels, source = original(*args, **kwargs)
        return kernels, source.replace("if (B_ >= NB_) return;\n",
                                       "if (B_ >= NB_) return;\n    not C at all;\n")
    monkeypatch.setattr(batch_cl, "render_kernels", broken)
    F = ad.record(chain, np.ones(6), tensor=True, device=opencl_device)
    X = np.random.default_rng(13).normal(size=(4, 6))
    with pytest.warns(ad.errors.CompilerWarning, match="point by point"):
        values, grads = F.value_and_gradient(X)
    for b in range(4):
        value, g = F.value_and_gradient(X[b])
        np.testing.assert_allclose(values[b], value, rtol=1e-12)
        np.testing.assert_allclose(grads[b], g, rtol=1e-12)
    assert launches == {}
