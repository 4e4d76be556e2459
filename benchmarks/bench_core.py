"""The core engine against plain floats and peer libraries, on one scalar function.

``f`` below is a fixed function of one variable of 44 elementary operations mixing
+ - * / ** sin exp log sqrt tanh, written ONCE, generically, with ``ad.sin`` etc. It runs
unchanged on plain floats (the baseline every target is a ratio of), on Traces (forward
mode) and on Records (reverse mode). The math-module baseline and every peer run the very
same bytecode with the name ``ad`` bound to their own functions (``math``, ``ad.admath``,
``autograd.numpy``, ``torch``), so each does exactly the same operations in the same order.

Targets (issue: core engine):
- Trace value + derivative: at most 2x the float time;
- Record recording + backward sweep: at most 3x the float time;
- the backward sweep alone (``z.derivatives()`` on a recorded tape): at most 15% of the
  recording time;
- tape memory: at most 40 bytes per entry.

Run through ``python benchmarks/run.py --only core`` (``--quick`` for a short run).
"""
from __future__ import annotations

import builtins
import importlib
import math
import types

import easyad as ad

NAME = "core"
TITLE = "easyad core engine: one scalar function, floats vs Trace vs Record vs peers"
LIBRARIES = ["easyad", "numpy", "ad", "autograd", "torch"]

X0 = 0.7
TOLERANCE = 1e-9    # relative (absolute below 1) agreement of values and derivatives

TRACE_TARGET = 2.0          # Trace / float
RECORD_TARGET = 3.0         # (recording + backward) / float
BACKWARD_TARGET = 0.15      # backward / recording
BYTES_TARGET = 40           # bytes per tape entry


def f(x):
    """The benchmark function: 44 operations of + - * / ** sin exp log sqrt tanh."""
    a = ad.sin(x) * x + 1.5
    b = ad.exp(-0.5 * x) / a
    c = ad.log(a + x * x) - b
    d = ad.sqrt(c * c + 1.0) * ad.tanh(b - x)
    e = (a / (1.0 + d * d)) ** 1.5
    g = ad.sin(e - c) + ad.exp(d / 3.0)
    h = ad.tanh(g * x) * ad.log(2.0 + e)
    k = (1.0 + e) ** x - ad.sqrt(a * b)
    return (h - k) / (2.0 + ad.exp(-c)) + g * 0.25 + ad.sin(k)


def rebind(function, namespace, label):
    """``function``'s own bytecode, with the global name ``ad`` meaning ``namespace``."""
    return types.FunctionType(function.__code__, {"ad": namespace, "__builtins__": builtins},
                              f"{function.__name__}_{label}")


def five_point_derivative(function, x, h=1e-3):
    """Central finite difference of 4th order: error ~h^4 f^(5)/30 + 1e-16 |f| / h."""
    return (8.0 * (function(x + h) - function(x - h))
            - (function(x + 2 * h) - function(x - 2 * h))) / (12.0 * h)


def _optional(module_name):
    try:
        return importlib.import_module(module_name)
    except Exception:   # not installed, or broken: either way the row says so
        return None


# ---- the variants: zero-argument callables returning (value, derivative or None) ----

def easyad_variants():
    f_float = f
    f_math = rebind(f, math, "math")
    variable = ad.Trace.variable

    def float_math():
        return f_math(X0), None

    def float_generic():
        return f_float(X0), None

    def trace():
        y = f(variable(X0))
        return y.number, y.derivative

    lst = ad.WengertList()

    def record_and_backward():
        lst.clear()
        x = lst.variable(X0)
        y = f(x)
        return y.number, y.derivatives()[x]

    def recording():
        lst.clear()
        x = lst.variable(X0)
        y = f(x)
        return y.number, None

    recorded = ad.WengertList()     # its own tape, recorded once and swept again and again
    x_recorded = recorded.variable(X0)
    y_recorded = f(x_recorded)
    sweep = y_recorded.derivatives

    def backward():
        return y_recorded.number, sweep()[x_recorded]

    return {
        "float, math module (math.sin ...)": (float_math, None),
        "float, generic (ad.sin ...)": (float_generic, None),
        "easyad Trace: value + derivative": (trace, None),
        "easyad Record: recording + backward": (record_and_backward, None),
        "easyad Record: recording only": (recording, None),
        # timed: the bound method z.derivatives itself (checked through backward())
        "easyad Record: backward only": (sweep, backward),
    }


