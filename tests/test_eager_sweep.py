"""Issue 16 item 1 leftovers: the transforms' fast path for one array (no needless copies
of the input or the gradient), the sweep that releases what tensor operations saved as it
passes them, and the core's strong-zero ufuncs (mul0, div0) against their definition."""
import gc
from pathlib import Path
import sys

import numpy as np
import pytest

import easyad as ad
from easyad import _core
from easyad._core import Node
from easyad.tensor._base import wrap


def rosen(x):
    return (100.0 * (x[1:] - x[:-1] ** 2) ** 2 + (1.0 - x[:-1]) ** 2).sum()


def rosen_grad(x):
    """The hand-written gradient (the reference)."""
    g = np.zeros_like(x, dtype=np.float64)
    d = x[1:] - x[:-1] ** 2
    g[:-1] = -400.0 * x[:-1] * d - 2.0 * (1.0 - x[:-1])
    g[1:] += 200.0 * d
    return g


def central_differences(f, x, h=1e-6):
    g = np.zeros(x.shape)
    for i in np.ndindex(x.shape):
        up, down = x.copy(), x.copy()
        up[i] += h
        down[i] -= h
        g[i] = (float(f(up)) - float(f(down))) / (2 * h)
    return g


# ---- ad.grad of one array: the fast path ----

@pytest.mark.parametrize("n", [2, 10, 1000])
def test_grad_of_one_array_matches_the_hand_written_gradient(rng, n):
    x0 = rng.uniform(-1.0, 1.5, n)
    kept = x0.copy()
    g = ad.grad(rosen)(x0)
    np.testing.assert_allclose(g, rosen_grad(x0), rtol=1e-13, atol=1e-12)
    np.testing.assert_array_equal(x0, kept)            # the input is read, never written
    value, g2 = ad.value_and_grad(rosen)(x0)
    assert value == pytest.approx(float(rosen(x0)), rel=1e-14)
    np.testing.assert_array_equal(g2, g)


@pytest.fixture
def on_device(device):
    previous = ad.get_device()
    ad.set_device(device)
    yield device
    ad.set_device(previous)


def test_grad_of_one_array_on_every_device(rng, on_device):
    """The fast path on the default device (OpenCL: the input copied to the device, the
    gradient read back once), scalar code on elements included; released as it goes."""
    x0 = rng.uniform(-1.0, 1.5, 33)
    leaked = []

    def f(x):
        leaked.append(x)
        return rosen(x) + x[0] * x[32]
    want = rosen_grad(x0)
    want[0] += x0[32]
    want[32] += x0[0]
    value, g = ad.value_and_grad(f)(x0)
    np.testing.assert_allclose(g, want, rtol=1e-12, atol=1e-12)
    assert value == pytest.approx(float(rosen(x0)) + x0[0] * x0[32], rel=1e-13)
    assert leaked[0].device == ad.get_device()
    assert g.flags.writeable and not np.shares_memory(g, x0)


def test_grad_hands_over_a_fresh_writeable_array(rng):
    """The gradient is the sweep's own buffer (not copied again), so it must be an array
    the caller owns: writeable, C-contiguous, sharing memory with neither the input nor
    the gradient of another call."""
    x0 = rng.uniform(-1.0, 1.5, 50)
    grad = ad.grad(rosen)
    g1, g2 = grad(x0), grad(x0)
    for g in (g1, g2):
        assert g.flags.writeable and g.flags.c_contiguous and g.dtype == np.float64
        assert not np.shares_memory(g, x0)
    assert not np.shares_memory(g1, g2)
    g1[:] = 0.0                          # the caller may write into it
    np.testing.assert_allclose(g2, rosen_grad(x0), rtol=1e-13, atol=1e-12)


def test_the_input_is_read_in_place_through_a_read_only_view(rng):
    """A float64 C-contiguous input is not copied: f's tensor reads it through a read-only
    view (the tensor layer never writes into an operand; the view makes sure)."""
    x0 = rng.standard_normal(6)
    seen = {}

    def f(x):
        seen["data"] = x._data
        return ad.sum(ad.sin(x) * x)
    g = ad.grad(f)(x0)
    np.testing.assert_allclose(g, np.cos(x0) * x0 + np.sin(x0), rtol=1e-14)
    assert np.shares_memory(seen["data"], x0) and not seen["data"].flags.writeable
    assert x0.flags.writeable                         # the caller's array is untouched


