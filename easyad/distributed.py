"""A recorded ``Function`` over a ``dask.array`` batch: ``F(X)``, ``F.gradient(X)``,
``F.value_and_gradient(X)``, ``F.hessian(X)`` and ``F.hvp(X, V)`` with X a dask array of
rows (B, n) return lazy dask arrays, one task per chunk of rows (``map_blocks``), run on
whatever scheduler computes them: dask's threads or processes, or a ``dask.distributed``
cluster. easyad writes no cluster code of its own. A ``TensorFunction`` (``ad.record`` of
tensor code, one array as x) does the same over X of shape ``(B, *x.shape)``, chunked along
the points, with its arguments after x shipped once (``tensor_batch``). Both kinds go
through one path (``_map``: X as rows, one ``_block`` task per chunk, the result's leaves
packed side by side and sliced lazily).

Under a ``distributed`` client the Function travels as its pickle (a program, not Python
code), scattered once to every worker (``broadcast``) rather than embedded in each task;
a worker loads it once (``_function``: the same validation as any pickle, a damaged one
raising ``TapeFormatError``, which dask shows at the client) and, if it was compiled,
compiles it into that worker's own private cache. Without a client the Function goes into
the tasks as it is (threads share it; dask's process pool pickles it).

dask is imported here only, and only when a dask array comes in: ``import easyad`` never
needs it (``pip install easyad[dask]``). ``shard_value_and_gradient``: data-parallel
gradients of a recorded loss. docs/distributed.md.

Examples
--------
>>> import numpy as np, dask.array as da, easyad as ad
>>> F = ad.record(lambda x: x[0] ** 2 * x[1], [1.0, 1.0])
>>> X = da.from_array(np.array([[1.0, 2.0], [3.0, 1.0], [2.0, 2.0]]), chunks=(2, 2))
>>> G = F.gradient(X)                # lazy: one task per chunk of rows
>>> G.numblocks
(2, 1)
>>> G.compute(scheduler="threads")
array([[4., 1.],
       [6., 9.],
       [8., 4.]])
"""
from __future__ import annotations

import hashlib
import pickle
import threading
import weakref
from collections import OrderedDict
from typing import Any

import numpy as np

from easyad import _arrays, _trees

_METHODS = ("__call__", "gradient", "value_and_gradient", "hessian", "hvp")


def is_dask_array(x: Any) -> bool:
    """Whether x is a ``dask.array.Array`` (checked by type, without importing dask)."""
    t = type(x)
    return t.__name__ == "Array" and t.__module__.startswith("dask.array")


def _dask() -> Any:
    try:
        import dask.array as da
    except ImportError as e:    # pragma: no cover - only where dask is missing
        raise ImportError("a dask array was passed, but dask is not installed: "
                          "pip install 'easyad[dask]' (dask[array] and distributed)") from e
    return da


# -- the worker's side: each payload loaded once per process --
_LOADED: OrderedDict[bytes, Any] = OrderedDict()
_LOADED_MAX = 16               # Functions kept per process (the least recently used go)
_LOCK = threading.Lock()       # a worker's threads load a payload once between them
# an OpenCL-device Function's chunks run one at a time: its kernel objects hold their
# arguments (clSetKernelArg is not thread-safe on one kernel), and one device runs them
_DEVICE_LOCK = threading.Lock()


def _function(payload: Any) -> Any:
    """The Function a task runs: payload itself (local schedulers) or, for the bytes
    scattered to a worker, the Function they pickle, loaded (validated, and compiled if
    the sender's was) on the first task of this process and kept."""
    if not isinstance(payload, bytes):
        return payload
    key = hashlib.sha256(payload).digest()
    with _LOCK:
        F = _LOADED.get(key)
        if F is None:
            F = pickle.loads(payload)   # _rebuild_function: every field checked
            _LOADED[key] = F
            while len(_LOADED) > _LOADED_MAX:
                _LOADED.popitem(last=False)
        else:
            _LOADED.move_to_end(key)
        return F


