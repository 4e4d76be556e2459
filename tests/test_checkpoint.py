"""ad.checkpoint, ad.scan, ad.fori_loop and the revolve schedule (issue 27 item 3).

References: the same code un-checkpointed (bitwise: the inner sweeps run the same
operations in the same order), central differences, torch.func.grad (float64), and for
the schedule a brute-force minimisation of the recursion (the formula's optimality),
with steps and live snapshots counted.
"""
from __future__ import annotations

import functools
import weakref

import numpy as np
import pytest

import easyad as ad
from easyad.transforms import checkpoint_revolve as revolve

# ---- the schedule ----


@functools.lru_cache(maxsize=None)
def _brute(steps: int, snaps: int) -> int:
    """The fewest forward steps reversing ``steps`` with ``snaps`` snapshots, by trying
    every first split (Griewank's recursion, no formula)."""
    if steps <= 1:
        return 0
    if snaps == 1:
        return steps * (steps - 1) // 2
    return min(m + _brute(steps - m, snaps - 1) + _brute(m, snaps)
               for m in range(1, steps))


def test_formula_is_the_optimum_of_the_recursion():
    for snaps in range(1, 7):
        for steps in range(1, 70):
            best = _brute(steps, snaps)
            assert revolve.forward_steps(steps, snaps) == best, (steps, snaps)
            if steps > 1 and snaps > 1:
                m = revolve.split(steps, snaps)
                assert m + _brute(steps - m, snaps - 1) + _brute(m, snaps) == best


def test_formula_hand_values():
    # c = 1: l (l - 1) / 2; c >= l - 1: l - 1 (each state once); beta(2, 3) = 10
    assert revolve.forward_steps(7, 1) == 21
    assert revolve.forward_steps(10, 9) == 9
    assert revolve.repetitions(10, 2) == 3 and revolve.repetitions(11, 2) == 4
    assert revolve.forward_steps(10, 2) == 3 * 10 - revolve.beta(3, 2)    # 20
    assert revolve.beta(100, 3) == 176851 and revolve.repetitions(10 ** 5, 100) == 3


class _State:
    live: set[int] = set()

    def __init__(self, step: int) -> None:
        self.step = step
        _State.live.add(id(self))
        weakref.finalize(self, _State.live.discard, id(self))


@pytest.mark.parametrize("steps,snaps", [(1, 1), (9, 1), (10, 3), (64, 4), (500, 7),
                                         (1000, 40), (3000, 3)])
def test_reverse_counts_and_memory(steps, snaps):
    _State.live.clear()
    stored = {p: _State(p) for p in revolve.spine(steps, snaps)}
    first = _State(0)
    counts = {"forward": 0, "most": 0}
    order = []

    def advance(s, i, j):
        assert s.step == i
        counts["forward"] += j - i
        return _State(j)

    def reverse_step(s, i, adjoint):
        assert s.step == i
        counts["most"] = max(counts["most"], len(_State.live))
        order.append(i)
        return adjoint + 1

    spine = revolve.spine(steps, snaps)
    assert len(spine) <= snaps - 1 and spine == sorted(spine)
    assert revolve.reverse(steps, snaps, first, stored, advance, reverse_step, 0) == steps
    assert order == list(range(steps - 1, -1, -1))
    kept = spine[-1] if spine else 0
    assert counts["forward"] == revolve.forward_steps(steps, snaps) - kept
    # the snapshots (first state included) plus the state being advanced
    assert counts["most"] <= snaps + 1


# ---- loops ----

H = 1e-2


def _rhs(u, v, p):
    a, b, c, d = p
    return a * u - b * u * v, -c * v + d * u * v


def _rk4(carry, x=None):
    (u, v), p = carry
    k1 = _rhs(u, v, p)
    k2 = _rhs(u + 0.5 * H * k1[0], v + 0.5 * H * k1[1], p)
    k3 = _rhs(u + 0.5 * H * k2[0], v + 0.5 * H * k2[1], p)
    k4 = _rhs(u + H * k3[0], v + H * k3[1], p)
    return ((u + H / 6 * (k1[0] + 2 * k2[0] + 2 * k3[0] + k4[0]),
             v + H / 6 * (k1[1] + 2 * k2[1] + 2 * k3[1] + k4[1])), p), None


def _ode_gradient(point, steps, checkpoints):
    lst = ad.WengertList()
    xs = [lst.variable(v) for v in point]
    ((u, v), _), _ = ad.scan(_rk4, ((xs[0], xs[1]), tuple(xs[2:])), length=steps,
                             checkpoints=checkpoints)
    loss = u * u + ad.sin(v)
    d = loss.derivatives()
    return loss.number, np.array([d[x] for x in xs]), len(lst)


