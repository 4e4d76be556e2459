"""The conformance machinery, driven by the rule table (issue 25 item 4; cf. PyTorch's OpInfo).

For every row of ``easyad/_rules.py`` it makes sample points (``samples``), runs them
through every engine that evaluates the rule (``ENGINES``: the scalar Trace and Record,
the replay VM and its compiled C, eager numpy and OpenCL tensors, the fused and unfused
tensor replay on numpy (C) and OpenCL, TraceTensor), and ``check_rule`` reports every
disagreement as a line of text, so a test asserts an empty list and a deliberately broken
engine shows up as lines that name it. The references are independent of easyad: the
math module and Python's operators (values, and which points raise what), numpy's or
torch's spelling of the row (array values), sympy's derivative and central differences
(at ordinary points), torch's autograd (ordinary points and ties).

What must agree, and how (docs/record-replay.md, docs/internals.md):
- bit for bit: the replay VM's values and the recording's (Record) values; the compiled
  C and the VM, values and gradients; an engine on a non-contiguous or big-endian input
  and on the same numbers contiguous and native (one input normalisation);
- to ``RTOL[dtype]`` with the same NaN/inf pattern and the same zeros: everything else.
  A selection (maximum/minimum's heaviside, abs's sign, max/min reductions, where) that
  lost the gradient of its chosen branch makes a zero where the reference has a number,
  which no relative tolerance forgives.

The tests batch: one program of every rule per engine, device, dtype (a dict of inputs in,
a dict of values out; the gradient program's loss adds every rule's sum), so PoCL and gcc
build each once.
"""
from __future__ import annotations

import math
import operator
import warnings
from dataclasses import dataclass, field
from collections.abc import Callable
from typing import Any

import numpy as np

import easyad as ad
from easyad import _rules

RTOL = {np.dtype(np.float64): 1e-13, np.dtype(np.float32): 2e-6}
# Rows with float32 forms (Rule.float32; docs/record-replay.md "float32 programs"): the
# fused C and eager numpy in float32, each within the stated bound of the float64 result
# (value 2 ulps, slope times an adjoint 6), agree within the sum, in ulps where the result
# is a normal float32 and within float32's smallest normal below it
FLOAT32_FORM_ULPS = {"value": 4.0, "gradient": 12.0}
# torch's libm and numpy's differ by an ulp or so; sympy's lambdified derivative is
# evaluated in float64 through other formulas (cancellation near domain edges)
REF_RTOL = 1e-12
FD_RTOL = 1e-6


# ---- sample points -------------------------------------------------------------------

SPECIAL = (0.0, -0.0, math.inf, -math.inf, math.nan, 5e-324, -5e-324, 1e-300, -1e-300,
           1e-8, -1e-8, 1e300, -1e300, 1.0, -1.0, 0.5, -0.5, 2.0, -2.0, 40.0, -40.0,
           710.0, -745.0)
SPECIAL_PAIR = (0.0, -0.0, math.inf, -math.inf, math.nan, 1e-300, 1e300, 1.0, -1.0, 2.0,
                0.5, -3.0)


def _ordinary(interval: tuple[float, float], u: np.ndarray) -> np.ndarray:
    """u in [0, 1) mapped well inside an open interval of a rule's domain."""
    lo, hi = interval
    if math.isinf(lo) and math.isinf(hi):
        return -3.0 + 6.0 * u
    if math.isinf(hi):
        return lo + 0.1 + 4.0 * u
    if math.isinf(lo):
        return hi - 0.1 - 4.0 * u
    return lo + (hi - lo) * (0.05 + 0.9 * u)


def _edges(interval: tuple[float, float]) -> list[float]:
    """A domain's finite ends, just inside, just outside."""
    out: list[float] = []
    for end, inward in ((interval[0], math.inf), (interval[1], -math.inf)):
        if math.isfinite(end):
            out += [end, math.nextafter(end, inward), math.nextafter(end, -inward),
                    end - math.copysign(0.5, inward)]
    return out


