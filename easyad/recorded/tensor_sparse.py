"""Sparse Jacobians and Hessians of a ``TensorFunction``: the pattern read off the
recorded tensor program (each slot's dependency on the elements of x as a sparse 0/1
matrix, propagated node by node), a partition of the rows (Jacobians: one VJP per colour)
or a star colouring (Hessians: one HVP per colour), and the compressed directions run as
one batch of the replay (one C loop without the GIL where the program fuses). A mixin of
``TensorFunction`` (``easyad/_recorded.py``): sparsity is one concern, apart from dense
evaluation.

Each node's rule: a map's output k reads the operands its expression names (broadcast);
strided views, reshapes, takes and assembles move elements; a reduction ORs the elements
it sums; a matmul ORs a row of one operand with a column of the other, skipping the
products with a constant operand's zero (a constant sparse matrix times x keeps its
pattern); guards read nothing. Any other node (linear layers, cross entropy, host calls,
table operations) counts every element of its outputs as depending on every element of
its inputs: never too few entries, possibly too many.
"""
from __future__ import annotations

from typing import Any

import numpy as np
import scipy.sparse as sp

from easyad import _expr, _trees
from easyad.recorded.sparse_jacobians import Colouring, check_format, pattern_as, shaped
from easyad.recorded.tensor_batches import TensorBatches
from easyad.recorded.tensor_recording import _on_host


def _size(shape: tuple[int, ...]) -> int:
    return int(np.prod(shape, dtype=int))


def _select(M: sp.csr_matrix, index: np.ndarray) -> sp.csr_matrix:
    return M[np.asarray(index, dtype=np.intp).ravel()]


def _gather(rows: np.ndarray, cols: np.ndarray, M: sp.csr_matrix, size: int
            ) -> sp.csr_matrix:
    """Output element rows[t] ORs input element cols[t]'s dependencies."""
    R = sp.csr_matrix((np.ones(len(rows), dtype=np.int8), (rows, cols)),
                      shape=(size, M.shape[0]))
    return _bool(R @ M)


def _bool(M: Any) -> sp.csr_matrix:
    M = sp.csr_matrix(M)
    M.data[:] = 1
    M.eliminate_zeros()
    return M.astype(np.int8)


def program_pattern(program: Any, inputs: int, outputs: list[int]) -> sp.csr_matrix:
    """The 0/1 matrix (total output elements, total elements of the first ``inputs``
    input slots) of which output elements depend on which input elements (see the
    module docstring for each node's rule)."""
    shapes = program.shapes
    n = sum(_size(shapes[s]) for s in program.inputs[:inputs])
    deps: dict[int, sp.csr_matrix] = {}
    start = 0
    for s in program.inputs[:inputs]:
        size = _size(shapes[s])
        deps[s] = sp.csr_matrix((np.ones(size, dtype=np.int8),
                                 (np.arange(size), np.arange(start, start + size))),
                                shape=(size, n))
        start += size

    def of(slot: Any) -> sp.csr_matrix | None:
        return deps.get(slot) if isinstance(slot, (int, np.integer)) else None

    for node in program.instructions:
        ins = [of(s) for s in node.ins]
        if node.op == "guard" or all(d is None or d.nnz == 0 for d in ins):
            continue           # a constant (of x) or a check: no dependency
        out_shapes = [tuple(shapes[o]) for o in node.outs]
        made = _node(node, ins, out_shapes, n, program)
        for o, M in zip(node.outs, made):
            if M is not None and M.nnz:
                deps[o] = M
    blocks = [deps.get(o, sp.csr_matrix((_size(shapes[o]), n), dtype=np.int8))
              for o in outputs]
    return sp.vstack(blocks, format="csr") if blocks else sp.csr_matrix((0, n))


