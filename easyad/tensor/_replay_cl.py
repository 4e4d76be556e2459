"""Replay of a scalar tape on OpenCL: one straight-line kernel, one work-item per point.

``render_replay_kernel`` turns the entries of a WengertList (``lst._arrays()``) into OpenCL
C: a forward pass that recomputes every value and every partial the gradient needs, from
the rule table's expression strings (each entry becomes ``{ x = ..; y = ..; v = value;
p0 = partial0; .. }`` with the rule's text verbatim), then the reverse pass
``a[arg] += mul0(partial, a[entry])`` in reverse order, as the core's sweep does.
Comparisons are evaluated again; a guard (Python branched on it) whose outcome differs from
the recorded one sets the row's ``branch_changed`` flag, and a select follows its re-evaluated
condition (the comparison entry just before it). ``replay_gradient_opencl`` compiles the
kernel once per (device, source) and runs it on a batch of points.
"""
from __future__ import annotations

import math
from typing import Any

import numpy as np

from easyad._tapeview import COMPARE, CONSTANT, GUARD, RULE, SELECT, VARIABLE, TapeView
from easyad.tensor import _kernels as kernels


def _literal(v: float) -> str:
    if math.isnan(v):
        return "NAN"
    if math.isinf(v):
        return "INFINITY" if v > 0 else "(-INFINITY)"
    text = repr(float(v))
    return f"({text})" if text.startswith("-") else text


def render_replay_kernel(arrays: dict[str, np.ndarray], inputs: list[int], output: int,
                         name: str = "easyad_replay") -> str:
    """OpenCL C source of the replay kernel ``name(X, values, grads, changed, B)``."""
    view = TapeView.of_arrays(arrays)
    n = len(inputs)
    position = {int(e): k for k, e in enumerate(inputs)}
    # values needed: ancestors of the output and of every guard (also those after it);
    # the gradient flows through the output's ancestors that depend on an input
    valued = view.ancestors([output, *view.guards()])
    flowing = view.ancestors([output])
    active: set[int] = set()
    for i in range(output + 1):
        if view.kind(i) in (COMPARE, GUARD):
            continue   # a comparison's outcome is piecewise constant: no gradient through it
        if i in position or (i in flowing and any(
                view.operand(i, k) in active for k in (0, 1))):
            active.add(i)
    active &= flowing
    forward, reverse = [], []

    def operand(i: int, k: int) -> str:
        j = view.operand(i, k)
        return f"v{j}" if j >= 0 else _literal(view.constant(i, k))

    for i in range(len(view)):  # guards after the output are evaluated too
        if i not in valued:
            continue
        kind = view.kind(i)
        a, b = view.operand(i, 0), view.operand(i, 1)
        recorded = _literal(float(view.values[i]))
        if kind == VARIABLE:
            value = f"X[row * {n} + {position[i]}]" if i in position else recorded
            forward.append(f"    const double v{i} = {value};")
        elif kind == CONSTANT:
            forward.append(f"    const double v{i} = {recorded};")
        elif kind in (COMPARE, GUARD):
            x, y = operand(i, 0), operand(i, 1)
            forward.append(f"    const double v{i} = ({x} {view.symbol(i)} {y}) ? 1.0 : 0.0;")
            if kind == GUARD:
                forward.append(f"    if (v{i} != {recorded}) changed = 1;")
        elif kind == SELECT:
            x, y, c = operand(i, 0), operand(i, 1), view.condition(i)
            forward.append(f"    const double v{i} = (v{c} != 0.0) ? {x} : {y};")
            if i in active:
                forward.append(f"    const double p0_{i} = (v{c} != 0.0) ? 1.0 : 0.0;")
                forward.append(f"    const double p1_{i} = 1.0 - p0_{i};")
        elif kind == RULE:
            rule = view.rule(i)
            x = operand(i, 0)
            y = operand(i, 1) if rule.arity == 2 else "0.0"
            lines = [f"const double x = {x};", f"const double y = {y};",
                     f"const double z = {rule.value};", f"v{i} = z;"]
            for k, (arg, partial) in enumerate(zip((a, b), rule.partials)):
                if i in active and arg in active:
                    lines.append(f"p{k}_{i} = {partial};")
            declared = [f"v{i}"] + [f"p{k}_{i}" for k, arg in enumerate((a, b)[:rule.arity])
                                    if i in active and arg in active]
            forward.append(f"    double {', '.join(declared)};")
            forward.append("    { " + " ".join(lines) + " (void)y; }")
        else:
            raise NotImplementedError(
                f"entry {i} is a {view.name(i)!r} operation, which OpenCL replay does not "
                f"run (only scalar rule operations, comparisons and selects)")
    order = sorted(active)
    if output in active:
        reverse.append("    double " + ", ".join(f"a{i} = 0.0" for i in order) + ";")
        reverse.append(f"    a{output} = 1.0;")
        for i in reversed(order):
            if view.kind(i) == VARIABLE:
                continue
            for k, arg in enumerate((view.operand(i, 0), view.operand(i, 1))):
                if arg in active:
                    reverse.append(f"    a{arg} += mul0(p{k}_{i}, a{i});")
    grads = [f"    G[row * {n} + {k}] = {f'a{e}' if e in active and output in active else '0.0'};"
             for k, e in enumerate(int(e) for e in inputs)]
    return (kernels.preamble("double")
            + f"__kernel void {name}(__global const double* restrict X, "
              "__global double* restrict V, __global double* restrict G, "
              "__global uchar* restrict changed_out, const long B)\n{\n"
              "    const long row = get_global_id(0);\n    if (row >= B) return;\n"
              "    uchar changed = 0;\n"
            + "\n".join(forward + reverse + grads)
            + f"\n    V[row] = v{output};\n    changed_out[row] = changed;\n}}\n")