@pytest.mark.parametrize("make", [
    lambda a: a.astype(np.float32),                   # float32 in, float32 out
    lambda a: np.round(a * 3).astype(np.int64),       # integers
    lambda a: np.asfortranarray(a.reshape(4, 5)),     # not C-contiguous
    lambda a: a[::2],                                 # strided
    lambda a: a.reshape(4, 5),                        # 2-D
], ids=["float32", "int64", "fortran", "strided", "2-D"])
def test_grad_of_other_arrays(rng, make):
    x0 = make(rng.uniform(-1.0, 1.0, 20))
    kept = x0.copy()

    def f(x):
        return ad.sum(ad.exp(x) * x) + ad.sum(x * x) * 0.5
    g = ad.grad(f)(x0)
    x = np.asarray(x0, dtype=np.float64)
    # derivatives follow the input's floating dtype (ints: float64), computed in float64
    # and rounded once (docs/conventions.md)
    dtype = x0.dtype if x0.dtype.kind == "f" else np.dtype(np.float64)
    np.testing.assert_allclose(g, np.exp(x) * x + np.exp(x) + x,
                               rtol=1e-13 if dtype == np.float64 else 2 ** -24)
    assert g.shape == x0.shape and g.dtype == dtype
    np.testing.assert_array_equal(x0, kept)
    np.testing.assert_allclose(g, central_differences(f, x), rtol=1e-6, atol=1e-8)


def test_grad_of_scalar_code_and_tensor_code_together(rng):
    """Element Records (x[i]) and the tensor adjoint add up on the fast path too."""
    x0 = rng.standard_normal(5)

    def f(x):
        return x[0] * x[3] + ad.sum(x ** 2) + ad.sin(x[4])
    want = 2 * x0
    want[0] += x0[3]
    want[3] += x0[0]
    want[4] += np.cos(x0[4])
    np.testing.assert_allclose(ad.grad(f)(x0), want, rtol=1e-14)
    only_elements = ad.grad(lambda x: x[1] * x[2])(x0)
    np.testing.assert_array_equal(only_elements, [0.0, x0[2], x0[1], 0.0, 0.0])


def test_grad_of_outputs_that_are_not_records(rng):
    x0 = rng.standard_normal(4)
    np.testing.assert_array_equal(ad.grad(lambda x: 3.0)(x0), np.zeros(4))
    np.testing.assert_allclose(ad.grad(lambda x: (x * x).sum())(x0), 2 * x0)
    # a 0-d tensor output: its sum is the scalar
    np.testing.assert_array_equal(ad.grad(lambda x: (x * 3.0)[1:2].reshape(()))(x0),
                                  [0.0, 3.0, 0.0, 0.0])
    other = ad.WengertList().variable(1.0)
    with pytest.raises(ad.TapeMismatchError):
        ad.grad(lambda x: ad.sum(x) * other)(x0)


def test_grad_through_a_primitive_whose_vjp_returns_its_seed(rng):
    """A custom vjp that hands back the very array it was given: the gradient still comes
    out as an array of its own (the sweep's buffer is handed over only when nothing else
    holds it)."""
    kept = []

    @ad.primitive(array=True)
    def ident(x):
        return np.array(x)

    @ident.defvjp
    def _(g, x, out):
        kept.append(g)
        return g
    x0 = rng.standard_normal(7)
    g = ad.grad(lambda x: ad.sum(ident(x) * 2.0))(x0)
    np.testing.assert_array_equal(g, np.full(7, 2.0))
    for k in kept:
        assert not np.shares_memory(g, k)


def test_take_node_adjoint_hands_the_adjoint_over():
    lst = ad.WengertList()
    x = ad.Tensor.variable(np.array([1.0, 2.0]), lst)
    d = ad.sum(x * x).derivatives()
    a = d._take_node_adjoint(x.handle.index)
    np.testing.assert_array_equal(a, [2.0, 4.0])
    assert d._take_node_adjoint(x.handle.index) is None       # taken: no longer held
    assert sys.getrefcount(a) == 2


def test_grad_leaves_no_garbage_cycles(rng):
    """A transform's call leaves nothing for the cyclic collector (the structure helpers
    recurse without self-referencing closures)."""
    x0 = rng.standard_normal(5)
    grad = ad.grad(rosen)
    gc.collect()
    was = gc.isenabled()
    gc.disable()
    try:
        for _ in range(20):
            grad(x0)
            ad.grad(lambda p: ad.sum(p["a"] * p["b"][0]))({"a": x0, "b": [x0, 1.0]})
        gc.set_debug(gc.DEBUG_SAVEALL)
        gc.collect()
        # only cycles easyad made: another thread of the process (pytest-xdist's channel,
        # a driver's) may leave garbage of its own while the collector is off
        found = [o for o in gc.garbage if _of_easyad(o)]
        assert not found, sorted({type(o).__name__ for o in found})
    finally:
        gc.set_debug(0)
        gc.garbage.clear()
        if was:
            gc.enable()