def _node(node: Any, ins: list[Any], out_shapes: list[tuple[int, ...]], n: int,
          program: Any) -> list[Any]:
    op, p = node.op, node.params
    empty = sp.csr_matrix((1, n), dtype=np.int8)
    if op == "map":
        out = []
        for expr, shape in zip(p.exprs, out_shapes):
            names = _expr.variables(_expr.parse(expr))
            total = None
            for name, d, slot in zip(p.names, ins, node.ins):
                if name in names and d is not None and d.nnz:
                    shp = tuple(program.shapes[slot])
                    idx = np.arange(_size(shp)).reshape(shp)
                    # one element per output element (a (1,) read as ()), else broadcast
                    idx = idx.reshape(shape) if idx.size == _size(shape) \
                        else np.broadcast_to(idx, shape)
                    part = _select(d, idx)
                    total = part if total is None else total + part
            out.append(None if total is None else _bool(total))
        return out
    (d,) = ins[:1] or (None,)
    if op == "reshape":
        return [d]
    if op == "strided":
        idx = p.offset + sum(np.arange(k).reshape([-1 if a == i else 1
                                                   for a in range(len(p.shape))]) * st
                             for i, (k, st) in enumerate(zip(p.shape, p.strides)))
        return [_select(d, np.broadcast_to(idx, p.shape))]
    if op == "take":
        return [_select(d, p.index)]
    if op == "reduce":
        shape = tuple(program.shapes[node.ins[0]])
        keep = [a for a in range(len(shape)) if a not in set(x % len(shape) for x in p.axes)]
        full = np.indices(shape).reshape(len(shape), -1)
        target = np.ravel_multi_index(full[keep], [shape[a] for a in keep]) if keep \
            else np.zeros(full.shape[1], dtype=np.intp)
        return [_gather(target, np.arange(full.shape[1]), d, _size(out_shapes[0]))]
    if op == "assemble":
        size = _size(p.shape)
        rows_all, blocks = [], []
        for part, dd in zip(p.parts, ins):
            if dd is None or dd.nnz == 0:
                continue
            idx = part.offset + sum(np.arange(k).reshape([-1 if a == i else 1
                                                          for a in range(len(part.shape))])
                                    * st for i, (k, st) in enumerate(zip(part.shape,
                                                                         part.strides)))
            rows_all.append(np.broadcast_to(idx, part.shape).ravel())
            blocks.append(dd)
        if not blocks:
            return [None]
        rows = np.concatenate(rows_all)
        stacked = sp.vstack(blocks, format="csr")
        return [_gather(rows, np.arange(len(rows)), stacked, size)]
    if op == "scatter_add":
        return [_gather(np.asarray(p.index).ravel(), np.arange(d.shape[0]), d,
                        _size(p.shape))]
    if op == "matmul":
        return [_matmul(node, ins, out_shapes[0], program)]
    # anything else: every output element reads every input element
    union = empty
    for dd in ins:
        if dd is not None and dd.nnz:
            union = union + sp.csr_matrix(dd.max(axis=0))
    union = _bool(union)
    return [_select(union, np.zeros(_size(s), dtype=np.intp)) for s in out_shapes]


def _matmul(node: Any, ins: list[Any], out_shape: tuple[int, ...], program: Any) -> Any:
    """out[..., i, j] ORs a[..., i, k] (where b[..., k, j] may be non-zero) and
    b[..., k, j] (where a[..., i, k] may be): a constant operand's zeros drop terms."""
    p = node.params
    shapes = [tuple(program.shapes[s]) if isinstance(s, (int, np.integer)) else
              np.shape(s) for s in node.ins]
    values = [program.values[s] if isinstance(s, (int, np.integer)) else s
              for s in node.ins]
    idx = []
    for shape, t in zip(shapes, (p.transpose_a, p.transpose_b)):
        a = np.arange(_size(shape)).reshape(shape)
        idx.append(np.swapaxes(a, -1, -2) if t else a)
    ia, ib = idx
    batch = out_shape[:-2]
    ia = np.broadcast_to(ia, batch + ia.shape[-2:])
    ib = np.broadcast_to(ib, batch + ib.shape[-2:])
    rows, K = ia.shape[-2:]
    cols = ib.shape[-1]
    # every (out, a, b) triple: out (.., i, j) reads a (.., i, k) and b (.., k, j)
    A = np.broadcast_to(ia[..., :, None, :], batch + (rows, cols, K)).ravel()
    B = np.broadcast_to(np.swapaxes(ib, -1, -2)[..., None, :, :], batch + (rows, cols, K)).ravel()
    out = np.repeat(np.arange(_size(out_shape)), K)
    live = np.ones(len(out), dtype=bool)
    for d, v, flat in zip(ins, values, (A, B)):
        if (d is None or d.nnz == 0) and v is not None:     # a constant: its zeros
            live &= np.asarray(v).ravel()[flat] != 0
    total = None
    for d, flat in zip(ins, (A, B)):
        if d is not None and d.nnz:
            part = _gather(out[live], flat[live], d, _size(out_shape))
            total = part if total is None else total + part
    return None if total is None else _bool(total)


