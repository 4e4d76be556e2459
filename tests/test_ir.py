"""The compiler's one program format (``easyad.compiler.ir``) and its one optimiser
(``easyad.compiler.optimiser``), on scalar tapes and tensor programs.

References: the unoptimised program itself, run by the VM (scalar tapes) or by the
unfused replay (tensor programs), bit for bit for values (zeros' signs and NaN included),
and its gradient to rounding (scalar) or bit for bit (a tensor program holds its own
gradient). Every random program has constants that make identities (exact and not),
repeated subexpressions, dead values and constant-only subexpressions, and is evaluated at
points with ties, +-0, inf and NaN."""
from __future__ import annotations

import operator

import numpy as np
import pytest

import easyad as ad
from easyad.compiler import ir
from easyad.compiler import optimiser as passes
from easyad.compiler.tape import optimise as optimise_tape
from easyad.tensor._program import BoundProgram


def bits_equal(a, b):
    """Equal bit for bit (the sign of zero too), NaN where NaN."""
    a, b = np.asarray(a, dtype=np.float64), np.asarray(b, dtype=np.float64)
    if a.shape != b.shape:
        return False
    nan = np.isnan(a)
    return bool(np.array_equal(nan, np.isnan(b))
                and np.array_equal(a[~nan].view(np.int64), b[~nan].view(np.int64)))


def close(a, b):
    a, b = np.asarray(a, dtype=float), np.asarray(b, dtype=float)
    assert np.array_equal(np.isnan(a), np.isnan(b)), (a, b)
    ok = np.isfinite(a) & np.isfinite(b)
    assert np.array_equal(a[~ok & ~np.isnan(a)], b[~ok & ~np.isnan(b)])
    np.testing.assert_allclose(a[ok], b[ok], rtol=1e-12, atol=1e-300)


CONSTANTS = (0.0, -0.0, 1.0, -1.0, 2.0, 0.5)
BINARY = (operator.add, operator.sub, operator.mul, operator.truediv)


def points(n, rng):
    """Ordinary points, ties (equal inputs: where/maximum decide on them), +-0, inf,
    NaN, huge and tiny ones."""
    X = [rng.uniform(-2, 2, n) for _ in range(3)]
    tie = rng.uniform(-1, 1, n)
    tie[1:] = tie[0]
    X.append(tie)
    for value in (0.0, -0.0, np.inf, -np.inf, np.nan, 1e300, -5e-324):
        x = rng.uniform(-1, 1, n)
        x[rng.integers(n)] = value
        X.append(x)
    X.append(np.zeros(n))
    X.append(-np.zeros(n))
    return X


def scalar_program(seed, n):
    """f(x) of n scalars: binary operations with constants (0, -0, 1, -1: identities,
    exact or not), subexpressions computed twice, dead values, constants only, double
    negations, where/maximum (ties) and a guard."""
    plan = np.random.default_rng(seed)
    steps = [(int(plan.integers(7)), plan.integers(0, 10**6, 2),
              float(CONSTANTS[plan.integers(len(CONSTANTS))]), bool(plan.random() < 0.5))
             for _ in range(40)]

    def f(x):
        nodes = list(x)
        total = ad.sin(3.0) * ad.exp(0.5)           # constants only: folded
        if x[0] > -10.0:                             # a guard (taken at every point here)
            total = total + 0.0 * ad.sin(2.0)
        for kind, (i, j), c, swap in steps:
            a, b = nodes[i % len(nodes)], nodes[j % len(nodes)]
            if kind < 4:                            # with a constant: identities or not
                if kind == 3:                       # never / 0 while recording
                    a, c = (ad.tanh(a) + 2.0, c) if swap else (a, c or 1.0)
                z = BINARY[kind](c, a) if swap else BINARY[kind](a, c)
            elif kind == 4:                         # twice: shared
                z = ad.tanh(a * b) + ad.tanh(a * b)
            elif kind == 5:
                z = -(-a) + ad.where(a > b, a, b) + ad.maximum(a, b)  # noqa: B002
            else:
                z = a ** 1.0 - ad.cos(b)
                _dead = ad.log(ad.exp(a) + 1.0)     # dead: dropped
            nodes.append(z)
        return total + sum(ad.tanh(z) for z in nodes[n:])

    return f