def _block(x: np.ndarray, payload: Any, shared: _Shared, method: str,
           options: tuple[tuple[str, Any], ...], point: tuple[int, ...],
           shapes: tuple[tuple[int, ...], ...], dtype: Any, *blocks: np.ndarray
           ) -> np.ndarray:
    """One chunk of rows: ``getattr(F, method)(x, *blocks, *shared, **options)`` with x
    (and each block of ``blocks``: per-point directions) as rows of ``point``'s shape; its
    result's leaves packed side by side, (rows, sum of the leaves' sizes) of ``dtype`` (a
    bool mask as 0.0/1.0), or the one leaf as it is (no copy, no slicing task after it);
    each leaf of the shape ``shapes`` says per point (reshape raises if not)."""
    F = _function(payload)
    b = x.shape[0]
    rows = [a.reshape((b,) + point) for a in (x, *blocks)]
    if getattr(getattr(F, "_backend", None), "kind", "numpy") != "numpy":
        with _DEVICE_LOCK:
            result = getattr(F, method)(*rows, *shared.values, **dict(options))
    else:
        result = getattr(F, method)(*rows, *shared.values, **dict(options))
    parts = _trees.flatten(result)[0]
    if len(parts) == 1:
        return np.asarray(parts[0]).reshape((b,) + shapes[0])
    widths = [int(np.prod(s, dtype=int)) for s in shapes]
    out = np.empty((b, sum(widths)), dtype=dtype)
    start = 0
    for part, w in zip(parts, widths):
        out[:, start:start + w] = np.asarray(part).reshape(b, w)
        start += w
    return out


# -- the client's side --
_SCATTERED: weakref.WeakKeyDictionary[Any, tuple[Any, Any, Any]] = weakref.WeakKeyDictionary()


def _client() -> Any:
    try:
        from distributed import default_client
        return default_client()
    except (ImportError, ValueError):    # no distributed, or no client: a local scheduler
        return None


def _payload(F: Any) -> Any:
    """What the tasks get: F itself, or under a client a Future of F's pickle, scattered
    to every worker once per (Function, client) and again only if F gained recordings
    since (a TensorFunction's hvp program, recorded on first use)."""
    client = _client()
    if client is None:
        return F
    version = tuple(getattr(F, "_recordings", ()))
    held = _SCATTERED.get(F)
    if held is not None and held[0] is client and held[2] == version \
            and held[1].status == "finished":
        return held[1]
    future = client.scatter(pickle.dumps(F), broadcast=True, hash=False)
    _SCATTERED[F] = (client, future, version)
    return future


class _Shared:
    """The arguments every task reads, as one opaque object (dask looks into tuples and
    lists of a task's arguments: a callable first would read as a task)."""

    __slots__ = ("values",)

    def __init__(self, values: tuple[Any, ...]) -> None:
        self.values = values


def _shared(values: tuple[Any, ...]) -> Any:
    """Arguments every task reads (numpy arrays, numbers, statics): under a client
    scattered to every worker once for this call, one Future; else one object in the
    graph, which every task refers to."""
    client = _client() if values else None
    if client is None:
        return _Shared(values)
    return client.scatter([_Shared(values)], broadcast=True, hash=False)[0]


def _rows(X: Any, point: tuple[int, ...], dtype: Any, what: str) -> Any:
    """X as (B, size of a point) of ``dtype``, each chunk whole points (rows)."""
    if X.ndim != 1 + len(point) or tuple(X.shape[1:]) != point:
        raise ValueError(f"a dask array {what} must have shape {('B',) + point} (recorded "
                         f"{what}: {point}, one more leading axis of points, chunked along "
                         f"it), got {X.shape}".replace("'B'", "B"))
    if X.dtype != dtype:
        X = X.astype(dtype)       # as the numpy batch converts (to the recorded dtype)
    if any(len(c) > 1 for c in X.chunks[1:]):
        X = X.rechunk({k: -1 for k in range(1, X.ndim)})   # a task needs whole points
    size = int(np.prod(point, dtype=int))
    return X.reshape((X.shape[0], size)) if X.ndim != 2 else X


def _map(F: Any, method: str, X: Any, point: tuple[int, ...], blocks: tuple[Any, ...],
         shared: tuple[Any, ...], options: tuple[tuple[str, Any], ...],
         leaves: list[tuple[tuple[int, ...], Any]]) -> list[Any]:
    """The one path of both kinds of Function: ``getattr(F, method)`` on each chunk of
    rows of X (2-D, rows of ``point``'s shape; ``blocks`` chunked as X), F and ``shared``
    shipped once; the result's leaves ((shape per point, dtype) each, a bool dtype for a
    mask) as lazy arrays (B, *shape), one task per chunk."""
    da = _dask()
    token = f"easyad-{method.strip('_')}"
    common = (_payload(F), _shared(shared), method, options, point,
              tuple(s for s, _ in leaves))
    if len(leaves) == 1:
        shape, dtype = leaves[0]
        return [da.map_blocks(_block, X, *common, dtype, *blocks, dtype=dtype,
                              chunks=(X.chunks[0], *((d,) for d in shape)),
                              drop_axis=[] if shape else [1],
                              new_axis=list(range(2, 1 + len(shape))) or None, token=token)]
    dtype = np.result_type(*(np.float64 if d == np.bool_ else d for _, d in leaves))
    widths = [int(np.prod(s, dtype=int)) for s, _ in leaves]
    packed = da.map_blocks(_block, X, *common, dtype, *blocks, dtype=dtype,
                           chunks=(X.chunks[0], (sum(widths),)), token=token)
    results, start = [], 0
    for (shape, leaf_dtype), w in zip(leaves, widths):
        piece = packed[:, start:start + w]
        start += w
        if leaf_dtype == np.bool_:
            piece = piece != 0.0
        elif leaf_dtype != dtype:
            piece = piece.astype(leaf_dtype)      # exact: it was widened to pack
        if shape == ():
            piece = piece[:, 0]
        elif len(shape) > 1:
            piece = piece.reshape((X.shape[0],) + shape, merge_chunks=False)
        results.append(piece)
    return results


