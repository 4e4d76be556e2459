"""``ad.checkpoint``: a function recorded as one tape entry, recomputed in the backward sweep.

Called on recorded values (Records, Tensors of a WengertList), a checkpointed ``f`` runs
on constants of its inputs (nothing recorded), and its outputs become ONE node of the
outer list whose vjp keeps only the inputs' values: during the backward sweep the vjp
records ``f`` again on a small inner list and sweeps it (``<g, f(x)>`` differentiated
once), then the inner list is dropped. The tape then holds f's inputs and outputs,
not its intermediates.

The node's output is one flat vector (every output's values, float64 unless every output
is a float32 tensor) and the outputs are its slices; all tensors of one call must be on
one device (the node's).

Modes other than a recorded backward sweep (see docs/checkpointing.md):

- forward mode (Traces, TraceTensors, nested Traces, Taylor series), shape tracing
  (``ad.eval_shape``), ``ad.record`` of tensor code, and calls on constants: ``f`` runs
  as it is (forward mode keeps no tape, so there is nothing to save);
- ``create_graph=True`` through the node (``ad.hessian``, ``ad.hvp``, gradients of
  gradients): the node's recorded vjp (``RecordedVjp``) records f again on the outer
  list and sweeps only that recording, so second derivatives are exact; the
  recomputation then stays on the list (no memory saved for second order);
- a closure over a recorded value of the outer list would be recorded outside the
  node and its derivative lost: detected (the list grows while f runs on constants, or
  an output is recorded), it raises ValueError asking to pass the value as an argument.

This module holds the machinery ``checkpoint_scan`` shares: structures with object
arrays, constants and inner variables, and the node (``attach``).
"""
from __future__ import annotations

import functools
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import numpy as np

from easyad import _levels
from easyad._core import NestedTrace, Record, Trace, WengertList
from easyad._higher import backward_graph
from easyad.errors import TapeMismatchError
from easyad.tensor import Tensor, TraceTensor
from easyad.tensor import _devices
from easyad.tensor._base import wrap
from easyad.tensor._base import record as record_node
from easyad.tensor._steps import Step

if TYPE_CHECKING:
    from easyad.tensor._backend import Backend

# ---- structures: tuples, lists, dicts, object arrays (their elements are leaves) ----
# A structure's shape is plain tuples (built and compared in C: a loop flattens its carry
# at every step): None for a leaf, ("tuple" | "list", children), ("dict", keys,
# children), ("objects", shape, size).

LEAF = None


def flatten(x: Any) -> tuple[list[Any], Any]:
    leaves: list[Any] = []
    return leaves, _visit(x, leaves)


def _visit(v: Any, leaves: list[Any]) -> Any:
    t = type(v)
    if t is tuple or t is list:
        return ("tuple" if t is tuple else "list", tuple([_visit(i, leaves) for i in v]))
    if t is dict or isinstance(v, dict):
        keys = tuple(v)
        return ("dict", keys, tuple([_visit(v[k], leaves) for k in keys]))
    if isinstance(v, (tuple, list)):                  # subclasses: rebuilt as the base
        return ("tuple" if isinstance(v, tuple) else "list",
                tuple([_visit(i, leaves) for i in v]))
    if t is np.ndarray and v.dtype == object:
        leaves.extend(v.reshape(-1).tolist())
        return ("objects", v.shape, v.size)
    leaves.append(v)
    return LEAF


def unflatten(tree: Any, leaves: list[Any]) -> Any:
    return _build(tree, iter(leaves))


def _build(t: Any, items: Any) -> Any:
    if t is None:
        return next(items)
    kind = t[0]
    if kind == "tuple":
        return tuple([_build(c, items) for c in t[1]])
    if kind == "list":
        return [_build(c, items) for c in t[1]]
    if kind == "dict":
        return dict(zip(t[1], [_build(c, items) for c in t[2]]))
    out = np.empty(t[2], dtype=object)
    for i in range(t[2]):
        out[i] = next(items)
    return out.reshape(t[1])