def outcome(call):
    try:
        return "ok", call()
    except Exception as error:       # errors are the VM's to report, on its own tape
        return type(error).__name__, None


@pytest.mark.parametrize("seed", range(6))
def test_optimised_scalar_tapes_equal_the_vm_bit_for_bit(seed):
    n = 5
    f = scalar_program(seed, n)
    rng = np.random.default_rng(seed)
    F = ad.record(f, rng.uniform(-1, 1, n))
    tape, ins, outs = optimise_tape(F.tape, F.inputs, F.outputs)
    G = ad.Function(tape, ins, outs)
    assert len(G) < len(F)
    for x in points(n, rng):
        left = outcome(lambda: F.value_and_gradient(x))
        if left[0] != "ok":
            continue
        value, gradient = G.value_and_gradient(x)
        assert bits_equal(value, left[1][0]), x
        close(gradient, left[1][1])


@pytest.mark.parametrize("seed", range(3))
def test_tape_to_ir_and_back_is_the_same_program(seed):
    """Unoptimised, a tape read into the IR and written back computes what it computed:
    values and gradients bit for bit (every rule of the table, selects, constants)."""
    from test_replay import random_program
    n = 5
    rng = np.random.default_rng(seed)
    F = ad.record(random_program(seed, n), rng.uniform(-1, 1, n))
    graph, outs = ir.from_tape(F.tape, F.inputs, F.outputs)
    assert len(graph.instructions) == len(F)       # no variable is a constant here
    G = ad.Function(*ir.to_tape(graph, outs))
    for x in points(n, rng):
        left = outcome(lambda: F.value_and_gradient(x))
        if left[0] == "ok":
            value, gradient = G.value_and_gradient(x)
            assert bits_equal(value, left[1][0]) and bits_equal(gradient, left[1][1])


def _scalar_graph(f, x0):
    F = ad.record(f, x0)
    graph, outs = ir.from_tape(F.tape, F.inputs, F.outputs)
    return F, graph, outs


def _ops(graph):
    return [node.op for node in graph.instructions]


def test_scalar_front_end_names_rules_and_keeps_params_named():
    F, g, outs = _scalar_graph(lambda x: ad.where(x[0] > x[1], ad.sin(x[0]), x[1] * 2.0),
                               [1.0, 0.5])
    # the comparison Python evaluated first is recorded too (dead: the select has its own)
    assert _ops(g) == ["variable", "variable", "compare_gt", "sin", "mul", "compare_gt",
                       "select"]
    sin, mul, compare, select = g.instructions[3:]
    assert sin.params == ir.ScalarRule(arity=1) and mul.ins == (1, 2.0)
    assert compare.params.symbol == ">" and select.ins[2] == compare.outs[0]
    assert all(g.shapes[o] == () for node in g.instructions for o in node.outs)
    # back to a tape: the same function
    tape, ins, outs2 = ir.to_tape(g, outs)
    H = ad.Function(tape, ins, outs2)
    for x in ([1.0, 0.5], [0.5, 1.0], [0.7, 0.7]):
        assert bits_equal(H.value_and_gradient(np.array(x))[1],
                          F.value_and_gradient(np.array(x))[1])