@dataclass
class Samples:
    """The points of one rule: ``xs`` (one array per operand), and masks of the ordinary
    points (inside the domain, finite, away from kinks: where derivatives are checked
    against sympy and differences) and of the ties (x == y, binary rules)."""
    xs: tuple[np.ndarray, ...]
    ordinary: np.ndarray
    ties: np.ndarray

    @property
    def size(self) -> int:
        return self.xs[0].size


def samples(rule: _rules.Rule, seed: int = 25, ordinary: int = 12) -> Samples:
    """Ordinary values in the domain, the domain's edges, kinks (0, ±0), ±inf, NaN,
    tiny and huge magnitudes, overflow; for binary rules also ties (x == y, the kink of
    maximum and minimum), near-ties (one ulp apart) and every pair of special values."""
    rng = np.random.default_rng(seed + sum(map(ord, rule.name)))
    ords = [_ordinary(iv, rng.uniform(size=ordinary)) for iv in rule.domain]
    if rule.arity == 1:
        special = list(SPECIAL) + _edges(rule.domain[0])
        x = np.concatenate([ords[0], special])
        mask = np.arange(x.size) < ordinary
        return Samples((x,), mask, np.zeros(x.size, bool))
    tied = _ordinary(rule.domain[0], rng.uniform(size=6))
    near = np.nextafter(tied, np.inf)
    grid = np.array([(a, b) for a in SPECIAL_PAIR for b in SPECIAL_PAIR]).T
    edges = [(e, o) for e in _edges(rule.domain[0]) for o in ords[1][:2]] + \
            [(o, e) for e in _edges(rule.domain[1]) for o in ords[0][:2]]
    edge = np.array(edges).T.reshape(2, -1)
    x = np.concatenate([ords[0], tied, tied, near, grid[0], edge[0]])
    y = np.concatenate([ords[1], tied, near, tied, grid[1], edge[1]])
    mask = np.arange(x.size) < ordinary
    return Samples((x, y), mask, (x == y) & np.isfinite(x))


# ---- applying a rule -----------------------------------------------------------------

def apply(rule: _rules.Rule, *operands: Any) -> Any:
    """The rule on any Numeric: ``ad.<name>``, or the Python operator it serves."""
    if rule.generic:
        return getattr(ad, rule.name)(*operands)
    return getattr(operator, rule.operator)(*operands)


def python_reference(rule: _rules.Rule) -> Callable[..., float] | None:
    """Python's own function for the row (what float raises is what easyad raises):
    math.<name>, math.pow for pow (float ** returns complex numbers), the operator."""
    if rule.name == "pow":
        return math.pow
    if hasattr(math, rule.name):
        return getattr(math, rule.name)
    if rule.name == "abs":
        return math.fabs
    if rule.operator:
        return getattr(operator, rule.operator)
    return None


def _python_outcome(rule: _rules.Rule, point: tuple[float, ...]) -> tuple[Any, str | None]:
    f = python_reference(rule)
    if f is None:
        return None, None
    try:
        return float(f(*point)), None
    except (ValueError, OverflowError, ZeroDivisionError) as e:
        return None, type(e).__name__


def numpy_reference(rule: _rules.Rule, xs: tuple[np.ndarray, ...]) -> np.ndarray:
    """The row's values by numpy's ufunc, else torch's spelling, in float64 (NaN/inf
    where they fall: the tensor convention)."""
    name = rule.spelling("numpy")
    with np.errstate(all="ignore"):
        if name is not None:
            return np.asarray(getattr(np, name)(*xs), dtype=np.float64)
        if rule.spelling("torch") is None:
            # scipy.special's ufunc of the row's name (digamma: torch's is not accurate)
            import scipy.special
            return np.asarray(getattr(scipy.special, rule.name)(*xs), dtype=np.float64)
    import torch
    return torch_values(rule, [torch.from_numpy(np.array(x, np.float64)) for x in xs]
                        ).numpy()