class Compiled:
    """``flatten`` and ``unflatten`` for one structure, as generated functions (a loop
    flattens its carry at every step): ``leaves(x)`` is None when ``x`` has another
    structure (then ``flatten`` says which), ``build(leaves)`` the structure again."""

    def __init__(self, tree: Any) -> None:
        lines: list[str] = []
        out = self._visit(tree, "x", lines, [0])
        # a leaf turned into a container is another structure too
        lines += [f"if isinstance({e}, C): return None" for e in out]
        body = "\n    ".join(lines)
        code = (f"def leaves(x):\n    {body}\n    return [{', '.join(out)}]\n"
                f"def build(v):\n    return {self._build(tree, iter(range(len(out))))}\n")
        names: dict[str, Any] = {"C": (tuple, list, dict)}
        exec(compile(code, "<easyad checkpoint structure>", "exec"), names)
        self.leaves: Callable[[Any], list[Any] | None] = names["leaves"]
        self.build: Callable[[list[Any]], Any] = names["build"]
        self.tree = tree

    def _visit(self, t: Any, name: str, lines: list[str], counter: list[int]) -> list[str]:
        if t is None:
            return [name]
        kind = t[0]
        if kind == "objects":
            raise _Generic
        if kind == "dict":
            lines.append(f"if type({name}) is not dict or tuple({name}) != {t[1]!r}: "
                         f"return None")
            items = [(f"{name}[{k!r}]", c) for k, c in zip(t[1], t[2])]
        else:
            lines.append(f"if type({name}) is not {kind} or len({name}) != {len(t[1])}: "
                         f"return None")
            items = [(f"{name}[{i}]", c) for i, c in enumerate(t[1])]
        out: list[str] = []
        for expr, c in items:
            if c is None:
                out.append(expr)
                continue
            counter[0] += 1
            local = f"n{counter[0]}"
            lines.append(f"{local} = {expr}")
            out += self._visit(c, local, lines, counter)
        return out

    def _build(self, t: Any, index: Any) -> str:
        if t is None:
            return f"v[{next(index)}]"
        if t[0] == "dict":
            return "{" + ", ".join(f"{k!r}: {self._build(c, index)}"
                                   for k, c in zip(t[1], t[2])) + "}"
        items = [self._build(c, index) for c in t[1]]
        if t[0] == "list":
            return "[" + ", ".join(items) + "]"
        return "(" + ", ".join(items) + ("," if len(items) == 1 else "") + ")"


class _Generic(Exception):
    """A structure the generated functions do not handle (object arrays)."""


def compiled(tree: Any) -> Any:
    """``Compiled(tree)``, or None for structures with object arrays (or dict keys
    that do not print as literals): the generic functions then."""
    try:
        return Compiled(tree)
    except (_Generic, SyntaxError):
        return None


# ---- leaves ----

def bypassed(v: Any) -> bool:
    """A leaf that makes f run as it is: forward mode, shape tracing, ad.record."""
    if isinstance(v, (Trace, NestedTrace, TraceTensor)) or \
            getattr(type(v), "_is_taylor_series", False):
        return True
    return isinstance(v, Tensor) and not v._backend.interpreter.checkpoints


def recorded(v: Any) -> bool:
    return (type(v) is Record or isinstance(v, Tensor)) and v.tape is not None


def constant(v: Any) -> Any:
    """A recorded leaf's value with no tape (the same type); others unchanged."""
    if type(v) is Record:
        return Record.constant(v.number)
    if isinstance(v, Tensor):
        return v.detach()
    return v


def number(v: Any) -> bool:
    """A Record or a float: run on constants, an operation of recorded values can give
    a float (the sum of a constant Tensor) where recorded it gives a Record."""
    return type(v) is Record or isinstance(v, (float, np.floating))


def floats(v: Any) -> bool:
    """A float numpy array: run on constants, a transform inside f (``ad.grad``) gives
    one where, recorded, it gives a recorded Tensor."""
    return type(v) is np.ndarray and v.dtype.kind == "f"


def active(v: Any) -> bool:
    """An output that may carry a derivative when recorded: a number, a float Tensor or
    a float array."""
    return number(v) or isinstance(v, Tensor) and v.dtype.kind == "f" or floats(v)


def variable(v: Any, inner: WengertList) -> Any:
    """A constant's value as a variable of ``inner`` (numbers and float Tensors)."""
    if type(v) is Record:
        return inner.variable(v.number)
    if isinstance(v, (float, np.floating)):
        return inner.variable(float(v))
    if isinstance(v, Tensor) and v.dtype.kind == "f":
        return Tensor.variable(v._data, inner, device=v.device, dtype=v.dtype)
    if floats(v):
        return Tensor.variable(v, inner)
    return v