def test_cse_and_dce_shrink_scalar_graphs():
    def f(x):
        a = ad.exp(x[0] * x[1]) + ad.sin(x[0])
        b = ad.exp(x[0] * x[1]) + ad.sin(x[0])      # the same again
        _dead = ad.log(x[1] * x[1] + 1.0) * 3.0      # read by nothing
        return a * b
    F, g, outs = _scalar_graph(f, [0.3, 0.7])
    h, outs2 = passes.optimise(g, outs)
    assert _ops(g).count("exp") == 2 and _ops(h).count("exp") == 1
    assert "log" not in _ops(h)
    assert len(h.instructions) == len(g.instructions) - 8   # 4 shared, 4 dead
    tape, ins, o = ir.to_tape(h, outs2)
    G = ad.Function(tape, ins, o)
    for x in ([0.3, 0.7], [-0.0, 0.0], [30.0, -1.0], [np.nan, 2.0]):
        x = np.array(x)
        assert bits_equal(G(x), F(x))
        close(G.gradient(x), F.gradient(x))


@pytest.mark.parametrize("expr, op", [
    (lambda x: x * 1.0, "mul"), (lambda x: 1.0 * x, "mul"), (lambda x: x / 1.0, "div"),
    (lambda x: x - 0.0, "sub"), (lambda x: x + -0.0, "add"), (lambda x: -0.0 + x, "add"),
    (lambda x: x ** 1.0, "pow"), (lambda x: -(-x), "neg")])  # noqa: B002
def test_exact_identities_are_applied(expr, op):
    F, g, outs = _scalar_graph(lambda x: ad.tanh(expr(x[0])), [0.3])
    h, outs2 = passes.optimise(g, outs)
    assert op in _ops(g) and op not in _ops(h)
    tape, ins, o = ir.to_tape(h, outs2)
    G = ad.Function(tape, ins, o)
    for v in (0.3, -0.0, 0.0, np.inf, -np.inf, np.nan):
        x = np.array([v])
        assert bits_equal(G.value_and_gradient(x)[0], F.value_and_gradient(x)[0])
        close(G.gradient(x), F.gradient(x))


@pytest.mark.parametrize("expr, op, at, expected", [
    (lambda x: x + 0.0, "add", -0.0, 0.0),          # -0 + 0 is +0, not x
    (lambda x: 0.0 + x, "add", -0.0, 0.0),
    (lambda x: x - -0.0, "sub", -0.0, 0.0),
    (lambda x: x * 0.0, "mul", np.inf, np.nan),     # not 0
    (lambda x: x * 0.0, "mul", -1.0, -0.0),
    (lambda x: x * -1.0, "mul", 2.0, -2.0),
    (lambda x: x / -1.0, "div", 2.0, -2.0),
    (lambda x: x ** 0.0, "pow", np.nan, 1.0)])
def test_identities_that_are_not_exact_are_not_applied(expr, op, at, expected):
    F, g, outs = _scalar_graph(lambda x: expr(x[0]), [0.3])
    h, outs2 = passes.optimise(g, outs)
    assert op in _ops(h)
    tape, ins, o = ir.to_tape(h, outs2)
    G = ad.Function(tape, ins, o)
    assert bits_equal(G(np.array([at])), expected)
    assert bits_equal(G(np.array([at])), F(np.array([at])))


def test_constants_fold_to_their_recorded_bits_and_guards_stay():
    def f(x):
        c = ad.sin(2.0) * 3.0 + ad.exp(-0.0)         # constants only
        if x[0] * x[0] > 0.25:                       # a guard: kept, with what it reads
            return x[1] * c
        return x[1] - c
    F, g, outs = _scalar_graph(f, [1.0, 2.0])
    h, outs2 = passes.optimise(g, outs)
    assert not {"sin", "exp"} & set(_ops(h))
    assert "guard_gt" in _ops(h) and "mul" in _ops(h)
    tape, ins, o = ir.to_tape(h, outs2)
    G = ad.Function(tape, ins, o)
    assert bits_equal(G(np.array([1.0, 2.0])), 2.0 * (np.sin(2.0) * 3.0 + 1.0))
    with pytest.raises(ad.BranchChangedError):
        G(np.array([0.1, 2.0]))


def test_nodes_refuse_positional_params():
    with pytest.raises(TypeError, match="ir.Reduce"):
        ir.Node("reduce", ("sum", (0,)), (0,), (1,))
    with pytest.raises(ValueError, match="unknown op 'conv'"):
        ir.Node("conv", ir.Linear(), (0,), (1,))