def torch_values(rule: _rules.Rule, ts: list[Any]) -> Any:
    import torch
    spelling = rule.spelling("torch")
    if spelling.isidentifier():
        return getattr(torch, spelling)(*ts)
    # the table's own strings (trusted data), over torch's namespace
    return eval(spelling, {"torch": torch}, {**vars(torch), **dict(zip("xy", ts))})


# ---- engines -------------------------------------------------------------------------

@dataclass
class Result:
    """One engine's answer at the sample points: values (n,), one gradient (n,) per
    operand, and for the scalar engines the exception each point raised (None: none)."""
    values: np.ndarray
    grads: tuple[np.ndarray, ...]
    raised: list[str | None] = field(default_factory=list)
    second: np.ndarray | None = None      # d2 value / dx2 (unary rules, where cheap)


def _scalar_point(rule: _rules.Rule, point: tuple[float, ...], kind: str
                  ) -> tuple[float, list[float], str | None]:
    try:
        if kind == "trace":
            grads, value = [], math.nan
            for k in range(rule.arity):
                args = [ad.Trace.variable(v) if i == k else ad.Trace.constant(v)
                        for i, v in enumerate(point)]
                z = apply(rule, *args)
                value = z.number
                grads.append(z.derivative)
            return value, grads, None
        lst = ad.WengertList()
        args = [lst.variable(v) for v in point]
        z = apply(rule, *args)
        d = z.derivatives()
        return z.number, [d[a] for a in args], None
    except (ValueError, OverflowError, ZeroDivisionError) as e:
        return math.nan, [math.nan] * rule.arity, type(e).__name__


def scalar_engine(kind: str) -> Callable[[_rules.Rule, Samples], Result]:
    """Trace (forward) or Record (reverse), one point at a time."""
    def run(rule: _rules.Rule, s: Samples) -> Result:
        values, grads, raised = [], [], []
        for point in zip(*(x.tolist() for x in s.xs)):
            v, g, r = _scalar_point(rule, point, kind)
            values.append(v)
            grads.append(g)
            raised.append(r)
        g = np.array(grads, dtype=np.float64).reshape(-1, rule.arity)
        second = None
        if kind == "trace" and rule.arity == 1:
            # second order through NestedTrace (forward over forward), ordinary points
            d2 = ad.derivative(ad.derivative(lambda u: apply(rule, u)))
            second = np.array([d2(float(v)) if ok else math.nan
                               for v, ok in zip(s.xs[0], s.ordinary)])
        return Result(np.array(values), tuple(g.T), raised, second)
    return run


def replay_engine(compiled: bool) -> Callable[[_rules.Rule, Samples], Result]:
    """``ad.record(f, x0)`` replayed by the VM (or its ``compile()``d C): the points that
    do not raise in one batch, the others one by one (each must raise)."""
    def run(rule: _rules.Rule, s: Samples) -> Result:
        x0 = np.array([x[0] for x in s.xs])
        F = ad.record(lambda v: apply(rule, *(v[k] for k in range(rule.arity))), x0)
        if compiled:
            with warnings.catch_warnings():
                warnings.simplefilter("error", ad.CompilerWarning)
                F = F.compile()
        X = np.stack(s.xs, axis=1)
        raised: list[str | None] = []
        for row in X:
            try:
                F.value_and_gradient(row)
                raised.append(None)
            except (ValueError, OverflowError, ZeroDivisionError) as e:
                raised.append(type(e).__name__)
        ok = np.array([r is None for r in raised])
        values = np.full(s.size, np.nan)
        grads = np.full((s.size, rule.arity), np.nan)
        if ok.any():
            values[ok], grads[ok] = F.value_and_gradient(X[ok])
        return Result(values, tuple(grads.T), raised)
    return run