def _of_easyad(obj):
    """Whether obj is easyad's: an instance of one of its classes, or a function, code
    object or frame of its source."""
    code = getattr(obj, "__code__", None) or getattr(obj, "f_code", None) or (
        obj if type(obj).__name__ == "code" else None)
    if code is not None:
        return "easyad" in Path(code.co_filename).parts
    return type(obj).__module__.split(".")[0] == "easyad"


# ---- the releasing sweep ----

def _probe(x, log, be):
    """x, through a node whose vjp notes the backend's live buffers when the sweep
    reaches it (the last node before the input)."""
    def vjp(g):
        gc.collect()
        log.append(be.live_buffers)
        return (g,)
    handle = x.tape._push_node(Node("probe", (x.handle.index,), vjp))
    return wrap(ad.Tensor, be, x._data, x.shape, x.dtype, x.tape, handle)


def _chain(t):
    for _ in range(12):
        t = ad.sin(t) * t + 1.0
    return ad.sum(t)


@pytest.mark.parametrize("release", [False, True])
def test_release_frees_intermediates_as_the_sweep_passes(rng, device, release):
    be = ad.Tensor.constant(np.ones(1), device=device).device.backend
    be.live_buffers                        # numpy counts buffers from the first read on
    x0 = rng.uniform(0.1, 1.0, 1000)
    lst = ad.WengertList()
    x = ad.Tensor.variable(x0, lst, device=device)
    log = []
    gc.collect()
    start = be.live_buffers                 # the input's, and whatever else is alive
    z = _chain(_probe(x, log, be))
    z.number          # on OpenCL, z's number stays in its 0-d buffer until it is read
    d = z.derivatives(release=release)     # z: a scalar Record (ad.sum's)
    held = log[0] - start
    # 36 operations, each saving a value or two: without release all are alive when the
    # sweep reaches the probe; with release only the adjoint being passed on
    if release:
        assert held <= 2, held
    else:
        assert held >= 24, held
    t, derivative = x0, np.ones(1000)       # the chain rule by hand
    for _ in range(12):
        derivative = derivative * (np.cos(t) * t + np.sin(t))
        t = np.sin(t) * t + 1.0
    np.testing.assert_allclose(d[x], derivative, rtol=1e-10, atol=1e-15)


def test_a_second_sweep_after_release_raises(rng):
    lst = ad.WengertList()
    x = ad.Tensor.variable(rng.standard_normal(4), lst)
    y = ad.sin(x) * x
    z = ad.sum(y)
    with pytest.raises(ValueError, match="one of create_graph and release"):
        z.derivatives(create_graph=True, release=True)
    first = z.derivatives(2.0, release=True)[x]
    np.testing.assert_allclose(first, 2 * (np.cos(x.value) * x.value + np.sin(x.value)))
    with pytest.raises(RuntimeError, match="released"):
        z.derivatives()
    with pytest.raises(RuntimeError, match="released"):
        y.derivatives(np.ones(4))
    with pytest.raises(RuntimeError, match="released"):
        z.derivatives(create_graph=True)
    # operations recorded after the released sweep are swept as usual
    w = ad.sum(x * 3.0)
    np.testing.assert_array_equal(w.derivatives()[x], np.full(4, 3.0))


def test_a_sweep_without_release_can_be_repeated(rng):
    lst = ad.WengertList()
    x = ad.Tensor.variable(rng.standard_normal(4), lst)
    z = ad.sum(ad.exp(x) * x)
    a, b = z.derivatives()[x], z.derivatives()[x]
    np.testing.assert_array_equal(a, b)


def test_grad_releases_its_own_list(rng):
    """ad.grad sweeps its own list once, releasing as it goes: a computation leaked out of
    f cannot be swept again (a clear error, not stale numbers)."""
    leaked = {}

    def f(x):
        leaked["z"] = ad.sum(ad.tanh(x) * x)
        return leaked["z"]
    x0 = rng.standard_normal(3)
    g = ad.grad(f)(x0)
    np.testing.assert_allclose(g, np.tanh(x0) + x0 / np.cosh(x0) ** 2, rtol=1e-14)
    with pytest.raises(RuntimeError, match="released"):
        leaked["z"].derivatives()
    _, u = ad.vjp(f, x0, 2.0)
    np.testing.assert_allclose(u, 2 * g, rtol=1e-14)
    with pytest.raises(RuntimeError, match="released"):
        leaked["z"].derivatives()


