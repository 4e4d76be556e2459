"""Sparse Jacobians of a ``Function``: the pattern read off the tape (``_sparsity``), a
partition of its columns and of its rows, and the compressed evaluation, by the
Jacobian's own program (``compiler.tape.sparse_jacobian``: forward mode over the column
colours done once, symbolically, replayed by the VM or compiled) or by sweeps, one per
colour (forward-over-reverse along each column colour's seed, or one reverse sweep per
row colour, whichever needs fewer), with results as ``scipy.sparse`` or triplets. A
mixin of ``Function`` (``easyad/replay.py``): sparse Jacobians are one concern, with
their own caches, apart from dense evaluation.
"""
from __future__ import annotations

from typing import Any, NamedTuple

import numpy as np
from numpy.typing import ArrayLike, NDArray

from easyad import _arrays, _core
from easyad.recorded.rows import _SECOND, Rows

FORMATS = ("csr", "csc", "coo", "triplets", "values")


class Colouring(NamedTuple):
    """How a sparse Jacobian is compressed (``Function.jacobian_colouring()``).

    ``mode``: "forward" (columns of one colour share a sweep) or "reverse" (rows);
    ``colours``: the sweeps per point (the fewer of the two partitions); ``columns`` and
    ``rows``: the colours each partition needs (``rows`` None where it would need more
    than ``columns``: it stopped early); ``colour``: the chosen partition's colour of each
    column (forward) or row (reverse); ``lower_bound``: the most non-zeros of a row
    (forward) or column (reverse), which any partition of that side needs."""

    mode: str
    colours: int
    columns: int
    rows: int | None
    colour: NDArray[np.intp]
    lower_bound: int


def check_format(format: str | None, default: str) -> str:
    """format, or the default; a clear error for an unknown one."""
    if format is None:
        return default
    if format not in FORMATS:
        raise ValueError(f"format must be one of {FORMATS}, got {format!r}")
    return format


def shaped(values: NDArray[np.float64], rows: NDArray[np.intp], cols: NDArray[np.intp],
           shape: tuple[int, int], format: str) -> Any:
    """The nonzeros of one point (nnz,) in ``format``: a scipy.sparse csr/csc/coo matrix,
    (rows, cols, values), or the values alone (the pattern's order)."""
    if format == "values":
        return values
    if format == "triplets":
        return rows.copy(), cols.copy(), values
    import scipy.sparse
    matrix = scipy.sparse.coo_matrix((values, (rows, cols)), shape=shape)
    # duplicates cannot occur (the pattern is a set): converting sums nothing
    return matrix if format == "coo" else matrix.asformat(format)


def pattern_as(rows: NDArray[np.intp], cols: NDArray[np.intp], shape: tuple[int, int],
               format: str | None) -> Any:
    """A pattern as (rows, cols) (format None) or a scipy.sparse matrix of ones."""
    if format is None:
        return rows.copy(), cols.copy()
    if format not in ("csr", "csc", "coo"):
        raise ValueError(f"a pattern's format is None (rows, cols), 'csr', 'csc' or 'coo', "
                         f"got {format!r}")
    import scipy.sparse
    ones = np.ones(len(rows), dtype=np.int8)
    return scipy.sparse.coo_matrix((ones, (rows, cols)), shape=shape).asformat(format)