class TensorSparse(TensorBatches):
    """Sparse Jacobians and Hessians of ``TensorFunction`` (see the module docstring)."""

    def _n_x(self) -> int:
        return sum(_size(s) for s, _ in self._x_specs)

    def jacobian_pattern(self, format: str | None = None) -> Any:
        """Which elements of f's output (flattened, leaves in order) depend on which
        elements of x (flattened, leaves in order), read off the recorded program:
        (rows, cols) row by row, or a scipy.sparse matrix of ones for "csr"/"csc"/"coo".
        """
        rows, cols = self._tensor_pattern("jacobian")
        m = sum(_size(s) for s, _ in self._recordings["first"].out_specs)
        return pattern_as(rows, cols, (m, self._n_x()), format)

    def hessian_pattern(self, format: str | None = None) -> Any:
        """The Hessian's pattern of a scalar f: the pattern of its recorded gradient
        program in x (symmetric; the diagonal always included), as ``jacobian_pattern``."""
        rows, cols = self._tensor_pattern("hessian")
        return pattern_as(rows, cols, (self._n_x(), self._n_x()), format)

    def _tensor_pattern(self, what: str) -> tuple[np.ndarray, np.ndarray]:
        cache = self.__dict__.setdefault("_sparse_cache", {})
        if what not in cache:
            rec = self._recordings["first"]
            if what == "hessian":
                if rec.gradient is None:
                    raise ValueError("hessian needs f to return one number; use "
                                     "jacobian(x, sparse=True)")
                M = program_pattern(rec.program, len(self._x_specs), rec.gradient)
                M = _bool(M + M.T + sp.identity(M.shape[0], dtype=np.int8, format="csr"))
            else:
                M = program_pattern(rec.program, len(self._x_specs), rec.outputs)
            M = sp.csr_matrix(M)
            M.sort_indices()
            coo = M.tocoo()
            cache[what] = (coo.row.astype(np.intp), coo.col.astype(np.intp))
        return cache[what]

    def jacobian_colouring(self) -> Colouring:
        """The partition of the Jacobian's rows (one VJP per colour: tensor programs are
        differentiated in reverse mode), with the column partition's size for
        comparison (see ``Function.jacobian_colouring``)."""
        cache = self.__dict__.setdefault("_sparse_cache", {})
        if "colouring" not in cache:
            from easyad import _sparsity
            rows, cols = self._tensor_pattern("jacobian")
            m = sum(_size(s) for s, _ in self._recordings["first"].out_specs)
            n = self._n_x()
            by_row = _sparsity.colour_partition(cols, rows, (n, m))
            by_col = _sparsity.colour_partition(rows, cols, (m, n))
            assert by_row is not None and by_col is not None
            R = int(by_row.max()) + 1 if m else 0
            K = int(by_col.max()) + 1 if n else 0
            worst = int(np.bincount(cols).max()) if len(cols) else 0
            cache["colouring"] = Colouring("reverse", R, K, R, by_row, worst)
        return cache["colouring"]

    def hessian_colouring(self) -> tuple[int, int]:
        """(colours of a partition of the Hessian's columns, colours of the star
        colouring the HVPs use)."""
        from easyad import _sparsity
        rows, cols = self._tensor_pattern("hessian")
        n = self._n_x()
        part = _sparsity.colour_partition(rows, cols, (n, n))
        assert part is not None
        return int(part.max()) + 1 if n else 0, int(self._star()[0].max()) + 1 if n else 0

    def _star(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        cache = self.__dict__.setdefault("_sparse_cache", {})
        if "star" not in cache:
            from easyad import _sparsity
            rows, cols = self._tensor_pattern("hessian")
            n = self._n_x()
            colour = _sparsity.star_colouring(n, rows, cols)
            cache["star"] = (colour, *_sparsity.star_sources(n, rows, cols, colour))
        return cache["star"]

    def _sparse_jacobian(self, x: Any, args: tuple[Any, ...], format: str | None) -> Any:
        """jacobian(x, sparse=True): the rows of each colour summed into one cotangent,
        all colours one batch of VJPs; J[r, c] is row colour[r] of the compressed S^T J."""
        format = check_format(format, "csr")
        rows, cols = self._tensor_pattern("jacobian")
        c = self.jacobian_colouring()
        specs = self._recordings["first"].out_specs
        m, n = sum(_size(s) for s, _ in specs), self._n_x()
        if len(rows) == 0:
            return shaped(np.zeros(0), rows, cols, (m, n), format)
        seeds = np.zeros((c.colours, m))
        seeds[c.colour, np.arange(m)] = 1.0
        compressed = self._directions("vjp", x, args, seeds, specs)   # (K, n)
        return shaped(compressed[c.colour[rows], cols], rows, cols, (m, n), format)

    def _sparse_hessian(self, x: Any, args: tuple[Any, ...], format: str | None) -> Any:
        """hessian(x, sparse=True): one HVP per star colour, as one batch; each entry read
        where the star colouring leaves it alone in its colour."""
        format = check_format(format, "csr")
        rows, cols = self._tensor_pattern("hessian")
        n = self._n_x()
        colour, src_row, src_colour = self._star()
        K = int(colour.max()) + 1 if n else 0
        seeds = np.zeros((K, n))
        seeds[colour, np.arange(n)] = 1.0
        compressed = self._directions("hvp", x, args, seeds, self._x_specs)   # (K, n)
        return shaped(compressed[src_colour, src_row], rows, cols, (n, n), format)

    def _directions(self, what: str, x: Any, args: tuple[Any, ...], seeds: np.ndarray,
                    specs: list[tuple[tuple[int, ...], Any]]) -> np.ndarray:
        """``what`` at x along each row of seeds (split into ``specs``' leaves): one batch
        of K points; (K, total elements of x)."""
        if self._batch_count(x) is not None:
            raise ValueError("sparse results are for one point: call once per point")
        xs, _ = self._inputs(x, args)
        K = seeds.shape[0]
        X = _trees.unflatten(self._x_tree, [np.broadcast_to(a, (K,) + a.shape)
                                            for a in _on_host(xs)])
        tangents, start = [], 0
        for shape, dtype in specs:
            size = _size(shape)
            tangents.append(np.ascontiguousarray(seeds[:, start:start + size], dtype=dtype)
                            .reshape((K,) + shape))
            start += size
        out = self._batched(what, X, args, K, tangents, specs, one_point=True)
        return np.concatenate([np.asarray(o, dtype=np.float64).reshape(K, -1) for o in out],
                              axis=1)