POINT = (1.0, 0.5, 1.1, 0.4, 0.4, 0.1)


def _ode_value(point, steps):
    state = ((point[0], point[1]), tuple(point[2:]))
    for _ in range(steps):
        state = _rk4(state)[0]
    (u, v), _ = state
    return u * u + np.sin(v)


@pytest.mark.parametrize("checkpoints", [1, 2, 7, "sqrt", 1000])
def test_scan_ode_gradient_is_plain_taping_bitwise(checkpoints):
    value, plain, plain_len = _ode_gradient(POINT, 120, None)
    v2, g, length = _ode_gradient(POINT, 120, checkpoints)
    assert v2 == value
    np.testing.assert_array_equal(g, plain)
    assert length < 40 < plain_len          # the loop is one node, not 120 steps


def test_scan_ode_gradient_against_central_differences():
    _, g, _ = _ode_gradient(POINT, 120, 5)
    h = 1e-6
    for k in range(len(POINT)):
        up, down = list(POINT), list(POINT)
        up[k] += h
        down[k] -= h
        fd = (_ode_value(up, 120) - _ode_value(down, 120)) / (2 * h)
        assert abs(g[k] - fd) < 1e-7 * max(1.0, abs(fd)), k


def test_scan_ode_gradient_against_torch():
    torch = pytest.importorskip("torch")
    from torch.func import grad

    def loss(p):
        state = ((p[0], p[1]), (p[2], p[3], p[4], p[5]))
        for _ in range(120):
            state = _rk4(state)[0]
        (u, v), _ = state
        return u * u + torch.sin(v)
    ref = grad(loss)(torch.tensor(POINT, dtype=torch.float64)).numpy()
    _, g, _ = _ode_gradient(POINT, 120, 4)
    np.testing.assert_allclose(g, ref, rtol=1e-12, atol=1e-13)


@pytest.mark.parametrize("steps,snaps", [(50, 3), (200, 6), (37, 1)])
def test_scan_runs_the_binomial_number_of_steps(steps, snaps):
    calls = []

    def body(c, x):
        calls.append(1)
        return c * 0.99 + 0.01 * ad.sin(c), None
    lst = ad.WengertList()
    x = lst.variable(0.3)
    y, _ = ad.scan(body, x, length=steps, checkpoints=snaps)
    forward = len(calls)
    assert forward == steps
    y.derivatives()
    spine = revolve.spine(steps, snaps)
    recomputed = revolve.forward_steps(steps, snaps) - (spine[-1] if spine else 0)
    assert len(calls) - forward == recomputed + steps      # + each step recorded once


def _tensor_body(c, x):
    u, w = c
    u2 = ad.tanh(w @ u + x)
    return (u2, w), (ad.sum(u2 * u2), u2 * 2.0)


def _tensor_scan(device, checkpoints):
    lst = ad.WengertList()
    u0 = ad.Tensor.variable(np.array([0.1, 0.2, -0.3]), lst, device=device)
    w = ad.Tensor.variable(np.array([[0.5, 0.1, 0.0], [0.2, -0.3, 0.4], [0.0, 0.1, 0.9]]),
                           lst, device=device)
    xs = ad.Tensor.variable(np.linspace(-1, 1, 36).reshape(12, 3), lst, device=device)
    (u, w2), (s, us) = ad.scan(_tensor_body, (u0, w), xs, checkpoints=checkpoints)
    loss = ad.sum(u * u) + ad.sum(s * s) + ad.sum(w2) + ad.sum(us * xs)
    d = loss.derivatives()
    return [np.asarray(d[t]) for t in (u0, w, xs)] + [np.asarray(s.value)]


def test_scan_tensors_with_xs_and_ys(device):
    plain = _tensor_scan(device, None)
    for snaps in (1, 3, 12) if device == "numpy" else (3,):
        for a, b in zip(_tensor_scan(device, snaps), plain):
            np.testing.assert_allclose(a, b, rtol=1e-12, atol=1e-14)


def test_scan_tensors_against_torch():
    torch = pytest.importorskip("torch")
    from torch.func import grad

    def loss(u0, w, xs):
        u, total = u0, 0.0
        for i in range(12):
            u = torch.tanh(w @ u + xs[i])
            total = total + torch.sum(u * u) ** 2 + torch.sum(2.0 * u * xs[i])
        return torch.sum(u * u) + total + torch.sum(w)
    args = [torch.tensor([0.1, 0.2, -0.3], dtype=torch.float64),
            torch.tensor([[0.5, 0.1, 0.0], [0.2, -0.3, 0.4], [0.0, 0.1, 0.9]],
                         dtype=torch.float64),
            torch.linspace(-1, 1, 36, dtype=torch.float64).reshape(12, 3)]
    ref = grad(loss, argnums=(0, 1, 2))(*args)
    got = _tensor_scan("numpy", 4)
    for a, b in zip(got, ref):
        np.testing.assert_allclose(a, b.numpy(), rtol=1e-12, atol=1e-14)


