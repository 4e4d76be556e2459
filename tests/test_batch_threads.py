"""How many threads a batch runs on (``easyad._pool``): the process's CPU affinity, or
``EASYAD_NUM_THREADS`` (dask workers sharing a machine); a bad value warns and is ignored
rather than stopping ``import easyad``."""
import os

import numpy as np
import pytest

import easyad as ad
from easyad import _pool


def test_affinity_is_the_default(monkeypatch):
    monkeypatch.delenv("EASYAD_NUM_THREADS", raising=False)
    expected = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") \
        else os.cpu_count()
    assert _pool._cores() == expected


def test_environment_sets_the_count(monkeypatch):
    monkeypatch.setenv("EASYAD_NUM_THREADS", "3")
    assert _pool._cores() == 3


@pytest.mark.parametrize("text", ["0", "-2", "four", "1.5"])
def test_bad_count_warns_and_is_ignored(monkeypatch, text):
    monkeypatch.delenv("EASYAD_NUM_THREADS", raising=False)
    default = _pool._cores()
    monkeypatch.setenv("EASYAD_NUM_THREADS", text)
    with pytest.warns(RuntimeWarning, match=f"EASYAD_NUM_THREADS is '{text}'"):
        assert _pool._cores() == default


def test_a_one_thread_child_computes_the_same_batch(tmp_path):
    """A process told to use one thread gives the batch's gradients bitwise."""
    import subprocess
    import sys
    code = ("import numpy as np, easyad as ad\n"
            "from easyad import _pool\n"
            "assert _pool.CORES == 1, _pool.CORES\n"
            "F = ad.record(lambda x: x[0] * x[1] + ad.sin(x[1]), np.ones(2))\n"
            "X = np.random.default_rng(0).random((5000, 2))\n"
            "np.save(r'%s', F.gradient(X))\n" % (tmp_path / "g.npy"))
    env = dict(os.environ, EASYAD_NUM_THREADS="1",
               PYTHONPATH=os.pathsep.join(sys.path))
    subprocess.run([sys.executable, "-c", code], check=True, env=env, timeout=120)
    F = ad.record(lambda x: x[0] * x[1] + ad.sin(x[1]), np.ones(2))
    X = np.random.default_rng(0).random((5000, 2))
    np.testing.assert_array_equal(np.load(tmp_path / "g.npy"), F.gradient(X))
