"""Replay of a scalar tape on OpenCL: one straight-line kernel, one work-item per point.

``Function.gradient(..., device="opencl")`` (``recorded/devices.py``) hands it the program
``compiler.tape.optimise`` makes, the one ``F.compile(optimise=True)`` renders to C:
constants folded, common subexpressions shared, exact identities, dead entries dropped.
``ReplayRenderer`` (``render_replay_kernel``), a ``compiler.cstyle.CStyleRenderer`` with
the OpenCL dialect (``compiler.dialect.OpenCLDialect``, real_t double), turns the entries
of a WengertList (``lst._arrays()``) into OpenCL C: a forward pass that recomputes every
value and every partial the gradient needs, from the rule table's expressions rendered
for the dialect (each entry becomes ``{ x = ..; y = ..; v = value; p0 = partial0; .. }``),
then the reverse pass ``a[arg] += mul0(partial, a[entry])`` in reverse order, as the
core's sweep does (``mul0``: the strong zero, 0 * inf = 0). Constants, comparisons,
selects, guards and the strong zero are the one renderer's. Comparisons are
evaluated again; a guard (Python branched on it) whose outcome differs from the recorded
one sets the point's ``branch_changed`` flag (and one flag for the whole batch, so the host
reads 4 bytes to learn whether any point changed), and a select follows its re-evaluated
condition (the comparison entry just before it).

Memory is variable-major so that neighbouring work-items touch neighbouring addresses
(coalesced on a GPU, one vector load on a CPU device): the gradient is written as (n, B),
``G[k*B + b]``; X is read through its strides, so X (B, n) in Fortran order, i.e. the
(n, B) array ``XT.T``, is read coalesced, and a row-major X works too (strided reads).
``ReplayKernel.run`` takes and returns ``pyopencl.array.Array``s that stay on the device;
calling the kernel with a numpy X uploads it (variable-major for a GPU; as it is for a CPU
device, where the transpose costs more than it saves) and brings results back.
"""
from __future__ import annotations

from typing import Any

import numpy as np

from easyad._tapeview import COMPARE, CONSTANT, GUARD, RULE, SELECT, VARIABLE, TapeView
from easyad.compiler.cstyle import CStyleRenderer
from easyad.compiler.dialect import OpenCLDialect

_SCALARS = [None, np.int64, np.int64, np.int64, None, None, None, None, np.int64, np.int32]


def render_replay_kernel(arrays: dict[str, np.ndarray], inputs: list[int], output: int,
                         name: str = "easyad_replay") -> str:
    """``ReplayRenderer().render``: see there."""
    return ReplayRenderer().render(arrays, inputs, output, name)


class ReplayRenderer(CStyleRenderer):
    """A scalar tape as one OpenCL kernel (see the module docstring): the VM's double."""

    def __init__(self, dialect: OpenCLDialect | None = None) -> None:
        super().__init__(dialect or OpenCLDialect("double"))

    def render(self, arrays: dict[str, np.ndarray], inputs: list[int], output: int,
               name: str = "easyad_replay") -> str:
        """OpenCL C source of the replay kernel ``name(X, x_offset, x_point, x_var, V, G,
        changed, any_changed, B, nan_on_change)``: input k of point b is
        ``X[x_offset + b*x_point + k*x_var]``; the value goes to ``V[b]``, the gradient to
        ``G[k*B + b]`` (variable-major), the changed-branch flag to ``changed[b]``, and
        ``any_changed[0]`` is or-ed with 1 when a point's branch changed. With
        ``nan_on_change`` such a point's value and gradient are NaN."""
        view = TapeView.of_arrays(arrays)
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
            return f"v{j}" if j >= 0 else self.literal(view.constant(i, k))

        for i in range(len(view)):  # guards after the output are evaluated too
            if i not in valued:
                continue
            kind = view.kind(i)
            a, b = view.operand(i, 0), view.operand(i, 1)
            recorded = self.literal(float(view.values[i]))
            if kind == VARIABLE:
                value = f"X[x_offset + row * x_point + {position[i]} * x_var]" \
                    if i in position else recorded
                forward.append(f"    const double v{i} = {value};")
            elif kind == CONSTANT:
                forward.append(f"    const double v{i} = {recorded};")
            elif kind in (COMPARE, GUARD):
                x, y = operand(i, 0), operand(i, 1)
                forward.append(f"    const double v{i} = {self.compare(x, view.symbol(i), y)};")
                if kind == GUARD:
                    check = self.guard_check(f"v{i}", view.values[i], "changed = 1;")
                    forward.append(f"    {check}")
            elif kind == SELECT:
                x, y, c = operand(i, 0), operand(i, 1), view.condition(i)
                forward.append(f"    const double v{i} = {self.select(f'v{c}', x, y)};")
                if i in active:
                    taken = self.select(f"v{c}", "1.0", "0.0")
                    forward.append(f"    const double p0_{i} = {taken};")
                    forward.append(f"    const double p1_{i} = 1.0 - p0_{i};")
            elif kind == RULE:
                rule = view.rule(i)
                x = operand(i, 0)
                y = operand(i, 1) if rule.arity == 2 else "0.0"
                lines = [f"const double x = {x};", f"const double y = {y};",
                         f"const double z = {self.expression(rule.value)};", f"v{i} = z;"]
                for k, (arg, partial) in enumerate(zip((a, b), rule.partials)):
                    if i in active and arg in active:
                        lines.append(f"p{k}_{i} = {self.expression(partial)};")
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
                        reverse.append(f"    a{arg} += {self.mul0(f'p{k}_{i}', f'a{i}')};")
        grads = [f"    G[{k} * B + row] = bad ? NAN : "
                 f"{f'a{e}' if e in active and output in active else '0.0'};"
                 for k, e in enumerate(int(e) for e in inputs)]
        return (self.dialect.preamble()
                + f"__kernel void {name}(__global const double* restrict X, const long x_offset,"
                  " const long x_point, const long x_var, __global double* restrict V,"
                  " __global double* restrict G, __global uchar* restrict changed_out,"
                  " __global volatile int* any_changed, const long B, const int nan_on_change)\n"
                  "{\n"
                  "    const long row = get_global_id(0);\n    if (row >= B) return;\n"
                  "    uchar changed = 0;\n"
                + "\n".join(forward + reverse)
                + "\n    if (changed) atomic_or(any_changed, 1);\n"
                  "    const int bad = changed && nan_on_change;\n"
                + "\n".join(grads)
                + f"\n    V[row] = bad ? NAN : v{output};\n    changed_out[row] = changed;\n}}\n")