class ReplayKernel:
    """A tape compiled for OpenCL replay: call it with X (B, n) for (values, grads,
    branch_changed). Rendering and compiling happen once, here; calls only run it."""

    def __init__(self, arrays: dict[str, np.ndarray], inputs: Any, output: int,
                 device: Any = None) -> None:
        from easyad.tensor import _devices

        backend = _devices.find_device(device if device is not None else "opencl").backend
        if backend.kind != "opencl":
            raise ValueError(f"OpenCL replay runs on an OpenCL device, not {device!r}")
        self.inputs = [int(i) for i in inputs]
        for i in self.inputs:
            if TapeView.of_arrays(arrays).kind(i) != VARIABLE:
                raise ValueError(f"entry {i} is not a variable")
        self.backend = backend
        self.source = render_replay_kernel(arrays, self.inputs, int(output))
        self.kernel = backend.kernel(self.source, "easyad_replay",
                                     [None, None, None, None, np.int64])

    def __call__(self, X: Any) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        n = len(self.inputs)
        X = np.ascontiguousarray(X, dtype=np.float64)
        if X.ndim != 2 or X.shape[1] != n:
            raise ValueError(f"X must have shape (B, {n}), got {X.shape}")
        be, B = self.backend, X.shape[0]
        x_buf = be.asarray(X, np.float64)
        values = be.allocate((B,), np.float64)
        grads = be.allocate((B, n), np.float64)
        changed = be.allocate((B,), np.uint8)
        be.launch(self.kernel, B, x_buf.data, values.data, grads.data, changed.data, B)
        return (be.to_numpy(values), be.to_numpy(grads), be.to_numpy(changed).astype(bool))


def replay_gradient_opencl(arrays: dict[str, np.ndarray], inputs: Any, output: int, X: Any,
                           device: Any = None) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Value and gradient of a recorded scalar function at every row of ``X`` (B, n).

    ``arrays`` is ``lst._arrays()``, ``inputs`` the entry indices of the n input variables
    (in the order of X's columns), ``output`` the entry index of the result. Returns
    ``(values (B,), grads (B, n), branch_changed (B,) bool)``; a row whose branch changed
    (a guard's outcome differs from the recording) has values that follow the recorded
    branch, not the function. ``device``: an OpenCL device spec (default: ``"opencl"``).
    """
    return ReplayKernel(arrays, inputs, output, device)(X)