def _inputs(table: dict[str, Samples], dtype: Any) -> dict[str, tuple[np.ndarray, ...]]:
    with np.errstate(over="ignore"):      # 1e300 is inf in float32: a sample too
        return {name: tuple(x.astype(dtype) for x in s.xs) for name, s in table.items()}


def _all_rules_values(inputs: dict[str, Any]) -> dict[str, Any]:
    return {name: apply(_rules.RULES_BY_NAME[name], *ops) for name, ops in inputs.items()}


def _all_rules_loss(inputs: dict[str, Any]) -> Any:
    total = 0.0
    for name, ops in inputs.items():
        total = total + ad.sum(apply(_rules.RULES_BY_NAME[name], *ops))
    return total


def _layout(x: np.ndarray, layout: str) -> np.ndarray:
    """The same numbers non-contiguous (every other element of a buffer) or big-endian."""
    if layout == "strided":
        buffer = np.zeros(2 * x.size, x.dtype)
        buffer[::2] = x
        return buffer[::2]
    if layout == "big-endian":
        return x.astype(x.dtype.newbyteorder(">"))
    return x


def eager_tensors(table: dict[str, Samples], device: str, dtype: Any,
                  layout: str = "contiguous") -> dict[str, Result]:
    """Eager Tensors: each rule on the variables, values and the adjoints of their sum."""
    out = {}
    with np.errstate(all="ignore"):
        for name, ops in _inputs(table, dtype).items():
            rule = _rules.RULES_BY_NAME[name]
            lst = ad.WengertList()
            ts = [ad.Tensor.variable(_layout(x, layout), lst, device=device) for x in ops]
            y = apply(rule, *ts)
            d = ad.sum(y).derivatives()
            out[name] = Result(np.asarray(y.value), tuple(np.asarray(d[t]) for t in ts))
    return out


def trace_tensors(table: dict[str, Samples], device: str, dtype: Any) -> dict[str, Result]:
    """TraceTensor (forward mode on arrays): one pass per operand, its tangent ones."""
    out = {}
    with np.errstate(all="ignore"):
        for name, ops in _inputs(table, dtype).items():
            rule = _rules.RULES_BY_NAME[name]
            grads, value = [], None
            for k in range(rule.arity):
                ts = [ad.TraceTensor.variable(x, device=device) if i == k else
                      ad.TraceTensor.constant(x, device=device) for i, x in enumerate(ops)]
                y = apply(rule, *ts)
                value = np.asarray(y.value)
                grads.append(np.asarray(y.tangent))
            out[name] = Result(value, tuple(grads))
    return out


def recorded_tensors(table: dict[str, Samples], device: str, dtype: Any, fuse: bool,
                     layout: str = "contiguous") -> dict[str, Result]:
    """``ad.record(f, x0, tensor=True)``: fused C (numpy device) or fused OpenCL kernels,
    or (fuse=False) replayed kernel by kernel. One program of every rule's values and one
    of the sum of them all, recorded at ordinary points and replayed at the samples."""
    inputs = _inputs(table, dtype)
    at = {name: tuple(np.ones_like(x) * 0.5 + 0.25 * (_rules.RULES_BY_NAME[name].domain[k][0]
                                                      == 1.0)
                      for k, x in enumerate(ops)) for name, ops in inputs.items()}
    with np.errstate(all="ignore"):
        V = ad.record(_all_rules_values, at, tensor=True, fuse=fuse, device=device)
        G = ad.record(_all_rules_loss, at, tensor=True, fuse=fuse, device=device)
        given = {name: tuple(_layout(x, layout) for x in ops) for name, ops in inputs.items()}
        values = V(given)
        _, grads = G.value_and_gradient(given)
    return {name: Result(np.asarray(values[name]), tuple(np.asarray(g) for g in grads[name]))
            for name in inputs}


# ---- checking --------------------------------------------------------------------------

def _pattern(a: np.ndarray) -> np.ndarray:
    """-2 NaN, -1 -inf, 1 +inf, 0 finite."""
    return np.where(np.isnan(a), -2, np.where(np.isinf(a), np.sign(a), 0)).astype(int)


