"""A scalar ``Function``'s gradients on an OpenCL device: every row in one kernel generated
from the optimised tape (``compiler/tape/render_cl.py``), with the C replay's branch handling;
device arrays in, device arrays out. A mixin of ``Function`` (``easyad/replay.py``), apart
because it is the one part of the class that knows a device.
"""
from __future__ import annotations

from typing import Any

import numpy as np
from numpy.typing import NDArray

from easyad.errors import BranchChangedError
from easyad.recorded.rows import _VALUE, Rows


class Devices(Rows):
    """``Function.gradient(x, device="opencl")`` (see the module docstring)."""

    # ---- internals ----
    def _cl_kernel(self, device: Any) -> Any:
        """The OpenCL replay kernel for device (rendered and built once per device and
        kept), from the optimised program (``easyad.compiler.tape.optimise``; the tape
        itself where that declines: user primitives, tensor nodes)."""
        from easyad.compiler import tape as tape_compiler
        from easyad.compiler.tape.render_cl import ReplayKernel
        kernels = self.__dict__.setdefault("_cl_kernels", {})
        key = str(device)
        if key not in kernels:
            made = tape_compiler.optimise(self.tape, self.inputs, self.outputs)
            tape, ins, outs = made if made is not None else (self.tape, self.inputs,
                                                             self.outputs)
            kernels[key] = ReplayKernel(tape._arrays(), ins, outs[0], device)
        return kernels[key]

    def _opencl(self, X: NDArray[np.float64], device: Any, mode: str | None
                ) -> tuple[NDArray[np.float64], NDArray[np.float64], NDArray[np.bool_] | None]:
        """Values and gradients of every row by the generated OpenCL kernel, with the same
        branch handling as the C replay."""
        mode = self._branch_mode(mode)
        values, grads, changed = self._cl_kernel(device)(X)
        mask = changed if mode == "mask" else None
        if changed.any():
            rows = np.flatnonzero(changed)
            self._changed_rows(X, rows, mode)
            if mode == "retape":
                values[rows], grads[rows] = self.value_and_gradient(
                    X[rows], on_branch_change="retape")
            else:
                values[rows] = np.nan
                grads[rows] = np.nan
        return values, grads, mask

    def _opencl_resident(self, X: Any, device: Any, mode: str | None) -> Any:
        """``gradient`` of a device array X: the results stay on the device (see
        ``gradient``); only rows whose branch changed travel, and only for "raise" (one
        row, to name the guard) and "retape" (re-recorded on the host, written back)."""
        mode = self._branch_mode(mode)
        if device is not None and not str(getattr(device, "kind", device)).startswith(
                "opencl"):
            raise ValueError(f"a pyopencl array is replayed on OpenCL, not on {device!r}")
        kernel = self._cl_kernel("opencl" if device is None else device)
        _, grads, changed, any_changed = kernel.run(X, nan_on_change=mode == "mask")
        G = grads.T if X.ndim == 2 else grads.reshape(grads.shape[0])
        if mode == "mask":
            mask = changed.get().astype(bool)
            return (G, mask) if X.ndim == 2 else (G, bool(mask[0]))
        if any_changed:
            rows = np.flatnonzero(changed.get())
            host = X.get() if X.flags.forc else X.copy().get()
            host = host.reshape(-1, self.n_inputs)
            self._changed_rows(host, rows, mode)
            fixed = grads.get()
            fixed[:, rows] = self.gradient(host[rows], on_branch_change="retape").T
            grads.set(fixed)
        return G

    def _changed_rows(self, X: NDArray[np.float64], rows: NDArray[np.intp], mode: str) -> None:
        # the rows of X whose branch changed on OpenCL: "raise" names the guard by the VM
        if mode == "raise":
            self._run(_VALUE, X[rows[:1]], "raise", "gradient", ())
            raise BranchChangedError(f"replaying at row {int(rows[0])} takes another "
                                     f"branch than recorded")