def test_scan_array_xs_and_one_number_per_step():
    def run(checkpoints):
        lst = ad.WengertList()
        x = lst.variable(0.3)
        c, ys = ad.scan(lambda c, t: (c + 0.1 * ad.sin(c * t), c * t), x,
                        np.linspace(0.0, 1.0, 20), checkpoints=checkpoints)
        loss = c + ad.sum(ys * ys)
        return loss.number, loss.derivatives()[x], np.asarray(ys.value)
    plain = run(None)
    for snaps in (1, 4):
        value, d, ys = run(snaps)
        assert value == plain[0] and d == plain[1]
        np.testing.assert_array_equal(ys, plain[2])


def test_fori_loop_passes_the_index():
    def body(i, c):
        return c + ad.sin(c * i)
    lst = ad.WengertList()
    x = lst.variable(0.2)
    y = ad.fori_loop(3, 40, body, x, checkpoints=4)
    z = ad.fori_loop(3, 40, body, x)
    assert y.number == z.number
    assert y.derivatives()[x] == z.derivatives()[x]


def test_forward_mode_runs_the_plain_loop():
    f = functools.partial(ad.fori_loop, 0, 30, lambda i, c: c * 1.01 + 0.1 * ad.sin(c))
    t = f(ad.Trace.variable(0.7), checkpoints=3)
    lst = ad.WengertList()
    x = lst.variable(0.7)
    assert t.derivative == pytest.approx(f(x).derivatives()[x], rel=1e-14)
    j = ad.jacobian(lambda z: f(z, checkpoints=3), mode="forward")(np.array([0.7, 1.0]))
    jr = ad.jacobian(lambda z: f(z, checkpoints=3), mode="reverse")(np.array([0.7, 1.0]))
    np.testing.assert_allclose(j, jr, rtol=1e-14)


# ---- ad.checkpoint ----

def _block(x, p):
    h = ad.sin(x * p["a"]) + p["b"]
    return {"s": ad.sum(h * h), "h": h, "tag": "kept"}


def _checkpoint_case(device, wrap):
    lst = ad.WengertList()
    x = ad.Tensor.variable(np.array([0.3, 0.7, 1.1]), lst, device=device)
    a = lst.variable(1.5)
    b = ad.Tensor.variable(np.array([0.1, 0.2, 0.3]), lst, device=device)
    out = wrap(_block)(x, {"a": a, "b": b})
    assert out["tag"] == "kept"
    loss = out["s"] * 2 + ad.sum(out["h"] * x)
    d = loss.derivatives()
    return [np.asarray(d[x]), d[a], np.asarray(d[b])], len(lst)


def test_checkpoint_structured_tensors_equal_plain(device):
    plain, _ = _checkpoint_case(device, lambda f: f)
    got, _ = _checkpoint_case(device, ad.checkpoint)
    for a, b in zip(got, plain):
        np.testing.assert_allclose(a, b, rtol=1e-13, atol=1e-15)


def test_checkpoint_scalar_against_formula_and_keeps_no_intermediates():
    def f(x, y):
        z = x
        for _ in range(50):
            z = ad.sin(z) * y
        return z
    lst = ad.WengertList()
    x, y = lst.variable(0.5), lst.variable(0.9)
    z = ad.checkpoint(f)(x, y)
    assert len(lst) < 10               # inputs, the node and its slice: not 100 entries
    d = z.derivatives()
    lst2 = ad.WengertList()
    x2, y2 = lst2.variable(0.5), lst2.variable(0.9)
    d2 = f(x2, y2).derivatives()
    assert d[x] == d2[x2] and d[y] == d2[y2]
    h = 1e-6
    fd = (f(0.5 + h, 0.9) - f(0.5 - h, 0.9)) / (2 * h)
    assert d[x] == pytest.approx(fd, rel=1e-8)


def test_checkpoint_under_grad_and_nested_with_scan():
    def loss(v):
        inner = ad.checkpoint(lambda t: ad.sum(ad.exp(t) * t))
        body = lambda c, _: (ad.checkpoint(lambda q: q * 0.9 + 0.1 * ad.cos(q))(c), None)  # noqa: E731
        c, _ = ad.scan(body, v, length=5, checkpoints=2)
        return inner(c)
    v = np.array([0.2, -0.4])
    g = ad.grad(loss)(v)
    plain = ad.grad(lambda t: ad.sum(ad.exp(_q5(t)) * _q5(t)))(v)
    np.testing.assert_allclose(g, plain, rtol=1e-13)