def peer_variants():
    """name -> (callable or None, check callable or None, note)."""
    peers = {}

    admath = _optional("ad.admath")
    adnumber = getattr(_optional("ad"), "adnumber", None)
    if admath is not None and adnumber is not None:
        f_ad = rebind(f, admath, "ad")

        def ad_package():
            x = adnumber(X0)
            y = f_ad(x)
            return y.x, y.d(x)

        peers["ad (PyPI): adnumber, .d(x)"] = (ad_package, None)
    else:
        peers["ad (PyPI): adnumber, .d(x)"] = None

    autograd = _optional("autograd")
    anp = _optional("autograd.numpy")
    if autograd is not None and anp is not None:
        f_autograd = rebind(f, anp, "autograd")
        gradient = autograd.grad(f_autograd)

        def autograd_grad():
            return None, gradient(X0)

        def autograd_check():
            return float(f_autograd(X0)), float(gradient(X0))

        peers["autograd: grad"] = (autograd_grad, autograd_check)
    else:
        peers["autograd: grad"] = None

    torch = _optional("torch")
    if torch is not None:
        f_torch = rebind(f, torch, "torch")
        tensor, float64 = torch.tensor, torch.float64

        def torch_backward():
            x = tensor(X0, dtype=float64, requires_grad=True)
            y = f_torch(x)
            y.backward()
            return y.item(), x.grad.item()

        peers["torch: float64 scalar, .backward()"] = (torch_backward, None)
    else:
        peers["torch: float64 scalar, .backward()"] = None
    return peers


def _agrees(got, expected):
    return abs(got - expected) <= TOLERANCE * max(1.0, abs(expected))


def check(name, function, value, derivative):
    """'' if the variant gives f's value and derivative at X0, else what is wrong."""
    try:
        got_value, got_derivative = function()
    except Exception as error:  # a peer that cannot run this function
        return f"raised {type(error).__name__}: {error}"
    problems = []
    if got_value is not None and not _agrees(float(got_value), value):
        problems.append(f"value {float(got_value)!r} != {value!r}")
    if got_derivative is not None and not _agrees(float(got_derivative), derivative):
        problems.append(f"derivative {float(got_derivative)!r} != {derivative!r}")
    return "; ".join(problems)