def test_transforms_with_several_sweeps_do_not_release(rng):
    """Jacobians sweep once per output row, Hessians differentiate recorded sweeps, HVPs
    sweep both parts of a traced output: none of them may release."""
    x0 = rng.standard_normal(3)

    def f(x):
        return ad.sin(x) * x

    J = ad.jacobian(f, mode="reverse")(x0)
    np.testing.assert_allclose(J, np.diag(np.cos(x0) * x0 + np.sin(x0)), rtol=1e-14)

    def h(x):
        return ad.sum(ad.exp(x) * x)
    H = ad.hessian(h)(x0)
    np.testing.assert_allclose(H, np.diag(np.exp(x0) * (x0 + 2)), rtol=1e-13)
    Hv = ad.jvp(ad.grad(h), x0, np.ones(3))[1]
    np.testing.assert_allclose(Hv, np.exp(x0) * (x0 + 2), rtol=1e-13)


# ---- the strong-zero ufuncs ----

SPECIAL = [0.0, -0.0, 1.0, -2.5, np.inf, -np.inf, np.nan, 5e-324, 3e-300, 1e300, -7.0]


def _mul0(a, b):
    """_helpers.h's mul0, element by element: 0 where either factor is 0 (+0.0, even
    against inf or NaN), else the product."""
    return 0.0 if a == 0 or b == 0 else a * b


def _div0(a, b):
    return 0.0 if a == 0 else a / b


def _reference(function, a, b, dtype):
    a, b = np.broadcast_arrays(np.asarray(a, dtype=dtype), np.asarray(b, dtype=dtype))
    with np.errstate(all="ignore"):
        out = [function(dtype.type(p), dtype.type(q)) for p, q in zip(a.ravel(), b.ravel())]
    return np.array(out, dtype=dtype).reshape(a.shape)


def _same(got, want):
    assert got.dtype == want.dtype and got.shape == want.shape
    np.testing.assert_array_equal(got, want)
    np.testing.assert_array_equal(np.signbit(got), np.signbit(want))   # zeros' signs


@pytest.mark.filterwarnings("ignore::RuntimeWarning")    # x / 0, inf / inf: numpy's warnings
@pytest.mark.parametrize("dtype", [np.float64, np.float32])
@pytest.mark.parametrize("name", ["mul0", "div0"])
def test_strong_zero_ufunc_every_pair_of_specials(name, dtype):
    ufunc = getattr(_core, f"_{name}_ufunc")
    function = _mul0 if name == "mul0" else _div0
    dtype = np.dtype(dtype)
    a, b = np.meshgrid(np.array(SPECIAL, dtype=dtype), np.array(SPECIAL, dtype=dtype))
    a, b = a.ravel(), b.ravel()
    _same(ufunc(a, b), _reference(function, a, b, dtype))
    for s in SPECIAL:                     # a scalar operand on either side
        _same(ufunc(a, dtype.type(s)), _reference(function, a, s, dtype))
        _same(ufunc(dtype.type(s), b), _reference(function, s, b, dtype))


@pytest.mark.filterwarnings("ignore::RuntimeWarning")
@pytest.mark.parametrize("dtype", [np.float64, np.float32])
@pytest.mark.parametrize("name", ["mul0", "div0"])
def test_strong_zero_ufunc_layouts(rng, name, dtype):
    """Every length around the vector widths (tails), strided and broadcast operands,
    Fortran order, out= (also in place), with zeros, infs and NaNs sprinkled in."""
    ufunc = getattr(_core, f"_{name}_ufunc")
    function = _mul0 if name == "mul0" else _div0
    dtype = np.dtype(dtype)

    def sample(shape):
        v = rng.standard_normal(shape).astype(dtype)
        pick = rng.random(shape)
        v[pick < 0.15] = 0.0
        v[(pick >= 0.15) & (pick < 0.2)] = -0.0
        v[(pick >= 0.2) & (pick < 0.25)] = np.inf
        v[(pick >= 0.25) & (pick < 0.3)] = np.nan
        return v
    for n in list(range(0, 70)) + [1000, 4099]:
        a, b = sample(n), sample(n)
        _same(ufunc(a, b), _reference(function, a, b, dtype))
    a, b = sample(300), sample(300)
    _same(ufunc(a[::3], b[1::3]), _reference(function, a[::3], b[1::3], dtype))
    _same(ufunc(a[::-1], b), _reference(function, a[::-1], b, dtype))
    A, B = sample((17, 1)), sample((1, 23))
    _same(ufunc(A, B), _reference(function, A, B, dtype))
    F, G = np.asfortranarray(sample((9, 11))), sample((9, 11))
    _same(ufunc(F, G), _reference(function, F, G, dtype))
    _same(ufunc(F.T, G.T), _reference(function, F.T, G.T, dtype))
    out = np.empty(300, dtype=dtype)
    want = _reference(function, a, b, dtype)
    assert ufunc(a, b, out=out) is out
    _same(out, want)
    inplace = a.copy()
    ufunc(inplace, b, out=inplace)
    _same(inplace, want)
    strided_out = np.zeros(600, dtype=dtype)
    ufunc(a, b, out=strided_out[::2])
    _same(strided_out[::2], want)


