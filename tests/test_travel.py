"""Recorded functions that travel (issue 29 item 1): a Function or TensorFunction pickles
as its program, is checked on arrival like ad.load's files (a damaged pickle raises
TapeFormatError), and compiles again in the receiving process, into that process's own
cache, or warns once and runs uncompiled where it has no compiler. The round trips run in a
fresh interpreter, as a worker would."""
import os
import pickle
import subprocess
import sys
import textwrap

import numpy as np
import pytest

import easyad as ad
from easyad._recorded import _rebuild_tensor_function
from easyad.compiler import tape as tape_compiler
from easyad.recorded import tensor_pickle

HAVE_CC = tape_compiler.compiler() is not None


@pytest.fixture(scope="module", autouse=True)
def cache(module_cache):
    return module_cache


def rosen(x):
    return sum(100.0 * (x[i + 1] - x[i] ** 2) ** 2 + (1.0 - x[i]) ** 2 for i in range(3))


def tensor_f(x, w):
    return ad.sum(w * ad.sin(x) ** 2) + ad.sum(x * x)


X = np.random.default_rng(0).normal(size=(6, 4))
W = np.array([1.0, 0.5, 2.0, -1.0])


def elsewhere(payload, script, tmp_path, **env):
    """Run script in a new interpreter with `F` unpickled from payload; its stdout is a
    pickle of the names it sets in `out`."""
    (tmp_path / "in.pkl").write_bytes(payload)
    code = textwrap.dedent(f"""
        import pathlib, pickle, sys, warnings, numpy as np, easyad as ad
        warnings.simplefilter("always")
        out = {{}}
        with warnings.catch_warnings(record=True) as caught:
            F = pickle.loads(pathlib.Path({str(tmp_path / 'in.pkl')!r}).read_bytes())
    """) + textwrap.indent(textwrap.dedent(script), "    ") + textwrap.dedent("""
        out["warnings"] = [type(w.message).__name__ for w in caught]
        sys.stdout.buffer.write(pickle.dumps(out))
    """)
    full_env = dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path),
                    EASYAD_CACHE_DIR=str(tmp_path / "worker-cache"), **env)
    done = subprocess.run([sys.executable, "-c", code], env=full_env, capture_output=True,
                          timeout=120)
    assert done.returncode == 0, done.stderr.decode()
    return pickle.loads(done.stdout)


def test_a_compiled_function_compiles_again_on_arrival(tmp_path):
    F = ad.record(rosen, np.zeros(4))
    with pytest.warns(ad.CompilerWarning) if not HAVE_CC else _nothing():
        F.compile(hessian=True)
    out = elsewhere(pickle.dumps((F, X)), """
        F, X = F
        out["compiled"] = F.compiled
        out["g"] = F.gradient(X)
        out["v"], out["g1"] = F.value_and_gradient(X[0])
        out["h"] = F.hessian(X)
        out["hvp"] = F.hvp(X, X[::-1].copy())
    """, tmp_path)
    assert out["compiled"] is HAVE_CC
    assert np.array_equal(out["g"], F.gradient(X))
    assert out["v"] == F(X[0]) and np.array_equal(out["g1"], F.gradient(X[0]))
    assert np.array_equal(out["h"], F.hessian(X))
    assert np.array_equal(out["hvp"], F.hvp(X, X[::-1].copy()))
    if HAVE_CC:   # compiled into the worker's own cache, not the sender's
        assert list((tmp_path / "worker-cache" / "compiled").glob("*.so"))
    # and independent of any recording: Rosenbrock's gradient by hand
    x = X[1]
    g = np.zeros(4)
    for i in range(3):
        g[i] += -400.0 * x[i] * (x[i + 1] - x[i] ** 2) - 2.0 * (1.0 - x[i])
        g[i + 1] += 200.0 * (x[i + 1] - x[i] ** 2)
    np.testing.assert_allclose(out["g"][1], g, rtol=1e-13)


class _nothing:
    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


@pytest.mark.skipif(not HAVE_CC, reason="no C compiler here to compile the sender's copy")
def test_a_worker_without_a_compiler_warns_once_and_runs_the_vm(tmp_path):
    F = ad.record(rosen, np.zeros(4)).compile()
    G = ad.record(lambda x: x[0] * ad.exp(x[1]) + x[2] * x[3], np.zeros(4)).compile()
    out = elsewhere(pickle.dumps((F, G)), """
        F, G = F
        out["compiled"] = (F.compiled, G.compiled)
        out["g"] = (F.gradient(np.ones(4)), G.gradient(np.ones(4)))
    """, tmp_path, CC="/nonexistent/cc")
    assert out["compiled"] == (False, False)
    assert out["warnings"] == ["CompilerWarning"]
    assert np.array_equal(out["g"][0], F.gradient(np.ones(4)))
    assert np.array_equal(out["g"][1], [np.e, np.e, 1.0, 1.0])   # by hand