def disagreements(got: np.ndarray, want: np.ndarray, rtol: float, what: str,
                  points: tuple[np.ndarray, ...], mask: np.ndarray | None = None,
                  atol: float = 0.0) -> list[str]:
    """Lines for the points where ``got`` differs from ``want``: another NaN/inf pattern,
    or finite values farther apart than rtol (rtol 0: bit for bit, -0.0 != 0.0)."""
    got = np.asarray(got, dtype=np.float64).reshape(-1)
    want = np.asarray(want, dtype=np.float64).reshape(-1)
    if got.shape != want.shape:
        return [f"{what}: shape {got.shape} != {want.shape}"]
    if rtol == 0:
        bad = ~((got == want) & (np.signbit(got) == np.signbit(want))
                | (np.isnan(got) & np.isnan(want)))
    else:
        finite = np.isfinite(got) & np.isfinite(want)
        with np.errstate(all="ignore"):
            far = np.abs(got - want) > rtol * np.abs(want) + atol
        bad = (_pattern(got) != _pattern(want)) | (finite & far) | \
            (~finite & np.isinf(got) & (got != want))
    if mask is not None:
        bad &= mask
    lines = []
    for i in np.flatnonzero(bad)[:6]:
        at = ", ".join(repr(float(x[i])) for x in points)
        lines.append(f"{what} at ({at}): {got[i]!r} != {want[i]!r}")
    if bad.sum() > 6:
        lines.append(f"{what}: ... {int(bad.sum()) - 6} more points")
    return lines


# The errors the scalar engines may raise, by name. An engine's error conforms when it is
# (a subclass of) Python's: ad.PowDomainError, raised by every engine at 0.0 to a negative
# power, is both math.pow's ValueError and float **'s ZeroDivisionError.
ERRORS = {e.__name__: e for e in (ValueError, OverflowError, ZeroDivisionError,
                                  ad.PowDomainError)}


def raises_as(got: str | None, want: str | None) -> bool:
    if got is None or want is None:
        return got == want
    return issubclass(ERRORS[got], ERRORS[want])


def check_scalar(rule: _rules.Rule, s: Samples, results: dict[str, Result]) -> list[str]:
    """The scalar engines: which points raise (Python's floats), values (Python's
    function), the VM bit for bit the recording's values, the compiled C bit for bit the
    VM, every derivative the Trace's."""
    lines: list[str] = []
    points = list(zip(*(x.tolist() for x in s.xs)))
    ref = [_python_outcome(rule, p) for p in points]
    expected_raise = [r for _, r in ref]
    for name, res in results.items():
        for p, got, (_, want) in zip(points, res.raised, ref):
            if python_reference(rule) is not None and not raises_as(got, want):
                lines.append(f"{rule.name} {name} at {p}: raised {got}, Python raises {want}")
            elif python_reference(rule) is None and got is not None:
                lines.append(f"{rule.name} {name} at {p}: raised {got} (policy "
                             f"{rule.errors})")
    ok = np.array([r is None for r in expected_raise])
    if python_reference(rule) is not None:
        want = np.array([math.nan if v is None else v for v, _ in ref])
        lines += disagreements(results["Trace"].values, want, 4e-16, f"{rule.name} Trace "
                               "value vs Python", s.xs, ok)
    record = results["Record"]
    lines += disagreements(results["VM"].values, record.values, 0,
                           f"{rule.name} VM value vs Record (bit for bit)", s.xs, ok)
    if "compiled" in results:
        for a, b in ((results["compiled"].values, results["VM"].values),
                     *zip(results["compiled"].grads, results["VM"].grads)):
            lines += disagreements(a, b, 0, f"{rule.name} compiled vs VM (bit for bit)",
                                   s.xs, ok)
    trace = results["Trace"]
    for name, res in results.items():
        for k, (a, b) in enumerate(zip(res.grads, trace.grads)):
            lines += disagreements(a, b, RTOL[np.dtype(np.float64)],
                                   f"{rule.name} {name} d/d{'xy'[k]} vs Trace", s.xs, ok)
        lines += disagreements(res.values, trace.values, RTOL[np.dtype(np.float64)],
                               f"{rule.name} {name} value vs Trace", s.xs, ok)
    return lines