def _q5(t):
    for _ in range(5):
        t = t * 0.9 + 0.1 * ad.cos(t)
    return t


def test_checkpoint_forward_mode_runs_f():
    f = ad.checkpoint(lambda x: ad.exp(x) * x)
    t = f(ad.Trace.variable(0.5))
    assert t.derivative == pytest.approx(np.exp(0.5) * 1.5, rel=1e-15)
    assert f(2.0) == np.exp(2.0) * 2.0


# ---- errors ----

def test_closure_over_a_recorded_value_raises():
    lst = ad.WengertList()
    x, k = lst.variable(0.5), lst.variable(2.0)
    with pytest.raises(ValueError, match="closure"):
        ad.checkpoint(lambda t: t * k)(x)
    with pytest.raises(ValueError, match="in the carry"):
        ad.fori_loop(0, 5, lambda i, c: c * k, x, checkpoints=2)
    ad.fori_loop(0, 5, lambda i, c: c * k, x)         # plain taping: closures are fine


def test_second_derivatives_through_checkpoint_against_torch():
    torch = pytest.importorskip("torch")
    from torch.func import hessian
    w = np.array([[1.0, 2.0, 0.0], [0.5, -1.0, 0.3]])

    def make(tanh, sum_, wrap):
        block = wrap(lambda x, y: (tanh(w_of(x) @ x) * y, y * y))

        def h(z):
            a, b = block(z[:3], z[3])
            return sum_(a * a) * b + z[0] ** 3
        return h
    w_of = lambda x: torch.tensor(w) if isinstance(x, torch.Tensor) else ad.Tensor.constant(w)  # noqa: E731
    z = np.array([0.3, 0.7, -0.2, 1.3])
    got = ad.hessian(make(ad.tanh, ad.sum, ad.checkpoint))(z)
    plain = ad.hessian(make(ad.tanh, ad.sum, lambda f: f))(z)
    ref = hessian(make(torch.tanh, torch.sum, lambda f: f))(torch.tensor(z)).numpy()
    np.testing.assert_allclose(got, plain, rtol=1e-12, atol=1e-14)
    np.testing.assert_allclose(got, ref, rtol=1e-12, atol=1e-13)


def test_second_derivatives_through_a_checkpointed_loop():
    def g(checkpoints):
        def f(z):
            c, ys = ad.scan(lambda c, x: (c * 1.1 + ad.sin(c) * x, ad.sum(c * c)), z,
                            np.linspace(0.1, 1.0, 9), checkpoints=checkpoints)
            return ad.sum(c ** 2) + ad.sum(ys)
        return f
    z = np.array([1.0, 2.0])
    np.testing.assert_allclose(ad.hessian(g(3))(z), ad.hessian(g(None))(z), rtol=1e-12)
    v = np.array([1.0, 0.5])
    np.testing.assert_allclose(ad.hvp(g(2), z, v), ad.hvp(g(None), z, v), rtol=1e-12)


def test_bad_arguments_raise():
    lst = ad.WengertList()
    x = lst.variable(0.5)
    with pytest.raises(TypeError, match="takes a function"):
        ad.checkpoint(3)
    with pytest.raises(ValueError, match="checkpoints must be"):
        ad.fori_loop(0, 5, lambda i, c: c, x, checkpoints=0)
    with pytest.raises(ValueError, match="structure"):
        ad.fori_loop(0, 5, lambda i, c: (c, c), x, checkpoints=2)
    with pytest.raises(ValueError, match="give xs or length"):
        ad.scan(lambda c, x: (c, None), x)
    with pytest.raises(ValueError, match="different lengths"):
        ad.scan(lambda c, x: (c, None), x, (np.zeros(3), np.zeros(4)))
    with pytest.raises(TypeError, match=r"\(carry, y\)"):
        ad.scan(lambda c, x: c, x, length=3)
    with pytest.raises(TypeError, match="must be ints"):
        ad.fori_loop(0.0, 5, lambda i, c: c, x)


