"""Hessians and Hessian-vector products of a scalar ``Function``: the sparsity pattern and
its colouring (``_sparsity``: star, or a partition of columns where that needs as few),
the Hessian's own second-order program (``compiler.tape.second_order_arrays``) and the
forward-over-reverse sweeps of the VM.
A mixin of ``Function`` (``easyad/replay.py``): the five routes to a Hessian and the
caches they share are one concern, apart from first-order evaluation.
"""
from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
from numpy.typing import ArrayLike, NDArray

from easyad import _arrays, _core, distributed
from easyad.distributed import is_dask_array
from easyad.recorded.rows import _SECOND, Rows

_HESSIAN_BLOCK = 16  # directions per forward-over-reverse sweep


class Hessians(Rows):
    """The second-order methods of ``Function`` (see the module docstring)."""

    def hessian(self, x: ArrayLike, *, on_branch_change: str | None = None,
                sparse: bool = False, out: NDArray[np.float64] | None = None,
                format: str | None = None) -> Any:
        """The Hessian (n, n) of a scalar function at x; (B, n, n) for a batch.

        ``sparse=True``: only the structurally non-zero entries, (nnz,) ((B, nnz) for a
        batch), in the order of ``hessian_pattern()`` (rows, then columns: for a
        symmetric matrix the order of CasADi's column-major nonzeros too). ``out``: an
        array of the result's shape to write it into (returned; with ``sparse=True`` at one
        point, no allocation at all).

        One point is computed, from the second one-point call on (or after
        ``bind_hessian`` or ``compile(hessian=True)``), by the Hessian's own program
        (``second_order_arrays.program``, the construction of
        easyad/compiler/tape/second_order.py written in C:
        forward-over-reverse done once, symbolically, simplified, over the nonzeros only;
        compiled by ``compile(hessian=True)``); the first call, batches, a point where
        that program flags something or gives a non-finite entry, and functions it cannot
        express (selects, abs, maximum, minimum, user primitives), by forward-over-reverse
        sweeps (blocks of directions per sweep). The two do the same operations in the same
        order: every route gives the same numbers (NaN and infinities too; the sign of a
        zero aside), and the same symmetric matrix (``H[c, r]`` is ``H[r, c]``, r <= c).

        ``format`` (with ``sparse=True``; not with ``out``): "csr", "csc", "coo"
        (scipy.sparse), "triplets" ((rows, cols, values)) or "values" (the default);
        a list for a batch (docs/sparse.md)."""
        # an ndarray first: the one-point fast path pays for no other test (a dask array
        # is never an ndarray; format= and a function that is not scalar go on below)
        if type(x) is np.ndarray:
            if format is None and on_branch_change is None and self.scalar \
                    and self.on_branch_change != "mask":
                # one point: the second-order program, built from the second one-point
                # call on (a one-off Hessian, ad.hessian, costs less by the sweeps than
                # building the program)
                if self._hessian_calls:
                    try:
                        second = self._second_cache     # built: no call of _second
                    except AttributeError:
                        second = self._second()
                else:
                    second = None
                self._hessian_calls += 1
                if second is not None:
                    program, native, target, _, source = second
                    # C writes into out only where its gate finds it a native float64
                    # vector of nnz, writable; any other out is checked below, then
                    # written converted
                    into = out if sparse and type(out) is np.ndarray else None
                    where = None if sparse else target
                    H1 = native.second_point(x, source, where, into) \
                        if native is not None else None
                    if H1 is None:
                        H1 = program.second_point(x, source, where, into)
                    if H1 is not None:
                        if out is not None and H1 is not out:
                            _arrays.out_array(out, self._hessian_shape(sparse))
                            return _arrays.write_out(out, H1)
                        return H1
        elif is_dask_array(x):
            if sparse or out is not None or format is not None:
                raise ValueError("sparse=, out= and format= are for numpy batches, not a "
                                 "dask array")
            return distributed.batch(self, "hessian", x, None, on_branch_change)
        self._need_scalar("hessian")
        if format is not None:
            return self._hessian_formatted(x, on_branch_change, sparse, out, format)
        if out is not None:         # checked before the sweeps run
            _arrays.out_array(out, self._result_shape(x, self._hessian_shape(sparse)))
        result = self._hessian_sparse(x, on_branch_change) if sparse else None
        if result is None:
            result = self._hessian_dense(x, on_branch_change)
            if sparse:       # dense (no plan) or compiled: the nonzeros picked out
                rows, cols = self.hessian_pattern()
                if isinstance(result, tuple):
                    result = (result[0][..., rows, cols], result[1])
                else:
                    result = result[..., rows, cols]
        if out is not None:
            if isinstance(result, tuple):
                return _arrays.write_out(out, result[0]), result[1]
            return _arrays.write_out(out, result)
        return result

    def _hessian_formatted(self, x: ArrayLike, on_branch_change: str | None, sparse: bool,
                           out: Any, format: str) -> Any:
        """hessian(x, sparse=True, format=...): the nonzeros as scipy.sparse or triplets."""
        from easyad.recorded.sparse_jacobians import check_format, shaped
        format = check_format(format, "values")
        if not sparse or out is not None:
            raise ValueError("format= is for sparse results without out=: pass "
                             "sparse=True and no out")
        got = self.hessian(x, on_branch_change=on_branch_change, sparse=True)
        values, mask = got if isinstance(got, tuple) else (got, None)
        rows, cols, _ = self._pattern()
        shape = (self.n_inputs, self.n_inputs)
        if np.ndim(values) == 2:
            result = values if format == "values" else \
                [shaped(v, rows, cols, shape, format) for v in values]
        else:
            result = shaped(values, rows, cols, shape, format)
        return result if mask is None else (result, mask)

    def hessian_colouring(self) -> tuple[int, int]:
        """(colours of a partition of the Hessian's columns, colours of a star colouring)
        of the Hessian's pattern. The sweeps and the Hessian's program use the star
        colouring where it needs fewer colours (an arrowhead: 2 against n; a band with a
        dense border: a few against n; a plain band: as many), the partition otherwise:
        one forward-over-reverse sweep per colour either way, and every entry read
        directly from the compressed H @ S, H[r, c] and H[c, r] from one place
        (``_sparsity.symmetric_sources``).

        >>> import numpy as np, easyad as ad
        >>> F = ad.record(lambda x: x[0] * np.sum(x[1:] ** 2), np.ones(6))   # an arrowhead
        >>> F.hessian_colouring()
        (6, 2)
        """
        self._pattern()
        return self._colourings

    def _hessian_shape(self, sparse: bool) -> tuple[int, ...]:
        """The shape of one point's Hessian: (nnz,) sparse, else (n, n)."""
        n = self.n_inputs
        return (len(self._pattern()[0]),) if sparse else (n, n)

    def hessian_pattern(self, format: str | None = None) -> Any:
        """(rows, cols) of the Hessian's structurally non-zero entries, row by row (every
        entry where the sparsity is not found): the order of ``hessian(x, sparse=True)``;
        with ``format`` "csr", "csc" or "coo" a scipy.sparse matrix of ones."""
        from easyad.recorded.sparse_jacobians import pattern_as
        rows, cols, _ = self._pattern()
        return pattern_as(rows, cols, (self.n_inputs, self.n_inputs), format)

    def _pattern(self) -> tuple[NDArray[np.intp], NDArray[np.intp], NDArray[np.intp]]:
        """(rows, cols, colour of each input), found once: the colouring the sweeps and
        the second-order program use (see ``hessian_colouring``)."""
        if not hasattr(self, "_pattern_cache"):
            from easyad import _sparsity
            n = self.n_inputs
            pattern = _sparsity.hessian_pattern(self.tape._arrays(), self.inputs,
                                                self.outputs[0])
            self._pattern_found = pattern is not None
            if pattern is None:      # dense: every entry, one colour per column
                rows, cols = np.divmod(np.arange(n * n, dtype=np.intp), n)
                colour = np.arange(n, dtype=np.intp)
                self._colourings = (n, n)
            else:
                rows, cols = pattern
                colour = _sparsity.colour_columns(n, rows, cols)
                star = _sparsity.star_colouring(n, rows, cols)
                self._colourings = (int(colour.max()) + 1 if n else 0,
                                    int(star.max()) + 1 if n else 0)
                if self._colourings[1] < self._colourings[0]:
                    colour = star
            self._pattern_cache = (rows, cols, colour)
        return self._pattern_cache

    def _hessian_sources(self) -> tuple[NDArray[np.intp], NDArray[np.intp]]:
        """Per pattern entry, (input, colour) of the compressed H @ S it is read from."""
        if not hasattr(self, "_sources_cache"):
            from easyad import _sparsity
            rows, cols, colour = self._pattern()
            self._sources_cache = _sparsity.symmetric_sources(self.n_inputs, rows, cols,
                                                              colour)
        return self._sources_cache

    def bind_hessian(self, x: NDArray[np.float64], h: NDArray[np.float64]
                     ) -> Callable[[], None]:
        """A call with no arguments that writes the Hessian's nonzeros at the current
        contents of x into h (the order of ``hessian_pattern()``, as
        ``hessian(x, sparse=True)``): arrays bound once, like CasADi's
        ``Function.buffer()``. The call runs the Hessian's own program (compiled by
        ``compile(hessian=True)``, else in the VM) straight from C; a point it flags (a
        changed branch, a failed entry), a nonzero that is not finite there, anomaly mode,
        or a function that program cannot express, goes through ``hessian`` (which raises,
        re-records or masks as ``on_branch_change`` says; "mask" writes NaN). x: C-contiguous,
        aligned, native float64 (n,), h (nnz,) writable, not sharing memory (anything else
        raises here); write x in place between calls.

        Examples
        --------
        >>> import numpy as np, easyad as ad
        >>> F = ad.record(lambda x: x[0] ** 2 * x[1], [1.0, 2.0])
        >>> x, h = np.array([3.0, 1.0]), np.empty(4)
        >>> F.hessian_pattern()
        (array([0, 0, 1, 1]), array([0, 1, 0, 1]))
        >>> call = F.bind_hessian(x, h)
        >>> call(); h
        array([2., 6., 6., 0.])
        """
        self._need_scalar("bind_hessian")
        _arrays.bound_array(x, self.n_inputs, "x", writable=False)
        _arrays.bound_array(h, len(self._pattern()[0]), "h", writable=True)

        def fallback() -> None:
            result = self.hessian(x, sparse=True)
            h[:] = result[0] if isinstance(result, tuple) else result

        second = self._second()
        self._hessian_calls += 1         # hessian() now uses the program too
        if second is None:
            return fallback
        return _core._BoundSecond(second[1], second[0], x, h, second[4], fallback)

    def _second(self) -> list[Any] | None:
        """[VM of the second-order program, its compiled code or None, flat indices of the
        nonzeros (int64), (tape, inputs, outputs), the output of each nonzero (int64)],
        built once; None where there is none."""
        if not hasattr(self, "_second_cache"):
            from easyad.compiler.tape import second_order_arrays
            made = None
            if not self.tape._customs_count():
                rows, cols, colour = self._pattern()
                order = self._replayer._layout()["original"]   # the sweeps' order
                program = second_order_arrays.program(
                    self.tape, self.inputs, self.outputs[0], rows, cols, colour, order,
                    self._hessian_sources())
                if program is not None:
                    # the program computes the upper triangle: H[r, c] is output k of the
                    # k-th (r <= c) pair, H[c, r] the same
                    # (keys of the pattern's order, sorted: no (n, n) array of numbers)
                    n = self.n_inputs
                    keys = (rows * n + cols).astype(np.int64)
                    upper_keys = keys[rows <= cols]
                    number = np.arange(len(upper_keys), dtype=np.int64)
                    if len(upper_keys) > 1 and not (np.diff(upper_keys) > 0).all():
                        number = np.argsort(upper_keys, kind="stable")
                        upper_keys = upper_keys[number]
                    source = number[np.searchsorted(
                        upper_keys, np.minimum(rows, cols).astype(np.int64) * n
                        + np.maximum(rows, cols))]
                    made = [_core._Replayer(*program), None,
                            (rows * self.n_inputs + cols).astype(np.int64), program,
                            np.ascontiguousarray(source, dtype=np.int64)]
            self._second_cache = made
        return self._second_cache

    def _hessian_dense(self, x: ArrayLike, on_branch_change: str | None) -> Any:
        """The Hessian by the sweeps (see hessian)."""
        plan = self._hessian_plan()
        native = self._native
        if native is not None and native.second_order and on_branch_change is None \
                and self.on_branch_change != "mask" and type(x) is np.ndarray:
            H1 = native.hessian_point(x, *self._native_map)   # compiled (hessian=True)
            if H1 is not None:
                return H1
        if plan is not None and on_branch_change is None and self.on_branch_change != "mask" \
                and type(x) is np.ndarray:  # one point: one C call
            H1 = self._replayer.hessian_point(x, plan[3], plan[4], plan[5])
            if H1 is not None:
                return H1
        X, batch = self._rows(x)
        n = self.n_inputs
        if plan is None:  # dense: every direction, in blocks
            H = np.empty((X.shape[0], n, n))
            mask = None
            for start in range(0, n, _HESSIAN_BLOCK):
                stop = min(n, start + _HESSIAN_BLOCK)
                seeds = np.zeros((1, n, stop - start))
                seeds[0, np.arange(start, stop), np.arange(stop - start)] = 1.0
                _, _, H[:, :, start:stop], mask = self._run(_SECOND, X, on_branch_change,
                                                             "hessian", (seeds,))
            below = np.tril_indices(n, -1)    # the upper triangle, mirrored (see _plan)
            H[:, below[0], below[1]] = H[:, below[1], below[0]]
            return self._masked(H if batch else H[0], mask, batch)
        # sparse: one sweep direction per colour, then direct recovery
        seeds, target, source = plan[:3]
        _, _, compressed, mask = self._run(_SECOND, X, on_branch_change, "hessian", (seeds,))
        B = X.shape[0]
        H = np.zeros((B, n, n))
        H.reshape(B, n * n)[:, target] = compressed.reshape(B, -1)[:, source]
        if mask is not None:
            H[mask] = np.nan
        return self._masked(H if batch else H[0], mask, batch)

    def _hessian_sparse(self, x: ArrayLike, on_branch_change: str | None) -> Any:
        """The nonzeros by the sweeps, one per colour, read straight from the compressed
        H @ S (no (n, n) array): one C call at one point, else the batch sweeps. None
        where there is no plan (dense) or the compiled Hessian should answer."""
        plan = self._hessian_plan()
        native = self._native
        if plan is None or (native is not None and native.second_order):
            return None
        if on_branch_change is None and self.on_branch_change != "mask" \
                and type(x) is np.ndarray:      # one point: one C call
            h = self._replayer.hessian_point(x, plan[3], plan[4], plan[5], True)
            if h is not None:
                return h
        X, batch = self._rows(x)
        _, _, compressed, mask = self._run(_SECOND, X, on_branch_change, "hessian",
                                           (plan[0],))
        values = compressed.reshape(X.shape[0], -1)[:, plan[2]]
        if mask is not None:
            values[mask] = np.nan
        return self._masked(values if batch else values[0], mask, batch)

    def _hessian_plan(self) -> tuple[Any, ...] | None:
        """The Hessian's sparsity and colouring (star or a partition of columns, whichever
        needs fewer), found once (None: go dense)."""
        if not hasattr(self, "_plan"):
            n = self.n_inputs
            rows, cols, colour = self._pattern()
            colours = int(colour.max()) + 1 if n else 0
            plan = None
            if self._pattern_found and colours < n:
                seeds = np.zeros((1, n, colours))
                seeds[0, np.arange(n), colour] = 1.0
                # H[r, c] is entry (source row, source colour) of the compressed
                # H @ seeds, one place for both (r, c) and (c, r): the two sweeps round
                # (and overflow) differently, the Hessian is symmetric, and the
                # second-order program computes those same places, with the same
                # operations. The last three: the same, as the one-point C path takes them
                src_row, src_colour = self._hessian_sources()
                target, source = rows * n + cols, src_row * colours + src_colour
                plan = (seeds, target, source, np.ascontiguousarray(seeds[0]),
                        target.astype(np.int64), source.astype(np.int64))
            self._plan = plan
        return self._plan

    def hvp(self, x: ArrayLike, v: ArrayLike, *, on_branch_change: str | None = None) -> Any:
        """The Hessian-vector product H(x) v without forming H (one sweep); v is (n,) or
        one direction per row (B, n)."""
        if type(x) is not np.ndarray and is_dask_array(x):   # (an ndarray: no call)
            return distributed.batch(self, "hvp", x, v, on_branch_change)
        native = self._native
        if native is not None and native.second_order and type(x) is np.ndarray \
                and type(v) is np.ndarray and on_branch_change is None \
                and self.on_branch_change != "mask":   # one point, compiled: one C call
            product = native.hvp_point(x, v)
            if product is not None:
                return product
        self._need_scalar("hvp")
        X, batch = self._rows(x)
        V = _arrays.real_array(v, "v")
        if V.shape not in ((self.n_inputs,), (X.shape[0], self.n_inputs)):
            raise ValueError(f"v must have shape ({self.n_inputs},) or "
                             f"({X.shape[0]}, {self.n_inputs}), got {V.shape}")
        seeds = np.ascontiguousarray(V.reshape(-1, self.n_inputs, 1))
        _, _, second, mask = self._run(_SECOND, X, on_branch_change, "hvp", (seeds,))
        out = second[:, :, 0]
        return self._masked(out if batch else out[0], mask, batch)