class SparseJacobians(Rows):
    """The sparse-Jacobian methods of ``Function`` (see the module docstring)."""

    def jacobian_pattern(self, format: str | None = None) -> Any:
        """The Jacobian's structurally non-zero entries, exact from the tape (index sets
        propagated over the recorded program, not sampled values): (rows, cols) row by
        row, or with ``format`` "csr", "csc", "coo" a scipy.sparse matrix of ones (m, n).
        A select counts both its operands (the pattern holds on either side of
        ``ad.where``); guards do not change it (where replay takes another branch,
        ``on_branch_change`` decides, as everywhere). A tape with tensor nodes has every
        entry in its pattern.

        >>> import easyad as ad
        >>> F = ad.record(lambda x: [x[0] * x[1], ad.sin(x[2])], [1.0, 2.0, 3.0])
        >>> F.jacobian_pattern()
        (array([0, 0, 1]), array([0, 1, 2]))
        """
        rows, cols = self._jacobian_pattern()
        return pattern_as(rows, cols, (self.n_outputs, self.n_inputs), format)

    def _jacobian_pattern(self) -> tuple[NDArray[np.intp], NDArray[np.intp]]:
        if not hasattr(self, "_jacobian_pattern_cache"):
            from easyad import _sparsity
            arrays = self.tape._arrays()
            # the index sets, kept for the Jacobian's program (built from them too)
            self._dependencies = _sparsity.dependencies(arrays, self.inputs, self.outputs) \
                if self.outputs else None
            pattern = _sparsity.jacobian_pattern(arrays, self.inputs, self.outputs,
                                                 self._dependencies)
            if pattern is None:       # tensor nodes: every entry
                rows, cols = np.divmod(np.arange(self.n_outputs * self.n_inputs,
                                                 dtype=np.intp), self.n_inputs)
                pattern = (rows, cols)
            self._jacobian_pattern_cache = pattern
        return self._jacobian_pattern_cache

    def jacobian_colouring(self) -> Colouring:
        """The partition of the Jacobian's columns and of its rows (greedy distance-2
        colourings, largest first, as ColPack's), and the side chosen: the one with
        fewer colours, columns on a tie (see ``Colouring``). Found once.

        >>> import numpy as np, easyad as ad
        >>> n = 50   # a tridiagonal residual: 3 colours whatever n is
        >>> F = ad.record(lambda u: [u[i - 1] - 2 * u[i] + u[i + 1] + u[i] ** 3
        ...                          for i in range(1, n - 1)], np.ones(n))
        >>> c = F.jacobian_colouring(); (c.mode, c.colours, c.lower_bound)
        ('forward', 3, 3)
        """
        if not hasattr(self, "_colouring_cache"):
            from easyad import _sparsity
            rows, cols = self._jacobian_pattern()
            m, n = self.n_outputs, self.n_inputs
            by_column = _sparsity.colour_partition(rows, cols, (m, n))
            assert by_column is not None
            K = int(by_column.max()) + 1 if n else 0
            by_row = _sparsity.colour_partition(cols, rows, (n, m), limit=K)
            R = None if by_row is None else (int(by_row.max()) + 1 if m else 0)
            worst_row = int(np.bincount(rows, minlength=1).max()) if len(rows) else 0
            worst_col = int(np.bincount(cols, minlength=1).max()) if len(cols) else 0
            if R is not None and R < K:
                assert by_row is not None
                self._colouring_cache = Colouring("reverse", R, K, R, by_row, worst_col)
            else:
                self._colouring_cache = Colouring("forward", K, K, R, by_column, worst_row)
        return self._colouring_cache

    def _sparse_jacobian(self, x: ArrayLike, on_branch_change: str | None,
                         format: str | None) -> Any:
        """jacobian(x, sparse=True): see Function.jacobian."""
        format = check_format(format, "csr")
        rows, cols = self._jacobian_pattern()
        shape = (self.n_outputs, self.n_inputs)
        mode = self.on_branch_change if on_branch_change is None else on_branch_change
        self._branch_mode(mode)
        X, batch = self._rows(x)
        values = self._nonzeros(X, on_branch_change, mode)
        mask = None
        if isinstance(values, tuple):
            values, mask = values
        if batch:
            result = values if format == "values" else \
                [shaped(v, rows, cols, shape, format) for v in values]
        else:
            result = shaped(values[0], rows, cols, shape, format)
        return self._masked(result, mask, batch)

    def _nonzeros(self, X: NDArray[np.float64], on_branch_change: str | None,
                  mode: str) -> Any:
        """The nonzeros (B, nnz) at every row of X, (values, mask) in mask mode: by the
        Jacobian's program where it has one and its numbers are finite, else (rows it
        flags, points where it fails) by the compressed sweeps."""
        program = self._jacobian_program()
        nnz = len(self._jacobian_pattern()[0])
        if program is not None and on_branch_change is None and mode != "mask" \
                and X.shape[0] == 1:        # one point: one C call
            source = self._jacobian_source
            got = program._native.second_point(X[0], source, None, None) \
                if program._native is not None else None
            if got is None:       # (None also where a nonzero is not finite)
                got = program._replayer.second_point(X[0], source, None, None)
            if got is not None:
                return got[None, :]
        todo = np.ones(X.shape[0], dtype=bool)
        out = np.empty((X.shape[0], nnz))
        if program is not None:
            try:
                values, flagged = program(X, on_branch_change="mask")
                out[:] = values[:, :nnz]
                todo = flagged | ~np.all(np.isfinite(out), axis=1)
            except (ArithmeticError, ValueError):
                pass        # an entry fails somewhere: the sweeps name it and raise
        if not todo.any():
            return (out, np.zeros(X.shape[0], dtype=bool)) if mode == "mask" else out
        got = self._swept(X[todo], on_branch_change)
        if isinstance(got, tuple):
            out[todo], changed = got
            mask = np.zeros(X.shape[0], dtype=bool)
            mask[todo] = changed
            return out, mask
        out[todo] = got
        return (out, np.zeros(X.shape[0], dtype=bool)) if mode == "mask" else out

    def _swept(self, X: NDArray[np.float64], on_branch_change: str | None) -> Any:
        """The nonzeros at the rows of X by sweeps, one per colour: forward-over-reverse
        of sum_r w_r y_r along each column colour's seed (the w part of H (s, 0) is J s),
        or one reverse sweep of each row colour's sum of outputs; the whole dense
        Jacobian where neither can be built (user primitives). A row where a branch
        changes or an entry fails is the dense ``jacobian``'s, which raises, re-records
        or masks as ``on_branch_change`` says."""
        rows, cols = self._jacobian_pattern()
        sweeps = self._jacobian_sweeps()
        if sweeps is None:
            got = self.jacobian(X, on_branch_change=on_branch_change)
            if isinstance(got, tuple):
                return got[0][:, rows, cols], got[1]
            return got[:, rows, cols]
        c = self.jacobian_colouring()
        G, seeds = sweeps
        n, m = self.n_inputs, self.n_outputs
        B = X.shape[0]
        if c.mode == "forward":
            XW = np.concatenate([X, np.zeros((B, m))], axis=1)
            _, _, second, flagged = G._run(_SECOND, XW, "mask", "jacobian", (seeds,))
            compressed = second[:, n:, :]           # (B, m, K): J S
            out = compressed[:, rows, c.colour[cols]]
        else:
            compressed, flagged = G.jacobian(X, on_branch_change="mask")   # (B, K, n): S^T J
            out = compressed[:, c.colour[rows], cols]
        bad = np.flatnonzero(flagged | ~np.all(np.isfinite(out), axis=1))
        if len(bad) == 0:
            return out
        again = self.jacobian(X[bad], on_branch_change=on_branch_change)
        if isinstance(again, tuple):
            out[bad] = again[0][:, rows, cols]
            mask = np.zeros(B, dtype=bool)
            mask[bad] = again[1]
            return out, mask
        out[bad] = again[:, rows, cols]
        return out

    def _jacobian_program(self) -> Any:
        """The Function of the Jacobian's nonzeros (then its error-checked values), built
        once, compiled where this Function is; None where it has no such program."""
        if not hasattr(self, "_jacobian_program_cache"):
            from easyad import _sparsity
            from easyad.compiler.tape import sparse_jacobian
            made = None
            if not self.tape._customs_count() and len(self._jacobian_pattern()[0]):
                rows, cols = self._jacobian_pattern()
                colour = self._column_colour()
                with _sparsity.no_cyclic_gc():
                    program = sparse_jacobian.jacobian_program(
                        self.tape, self.inputs, self.outputs, rows, cols, colour,
                        getattr(self, "_dependencies", None))
                if program is not None:
                    made = type(self)(program[0], program[1], program[2], scalar=False)
                    self._jacobian_source = np.arange(len(rows), dtype=np.int64)
            self._jacobian_program_cache = made
        made = self._jacobian_program_cache
        if made is not None and self._native is not None and made._native is None:
            from easyad.compiler.tape import native
            tape, ins, outs = made.tape, made.inputs, made.outputs
            made._native = native(tape, ins, outs, gradient=False)
        return made

    def _column_colour(self) -> NDArray[np.intp]:
        """The columns' partition (the program's colours, whichever side sweeps use)."""
        c = self.jacobian_colouring()
        if c.mode == "forward":
            return c.colour
        from easyad import _sparsity
        rows, cols = self._jacobian_pattern()
        colour = _sparsity.colour_partition(rows, cols, (self.n_outputs, self.n_inputs))
        assert colour is not None
        return colour

    def _jacobian_sweeps(self) -> tuple[Any, NDArray[np.float64] | None] | None:
        """(the Function the sweeps run, the seeds (1, n + m, K) for forward), built once:
        forward: sum_r w_r y_r over inputs (x, w); reverse: per row colour the sum of its
        outputs. None with user primitives (a rebuilt tape cannot carry them)."""
        if not hasattr(self, "_sweeps_cache"):
            made = None
            if not self.tape._customs_count():
                made = self._build_sweeps()
            self._sweeps_cache = made
        return self._sweeps_cache

    def _build_sweeps(self) -> tuple[Any, NDArray[np.float64] | None]:
        from easyad import _rules
        from easyad.compiler.tape.optimiser import rebuild_tape
        c = self.jacobian_colouring()
        a = self.tape._arrays()
        ops = a["ops"].tolist()
        args = (a["arg0"].tolist(), a["arg1"].tolist())
        values = a["values"].tolist()
        partials = (a["partial0"].tolist(), a["partial1"].tolist())

        def emit(op: int, x: int, y: int, value: float = 0.0) -> int:
            ops.append(op)
            args[0].append(x)
            args[1].append(y)
            values.append(value)
            partials[0].append(0.0)
            partials[1].append(0.0)
            return len(ops) - 1

        add, mul = _rules.OPCODES["add"], _rules.OPCODES["mul"]
        n, m = self.n_inputs, self.n_outputs
        if c.mode == "forward":
            weights = [emit(_rules.OP_VARIABLE, -1, -1) for _ in range(m)]
            total = -1
            for w, o in zip(weights, self.outputs):
                term = emit(mul, w, o)
                total = term if total < 0 else emit(add, total, term)
            if total < 0:
                total = emit(_rules.OP_VARIABLE, -1, -1)
            tape, ins, outs = rebuild_tape([True] * len(ops), ops, args, values, partials,
                                           [*self.inputs, *weights], [total])
            seeds = np.zeros((1, n + m, c.colours))
            seeds[0, np.arange(n), c.colour] = 1.0
            return type(self)(tape, ins, outs), seeds
        sums: list[int] = [-1] * c.colours
        for r, o in enumerate(self.outputs):
            k = int(c.colour[r])
            sums[k] = o if sums[k] < 0 else emit(add, sums[k], o)
        # an output alone in its colour is its own sum
        tape, ins, outs = rebuild_tape([True] * len(ops), ops, args, values, partials,
                                       list(self.inputs), sums)
        return type(self)(tape, ins, outs, scalar=False), None

    def bind_jacobian(self, x: NDArray[np.float64], values: NDArray[np.float64]) -> Any:
        """A call with no arguments that writes the Jacobian's nonzeros at the current
        contents of x into ``values`` (the order of ``jacobian_pattern()``), arrays bound
        once, like CasADi's ``Function.buffer()``: one C call of the Jacobian's program
        (compiled where this Function is). x: native float64 (n,), values (nnz,)
        writable; write x in place between calls. A point the program flags goes
        through ``jacobian(x, sparse=True)``."""
        nnz = len(self._jacobian_pattern()[0])
        _arrays.bound_array(x, self.n_inputs, "x", writable=False)
        _arrays.bound_array(values, nnz, "values", writable=True)
        program = self._jacobian_program()

        def slow() -> None:
            got = self._sparse_jacobian(x, None, "values")
            values[:] = got[0] if isinstance(got, tuple) else got

        if program is None:
            return slow
        source = np.arange(nnz, dtype=np.int64)
        return _core._BoundSecond(program._native, program._replayer, x, values, source,
                                  slow)
