"""``Function.compile`` (the tape rendered to C by ``easyad.compiler.tape`` and loaded)
and ``Function.bind_gradient`` (arrays bound once, the compiled code called straight from
C). A mixin of ``Function`` (``easyad/replay.py``): what compiling chooses (which Hessian
seeds go into the shared object) is kept beside the call that uses it.
"""
from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

import numpy as np
from numpy.typing import NDArray

from easyad import _arrays, _core
from easyad.recorded.rows import Rows

if TYPE_CHECKING:
    from easyad.replay import Function

_COMPILED_DENSE_HESSIAN = 64  # compile(hessian=True) without a sparse colouring: up to
                              # this many inputs (one sweep of n directions), else the VM


class Compiling(Rows):
    """Native code for ``Function`` (see the module docstring)."""

    def compile(self, *, optimise: bool = False, hessian: bool = False) -> Function:
        """Compile this Function to native code; return it (now compiled).

        The recorded program, as the VM lays it out, is rendered to C as a straight-line
        program (values, then the adjoints in the VM's order, the rule table's math from
        ``_helpers.h``; affine runs as loops the compiler vectorises) and compiled with the
        C compiler found at run time (``$CC``, else the one Python was built with). The
        shared object is cached on disk (``$EASYAD_CACHE_DIR/compiled``, else
        ``~/.cache/easyad/compiled``: a private folder; a file is loaded only when its
        sha256 matches the one written beside it), keyed by a hash of the C source, its
        headers, the compiler and its flags, so a second process loads it without
        compiling.

        Values, gradients and ``value_and_gradient``, for one point or a batch (rows split
        over threads, without the GIL), then run the compiled code; with ``hessian=True``
        the one-point ``hessian`` and ``hvp`` too (the VM's forward-over-reverse sweep
        rendered to C in the same shared object, the Hessian's seed directions, from its
        sparsity colouring, compiled in; a longer compile). Jacobians of several outputs
        and batches of Hessians stay in the VM. Results are the VM's, bit for bit: a
        point where a guarded comparison comes out differently, or an entry fails (``log``
        of a negative number...), is handed to the VM, which raises, re-records or masks as
        ``on_branch_change`` says. Without a working compiler (or cache) this warns once
        (``ad.CompilerWarning``) and the VM goes on; a tape with user primitives
        (``ad.primitive``) is not compiled (silently: the VM runs it). ``F.compiled`` says
        whether compiled code is in use.

        With ``optimise=True`` the program is first optimised (constants folded, common
        subexpressions shared, exact identities such as ``x * 1``, dead entries dropped):
        values stay the same bit for bit, but gradients may differ from the VM's in the
        last bits, since adjoints are then summed in another order (a shared entry adds
        its consumers' adjoints before multiplying by its partials).

        Examples
        --------
        >>> import numpy as np, warnings, easyad as ad
        >>> F = ad.record(lambda x: x[0] ** 2 * x[1] + ad.sin(x[1]), [1.0, 2.0])
        >>> with warnings.catch_warnings():
        ...     warnings.simplefilter("ignore", ad.CompilerWarning)  # no compiler: the VM
        ...     F = F.compile()
        >>> F.gradient(np.array([3.0, 0.0]))
        array([ 0., 10.])
        """
        old = self._compile_args    # kept for pickles (even where no compiler is found)
        self._compile_args = (bool(optimise) or bool(old and old[0]),
                              bool(hessian) or bool(old and old[1]))
        if self._native is None or (hessian and self.scalar
                                    and not self._native.second_order):
            from easyad.compiler import tape as tape_compiler
            seeds = None
            hvp = False
            if hessian and self.scalar:
                plan = self._hessian_plan()
                n = self.n_inputs
                if self._second() is not None:
                    # Hessians by the second-order program (compiled below); the sweeps
                    # compiled for the HVP alone (their Hessian is left to the VM)
                    hvp = True
                    self._native_map = (np.zeros(0, dtype=np.int64),) * 2
                elif plan is not None:
                    seeds, self._native_map = plan[3], (plan[4], plan[5])
                elif n <= _COMPILED_DENSE_HESSIAN:
                    seeds = np.eye(n)
                    every = np.arange(n * n, dtype=np.int64)
                    rows, cols = np.divmod(every, n)   # the upper triangle, mirrored
                    self._native_map = (every, np.minimum(rows, cols) * n
                                        + np.maximum(rows, cols))
            made = tape_compiler.native(self.tape, self.inputs, self.outputs,
                                        optimised=optimise, seeds=seeds, hvp=hvp)
            if made is not None or self._native is None:
                self._native = made
        if hessian and self.scalar and self._native is not None:
            self._hessian_calls += 1     # hessian() uses the program from the first call on
            second = self._second()      # the Hessian's own program, compiled too
            if second is not None and second[1] is None:
                from easyad.compiler import tape as tape_compiler
                tape, ins, outs = second[3]
                second[1] = tape_compiler.native(tape, tuple(ins), tuple(outs),
                                                 gradient=False)
        return self

    def bind_gradient(self, x: NDArray[np.float64], g: NDArray[np.float64],
                      value: NDArray[np.float64] | None = None) -> Callable[[], None]:
        """A call with no arguments that writes the gradient at the current contents of x
        into g (and the value into value[0]): arrays bound once, like CasADi's
        ``Function.buffer()``. For a compiled Function the call goes straight to the
        compiled code (no checks, no allocation, no Python in between); a point where a
        branch changes or an entry fails, anomaly mode, or a Function not compiled, goes
        through ``value_and_gradient`` (raising or re-recording as ``on_branch_change``
        says; "mask" writes NaN). x, g: C-contiguous, aligned, native float64 (n,), value
        (1,), none sharing memory (anything else raises here: bound arrays are not
        converted); keep them alive and write x in place (``x[:] = ...``) between calls.

        Examples
        --------
        >>> import numpy as np, easyad as ad
        >>> F = ad.record(lambda x: x[0] ** 2 * x[1], [1.0, 2.0])
        >>> x, g = np.array([3.0, 1.0]), np.empty(2)
        >>> call = F.bind_gradient(x, g)
        >>> call(); g
        array([6., 9.])
        >>> x[:] = [1.0, 1.0]; call(); g
        array([2., 1.])
        """
        self._need_scalar("bind_gradient")
        _arrays.bound_array(x, self.n_inputs, "x", writable=False)
        _arrays.bound_array(g, self.n_inputs, "g", writable=True)
        if value is not None:
            _arrays.bound_array(value, 1, "value", writable=True)

        def fallback() -> None:
            result = self.value_and_gradient(x)
            if self.on_branch_change == "mask":
                result = result[0]
            if value is not None:
                value[0] = result[0]
            g[:] = result[1]

        return _core._BoundGradient(self._native, x, g, value, fallback, self._replayer)

    @property
    def compiled(self) -> bool:
        """Whether values and gradients run compiled code (see ``compile``)."""
        return self._native is not None