def cotangent(var: Any, d: Any) -> Any:
    """The adjoint of an inner variable: a float, a constant Tensor, or None."""
    if d is None or not recorded(var):
        return None
    if type(var) is Record:
        return d[var]
    buf = d._node_adjoint(var._index)
    return None if buf is None else wrap(Tensor, var._backend, buf, var.shape, var.dtype)


def pairing(outs: list[Any], gs: list[Any]) -> Any:
    """``sum_k <g_k, out_k>`` over the recorded outputs: one Record (or None)."""
    total: Any = None
    for o, g in zip(outs, gs):
        if g is None or not recorded(o):
            continue
        if type(o) is Record:
            term = o * g
        elif isinstance(g, Tensor):
            term = (o * g).sum()
        else:
            term = o.sum() * g                   # a Tensor output of one number
        total = term if total is None else total + term
    return total


def one_tape(leaves: list[Any], what: str) -> Any:
    tape = None
    for v in leaves:
        if recorded(v):
            if tape is None:
                tape = v.tape
            elif v.tape is not tape:
                raise TapeMismatchError(f"{what} got recorded values of two different lists "
                                        f"({tape!r} and {v.tape!r}); record on one list")
    return tape


def own_lists() -> Any:
    """While f runs on constants or on its own list: a transform inside f (ad.grad)
    records on a list of its own or its inputs', not on the list of a transform open
    around the call (which would look like a closure)."""
    return _levels.opened(_levels.LEVEL.get()[0], None)


def closure_error(what: str) -> ValueError:
    return ValueError(
        f"{what}: the function reads a recorded value (a Record or Tensor of the list) that "
        f"is not one of its arguments (a closure, a global); its derivative would be lost "
        f"when the function is recomputed. Pass the value as an argument (for ad.scan and "
        f"ad.fori_loop: in the carry)")


# ---- the node ----

def backend_of(values: list[Any], what: str) -> Any:
    be = None
    for v in values:
        if isinstance(v, Tensor):
            if be is None:
                be = v._backend
            elif v._backend is not be:
                raise ValueError(f"{what}: tensors on different devices ({be.device} and "
                                 f"{v._backend.device}) in one call; move them to one "
                                 f"device with .to(device)")
    return be if be is not None else _devices.resolve("numpy")


class CheckpointStep(Step):
    """The node's vjp: the packed output's adjoint split into one cotangent per output
    (floats; constant Tensors), ``vjp`` on them (it recomputes), and its results as the
    sweep wants them (floats for Record inputs, device buffers for tensors)."""

    __slots__ = ("vjp", "be", "dtype", "layout", "inputs")

    def __init__(self, vjp: Callable[[list[Any]], list[Any]], be: Backend, dtype: Any,
                 layout: list[tuple[int, tuple[int, ...] | None]],
                 inputs: list[tuple[tuple[int, ...], Any] | None]) -> None:
        self.vjp, self.be, self.dtype, self.layout, self.inputs = vjp, be, dtype, layout, inputs

    def __call__(self, g: Any) -> tuple[Any, ...]:
        be, size = self.be, sum(1 if s is None else int(np.prod(s)) for _, s in self.layout)
        host = None
        if any(s is None for _, s in self.layout):
            host = np.asarray(be.to_numpy(g)).reshape(-1)
        whole = wrap(Tensor, be, g, (size,), self.dtype)
        gs: list[Any] = []
        for offset, shape in self.layout:
            if shape is None:
                gs.append(float(host[offset]))  # type: ignore[index]
            else:
                n = int(np.prod(shape))
                gs.append(whole[offset:offset + n].reshape(shape))
        result = []
        for c, meta in zip(self.vjp(gs), self.inputs):
            if meta is None:                                      # a Record input
                result.append(0.0 if c is None else float(c))
            else:
                shape, dtype = meta
                result.append(be.full(shape, 0.0, dtype) if c is None else
                              c.astype(dtype)._data)
        return tuple(result)


