"""A recorded Function over dask arrays (issue 29 item 2, easyad.distributed): lazy results,
one task per chunk, the same numbers as the in-process batch (bit for bit), on dask's
threads and on a real LocalCluster of 2 worker processes, the Function loaded once per
worker; a tampered payload raises TapeFormatError at the client; a worker killed while it
computes: dask runs its tasks again and the results are the same."""
import os
import signal
import time

import numpy as np
import pytest

import easyad as ad

da = pytest.importorskip("dask.array")
distributed = pytest.importorskip("distributed")


@pytest.fixture(scope="module", autouse=True)
def cache(module_cache):
    return module_cache


def rosen(x):
    return sum(100.0 * (x[i + 1] - x[i] ** 2) ** 2 + (1.0 - x[i]) ** 2 for i in range(5))


def branchy(x):
    return (x[0] * x[1] if x[0] > 0 else ad.sin(x[1])) + x[2] ** 2    # a Python branch


N = 6
RNG = np.random.default_rng(29)
XN = RNG.normal(size=(40, N))
VN = RNG.normal(size=(40, N))
X = da.from_array(XN, chunks=(7, N))       # 6 chunks of rows, the last of 5


def _calls(F, X, V):
    """Each method on X (dask or numpy), in the order the tests compare them."""
    return [F(X), F.gradient(X), *F.value_and_gradient(X), F.hessian(X),
            F.hvp(X, V), F.hvp(X, VN[0])]


def _check_same(F, computed):
    for got, want in zip(computed, _calls(F, XN, VN)):
        assert got.shape == want.shape
        assert np.array_equal(got, want), np.max(np.abs(got - want))


def _easyad_tasks(array):
    return [k for k in dict(array.__dask_graph__()) if str(k[0] if isinstance(k, tuple)
                                                            else k).startswith("easyad-")]


# -- dask's own schedulers (no client) --
@pytest.mark.parametrize("compiled", [False, True])
def test_every_call_on_the_threaded_scheduler_is_the_batch_result(compiled):
    F = ad.record(rosen, np.zeros(N))
    if compiled:
        import warnings
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", ad.CompilerWarning)
            F.compile(hessian=True)
    lazy = _calls(F, X, da.from_array(VN, chunks=(13, N)))
    assert all(isinstance(a, da.Array) for a in lazy)
    assert len(_easyad_tasks(F.gradient(X))) == len(X.chunks[0])      # one task per chunk
    import dask
    computed = dask.compute(*lazy, scheduler="threads")
    _check_same(F, computed)
    # and against Rosenbrock's gradient by hand
    g = np.zeros_like(XN)
    for i in range(N - 1):
        g[:, i] += -400.0 * XN[:, i] * (XN[:, i + 1] - XN[:, i] ** 2) - 2.0 * (1 - XN[:, i])
        g[:, i + 1] += 200.0 * (XN[:, i + 1] - XN[:, i] ** 2)
    np.testing.assert_allclose(computed[1], g, rtol=1e-12, atol=1e-12)


def test_mask_mode_returns_lazy_results_and_a_lazy_mask():
    F = ad.record(branchy, np.ones(3), on_branch_change="mask")
    x = np.array([[1.0, 2.0, 3.0], [-1.0, 2.0, 3.0], [2.0, 0.5, 1.0], [0.0, 1.0, 1.0]])
    (g, mask) = F.gradient(da.from_array(x, chunks=(2, 3)))
    g_want, mask_want = F.gradient(x)
    assert mask.dtype == bool
    got_g, got_mask = g.compute(scheduler="threads"), mask.compute(scheduler="threads")
    assert np.array_equal(got_mask, mask_want) and got_mask.tolist() == [False, True,
                                                                           False, True]
    assert np.array_equal(got_g, g_want, equal_nan=True)
    (v, g2), mask2 = F.value_and_gradient(da.from_array(x, chunks=(3, 3)))
    assert np.array_equal(g2.compute(scheduler="sync"), g_want, equal_nan=True)
    assert np.array_equal(v.compute(scheduler="sync"), F(x)[0], equal_nan=True)


def test_bad_dask_inputs_are_refused_with_the_fix():
    F = ad.record(rosen, np.zeros(N))
    with pytest.raises(ValueError, match=r"shape \(B, 6\)"):
        F.gradient(da.ones((10, 5), chunks=5))
    with pytest.raises(ValueError, match="out= and device="):
        F.gradient(X, out=np.empty((40, N)))
    with pytest.raises(ValueError, match="v must have shape"):
        F.hvp(X, np.ones(3))
    # columns split over chunks are joined: a task needs whole rows
    split = da.from_array(XN, chunks=(10, 2))
    assert np.array_equal(F.gradient(split).compute(scheduler="sync"), F.gradient(XN))


def test_easyad_imports_without_dask():
    import subprocess
    import sys
    code = ("import sys; sys.modules['dask'] = None; sys.modules['distributed'] = None\n"
            "import numpy as np, easyad as ad\n"
            "print(ad.record(lambda x: x[0] ** 2, [1.0]).gradient(np.array([[3.0]]))[0, 0])")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          env=dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path)),
                          timeout=60)
    assert done.stdout.strip() == "6.0", done.stderr