def check_derivatives(rule: _rules.Rule, s: Samples, trace: Result) -> list[str]:
    """The Trace's derivatives at the ordinary points against sympy's and central
    differences, its second derivative (NestedTrace) against sympy's, and against torch's
    autograd at ordinary points and ties."""
    import sympy
    sx, sy = sympy.symbols("x y", real=True)
    symbols = (sx, sy)[:rule.arity]
    spelling = rule.spelling("sympy")
    expr = getattr(sympy, spelling)(*symbols) if spelling.isidentifier() else \
        sympy.sympify(spelling, locals={"x": sx, "y": sy})
    o = s.ordinary
    pts = tuple(x[o] for x in s.xs)
    with np.errstate(all="ignore"):   # lambdify's unselected Piecewise branches
        return _derivative_lines(rule, s, trace, expr, symbols, o, pts)


def _derivative_lines(rule: _rules.Rule, s: Samples, trace: Result, expr: Any,
                      symbols: tuple[Any, ...], o: np.ndarray, pts: tuple[np.ndarray, ...]
                      ) -> list[str]:
    import sympy
    lines: list[str] = []
    for k, v in enumerate(symbols):
        d = sympy.lambdify(symbols, sympy.diff(expr, v), modules=["scipy", "numpy"])
        want = np.broadcast_to(np.asarray(d(*pts), dtype=np.float64), pts[0].shape)
        lines += disagreements(trace.grads[k][o], want, REF_RTOL,
                               f"{rule.name} d/d{v} vs sympy", pts, atol=1e-300)
        h = 1e-6 * np.maximum(1e-3, np.abs(pts[k]))     # relative: cbrt near 0 curves
        up = [p + h if j == k else p for j, p in enumerate(pts)]
        down = [p - h if j == k else p for j, p in enumerate(pts)]
        fd = (numpy_reference(rule, tuple(up)) - numpy_reference(rule, tuple(down))) / (2 * h)
        scale = np.maximum(1.0, np.abs(numpy_reference(rule, pts)))
        lines += disagreements(trace.grads[k][o], fd, FD_RTOL,
                               f"{rule.name} d/d{v} vs central differences", pts,
                               atol=FD_RTOL * float(scale.max()))
    if trace.second is not None:
        d2 = sympy.lambdify(symbols, sympy.diff(expr, symbols[0], 2).replace(
            sympy.DiracDelta, lambda *a: sympy.S.Zero), modules=["scipy", "numpy"])
        want = np.broadcast_to(np.asarray(d2(*pts), dtype=np.float64), pts[0].shape)
        lines += disagreements(trace.second[o], want, 1e-10,
                               f"{rule.name} d2/dx2 (NestedTrace) vs sympy", pts, atol=1e-300)
    # ties away from 0 and overflow: the kink of maximum and minimum, where torch splits
    # the derivative as the table's heaviside does (at 0, pow's conventions differ; at
    # extreme magnitudes torch's own formulas underflow: atan2's gives 0 at 1e-300)
    fine = np.array([r is None for r in trace.raised]) & (np.abs(s.xs[0]) > 1e-100) & \
        (np.abs(s.xs[0]) < 1e100)
    if rule.name in _TORCH_TIES_DIFFER:
        fine &= ~s.ties
    lines += _check_torch_gradients(rule, s, trace, o | (s.ties & fine))
    return lines


# torch gives fmax's and fmin's whole derivative to the first operand at a tie; easyad
# splits it, as for maximum and minimum (docs/conventions.md)
_TORCH_TIES_DIFFER = frozenset({"fmax", "fmin"})