# ---- tensor programs ----

def tensor_program(seed):
    """f(x) of a vector: elementwise operations with constants (identities, exact or not),
    subexpressions twice, dead values, constant-only arrays, where/maximum, a reversal and
    sums."""
    plan = np.random.default_rng(seed)
    steps = [(int(plan.integers(7)), plan.integers(0, 10**6, 2),
              float(CONSTANTS[plan.integers(len(CONSTANTS))]), bool(plan.random() < 0.5))
             for _ in range(16)]
    table = plan.uniform(-1, 1, 6)

    def f(x):
        nodes = [x, x[::-1]]
        c = ad.sin(ad.Tensor.constant(table)) * 2.0   # constants only: folded
        for kind, (i, j), k, swap in steps:
            a, b = nodes[i % len(nodes)], nodes[j % len(nodes)]
            if kind < 4:
                if kind == 3:
                    a, k = (ad.tanh(a) + 2.0, k) if swap else (a, k or 1.0)
                z = BINARY[kind](k, a) if swap else BINARY[kind](a, k)
            elif kind == 4:
                z = ad.tanh(a * b) + ad.tanh(a * b)       # twice: shared
            elif kind == 5:
                z = ad.where(a > b, a, b) + ad.maximum(a, b) * c
            else:
                z = ad.exp(-(a * a)) - ad.sum(b) * 0.25
                _dead = ad.log(a * a + 1.0)
            nodes.append(z)
        return ad.sum(sum(ad.tanh(z) for z in nodes[2:]))

    return f


def _replays(F):
    """The recording's outputs (value, gradient), and a run of a program for them by
    the unfused replay."""
    rec = F._recordings["first"]
    outputs = list(rec.outputs) + list(rec.gradient)

    def run(program, outs, x):
        def on_guard(value, recorded):
            raise ad.BranchChangedError("changed")
        bound = BoundProgram(program, F._backend, outs, on_guard)
        extra = [np.zeros(())] * (len(program.inputs) - 1)        # the learning rate
        return [np.asarray(v) for v in bound.run([x, *extra])]
    return rec.program, outputs, run


@pytest.mark.parametrize("seed", range(6))
def test_optimised_tensor_programs_equal_the_replay_bit_for_bit(seed):
    n = 6
    rng = np.random.default_rng(seed)
    F = ad.record(tensor_program(seed), rng.uniform(-1, 1, n), tensor=True)
    program, outputs, run = _replays(F)
    optimised, outs = passes.optimise_program(program, outputs)
    assert len(optimised.instructions) < len(program.instructions)
    for x in points(n, rng):
        want = run(program, outputs, x)
        got = run(optimised, outs, x)
        for a, b in zip(got, want):
            assert bits_equal(a, b), (x, a, b)
        # the fused program (optimised, then planned) agrees to rounding
        value, gradient = F.value_and_gradient(x)
        close(value, want[0].reshape(np.shape(value)))
        close(gradient, want[1].reshape(np.shape(gradient)))


def _maps(program, expr):
    return [i for i in program.instructions if i.op == "map" and expr in i.params.exprs]


def test_cse_fold_and_dce_shrink_tensor_programs():
    table = np.linspace(-1, 1, 5)

    def f(x):
        c = ad.exp(ad.Tensor.constant(table))           # constants: folded
        _dead = ad.log(x * x + 1.0)                     # dead: dropped
        return ad.sum(ad.sin(x) * c + ad.sin(x) * x)    # sin(x) twice: shared
    F = ad.record(f, np.ones(5), tensor=True)
    program, outputs, run = _replays(F)
    optimised, outs = passes.optimise_program(program, outputs)
    sines = [i for i in program.instructions if i.op == "map"
             and any("sin(" in e for e in i.params.exprs)]
    kept = [i for i in optimised.instructions if i.op == "map"
            and any("sin(" in e for e in i.params.exprs)]
    assert len(sines) > len(kept) >= 1
    assert not any("exp(" in e for i in optimised.instructions if i.op == "map"
                   for e in i.params.exprs)
    assert not any("log(" in e for i in optimised.instructions if i.op == "map"
                   for e in i.params.exprs)
    for x in ([0.1, -0.0, 0.0, np.inf, np.nan], [1.0, 2.0, 3.0, 4.0, 5.0]):
        x = np.array(x)
        for a, b in zip(run(optimised, outs, x), run(program, outputs, x)):
            assert bits_equal(a, b)


