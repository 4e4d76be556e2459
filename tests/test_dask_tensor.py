"""A TensorFunction over dask arrays (issue 29 item 2, easyad.distributed.tensor_batch):
x with one more leading axis of points, chunked along it; calls, gradient,
value_and_gradient, hvp and hessian give lazy arrays, one task per chunk, bit for bit the
numpy batch's (float64 and float32), on dask's threads and on a real LocalCluster of 2
worker processes (the program loaded once per worker); the arguments after x shipped
once; the Hessians checked against torch.func; bad input refused with the fix."""
import numpy as np
import pytest

import easyad as ad
from conftest import OPENCL

da = pytest.importorskip("dask.array")
distributed = pytest.importorskip("distributed")


@pytest.fixture(scope="module", autouse=True)
def cache(module_cache):
    return module_cache


def loss(x, w, scale):
    """x (2, 3), w (3,) a float argument, scale a static number."""
    return ad.sum(w * ad.sin(x) ** 2) * ad.sum(x[0] * x[1]) + scale * ad.sum(x ** 3)


def loss_torch(x, w, scale):
    import torch
    return torch.sum(w * torch.sin(x) ** 2) * torch.sum(x[0] * x[1]) + scale * torch.sum(x ** 3)


RNG = np.random.default_rng(2929)
B = 23
XN = RNG.normal(size=(B, 2, 3))
VN = RNG.normal(size=(B, 2, 3))
W = np.array([0.5, -1.0, 2.0])
X = da.from_array(XN, chunks=(6, 2, 3))        # 4 chunks of points, the last of 5


def _record(dtype=np.float64):
    return ad.record(loss, np.ones((2, 3), dtype=dtype), W.astype(dtype), 0.25)


def _calls(T, X, V, v):
    """Each method on X (dask or numpy), as the tests compare them."""
    return [T(X, W, 0.25), T.gradient(X, W, 0.25), *T.value_and_gradient(X, W, 0.25),
            T.hvp(X, V, W, 0.25), T.hvp(X, v, W, 0.25), T.hessian(X, W, 0.25)]


def _check_same(T, computed, XN=XN, VN=VN):
    want = _calls(T, XN, VN, VN[0])
    assert len(computed) == len(want)
    for got, w in zip(computed, want):
        assert got.shape == w.shape and got.dtype == w.dtype, (got.shape, w.shape)
        assert np.array_equal(got, w), np.max(np.abs(got - w))


def _easyad_tasks(array):
    return [k for k in dict(array.__dask_graph__()) if str(k[0] if isinstance(k, tuple)
                                                            else k).startswith("easyad-")]


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
def test_every_method_on_the_threaded_scheduler_is_the_numpy_batch(dtype):
    import dask
    T = _record(dtype)
    lazy = _calls(T, X.astype(dtype), da.from_array(VN.astype(dtype), chunks=(10, 2, 3)),
                  VN[0].astype(dtype))
    assert all(isinstance(a, da.Array) for a in lazy)
    for a in lazy:                           # one block per chunk of points, nothing else
        assert a.numblocks[0] == len(X.chunks[0]) and all(n == 1 for n in a.numblocks[1:])
    assert len(_easyad_tasks(lazy[1])) == len(X.chunks[0])          # one task per chunk
    assert lazy[6].shape == (B, 2, 3, 2, 3) and lazy[2].shape == (B,)
    computed = dask.compute(*lazy, scheduler="threads")
    _check_same(T, computed, XN.astype(dtype), VN.astype(dtype))