def _check_torch_gradients(rule: _rules.Rule, s: Samples, trace: Result,
                           where: np.ndarray) -> list[str]:
    if rule.spelling("torch") is None:
        return []
    import torch
    ts = [torch.tensor(x[where], dtype=torch.float64, requires_grad=True) for x in s.xs]
    torch_values(rule, ts).sum().backward()
    pts = tuple(x[where] for x in s.xs)
    lines = []
    for k, t in enumerate(ts):
        lines += disagreements(trace.grads[k][where], t.grad.numpy(), REF_RTOL,
                               f"{rule.name} d/d{'xy'[k]} vs torch", pts, atol=1e-300)
    return lines


def check_tensor(rule: _rules.Rule, s: Samples, dtype: Any, results: dict[str, Result],
                 scalar: Result, reference: str) -> list[str]:
    """Tensor engines (one dtype): values against numpy's (torch's) spelling, every
    engine's values and gradients against ``reference``'s (the eager numpy tensor), and
    (float64) that one's gradients against the scalar Trace's where the Trace does not
    raise. Every result must keep the dtype."""
    dtype = np.dtype(dtype)
    rtol = RTOL[dtype]
    lines: list[str] = []
    with np.errstate(over="ignore"):
        xs = tuple(x.astype(dtype) for x in s.xs)
        wide = tuple(x.astype(np.float64) for x in xs)
        want = numpy_reference(rule, wide).astype(dtype)
    base = results[reference]
    info = np.finfo(dtype)
    for name, res in results.items():
        tag = f"{rule.name} {name} {dtype}"
        if res.values.dtype != dtype or any(g.dtype != dtype for g in res.grads):
            lines.append(f"{tag}: dtypes {res.values.dtype}, "
                         f"{[str(g.dtype) for g in res.grads]}")
        lines += disagreements(res.values, want, rtol, f"{tag} value vs numpy", xs,
                               atol=info.tiny)
        if name != reference:
            lines += disagreements(res.values, base.values, rtol,
                                   f"{tag} value vs {reference}", xs, atol=info.tiny)
            for k, (a, b) in enumerate(zip(res.grads, base.grads)):
                lines += disagreements(a, b, rtol, f"{tag} d/d{'xy'[k]} vs {reference}",
                                       xs, atol=info.tiny)
    if dtype == np.float64:
        ok = np.array([r is None for r in scalar.raised])
        for k, (a, b) in enumerate(zip(base.grads, scalar.grads)):
            lines += disagreements(a, b, rtol, f"{rule.name} {reference} d/d{'xy'[k]} "
                                   "vs Trace", xs, ok)
    return lines


# ---- reductions and selections ---------------------------------------------------------

def selection_points(rng: np.random.Generator, rows: int = 16, cols: int = 8
                     ) -> np.ndarray:
    """Three (rows >= 12, cols >= 8) operands stacked: random, with ties (equal columns,
    constant rows, a == b), near-ties (one ulp apart), ±0, huge and infinite values."""
    a = rng.normal(size=(rows, cols))
    b = rng.normal(size=(rows, cols))
    a[:, 3] = a[:, 1]                     # ties along rows
    a[5] = 0.75                           # a constant row
    b[:, :4] = a[:, :4]                   # a == b: maximum/minimum/where at ties
    a[7, :2], b[7, :2] = (0.0, -0.0), (-0.0, 0.0)
    a[9, 6], b[10, 7], a[11, 5] = np.inf, -np.inf, 700.0
    # the third operand, compared with a as it is (no exp): ties, near-ties (one ulp
    # apart either way), ±0 against ∓0, a column of ties for its min over rows
    c = a.copy()
    c[:, 4] = np.nextafter(a[:, 4], np.inf)
    c[:, 5] = np.nextafter(a[:, 5], -np.inf)
    c[:, 6] = c[0, 6]
    return np.stack([a, b, c])


