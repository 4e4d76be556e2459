"""A recorded ``Function`` over a ``dask.array`` batch: ``F(X)``, ``F.gradient(X)``,
``F.value_and_gradient(X)``, ``F.hessian(X)`` and ``F.hvp(X, V)`` with X a dask array of
rows (B, n) return lazy dask arrays, one task per chunk of rows (``map_blocks``), run on
whatever scheduler computes them: dask's threads or processes, or a ``dask.distributed``
cluster. easyad writes no cluster code of its own.

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

from easyad import _trees

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


def _block(x: np.ndarray, payload: Any, method: str, obc: str | None, widths: tuple[int, ...],
           v: Any = None) -> np.ndarray:
    """One chunk of rows: the method's results packed side by side, (rows, sum(widths))."""
    F = _function(payload)
    args = (x,) if v is None else (x, v)
    result = getattr(F, method)(*args, on_branch_change=obc)
    parts = result if isinstance(result, tuple) else (result,)
    if isinstance(result, tuple) and isinstance(result[0], tuple):   # (v, g), mask
        parts = (*result[0], result[1])
    b = x.shape[0]
    if len(parts) == 1:       # one result: as it is (no copy, no slicing task after it)
        return np.asarray(parts[0], dtype=np.float64)
    out = np.empty((b, sum(widths)))
    start = 0
    for part, w in zip(parts, widths):
        out[:, start:start + w] = np.asarray(part, dtype=np.float64).reshape(b, w)
        start += w
    return out


# -- the client's side --
_SCATTERED: weakref.WeakKeyDictionary[Any, tuple[Any, Any]] = weakref.WeakKeyDictionary()


def _client() -> Any:
    try:
        from distributed import default_client
        return default_client()
    except (ImportError, ValueError):    # no distributed, or no client: a local scheduler
        return None


def _payload(F: Any) -> Any:
    """What the tasks get: F itself, or under a client a Future of F's pickle, scattered
    to every worker once per (Function, client)."""
    client = _client()
    if client is None:
        return F
    held = _SCATTERED.get(F)
    if held is not None and held[0] is client and held[1].status == "finished":
        return held[1]
    future = client.scatter(pickle.dumps(F), broadcast=True, hash=False)
    _SCATTERED[F] = (client, future)
    return future


def batch(F: Any, method: str, X: Any, V: Any = None,
          on_branch_change: str | None = None) -> Any:
    """``getattr(F, method)`` over the rows of the dask array X (see the module docstring):
    lazy dask arrays, shaped as the method's results for a numpy batch."""
    if method not in _METHODS:
        raise ValueError(f"method must be one of {_METHODS}, not {method!r}")
    da = _dask()
    n = F.n_inputs
    if X.ndim != 2 or X.shape[1] != n:
        raise ValueError(f"a dask array x must have shape (B, {n}) for this Function of {n} "
                         f"inputs (rows chunked along axis 0), got {X.shape}")
    if X.dtype != np.float64:
        X = X.astype(np.float64)        # as _arrays.real_array converts numpy batches
    if len(X.chunks[1]) > 1:
        X = X.rechunk({1: -1})          # a task needs whole rows
    mode = on_branch_change if on_branch_change is not None else F.on_branch_change
    shapes: list[tuple[int, ...]] = {
        "__call__": [() if F.scalar else (len(F.outputs),)],
        "gradient": [(n,)], "value_and_gradient": [(), (n,)],
        "hessian": [(n, n)], "hvp": [(n,)]}[method]
    if mode == "mask":
        shapes.append(())               # the mask, packed as 0.0/1.0
    widths = tuple(int(np.prod(s, dtype=int)) for s in shapes)
    extra: tuple[Any, ...] = ()
    if method == "hvp":
        if is_dask_array(V) or np.ndim(V) == 2:
            V = da.asarray(V)
            if V.shape != X.shape:
                raise ValueError(f"v must have shape ({n},) or {X.shape}, got {V.shape}")
            extra = (V.astype(np.float64).rechunk(X.chunks),)
        else:
            V = np.asarray(V, dtype=np.float64)
            if V.shape != (n,):
                raise ValueError(f"v must have shape ({n},) or {X.shape}, got {V.shape}")
            extra = (V,)
    payload = _payload(F)
    if len(shapes) == 1:
        shape = shapes[0]
        return da.map_blocks(_block, X, payload, method, on_branch_change, widths, *extra,
                             dtype=np.float64, chunks=(X.chunks[0], *((d,) for d in shape)),
                             drop_axis=[] if shape else [1],
                             new_axis=list(range(2, 1 + len(shape))) or None,
                             token=f"easyad-{method.strip('_')}")
    packed = da.map_blocks(_block, X, payload, method, on_branch_change, widths, *extra,
                           dtype=np.float64, chunks=(X.chunks[0], (sum(widths),)),
                           token=f"easyad-{method.strip('_')}")
    results, start = [], 0
    for k, (shape, w) in enumerate(zip(shapes, widths)):
        piece = packed[:, start:start + w]
        start += w
        if mode == "mask" and k == len(shapes) - 1:
            results.append(piece[:, 0] != 0.0)
        elif shape == ():
            results.append(piece[:, 0])
        elif len(shape) == 1:
            results.append(piece)
        else:
            results.append(piece.reshape((X.shape[0],) + shape, merge_chunks=False))
    if mode == "mask":
        *found, mask = results
        return (tuple(found) if len(found) > 1 else found[0]), mask
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


__all__ = ["batch", "is_dask_array", "shard_value_and_gradient"]