class RecordedVjp:
    """The node's vjp in recorded operations (``create_graph``): ``recompute(inputs)``
    records the function again on the list from the node's inputs (handles of their
    entries) and gives the outputs; ``<g, outputs>`` is swept with create_graph down to
    where that recording began only (``backward_graph``'s ``stop``), so the cotangents
    are recorded functions of the inputs and of ``g``, second derivatives included.
    (The recomputation stays on the list: reverse over reverse keeps it all anyway.)"""

    __slots__ = ("recompute", "values", "layout", "dtype")

    def __init__(self, recompute: Callable[[list[Any]], list[Any]], values: list[Any],
                 layout: list[tuple[int, tuple[int, ...] | None]], dtype: Any) -> None:
        self.recompute, self.values, self.layout, self.dtype = recompute, values, layout, dtype

    def __call__(self, tape: Any, index: int, g: Any) -> tuple[Any, ...]:
        inputs = tape._node(index).inputs
        handles = [tape._record_at(j) if not isinstance(v, Tensor) else
                   wrap(Tensor, v._backend, v._data, v.shape, v.dtype, tape,
                        tape._record_at(j)) for v, j in zip(self.values, inputs)]
        if not isinstance(g, Tensor):
            size = sum(1 if s is None else int(np.prod(s)) for _, s in self.layout)
            g = Tensor.constant(np.broadcast_to(np.asarray(g, dtype=self.dtype), (size,)))
        gs = [g[o] if shape is None else g[o:o + int(np.prod(shape))].reshape(shape)
              for o, shape in self.layout]
        start = len(tape)
        total = pairing(self.recompute(handles), gs)
        if not recorded(total):
            return (None,) * len(inputs)
        d = backward_graph(total, 1.0, stop=start)
        return tuple(d._adjoint(j) for j in inputs)


def attach(label: str, tape: Any, inputs: list[Any], outputs: list[Any],
           vjp: Callable[[list[Any]], list[Any]],
           recompute: Callable[[list[Any]], list[Any]]) -> list[Any]:
    """Record ``outputs`` (constant Records and Tensors: their values) as one node of
    ``tape`` on ``inputs`` (recorded leaves) whose vjp is ``vjp(cotangents per output)
    -> cotangents per input``, and whose recorded vjp (create_graph) runs
    ``recompute(inputs) -> outputs`` on the list; returns the recorded outputs (slices
    of the node)."""
    be = backend_of(list(inputs) + list(outputs), label)
    wide = any(number(o) or o.dtype == np.float64 for o in outputs)
    dtype = np.dtype(np.float64 if wide or not outputs else np.float32)
    layout: list[tuple[int, tuple[int, ...] | None]] = []
    pieces: list[Any] = []
    numbers: list[float] = []
    offset = 0
    for o in outputs:
        if number(o):
            layout.append((offset, None))
            numbers.append(o.number if type(o) is Record else float(o))
            offset += 1
        else:
            if numbers:
                pieces.append(Tensor.constant(np.array(numbers), device=be.device, dtype=dtype))
                numbers = []
            layout.append((offset, o.shape))
            if floats(o):
                o = Tensor.constant(o, device=be.device)
            pieces.append(o.reshape(-1).astype(dtype))
            offset += o.size
    if numbers or not pieces:
        pieces.append(Tensor.constant(np.array(numbers), device=be.device, dtype=dtype))
    packed = pieces[0] if len(pieces) == 1 else _concatenate(pieces)
    metas = [None if type(v) is Record else (v.shape, v.dtype) for v in inputs]
    step = CheckpointStep(vjp, be, dtype, layout, metas)
    index = tuple(v.index if type(v) is Record else v._index for v in inputs)
    graph = RecordedVjp(recompute, [v.detach() if isinstance(v, Tensor) else None
                                     for v in inputs], layout, dtype)
    node = record_node(Tensor, label, be, packed._data, (offset,), dtype, tape, index, step,
                       graph)
    result: list[Any] = []
    for o, (at, shape) in zip(outputs, layout):
        if shape is None:
            result.append(node[at])
        else:
            n = int(np.prod(shape))
            result.append(node[at:at + n].reshape(shape).astype(o.dtype))
    return result


def _concatenate(pieces: list[Any]) -> Any:
    from easyad.tensor._generic import concatenate
    return concatenate(pieces)