def test_batched_hessians_match_torch_func_and_the_one_point_hessian():
    torch = pytest.importorskip("torch")
    T = _record()
    H = T.hessian(X, W, 0.25).compute(scheduler="sync")
    G = T.gradient(X, W, 0.25).compute(scheduler="sync")
    for b in (0, 7, B - 1):
        assert np.array_equal(H[b], T.hessian(XN[b], W, 0.25))     # the one-point route
        x = torch.tensor(XN[b])
        want = torch.func.hessian(loss_torch)(x, torch.tensor(W), 0.25).numpy()
        np.testing.assert_allclose(H[b], want, rtol=1e-12, atol=1e-12)
        g = torch.func.grad(loss_torch)(x, torch.tensor(W), 0.25).numpy()
        np.testing.assert_allclose(G[b], g, rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(H, np.swapaxes(np.swapaxes(H, 1, 3), 2, 4), rtol=1e-12)


def test_structured_outputs_and_one_number_points():
    parts = ad.record(lambda x: {"s": ad.sin(x), "t": ad.sum(x * x)}, np.ones(4), tensor=True)
    XV = RNG.normal(size=(9, 4))
    got = parts(da.from_array(XV, chunks=4))
    assert set(got) == {"s", "t"} and isinstance(got["s"], da.Array)
    want = parts(XV)
    for k in got:
        assert np.array_equal(got[k].compute(scheduler="sync"), want[k])
    np.testing.assert_allclose(want["s"], np.sin(XV), rtol=1e-15)
    # x one number per point: X of shape (B,)
    cube = ad.record(lambda x: x ** 3, np.array(2.0), tensor=True)
    xs = np.linspace(-1.0, 2.0, 7)
    g = cube.gradient(da.from_array(xs, chunks=3)).compute(scheduler="sync")
    assert np.array_equal(g, cube.gradient(xs))
    np.testing.assert_allclose(g, 3.0 * xs ** 2, rtol=1e-15)
    # a static argument that is callable stays an argument (not read as a dask task)
    act = ad.record(lambda x, fn: ad.sum(fn(x)), np.ones(4), ad.tanh)
    got = act.gradient(da.from_array(XV, chunks=4), ad.tanh).compute(scheduler="sync")
    np.testing.assert_allclose(got, 1.0 - np.tanh(XV) ** 2, rtol=1e-14)


def test_bad_dask_inputs_are_refused_with_the_fix():
    T = _record()
    with pytest.raises(ValueError, match=r"shape \(B, 2, 3\).*got \(23, 3, 2\)"):
        T.gradient(da.from_array(XN.reshape(B, 3, 2)), W, 0.25)
    with pytest.raises(ValueError, match=r"v must have shape \(2, 3\) or \(23, 2, 3\)"):
        T.hvp(X, np.ones((23, 3)), W, 0.25)
    with pytest.raises(ValueError, match=r"v must have shape"):
        T.hvp(X, da.ones((22, 2, 3)), W, 0.25)
    with pytest.raises(ValueError, match="same for every point"):
        T.gradient(X, da.from_array(W), 0.25)
    with pytest.raises(ValueError, match="argument of shape"):
        T.gradient(X, np.ones(4), 0.25)             # checked at the client, not on a worker
    with pytest.raises(ValueError, match="part of the recording and changed"):
        T.gradient(X, W, 0.5)
    with pytest.raises(NotImplementedError, match="map_blocks"):
        T.vjp(X, 1.0, W, 0.25)
    with pytest.raises(ValueError, match="sparse= and format="):
        T.hessian(X, W, 0.25, sparse=True)
    tree = ad.record(lambda p: ad.sum(p["a"] * p["b"]), {"a": np.ones(2), "b": np.ones(2)})
    with pytest.raises(NotImplementedError, match="one array"):
        tree.gradient(da.ones((4, 2)))
    vector = ad.record(lambda x: ad.sin(x), np.ones(3), tensor=True)
    with pytest.raises(ValueError, match="gradient needs f to return one number"):
        vector.gradient(da.ones((4, 3)))
    # other axes split over chunks are joined: a task needs whole points
    split = da.from_array(XN, chunks=(5, 1, 2))
    assert np.array_equal(T.gradient(split, W, 0.25).compute(scheduler="sync"),
                          T.gradient(XN, W, 0.25))


def test_a_branch_change_on_a_chunk_raises_as_the_numpy_batch_does():
    def kinked(x):
        return ad.sum(x ** 2) if bool(ad.sum(x) > 0) else ad.sum(ad.sin(x))
    T = ad.record(kinked, np.ones(3), tensor=True)
    fine = RNG.uniform(0.1, 1.0, size=(6, 3))
    assert np.array_equal(T.gradient(da.from_array(fine, chunks=2)).compute(
        scheduler="sync"), 2.0 * fine)
    mixed = fine.copy()
    mixed[4] = -1.0
    with pytest.raises(ad.BranchChangedError):
        T.gradient(mixed)
    with pytest.raises(ad.BranchChangedError):
        T.gradient(da.from_array(mixed, chunks=2)).compute(scheduler="sync")


@pytest.mark.skipif(not OPENCL, reason="no working OpenCL device")
def test_an_opencl_tensor_function_on_dask_threads():
    # its chunks run one at a time (a lock: kernels hold their arguments), as it is (one
    # device, one method: recording and building kernels on OpenCL is the slow part)
    T = ad.record(loss, np.ones((2, 3)), W, 0.25, device=OPENCL[0])
    got = T.gradient(X, W, 0.25).compute(scheduler="threads")
    assert np.array_equal(got, T.gradient(XN, W, 0.25))
    np.testing.assert_allclose(got, _record().gradient(XN, W, 0.25), rtol=1e-12,
                               atol=1e-12)


# -- a real cluster: 2 worker processes --
@pytest.fixture(scope="module")
def client(module_cache):
    import sys

    import cloudpickle      # this module's helpers go to the workers by value
    cloudpickle.register_pickle_by_value(sys.modules[__name__])
    cluster = distributed.LocalCluster(n_workers=2, processes=True, threads_per_worker=1,
                                       dashboard_address=None, silence_logs=50)
    with distributed.Client(cluster) as c:
        yield c
    cluster.close()


def _count_loads():
    """On a worker: count TensorFunctions unpickled from now on."""
    import easyad._recorded as recorded
    original = getattr(recorded, "_original_rebuild", recorded._rebuild_tensor_function)
    recorded._original_rebuild = original
    recorded._loads = 0

    def counting(*state):
        recorded._loads += 1
        return original(*state)
    recorded._rebuild_tensor_function = counting


def _loads():
    import easyad._recorded as recorded
    return recorded._loads


def test_on_a_local_cluster_every_method_is_the_numpy_batch(client):
    T = _record()
    client.run(_count_loads)
    scatters = []
    original = client.scatter
    client.scatter = lambda *a, **k: scatters.append(a) or original(*a, **k)
    try:
        lazy = _calls(T, X, da.from_array(VN, chunks=(10, 2, 3)), VN[0])
    finally:
        del client.scatter
    computed = client.compute(lazy, sync=True)
    _check_same(T, computed)
    # the program went to each worker once; then again once, when hvp was first asked for
    # (its second-sweep program recorded then, at the client: f stays there)
    loads = client.run(_loads)
    assert sorted(loads.values()) == [2, 2], loads
    payloads = [a for a in scatters if isinstance(a[0], bytes)]
    assert len(payloads) == 2
    client.run(_count_loads)
    again = client.compute(_calls(T, X, da.from_array(VN, chunks=(10, 2, 3)), VN[0]),
                           sync=True)
    _check_same(T, again)
    assert sorted(client.run(_loads).values()) == [0, 0]         # nothing sent again


def test_a_tampered_tensor_payload_raises_tape_format_error_at_the_client(client):
    T = _record()
    T._recordings["first"].guards = -1       # the worker's check refuses it
    with pytest.raises(ad.TapeFormatError, match="guards"):
        T.gradient(X, W, 0.25).compute()


def test_what_does_not_travel_is_refused_at_the_client(client):
    T = ad.record(loss, np.ones((2, 3)), W, 0.25, on_branch_change="retape")
    with pytest.raises(TypeError, match="retape"):
        T.gradient(X, W, 0.25)
    if OPENCL:          # its values live on the device: record it on the numpy device
        T = ad.record(loss, np.ones((2, 3)), W, 0.25, device=OPENCL[0])
        with pytest.raises(TypeError, match="device='numpy'"):
            T.gradient(X, W, 0.25)