def test_record_of_tensor_code_and_eval_shape_run_f_inline():
    f = lambda x: ad.sum(ad.checkpoint(lambda t: ad.sin(t) * t)(x))  # noqa: E731
    g = lambda x: ad.sum(ad.fori_loop(0, 5, lambda i, c: ad.sin(c) * 0.5 + c, x,  # noqa: E731
                                      checkpoints=2))
    x = np.array([0.4, 0.5, 0.6])
    for h in (f, g):
        replayed = ad.record(h, np.array([0.1, 0.2, 0.3]), tensor=True).gradient(x)
        np.testing.assert_allclose(replayed, ad.grad(h)(x), rtol=1e-14)
    np.testing.assert_allclose(ad.grad(f)(x), np.sin(x) + x * np.cos(x), rtol=1e-15)
    assert ad.eval_shape(f, ad.ShapeDtype((3,), np.float64)).shape == ()


def test_scan_memory_is_bounded_by_the_snapshots():
    import tracemalloc
    size, steps, snaps = 20_000, 120, 4            # one carry: 160 kB
    chunk = 8 * size

    def body(c, _):
        return c * 0.99 + 0.01 * ad.sin(c), None

    def peaks(checkpoints):
        lst = ad.WengertList()
        x = ad.Tensor.variable(np.linspace(0.0, 1.0, size), lst)
        tracemalloc.start()
        y, _ = ad.scan(body, x, length=steps, checkpoints=checkpoints)
        loss = ad.sum(y * y)
        forward = tracemalloc.get_traced_memory()[1]
        tracemalloc.reset_peak()
        d = loss.derivatives()
        backward = tracemalloc.get_traced_memory()[1]
        tracemalloc.stop()
        return forward, backward, d[x]
    plain_forward, _, plain = peaks(None)
    forward, backward, got = peaks(snaps)
    np.testing.assert_array_equal(got, plain)
    assert plain_forward > steps * chunk            # every step's values on the tape
    # at most `snaps` carries kept, plus one step's recording, its sweep and adjoints
    assert forward < (snaps + 6) * chunk and backward < (snaps + 16) * chunk, \
        (forward / chunk, backward / chunk)


def test_record_of_scalar_code_says_to_record_tensor_code():
    f = lambda x: ad.checkpoint(lambda a, b: a * ad.sin(b))(x[0], x[1])  # noqa: E731
    with pytest.raises(TypeError, match="tensor operations"):
        ad.record(f, [1.0, 2.0])
    got = ad.record(f, [1.0, 2.0], tensor=True).gradient(np.array([1.0, 2.0]))
    np.testing.assert_allclose(got, [np.sin(2.0), np.cos(2.0)], rtol=1e-15)


def test_generated_structure_functions_match_the_generic_ones():
    from easyad.transforms.checkpoint import compiled, flatten, unflatten
    cases = [((1.0, 2.0), (3.0, [4.0, 5.0], {"k": 6.0, 2: 7.0})), 1.0, [1.0], (1.0,), (), {}]
    for x in cases:
        leaves, tree = flatten(x)
        shape = compiled(tree)
        assert shape.leaves(x) == leaves
        rebuilt = shape.build(leaves)
        assert rebuilt == unflatten(tree, leaves) == x and type(rebuilt) is type(x)
    shape = compiled(flatten(((1.0, 2.0), 3.0))[1])
    for other in [((1.0, 2.0, 3.0), 3.0), ([1.0, 2.0], 3.0), ((1.0, 2.0), (3.0,)), 1.0]:
        assert shape.leaves(other) is None
    assert compiled(flatten(np.array([ad.Record.constant(1.0)], dtype=object))[1]) is None


def test_a_transform_inside_the_checkpointed_function():
    # ad.grad inside f gives a plain array on constants and a recorded Tensor on
    # recorded inputs: both count as f's output (no derivative dropped)
    inner = lambda y: ad.grad(lambda z: ad.sum(ad.sin(z) * z))(y)  # noqa: E731
    x0 = np.array([0.3, 0.5])
    want = ad.grad(lambda x: ad.sum(inner(x) ** 2))(x0)
    np.testing.assert_allclose(ad.grad(lambda x: ad.sum(ad.checkpoint(inner)(x) ** 2))(x0),
                               want, rtol=1e-14)
    lst = ad.WengertList()
    x = ad.Tensor.variable(x0, lst)
    np.testing.assert_allclose(ad.sum(ad.checkpoint(inner)(x) ** 2).derivatives()[x], want,
                               rtol=1e-14)
    grads = []
    for snaps in (None, 2):
        lst = ad.WengertList()
        x = ad.Tensor.variable(x0, lst)
        _, ys = ad.scan(lambda c, _: (c * 0.9, inner(c)), x, length=4, checkpoints=snaps)
        grads.append(ad.sum(ys ** 2).derivatives()[x])
    np.testing.assert_allclose(grads[1], grads[0], rtol=1e-14)