def test_a_tensor_function_travels_as_its_program(tmp_path):
    F = ad.record(tensor_f, np.zeros(4), np.ones(4))
    v = np.linspace(-1.0, 1.0, 4)
    F.hvp(X[0], v, W)            # its second recording travels too
    payload = pickle.dumps(F)
    assert b"test_travel" not in payload      # the program, not f (nor its module)
    out = elsewhere(payload, f"""
        x, w, v = np.array({X[0].tolist()}), np.array({W.tolist()}), np.array({v.tolist()})
        out["value"] = F(x, w)
        out["g"] = F.gradient(x, w)
        out["hvp"] = F.hvp(x, v, w)
        out["f"] = F.f
    """, tmp_path)
    x = X[0]
    assert out["f"] is None and out["warnings"] == []
    assert out["value"] == F(x, W)
    assert np.array_equal(out["g"], F.gradient(x, W))
    assert np.array_equal(out["hvp"], F.hvp(x, v, W))
    # by hand: d/dx [w sin^2 x + x^2] = w sin 2x + 2x; second derivative 2w cos 2x + 2
    np.testing.assert_allclose(out["g"], W * np.sin(2 * x) + 2 * x, rtol=1e-14)
    np.testing.assert_allclose(out["hvp"], (2 * W * np.cos(2 * x) + 2) * v, rtol=1e-14)


def test_an_unpickled_tensor_function_says_which_recording_it_lacks():
    F = pickle.loads(pickle.dumps(ad.record(tensor_f, np.zeros(4), np.ones(4))))
    with pytest.raises(ValueError, match="hvp needs a recording .* no f"):
        F.hvp(X[0], X[1], W)


def test_what_does_not_travel_is_refused_with_the_fix():
    F = ad.record(tensor_f, np.zeros(4), np.ones(4), on_branch_change="retape")
    with pytest.raises(TypeError, match="on_branch_change='raise'"):
        pickle.dumps(F)
    layer = ad.nn.Linear(4, 1)
    F = ad.record(lambda x: ad.sum(layer(x)), np.zeros((2, 4)))
    with pytest.raises(TypeError, match="module parameters"):
        pickle.dumps(F)


def _state(F):
    return list(tensor_pickle.state(F))


class _Crafted:
    """Pickles as a TensorFunction with the given data (a hostile or damaged payload)."""

    def __init__(self, data):
        self.data = tuple(data)

    def __reduce__(self):
        return (_rebuild_tensor_function, self.data)


def _tampered(F, change):
    data = _state(F)
    recordings = dict(data[8])
    rec = list(recordings["first"])
    program = list(rec[0])
    program[0] = list(program[0])
    change(data, rec, program)
    rec[0] = tuple(program)
    recordings["first"] = tuple(rec)
    data[8] = recordings
    return pickle.dumps(_Crafted(data))


@pytest.mark.parametrize("change, message", [
    # C injected into an elementwise expression: never reaches the compiler
    (lambda d, r, p: p[0].__setitem__(0, (p[0][0][0], p[0][0][1][:1] + (
        ('sin(x0)); system("touch /tmp/pwned"',),) + p[0][0][1][2:], *p[0][0][2:])),
     "not in the rule expression language|cannot parse"),
    (lambda d, r, p: p[0].__setitem__(0, p[0][0][:2] + ((10 ** 6,),) + p[0][0][3:]),
     "not a slot of the program"),
    (lambda d, r, p: p[0].__setitem__(0, ("host",) + p[0][0][1:]),
     "not one a program|fields of HostCall"),
    # a host call of Python code (only registered host kernels travel)
    (lambda d, r, p: p[0].__setitem__(0, ("host", ("x", print, (), ()), *p[0][0][2:])),
     "holds a builtin|not a registered host kernel"),
    (lambda d, r, p: r.__setitem__(2, [-1]), "not a slot"),
    (lambda d, r, p: p.__setitem__(1, p[1][:-1]), "shapes"),
    (lambda d, r, p: p.__setitem__(2, ["O"] + p[2][1:]), "not a numeric dtype"),
    (lambda d, r, p: d.__setitem__(6, "retape"), "on_branch_change"),
    (lambda d, r, p: d.__setitem__(0, 99), "format"),
], ids=["c-injection", "operand", "op", "host-code", "output", "shapes", "dtype", "mode", "format"])
def test_a_tampered_tensor_pickle_raises_tape_format_error(change, message):
    F = ad.record(tensor_f, np.zeros(4), np.ones(4))
    with pytest.raises(ad.TapeFormatError, match=message):
        pickle.loads(_tampered(F, change))


def test_a_tampered_function_pickle_raises_tape_format_error():
    F = ad.record(rosen, np.zeros(4))
    from easyad.replay import _rebuild_function
    tape, *rest = F.__reduce__()[1]

    class Bad:
        def __reduce__(self):
            return (_rebuild_function, (tape, *rest[:5], ("yes", False)))

    with pytest.raises(ad.TapeFormatError, match="compile options"):
        pickle.loads(pickle.dumps(Bad()))
    good = pickle.dumps(F)
    bad = good.replace(b"raise", b"RAISE")
    with pytest.raises(ad.TapeFormatError, match="on_branch_change"):
        pickle.loads(bad)