# -- data-parallel gradients of a recorded loss --
A = RNG.normal(size=(48, 3))
Y = A @ np.array([1.0, -2.0, 0.5]) + 0.1 * RNG.normal(size=48)


def least_squares(w, a, y):
    return ad.sum((a @ w["w"] + w["b"] - y) ** 2)


def _train(steps, grad_of):
    """SGD on the client: w <- w - lr * gradient (summed over the shards)."""
    w = {"w": np.zeros(3), "b": np.zeros(())}
    for _ in range(steps):
        _, g = grad_of(w)
        w = {k: w[k] - 0.005 * g[k] for k in w}
    return w


def _by_hand(w):
    r = A @ w["w"] + w["b"] - Y
    return r @ r, {"w": 2.0 * A.T @ r, "b": 2.0 * r.sum()}


def test_shard_gradients_sum_to_the_whole_datasets(client=None):
    from easyad.distributed import shard_value_and_gradient
    T = ad.record(least_squares, {"w": np.zeros(3), "b": np.zeros(())}, A[:8], Y[:8])
    data = (da.from_array(A, chunks=(8, 3)), da.from_array(Y, chunks=8))   # 6 shards
    w = {"w": np.array([0.3, -1.0, 2.0]), "b": np.array(0.25)}
    value, g = shard_value_and_gradient(T, w, *data, split_every=2).compute(
        scheduler=None if client else "threads")
    want_value, want = _by_hand(w)
    np.testing.assert_allclose(value, want_value, rtol=1e-13)
    np.testing.assert_allclose(g["w"], want["w"], rtol=1e-13)
    np.testing.assert_allclose(g["b"], want["b"], rtol=1e-13)
    steps = 4 if client else 20          # a round trip per step on the cluster
    trained = _train(steps, lambda w: shard_value_and_gradient(T, w, *data).compute(
        scheduler=None if client else "threads"))
    single = _train(steps, _by_hand)     # one process, numpy by hand
    for k in trained:
        np.testing.assert_allclose(trained[k], single[k], rtol=0, atol=1e-10)
    with pytest.raises(ValueError, match="chunked alike"):
        shard_value_and_gradient(T, w, data[0], da.from_array(Y, chunks=16))


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
    """On a worker: count Functions unpickled from now on."""
    import easyad.replay as replay
    original = getattr(replay, "_original_rebuild", replay._rebuild_function)
    replay._original_rebuild = original
    replay._loads = 0

    def counting(*state):
        replay._loads += 1
        return original(*state)
    replay._rebuild_function = counting


def _loads():
    import easyad.replay as replay
    return replay._loads


def test_on_a_local_cluster_every_call_is_the_batch_result(client):
    F = ad.record(rosen, np.zeros(N))
    client.run(_count_loads)
    lazy = _calls(F, X, da.from_array(VN, chunks=(13, N)))
    computed = client.compute(lazy, sync=True)
    _check_same(F, computed)
    # the Function went to each worker once (scattered), not with each of the ~40 tasks
    loads = client.run(_loads)
    assert sorted(loads.values()) == [1, 1], loads


def test_a_tampered_payload_raises_tape_format_error_at_the_client(client):
    F = ad.record(rosen, np.zeros(N))
    F._compile_args = ("yes", False)        # not two bools: the worker's check refuses it
    with pytest.raises(ad.TapeFormatError, match="compile options"):
        F.gradient(X).compute()


def test_a_worker_killed_mid_computation_changes_nothing(client):
    F = ad.record(rosen, np.zeros(N))
    big = RNG.normal(size=(4000, N))
    lazy = F.hessian(da.from_array(big, chunks=(25, N)))     # 160 tasks
    pids = client.run(os.getpid)
    future = client.compute(lazy)
    deadline = time.monotonic() + 30
    while not any(client.processing().values()) and time.monotonic() < deadline:
        time.sleep(0.01)
    victim = next(iter(pids))
    assert future.status == "pending"               # killed mid-computation
    os.kill(pids[victim], signal.SIGKILL)           # the nanny starts a new one
    result = future.result(timeout=120)
    deadline = time.monotonic() + 30                # the scheduler saw it die
    while victim in client.scheduler_info()["workers"] and time.monotonic() < deadline:
        time.sleep(0.05)
    assert victim not in client.scheduler_info()["workers"]
    assert np.array_equal(result, F.hessian(big))


def test_data_parallel_training_on_the_cluster(client):
    test_shard_gradients_sum_to_the_whole_datasets(client)


def test_monte_carlo_example_on_a_cluster():
    """examples/monte_carlo.py at a small size: the price and greeks from shards on 2
    worker processes equal one process's, and lie within 4 standard errors of Black and
    Scholes' closed forms (the example asserts both)."""
    import importlib.util
    import pathlib
    path = pathlib.Path(__file__).resolve().parent.parent / "examples" / "monte_carlo.py"
    spec = importlib.util.spec_from_file_location("monte_carlo", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    module.main(["--paths", "40000", "--shards", "4"])
    price, greeks = module.black_scholes(105.0, 0.2, 0.03)
    assert 12.6 < price < 12.7 and 0.68 < greeks[0] < 0.70     # the closed form itself
