"""Forward mode for the transforms of ``functional.py``: f run on TraceTensors and Traces
(over recorded leaves inside a reverse transform; one level deeper inside another forward
one), its point and tangents, and Jacobians assembled column by column. Its own module
because it is one transform: what it shares with reverse mode is ``_evaluation.py``.
"""
from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from easyad import _trees
from easyad._core import Trace
from easyad._evaluation import (in_program, _base, _call, _constant_above, _depth, _lift, _name,
                                _output_leaves, _Point, _shape, _shapes_jacobian,
                                _shapes_only, _split_top, _tape_of, _traces_block)
from easyad._levels import LEVEL as _LEVEL
from easyad._trees import TreeDef
from easyad.tensor import Tensor, TraceTensor, get_device, stack
from easyad.tensor._interpreters import replaying


def _forward_point(x0: Any, caller: str) -> _Point:
    leaves, _ = _trees.flatten(x0)
    # a Trace or TraceTensor is nested (forward over forward); object arrays of Traces not
    if any(_trees.is_traced(v) and not isinstance(v, (Trace, TraceTensor)) for v in leaves):
        raise NotImplementedError(
            f"{caller} (forward mode) inside another forward-mode transform: nest Traces "
            f"directly, or use reverse mode for one of them")
    point = _Point(x0)
    # this transform's level: one depth above every level open around it and above the
    # point; over Records when a reverse transform is open (or the point is recorded)
    open_depth, tape = _LEVEL.get()
    depth = max([open_depth] + [_depth(r) for r in point.recorded if r is not None]) + 1
    if tape is None:
        tape = next((t for t in (_tape_of(_base(r)) for r in point.recorded
                                 if r is not None) if t is not None), None)
    point.level = (depth, tape)
    return point


def _forward_inputs(point: _Point, tangents: list[Any]) -> list[Any]:
    depth, tape = point.level
    inputs: list[Any] = []
    for a, t, scalar, device, recorded in zip(point.arrays, tangents, point.scalar,
                                              point.devices, point.recorded):
        if recorded is None and depth == 1 and tape is None and not in_program(t):
            # the common case
            inputs.append(Trace(float(a), float(t)) if scalar else TraceTensor._input(
                a, t, device if device is not None else get_device()))
            continue
        device = device if device is not None else get_device()
        base = recorded
        if base is None:
            # inside a reverse transform: on its list, so the Records f's closure holds
            # meet a Trace over Records (a float Trace and a Record do not mix)
            base = float(a) if tape is None and scalar else a if tape is None else \
                tape.variable(float(a)) if scalar else Tensor.variable(a, tape, device=device)
        inputs.append(_lift(_constant_above(base, depth - 1), t))
    return inputs


def _forward_run(f: Callable[..., Any], point: _Point, tangents: list[Any],
                 args: tuple[Any, ...]) -> Any:
    inputs = _forward_inputs(point, tangents)
    token = _LEVEL.set(point.level)       # (_level, inlined: every forward pass)
    try:
        return _call(f, point.rebuild(inputs), args)
    finally:
        _LEVEL.reset(token)


def _forward_nested(point: _Point) -> bool:
    """Whether a forward transform's results stay values of the levels around it
    (Traces, Records) rather than numbers."""
    depth, tape = point.level
    return depth > 1 or tape is not None or replaying()


def _tangent(leaf: Any) -> Any:
    """The tangent f carried out in an output leaf (zeros for constants)."""
    if isinstance(leaf, Trace):
        return leaf.derivative
    if isinstance(leaf, TraceTensor):
        if _shapes_only(leaf):
            return leaf._tangent       # eval_shape of a transform: shapes only
        return np.array(leaf.tangent, dtype=np.float64)
    if isinstance(leaf, Tensor):
        return np.zeros(leaf.shape)
    if isinstance(leaf, np.ndarray):
        if leaf.dtype == object:
            return np.array([_tangent(e) for e in leaf.reshape(-1)],
                            dtype=np.float64).reshape(leaf.shape)
        return np.zeros(leaf.shape)
    return 0.0


def _jacobian_forward(f: Callable[..., Any], point: _Point, args: tuple[Any, ...],
                      first: Any = None) -> Any:
    columns: list[list[Any]] = []       # per input element: the output leaves' tangents
    nested = _forward_nested(point)
    depth = point.level[0]
    mode = "any" if nested else "forward"
    out_tree: TreeDef | None = None
    out_shapes: list[tuple[int, ...]] = []
    for k, a in enumerate(point.arrays):
        for j in range(a.size):
            if first is not None and not columns:
                result = first
            else:
                tangents = [np.zeros(b.shape) for b in point.arrays]
                tangents[k].reshape(-1)[j] = 1.0
                result = _forward_run(f, point, tangents, args)
            leaves, tree = _output_leaves(result, f, mode)
            if any(_shapes_only(v) for v in leaves):        # eval_shape: shapes only
                shapes_of_point = [b.shape for b in point.arrays]
                return _trees.unflatten(tree, [point.rebuild(b) for b in
                                               _shapes_jacobian(leaves, shapes_of_point)])
            shapes = [_shape(v) for v in leaves]
            if out_tree is None:
                out_tree, out_shapes = tree, shapes
            elif (tree, shapes) != (out_tree, out_shapes):
                raise ValueError(f"{_name(f)} returned outputs of another structure or shape "
                                 f"on one pass than on another: its output must not change "
                                 f"size")
            columns.append([_split_top(v, depth)[1] if nested else _tangent(v)
                            for v in leaves])
    if out_tree is None:       # no inputs: one evaluation tells the output's structure
        leaves, out_tree = _output_leaves(_forward_run(f, point, point.arrays, args), f,
                                          mode)
        out_shapes = [_shape(v) for v in leaves]
    blocks = []
    for i, out_shape in enumerate(out_shapes):
        per_input, start = [], 0
        for a in point.arrays:
            if nested:       # recorded columns: a recorded block
                part = [c[i] for c in columns[start:start + a.size]]
                start += a.size
                per_input.append(_recorded_block(part, out_shape, a.shape))
                continue
            cols = [np.asarray(c[i], dtype=np.float64) for c in columns[start:start + a.size]]
            start += a.size
            block = (np.stack(cols, axis=-1) if cols else np.zeros(out_shape + (0,)))
            block = block.reshape(out_shape + a.shape)
            per_input.append(float(block) if block.ndim == 0 else block)
        blocks.append(point.rebuild(per_input))
    return _trees.unflatten(out_tree, blocks)


def _recorded_block(columns: list[Any], out_shape: tuple[int, ...],
                    in_shape: tuple[int, ...]) -> Any:
    """Recorded columns (one per input element, each of out_shape) as the recorded block
    out_shape + in_shape."""
    if out_shape == ():
        if in_shape == ():
            return columns[0]
        return _traces_block(columns, in_shape)
    return stack(columns, axis=-1).reshape(out_shape + in_shape)