def is_device_array(x: Any) -> bool:
    """Whether x is a ``pyopencl.array.Array`` (checked without importing pyopencl)."""
    return type(x).__module__.startswith("pyopencl") and hasattr(x, "base_data")


class ReplayKernel:
    """A tape compiled for OpenCL replay. Call it with a numpy X (B, n) for host arrays
    ``(values, grads, branch_changed)``, or use ``run`` with a device array. The source is
    rendered once, here; the program is built once per OpenCL context."""

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
        self.kernel = backend.kernel(self.source, "easyad_replay", _SCALARS)
        self._foreign: dict[Any, Any] = {}   # kernels built for other contexts

    def _kernel_for(self, context: Any) -> Any:
        if context == self.backend.context:
            return self.kernel
        k = self._foreign.get(context)
        if k is None:
            import pyopencl as cl

            from easyad.errors import DeviceError
            from easyad.tensor import _devices, _probe
            # built only where a listed device passed its proofs (float64 kernels, the
            # replay kernel among them: _proofs), as the backends' kernels are
            handle = context.devices[0]
            if not any(d._handle == handle and d.fp64 for d in _devices.devices()
                       if d.kind == "opencl"):
                raise DeviceError(
                    f"the replay kernel is not built on {handle.name.strip()!r}: it is no "
                    f"device whose float64 kernels passed their proofs (see `python -m "
                    f"easyad devices`). Fix: put X on a working device listed there")
            k = cl.Program(context, self.source).build(
                _probe.build_options(cl, context.devices)).easyad_replay
            k.set_scalar_arg_dtypes(_SCALARS)
            self._foreign[context] = k
        return k

    def run(self, X: Any, nan_on_change: bool = False) -> tuple[Any, Any, Any, bool]:
        """Replay at every point of the device array X, on X's queue, leaving the results on
        the device: ``(values (B,), G (n, B) variable-major, changed (B,) uint8,
        any_changed)``; only ``any_changed`` (4 bytes) is read back. X: a float64
        ``pyopencl.array.Array`` (B, n) in any layout, read through its strides (Fortran
        order, i.e. ``XT.T`` for a C-ordered (n, B) array ``XT``, reads coalesced), or (n,)
        for one point."""
        import pyopencl.array as cl_array

        n = len(self.inputs)
        if X.dtype != np.float64:
            raise TypeError(f"X must be a float64 device array, got {X.dtype}")
        if X.ndim == 1 and X.shape[0] == n:
            B, x_point, x_var = 1, 0, X.strides[0] // 8
        elif X.ndim == 2 and X.shape[1] == n:
            B, (x_point, x_var) = X.shape[0], (s // 8 for s in X.strides)
        else:
            raise ValueError(f"X must have shape (B, {n}) or ({n},), got {X.shape}")
        queue = X.queue
        if queue is None:
            raise ValueError("X has no command queue (pyopencl Array made with queue=None)")
        kernel = self._kernel_for(queue.context)
        own = queue.context == self.backend.context
        alloc = self.backend.pool if own else None
        values = cl_array.empty(queue, (B,), np.float64, allocator=alloc)
        grads = cl_array.empty(queue, (n, B), np.float64, allocator=alloc)
        changed = cl_array.empty(queue, (B,), np.uint8, allocator=alloc)
        flag = cl_array.zeros(queue, (1,), np.int32, allocator=alloc)
        if B:
            group = min(256, queue.device.max_work_group_size)
            kernel(queue, (-(-B // group) * group,), (group,), X.base_data, X.offset // 8,
                   x_point, x_var, values.data, grads.data, changed.data, flag.data, B,
                   int(nan_on_change))
        return values, grads, changed, bool(flag.get()[0])

    def __call__(self, X: Any) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """``(values (B,), grads (B, n), branch_changed (B,) bool)`` at the rows of the
        host array X (B, n), uploaded variable-major for a GPU, as it is for a CPU device."""
        import pyopencl.array as cl_array

        n = len(self.inputs)
        X = np.asarray(X, dtype=np.float64)
        if X.ndim != 2 or X.shape[1] != n:
            raise ValueError(f"X must have shape (B, {n}), got {X.shape}")
        be, B = self.backend, X.shape[0]
        if B == 0:
            return np.empty(0), np.empty((0, n)), np.zeros(0, dtype=bool)
        if self.backend.device.is_gpu:   # coalesced reads: worth a transpose on the host
            Xd = cl_array.to_device(be.queue, np.ascontiguousarray(X.T), allocator=be.pool).T
        else:   # a CPU device: the transpose costs more (16 ms at B=10^5, n=100) than it saves
            Xd = cl_array.to_device(be.queue, np.ascontiguousarray(X), allocator=be.pool)
        values, grads, changed, _ = self.run(Xd)
        return values.get(), grads.get().T, changed.get().astype(bool)


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