def batch(F: Any, method: str, X: Any, V: Any = None,
          on_branch_change: str | None = None) -> Any:
    """``getattr(F, method)`` of a recorded ``Function`` over the rows of the dask array
    X (see the module docstring): lazy dask arrays, shaped as the method's results for a
    numpy batch."""
    if method not in _METHODS:
        raise ValueError(f"method must be one of {_METHODS}, not {method!r}")
    n = F.n_inputs
    X = _rows(X, (n,), np.float64, "x")
    mode = on_branch_change if on_branch_change is not None else F.on_branch_change
    per_method: dict[str, list[tuple[int, ...]]] = {
        "__call__": [() if F.scalar else (len(F.outputs),)],
        "gradient": [(n,)], "value_and_gradient": [(), (n,)],
        "hessian": [(n, n)], "hvp": [(n,)]}
    shapes = per_method[method]
    leaves: list[tuple[tuple[int, ...], Any]] = [(s, np.float64) for s in shapes]
    if mode == "mask":
        leaves.append(((), np.bool_))
    blocks, shared = _directions(V, X, (n,), np.float64) if method == "hvp" else ((), ())
    results = _map(F, method, X, (n,), blocks, shared,
                   (("on_branch_change", on_branch_change),), leaves)
    if mode == "mask":
        *found, mask = results
        return (tuple(found) if len(found) > 1 else found[0]), mask
    return tuple(results) if len(results) > 1 else results[0]


def _directions(V: Any, X: Any, point: tuple[int, ...], dtype: Any
                ) -> tuple[tuple[Any, ...], tuple[Any, ...]]:
    """hvp's v: one direction per point (a dask or numpy array (B, *point): a block per
    chunk of X) or one for all (``point``'s shape: shared)."""
    da = _dask()
    B = X.shape[0]
    want = f"{point} or {(B,) + point}"
    if is_dask_array(V) or np.ndim(V) == 1 + len(point):
        V = da.asarray(V)
        if tuple(V.shape) != (B,) + point:
            raise ValueError(f"v must have shape {want}, got {V.shape}")
        return (_rows(V, point, dtype, "v").rechunk({0: X.chunks[0]}),), ()
    v = _arrays.real_array(V, "v", dtype)
    if v.shape != point:
        raise ValueError(f"v must have shape {want}, got {v.shape}")
    return (), (v,)