def test_tensor_identities_exact_only():
    def f(x):
        return ad.sum(ad.sin(x * 1.0) + ad.cos(x + 0.0) + ad.tanh(x - 0.0))
    F = ad.record(f, np.ones(4), tensor=True)
    program, outputs, run = _replays(F)
    optimised, outs = passes.optimise_program(program, outputs)

    def maps(p):
        return [i.params.exprs for i in p.instructions if i.op == "map"
                and i.params.label in ("mul", "add", "sub")
                and any(type(a) is float for a in i.ins)]
    before, after = maps(program), maps(optimised)
    # x * 1.0 and x - 0.0 go; x + 0.0 stays (-0.0 + 0.0 is +0.0)
    assert len(before) - len(after) == 2, (before, after)
    x = np.array([-0.0, 0.0, np.inf, np.nan])
    for a, b in zip(run(optimised, outs, x), run(program, outputs, x)):
        assert bits_equal(a, b)


def test_tensor_guards_stay_with_what_they_read():
    def f(x):
        s = ad.sum(ad.sin(x) * 3.0)          # read only by the guard (float(s): its value)
        if float(s) > 0:
            return ad.sum(x * x)
        return ad.sum(x)
    F = ad.record(f, np.ones(4), tensor=True)
    program, outputs, run = _replays(F)
    optimised, outs = passes.optimise_program(program, outputs)
    assert [i.op for i in optimised.instructions].count("guard") == 1
    assert any("sin(" in e for i in optimised.instructions if i.op == "map"
               for e in i.params.exprs)
    for a, b in zip(run(optimised, outs, np.ones(4)), run(program, outputs, np.ones(4))):
        assert bits_equal(a, b)
    for p, o in ((program, outputs), (optimised, outs)):     # the value read changed
        with pytest.raises(ad.BranchChangedError):
            run(p, o, np.array([0.5, -0.0, 2.0, 1.0]))


def test_the_unfused_replay_runs_the_optimised_program():
    # fuse=False replays through BoundProgram: the same optimiser as the fused paths
    table = np.linspace(-1, 1, 5)

    def f(x):
        c = ad.exp(ad.Tensor.constant(table))
        _dead = ad.log(x * x + 1.0)
        return ad.sum(ad.sin(x) * c + ad.sin(x) * x)
    F = ad.record(f, np.ones(5), tensor=True, fuse=False)
    program, outputs, run = _replays(F)
    x = np.array([0.3, -0.7, 1.1, 2.0, -0.0])
    value, gradient = F.value_and_gradient(x)
    bound = F._bound["gradient"]
    exprs = [e for i in bound.instructions if i.op == "map" for e in i.params.exprs]
    assert not any("exp(" in e or "log(" in e for e in exprs)          # folded, dropped
    assert sum("sin(" in e for e in exprs) < sum(
        "sin(" in e for i in program.instructions if i.op == "map" for e in i.params.exprs)
    # the unoptimised replay's numbers, bit for bit; and the hand-derived gradient
    want = run(program, outputs, x)
    assert bits_equal(np.asarray(value).reshape(-1), want[0].reshape(-1))
    assert bits_equal(np.asarray(gradient).reshape(-1), want[1].reshape(-1))
    c = np.exp(table)
    close(value, np.sum(np.sin(x) * c + np.sin(x) * x))
    close(gradient, np.cos(x) * c + np.cos(x) * x + np.sin(x))