def test_strong_zero_ufunc_dtypes():
    a32, a64 = np.array([0.0, 2.0, np.inf], np.float32), np.array([np.nan, 3.0, 0.0])
    assert _core._mul0_ufunc(a32, 2.0).dtype == np.float32
    assert _core._mul0_ufunc(a32, a64).dtype == np.float64
    _same(_core._mul0_ufunc(a32, a64), np.array([0.0, 6.0, 0.0]))
    _same(_core._div0_ufunc(np.array([0, 3]), np.array([0, 2])), np.array([0.0, 1.5]))
    assert isinstance(_core._mul0_ufunc(0.0, np.inf), np.float64)
    assert _core._mul0_ufunc(0.0, np.inf) == 0.0 and _core._div0_ufunc(0.0, 0.0) == 0.0



def test_public_release_on_tensor_derivatives(rng):
    """``t.derivatives(release=True)``: the same gradient, and a second sweep through the
    released operations raises instead of giving wrong numbers."""
    x0 = rng.normal(size=7)
    lst = ad.WengertList()
    x = ad.Tensor.variable(x0, lst)
    y = ad.sin(x) * x
    g = y.derivatives(np.ones(7), release=True)[x]
    np.testing.assert_allclose(g, np.cos(x0) * x0 + np.sin(x0), rtol=1e-14)
    with pytest.raises(RuntimeError, match="released"):
        y.derivatives(np.ones(7))


# ---- slices' adjoints added in place (a loop over x[t] costs one array of x's shape) ----

def test_slices_add_into_one_adjoint_in_place(rng):
    x = rng.normal(size=(6, 3, 4))
    c = rng.normal(size=(3, 4))
    lst = ad.WengertList()
    X = ad.Tensor.variable(x, lst)
    # every step's slice, an overlapping slice pair, the whole of x in between, and a
    # slice of a slice: d/dx of the sum below, derived by hand
    loss = sum((ad.sum(ad.tanh(X[t]) * c) for t in range(6)), start=0.0)
    loss = loss + ad.sum(X[1:4] ** 2) + ad.sum(X * 3.0) + ad.sum(X[2:5] ** 2) + \
        ad.sum(X[::2][1] * c)
    want = (1.0 - np.tanh(x) ** 2) * c + 3.0
    want[1:4] += 2.0 * x[1:4]
    want[2:5] += 2.0 * x[2:5]
    want[2] += c
    d = loss.derivatives()
    np.testing.assert_allclose(d[X], want, rtol=1e-14)
    # a second sweep of the same list gives the same (its own arrays, nothing reused)
    np.testing.assert_allclose(loss.derivatives()[X], want, rtol=1e-14)
    np.testing.assert_allclose(d[X], want, rtol=1e-14)


def test_in_place_slices_never_write_an_array_made_elsewhere(rng):
    # the adjoint of y = x.reshape arrives at x as a view of y's; a slice of x added later
    # must copy it, not write through the view into y's adjoint (read again for d[y])
    x = rng.normal(size=(4, 2))
    lst = ad.WengertList()
    X = ad.Tensor.variable(x, lst)
    Y = X.reshape((8,))
    Y.retain()
    seed = np.ones(8)
    loss = ad.sum(Y * seed) + ad.sum(X[1] * 5.0)
    d = loss.derivatives()
    np.testing.assert_array_equal(d[Y], np.ones(8))
    want = np.ones((4, 2))
    want[1] += 5.0
    np.testing.assert_array_equal(d[X], want)
    np.testing.assert_array_equal(seed, np.ones(8))
    # float32 slices of a float32 variable stay float32, and match float64's
    x32 = x.astype(np.float32)
    lst = ad.WengertList()
    X = ad.Tensor.variable(x32, lst)
    d = (ad.sum(X[0] * X[0]) + ad.sum(X[0:2] * 2.0)).derivatives()
    assert d[X].dtype == np.float32
    want = np.zeros((4, 2), np.float32)
    want[0] = 2.0 * x32[0]
    want[0:2] += 2.0
    np.testing.assert_allclose(d[X], want, rtol=1e-6)