def selections(ab: Any) -> Any:
    """sum, amax/amin along each axis and over all, maximum, minimum, where (with a
    comparison), abs at ties: on exp of the inputs, so the values compared are libm's
    (exact ties only: one ulp apart before exp, engines with different libms may round
    to a tie or not), then on the inputs themselves (near-ties, ±0, inf); weighted apart
    so a lost share changes the gradient."""
    e, f = ad.exp(ab[0] * 0.3), ad.exp(ab[1] * 0.3)
    return (ad.sum(ad.amax(e, axis=1) ** 2) + 0.7 * ad.sum(ad.amin(e, axis=0))
            + ad.amax(f) - 0.3 * ad.amin(e)
            + 0.9 * ad.sum(ad.maximum(e, f)) + 1.1 * ad.sum(ad.minimum(e, f) * e)
            + 0.5 * ad.sum(ad.where(e >= f, e, 0.5 * f)) + 0.2 * ad.sum(ad.abs(e - f))
            + 0.4 * ad.sum(ad.maximum(ab[0], ab[2])) + 0.6 * ad.amin(ab[2], axis=0)[6]
            + 0.8 * ad.sum(ad.where(ab[0] < ab[2], ab[0], 0.25 * ab[2])))


def check_selections(x: np.ndarray, engines: dict[str, Callable[[np.ndarray], Any]],
                     reference: str = "eager", rtol: float = 1e-13) -> list[str]:
    """Every engine's value and gradient of ``selections`` against the reference's (eager
    tensors keep every compared value in memory: right by construction): same NaN/inf
    pattern, same zeros (the elements each selection picked), rtol otherwise."""
    want_v, want_g = engines[reference](x)
    lines: list[str] = []
    for name, run in engines.items():
        if name == reference:
            continue
        v, g = run(x)
        idx = tuple(np.indices(x.shape).reshape(x.ndim, -1).astype(float))
        lines += disagreements(np.array([v]), np.array([want_v]), rtol,
                               f"selections {name} value", (np.zeros(1),))
        lines += disagreements(np.asarray(g).reshape(-1), np.asarray(want_g).reshape(-1),
                               rtol, f"selections {name} gradient [element index]", idx)
    return lines


def selection_engines(x0: np.ndarray, device: str = "numpy", dtype: Any = np.float64
                      ) -> dict[str, Callable[[np.ndarray], Any]]:
    """eager, fused and unfused replay of ``selections`` on one device and dtype."""
    def eager(x: np.ndarray) -> Any:
        lst = ad.WengertList()
        t = ad.Tensor.variable(x.astype(dtype), lst, device=device)
        y = selections(t)
        return y.number, np.asarray(y.derivatives()[t])

    def replay(fuse: bool) -> Callable[[np.ndarray], Any]:
        F = ad.record(selections, x0.astype(dtype), tensor=True, fuse=fuse, device=device)
        return lambda x: F.value_and_gradient(x.astype(dtype))

    return {"eager": eager, "fused": replay(True), "unfused": replay(False)}


def float32_ulps(got: np.ndarray, want: np.ndarray) -> np.ndarray:
    """|got - want| in float32 ulps of want where want is a normal float32, in units of
    float32's smallest normal below it (both arrays float32; 0 where both are the same
    NaN or infinity, inf where the NaN/inf patterns differ)."""
    got, want = got.astype(np.float64), want.astype(np.float64)
    tiny = float(np.finfo(np.float32).tiny)
    with np.errstate(all="ignore"):
        unit = np.where(np.abs(want) >= tiny, np.spacing(np.abs(want).astype(np.float32)),
                        tiny).astype(np.float64)
        d = np.abs(got - want) / unit
    d[(got == want) | (np.isnan(got) & np.isnan(want))] = 0.0
    d[(np.isnan(got) != np.isnan(want)) | (np.isinf(got) != np.isinf(want))] = np.inf
    return d