# ---- ad.checkpoint ----

def checkpoint(f: Callable[..., Any]) -> Callable[..., Any]:
    """``f`` recorded as one node keeping only its inputs; recomputed in the backward sweep.

    The tape of ``ad.checkpoint(f)(*args)`` holds the recorded arguments and the outputs,
    not f's intermediates: the backward sweep records f again on a small list of its own,
    sweeps it and drops it (f runs twice in all). Arguments and results are structures
    (tuples, lists, dicts, object arrays of Records) of Records, Tensors (numpy or
    OpenCL, one device per call) and anything else (passed as it is). Forward mode and
    calls on constants run f as it is; ``create_graph=True`` (Hessians) records f again
    on the list (exact, no memory saved); a closure over a recorded value raises
    ValueError. See docs/checkpointing.md.

    Examples
    --------
    >>> import easyad as ad
    >>> @ad.checkpoint
    ... def block(x, y):
    ...     return ad.sin(x) * y, x * x
    >>> lst = ad.WengertList()
    >>> x, y = lst.variable(0.5), lst.variable(2.0)
    >>> a, b = block(x, y)
    >>> d = (a + b).derivatives()
    >>> round(d[x], 12), round(d[y], 12)
    (2.755165123781, 0.479425538604)
    """
    if not callable(f):
        raise TypeError(f"ad.checkpoint takes a function, got {type(f).__name__}")

    @functools.wraps(f)
    def checkpointed(*args: Any, **kwargs: Any) -> Any:
        leaves, tree = flatten((args, kwargs))
        if any(bypassed(v) for v in leaves):
            return f(*args, **kwargs)
        tape = one_tape(leaves, "ad.checkpoint")
        if tape is None:
            return f(*args, **kwargs)
        which = [k for k, v in enumerate(leaves) if recorded(v)]
        consts = [constant(v) for v in leaves]
        before = len(tape)
        a, kw = unflatten(tree, consts)
        with own_lists():
            out_leaves, out_tree = flatten(f(*a, **kw))
        if len(tape) != before or any(recorded(v) for v in out_leaves):
            raise closure_error("ad.checkpoint")
        live = [k for k, v in enumerate(out_leaves) if active(v)]
        vjp = _recompute(f, tree, consts, which, out_tree, live)
        outs = attach("checkpoint", tape, [leaves[k] for k in which],
                      [out_leaves[k] for k in live], vjp,
                      _again(f, tree, consts, which, out_tree, live))
        for k, o in zip(live, outs):
            out_leaves[k] = o
        return unflatten(out_tree, out_leaves)
    return checkpointed


def _recompute(f: Callable[..., Any], tree: Any, consts: list[Any], which: list[int],
               out_tree: Any, live: list[int]) -> Callable[[list[Any]], list[Any]]:
    # holds the inputs' values (constants), never the outer list: a node that points
    # back at its own list is a reference cycle
    def vjp(gs: list[Any]) -> list[Any]:
        inner = WengertList()
        xs = list(consts)
        for k in which:
            xs[k] = variable(consts[k], inner)
        a, kw = unflatten(tree, xs)
        with own_lists():
            outs, again = flatten(f(*a, **kw))
        if again != out_tree:
            raise ValueError("ad.checkpoint: the function returned a different structure "
                             "when recomputed; it must be deterministic")
        total = pairing([outs[k] for k in live], gs)
        d = total.derivatives() if type(total) is Record and total.tape is inner else None
        return [cotangent(xs[k], d) for k in which]
    return vjp


def _again(f: Callable[..., Any], tree: Any, consts: list[Any], which: list[int],
           out_tree: Any, live: list[int]) -> Callable[[list[Any]], list[Any]]:
    """f on handles of the node's inputs, recorded on the list (create_graph)."""
    def recompute(handles: list[Any]) -> list[Any]:
        xs = list(consts)
        for k, h in zip(which, handles):
            xs[k] = h
        a, kw = unflatten(tree, xs)
        outs, again = flatten(f(*a, **kw))
        if again != out_tree:
            raise ValueError("ad.checkpoint: the function returned a different structure "
                             "when recomputed; it must be deterministic")
        return [outs[k] for k in live]
    return recompute


__all__ = ["checkpoint"]