def run(ctx):
    f_math = rebind(f, math, "math")
    value = f_math(X0)
    derivative = five_point_derivative(f_math, X0)

    lst = ad.WengertList()
    x = lst.variable(X0)
    f(x)
    entries = len(lst)
    operations = entries - 1
    # memory per used entry, at the worst length from 64 to 300,000 entries (the list
    # grows in steps, so just after a step is the worst) and at 300,000
    grown = ad.WengertList()
    y = grown.variable(X0)
    worst_bytes = 0.0
    while len(grown) < 300_000:
        y = y * 1.0
        if len(grown) >= 64:
            worst_bytes = max(worst_bytes, grown.bytes_per_entry)
    bytes_per_entry = grown.bytes_per_entry

    ours = easyad_variants()
    peers = peer_variants()

    # 1. correctness, once, before any timing
    ctx.log(f"   f has {operations} operations; f({X0}) = {value!r}, "
            f"f'({X0}) = {derivative!r} (5-point central difference)")
    variants, wrong, missing = {}, {}, []
    for name, entry in list(ours.items()) + list(peers.items()):
        if entry is None:
            missing.append(name)
            continue
        function, checker = entry
        problem = check(name, checker or function, value, derivative)
        if problem:
            wrong[name] = problem
            ctx.log(f"   WRONG {name}: {problem}")
            continue
        variants[name] = function
    if any(name in wrong for name in ours):
        raise SystemExit("easyad disagrees with the finite difference: not benchmarking")

    # 2. timing, every variant interleaved
    ctx.log(f"   timing {len(variants)} variants, {ctx.rounds} rounds")
    timings = ctx.measure(variants)

    base = "float, generic (ad.sin ...)"
    trace = "easyad Trace: value + derivative"
    record = "easyad Record: recording + backward"
    recording = "easyad Record: recording only"
    backward = "easyad Record: backward only"
    backward_share = timings.ratio(backward, recording)

    missed = []

    def verdict(ok, what):
        if not ok:
            missed.append(what)
        return "pass" if ok else "**FAIL**"

    rows = []
    for name in list(ours) + list(peers):
        if name in missing:
            rows.append((name, "not installed", "", "", "", ""))
            continue
        if name in wrong:
            rows.append((name, "wrong result", "", "", wrong[name], ""))
            continue
        ns = timings.median(name) * 1e9
        ratio = timings.ratio(name, base)
        q1, q3 = timings.ratio_quartiles(name, base)
        target, result = "", ""
        if name == base:
            target = "baseline"
        elif name == "float, math module (math.sin ...)":
            target = "reference"
        elif name == trace:
            target = f"<= {TRACE_TARGET:g}x"
            result = verdict(ratio <= TRACE_TARGET, f"Trace {ratio:.2f}x floats "
                                                     f"(target {TRACE_TARGET:g}x)")
        elif name == record:
            target = f"<= {RECORD_TARGET:g}x"
            result = verdict(ratio <= RECORD_TARGET, f"Record {ratio:.2f}x floats "
                                                       f"(target {RECORD_TARGET:g}x)")
        elif name == backward:
            b1, b3 = timings.ratio_quartiles(backward, recording)
            target = (f"<= {BACKWARD_TARGET:.0%} of recording: {backward_share:.1%} "
                      f"(middle 50%: {b1:.1%}-{b3:.1%})")
            result = verdict(backward_share <= BACKWARD_TARGET,
                             f"backward sweep {backward_share:.1%} of recording "
                             f"(target {BACKWARD_TARGET:.0%})")
        rows.append((name, f"{ns:,.0f}", f"{ratio:.2f}x", f"{q1:.2f}-{q3:.2f}",
                     target, result))

    bytes_ok = max(bytes_per_entry, worst_bytes) <= BYTES_TARGET
    memory_result = verdict(bytes_ok, f"tape {max(bytes_per_entry, worst_bytes):.1f} "
                                      f"bytes per entry (target {BYTES_TARGET})")

    lines = [
        f"f: {operations} operations (+ - * / ** sin exp log sqrt tanh), one input, "
        f"at x = {X0}; f(x) = {value:.15g}, f'(x) = {derivative:.15g}. Every variant "
        f"below agreed on value and derivative to {TOLERANCE:g} (relative) with the "
        f"math-module function and a 5-point central difference before timing.",
        "",
        "| variant | ns per call (median) | ratio vs floats (median) "
        "| middle 50% of ratios | target | pass/fail |",
        "| --- | ---: | ---: | ---: | --- | --- |",
    ]
    lines += ["| " + " | ".join(row) + " |" for row in rows]
    lines += [
        "",
        "| tape memory | bytes per entry | target | pass/fail |",
        "| --- | ---: | --- | --- |",
        f"| `lst.bytes_per_entry` (= `nbytes / len`), 300,000 entries | "
        f"{bytes_per_entry:.1f} | <= {BYTES_TARGET} | {memory_result} |",
        f"| the same, worst length from 64 to 300,000 entries | {worst_bytes:.1f} | "
        f"<= {BYTES_TARGET} | {memory_result} |",
        "",
        f"Notes: \"floats\" is `f` itself on Python floats (the generic functions `ad.sin` "
        f"... on floats); every ratio is against it, taken per round then median'd. "
        f"The math-module row is the same bytecode with `math.sin` ...; it is shown for "
        f"reference. The Record rows reuse one `WengertList` through `lst.clear()`; the "
        f"backward-only row times `z.derivatives()` on a tape recorded once "
        f"({entries} entries: the variable and {operations} operations; constants take "
        f"none). The Trace and Record rows include making the input and reading the value "
        f"and derivative; the peers do the same (`ad`: `adnumber(x)`, `y.d(x)`; autograd: "
        f"`autograd.grad(f)(x)`, made once; torch: a float64 scalar tensor with "
        f"`requires_grad=True`, `y.backward()`, `.item()`).",
    ]
    return "\n".join(lines), missed