def tensor_batch(T: Any, method: str, X: Any, V: Any = None, args: tuple[Any, ...] = ()
                 ) -> Any:
    """``getattr(T, method)`` of a ``TensorFunction`` over the dask array X: the recorded
    x with one more leading axis, chunked along it (the points); ``args`` (numpy arrays,
    numbers: the same for every point) shipped once; lazy results shaped as the numpy
    batch's (a leading axis of points), one task per chunk.

    Examples
    --------
    >>> import numpy as np, dask.array as da, easyad as ad
    >>> T = ad.record(lambda x, w: ad.sum(w * x ** 2), np.zeros(2), np.ones(2))
    >>> P = da.from_array(np.array([[1.0, 2.0], [3.0, 1.0], [2.0, 2.0]]), chunks=(2, 2))
    >>> T.gradient(P, np.array([1.0, 0.5])).compute(scheduler="sync")   # 2 w x per point
    array([[2., 2.],
           [6., 1.],
           [4., 2.]])
    """
    if method not in _METHODS:
        raise ValueError(f"method must be one of {_METHODS}, not {method!r}")
    T._refuse_effects(f"{method.strip('_')} over a dask array of points")
    if not T._x_tree.is_leaf:
        raise NotImplementedError(
            "a dask array x is for a TensorFunction recorded with one array as x; this one "
            f"takes {T._x_tree.describe()}: record f of one array (concatenate the leaves "
            "and split them in f), or map over numpy blocks with dask.array.map_blocks")
    if any(is_dask_array(leaf) for a in args for leaf in _trees.flatten(a)[0]):
        raise ValueError("the arguments after x are the same for every point: pass them as "
                         "numpy arrays or numbers (per-point data belongs in x; shards of "
                         "a dataset: distributed.shard_value_and_gradient)")
    (point, dtype), = T._x_specs
    X = _rows(X, point, dtype, "x")
    first = T._recordings["first"]
    leaves: list[tuple[tuple[int, ...], Any]]
    if method == "__call__":
        leaves = [((), first.out_specs[0][1])] if first.scalar_output else \
            [(s, d) for s, d in first.out_specs]
    elif first.gradient is None:
        raise ValueError(f"{method.strip('_')} needs f to return one number; it returned "
                         f"{first.out_tree.describe()}")
    else:
        leaves = {"gradient": [(point, dtype)], "hvp": [(point, dtype)],
                  "value_and_gradient": [((), first.out_specs[0][1]), (point, dtype)],
                  "hessian": [(point + point, dtype)]}[method]
    x0 = [T._host(first.program.values[i]) for i in first.program.inputs[:1]]
    statics = T._inputs(x0[0], args)[1]        # the arguments checked here, at the client
    if method in ("hvp", "hessian") and "hvp" not in T._recordings:
        T._record("hvp", x0, statics)     # before it travels (f stays behind), at x0
    blocks, shared = _directions(V, X, point, dtype) if method == "hvp" else ((), ())
    results = _map(T, method, X, point, blocks, shared + tuple(args), (), leaves)
    if method == "__call__" and not first.scalar_output:
        return _trees.unflatten(first.out_tree, results)
    return tuple(results) if len(results) > 1 else results[0]


# -- data-parallel gradients: a loss over shards, summed by a tree --
def _shard(payload: Any, x: Any, *blocks: Any) -> tuple[float, list[np.ndarray]]:
    value, gradient = _function(payload).value_and_gradient(x, *blocks)
    return float(value), [np.asarray(g, dtype=np.float64) for g in _trees.flatten(gradient)[0]]


def _add(*parts: tuple[float, list[np.ndarray]]) -> tuple[float, list[np.ndarray]]:
    value, leaves = parts[0][0], [g.copy() for g in parts[0][1]]
    for v, gs in parts[1:]:          # in the parts' order: the same sum on every run
        value += v
        for acc, g in zip(leaves, gs):
            acc += g
    return value, leaves


def shard_value_and_gradient(F: Any, x: Any, *data: Any, split_every: int = 4) -> Any:
    """The sum over shards of ``F.value_and_gradient(x, *shard)``, lazy (a
    ``dask.delayed`` of ``(value, gradient)``, the gradient structured as x): F a
    recording (``ad.record`` of tensor code) of a loss that is a sum over examples,
    recorded at one shard's shapes; ``data`` dask arrays chunked alike along axis 0, each
    chunk a shard of those shapes. One task per shard, then a tree of sums,
    ``split_every`` parts a node (deterministic: the same tree, the same order, every
    run). Under a ``distributed`` client F is scattered once to each worker (a
    TensorFunction travels as its program). x is sent with the graph (the parameters:
    small beside the data). Step the optimizer on the client with the result."""
    import dask
    _dask()
    if not data or not all(is_dask_array(d) for d in data):
        raise TypeError("data: one or more dask arrays (the shards are their chunks along "
                        "axis 0); wrap numpy data with dask.array.from_array(a, chunks=...)")
    rows = data[0].chunks[0]
    if any(d.chunks[0] != rows for d in data):
        raise ValueError("the data arrays must be chunked alike along axis 0 (each chunk "
                         f"one shard): got {[d.chunks[0] for d in data]}")
    if type(split_every) is not int or split_every < 2:
        raise ValueError(f"split_every must be an int >= 2, got {split_every!r}")
    # each array's chunks of a row block as one block (the other axes joined)
    blocks = [d.rechunk({k: -1 for k in range(1, d.ndim)}).to_delayed().reshape(-1)
              for d in data]
    payload = _payload(F)
    level = [dask.delayed(_shard, pure=True)(payload, x, *parts) for parts in zip(*blocks)]
    while len(level) > 1:
        level = [dask.delayed(_add, pure=True)(*level[k:k + split_every])
                 for k in range(0, len(level), split_every)]
    tree = _trees.flatten(x)[1]
    return dask.delayed(lambda total: (total[0], _trees.unflatten(tree, total[1])),
                        pure=True)(level[0])


__all__ = ["batch", "is_dask_array", "shard_value_and_gradient", "tensor_batch"]
