"""A ``TensorFunction`` pickled as its program (plain data, no Python code): the recorded
instructions, slots and outputs, checked field by field on arrival (``rebuild``: a damaged
or hostile pickle raises ``TapeFormatError`` before anything is compiled or run) and bound
again, so its fused C compiles into the receiving process's own cache (``_cache.py``; no
compiler: one ``CompilerWarning`` and the kernels run unfused).

What does not travel is refused when pickling, each with its fix: ``f`` itself (so
``on_branch_change="retape"``, and calls whose recording was not made yet, need it),
module parameters read at every call, user array primitives (host Python functions),
OpenCL devices (the program's values live there).
"""
from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np

from easyad import _expr, _trees
from easyad.compiler import ir
from easyad.errors import TapeFormatError
from easyad.ops._table import KERNELS, HostKernel, Op, params_types
from easyad.recorded.tensor_recording import _Recording, _Static
from easyad.tensor import _devices
from easyad.tensor._program import Program

_FORMAT = 1
_SOURCE = "pickled TensorFunction"
_DAMAGED = "The data is damaged, or is not a TensorFunction pickled by easyad"
_KINDS = ("first", "hvp", "vjp")
_REC_FIELDS = ("out_tree", "outputs", "n_forward", "gradient", "descended", "hvp", "vjp",
               "out_specs", "scalar_output", "guards")
# every op a program records; a host call passes only when it calls a registered host
# kernel (pickled by name with its parameters), not a Python function of the user's
_OPS = dict(ir._NODES)


def state(F: Any) -> tuple[Any, ...]:
    """The data a TensorFunction pickles as (see the module docstring)."""
    if F.on_branch_change == "retape":
        raise TypeError("a TensorFunction with on_branch_change='retape' does not pickle: "
                        "re-recording needs f, which stays behind; record it with "
                        "on_branch_change='raise' to send it")
    if F._backend.kind != "numpy":
        raise TypeError("a TensorFunction recorded on an OpenCL device does not pickle (its "
                        "values live there); record it on the numpy device "
                        "(device='numpy') to send it")
    recordings = {}
    for key, rec in F._recordings.items():
        p = rec.program
        if p.effects:
            raise TypeError("this TensorFunction updates live arrays at every replay "
                            "(BatchNorm's running statistics in training mode), which do "
                            "not travel with a pickle; record it after model.eval() to "
                            "send it, or record f again in the other process")
        if p.live:
            raise TypeError("this TensorFunction reads module parameters at every call, "
                            "which do not travel; pass the parameters as arguments of f "
                            "(arrays after x0) to pickle it")
        hosts = sorted({i.params.label for i in p.instructions
                        if i.op == "host" and not isinstance(i.params.fn, HostKernel)})
        if hosts or any(d is None for d in p.dtypes):
            named = f" ({', '.join(map(repr, hosts))})" if hosts else ""
            raise TypeError(f"this TensorFunction calls host Python code{named}: a user "
                            "array primitive or an opaque step, which does not pickle "
                            "as a program; record f again in the other process")
        program = ([(i.op, tuple(i.params), tuple(i.ins), tuple(i.outs))
                    for i in p.instructions],
                   list(p.shapes), [np.dtype(d).str for d in p.dtypes],
                   [np.asarray(v) for v in p.values], list(p.inputs),
                   dict(p.constants), dict(p.in_place))
        recordings[key] = (program, *(getattr(rec, f) for f in _REC_FIELDS))
    statics = [None if k is None else k.value for k in F._arg_kinds]
    return (_FORMAT, F._x_tree, [(s, np.dtype(d).str) for s, d in F._x_specs],
            F._arg_tree, statics, [None if s is None else (s[0], np.dtype(s[1]).str)
                                   for s in F._arg_specs],
            F.on_branch_change, bool(F.fuse), recordings)


# ---- the checks ----
def _fail(what: str) -> TapeFormatError:
    return TapeFormatError(f"{_SOURCE}: {what}. {_DAMAGED}")


def _shape(v: Any, what: str) -> tuple[int, ...]:
    if type(v) is not tuple or any(type(d) is not int or d < 0 for d in v):
        raise _fail(f"{what} is {v!r}, not a shape (a tuple of non-negative ints)")
    return v


def _dtype(v: Any, what: str) -> np.dtype[Any]:
    try:
        d = np.dtype(v) if type(v) is str else None
    except TypeError:
        d = None
    if d is None or d.kind not in "biuf" or d.hasobject:
        raise _fail(f"{what} is {v!r}, not a numeric dtype")
    return d


def _slot(v: Any, size: int, what: str) -> int:
    if type(v) is not int or not 0 <= v < size:
        raise _fail(f"{what} is {v!r}, not a slot of the program (0 to {size - 1})")
    return v


def _tree(t: Any, what: str) -> Any:
    if type(t) is not _trees.TreeDef or t.kind not in ("leaf", "tuple", "list", "dict",
                                                       "arguments") \
            or type(t.children) is not tuple or type(t.keys) is not tuple:
        raise _fail(f"{what} is not a structure of arrays")
    for c in t.children:
        _tree(c, what)
    return t


def _plain(v: Any, what: str) -> None:
    """A parameter value: numbers, strings, numeric arrays, dtypes, op-table ops (pickled
    by name) and tuples of these: nothing that runs code when used."""
    if v is None or type(v) in (bool, int, float, str, np.float64, np.int64, np.bool_):
        return
    if type(v) is np.ndarray and not v.dtype.hasobject:
        return
    if isinstance(v, (np.dtype, Op)) or (isinstance(v, type) and issubclass(v, np.generic)):
        return
    if isinstance(v, HostKernel):       # a registered host kernel, by name
        if v.name not in KERNELS or type(v.params) is not KERNELS[v.name].params:
            raise _fail(f"{what} calls host kernel {v.name!r}, which is not registered "
                        f"with these parameters")
        _plain(v.params, what)
        return
    if type(v) in params_types():       # an op's (or host kernel's) typed parameters
        for field in dataclasses.fields(v):
            _plain(getattr(v, field.name), what)
        return
    if isinstance(v, tuple):
        for x in v:
            _plain(x, what)
        return
    raise _fail(f"{what} holds a {type(v).__name__}")


def _program(data: Any, key: str) -> Program:
    if type(data) is not tuple or len(data) != 7:
        raise _fail(f"the {key} program is not 7 fields")
    instructions, shapes, dtypes, values, inputs, constants, in_place = data
    if not all(type(x) is list for x in (instructions, shapes, dtypes, values, inputs)) \
            or type(constants) is not dict or type(in_place) is not dict:
        raise _fail(f"the {key} program's fields are not lists and dicts")
    p = Program()
    size = len(shapes)
    if len(dtypes) != size or len(values) != size:
        raise _fail(f"the {key} program has {size} shapes, {len(dtypes)} dtypes and "
                    f"{len(values)} values")
    p.shapes = [_shape(s, f"slot {k}'s shape") for k, s in enumerate(shapes)]
    p.dtypes = [_dtype(d, f"slot {k}'s dtype") for k, d in enumerate(dtypes)]
    for k, v in enumerate(values):
        if type(v) is not np.ndarray or v.shape != p.shapes[k] or v.dtype.hasobject:
            raise _fail(f"slot {k}'s value is not an array of shape {p.shapes[k]}")
    p.values = values
    p.inputs = [_slot(s, size, "an input") for s in inputs]
    for s, v in constants.items():
        _slot(s, size, "a constant")
        if type(v) is not np.ndarray or v.shape != p.shapes[s] or v.dtype.hasobject:
            raise _fail(f"constant {s} is not an array of shape {p.shapes[s]}")
    p.constants = constants
    p.in_place = {_slot(a, size, "an in-place output"): _slot(b, size, "an in-place input")
                  for a, b in in_place.items()}
    for n, entry in enumerate(instructions):
        if type(entry) is not tuple or len(entry) != 4:
            raise _fail(f"instruction {n} is not (op, params, ins, outs)")
        op, params, ins, outs = entry
        kind = _OPS.get(op) if type(op) is str else None
        if kind is None:
            raise _fail(f"instruction {n}'s op {op!r} is not one a program records")
        if type(params) is not tuple or len(params) != len(kind._fields):
            raise _fail(f"instruction {n}'s params are not the {len(kind._fields)} fields "
                        f"of {kind.__name__}")
        _plain(params, f"instruction {n}'s params")
        if kind is ir.HostCall and not isinstance(params[1], HostKernel):
            raise _fail(f"instruction {n} calls Python code, not a registered host kernel")
        if kind is ir.Map:     # its expressions become C: only the rule language passes
            for text in params[1]:
                try:
                    _expr.parse(text) if type(text) is str else None
                except ValueError as e:
                    raise _fail(f"instruction {n}: {e}") from None
                if type(text) is not str:
                    raise _fail(f"instruction {n}'s expression is {text!r}")
            if any(type(x) is not str or not x.isidentifier() for x in params[2]):
                raise _fail(f"instruction {n}'s names are not identifiers")
        if type(ins) is not tuple or type(outs) is not tuple:
            raise _fail(f"instruction {n}'s operands are not tuples")
        for i in ins:     # a slot's number, or a constant in place
            if type(i) is int:
                _slot(i, size, f"instruction {n}'s operand")
            else:
                _plain(i, f"instruction {n}'s operand")
        for o in outs:
            _slot(o, size, f"instruction {n}'s output")
        p.instructions.append(ir.Node(op, kind(*params), ins, outs))
    return p


def _slots(v: Any, size: int, what: str, optional: bool = True) -> Any:
    if v is None and optional:
        return None
    if type(v) is not list:
        raise _fail(f"{what} is not a list of slots")
    return [_slot(s, size, what) for s in v]


def rebuild(TensorFunction: type, *data: Any) -> Any:
    """A TensorFunction from ``state``'s data, every field checked (TapeFormatError), its
    programs bound (compiled into this process's cache)."""
    if len(data) != 9 or data[0] != _FORMAT:
        raise _fail(f"{len(data)} fields of format {data[0] if data else None!r}, expected 9 "
                    f"of format {_FORMAT}")
    _, x_tree, x_specs, arg_tree, statics, arg_specs, obc, fuse, recordings = data
    F = TensorFunction.__new__(TensorFunction)
    F._x_tree = _tree(x_tree, "x's structure")
    if type(arg_tree) is not tuple:
        raise _fail("the arguments' structures are not a tuple")
    F._arg_tree = tuple(_tree(t, "an argument's structure") for t in arg_tree)
    if sum(t.leaf_count for t in F._arg_tree) != len(arg_specs) or type(x_specs) is not list \
            or type(arg_specs) is not list or type(statics) is not list \
            or len(statics) != len(arg_specs) or len(x_specs) != F._x_tree.leaf_count:
        raise _fail("the input specifications do not match the structures")
    if type(x_specs) is not list or type(arg_specs) is not list or type(statics) is not list \
            or len(statics) != len(arg_specs) or len(x_specs) != x_tree.leaf_count:
        raise _fail("the input specifications do not match the structures")
    F._x_specs = [(_shape(s, "an input's shape"), _dtype(d, "an input's dtype"))
                  for s, d in x_specs]
    F._arg_specs = [None if s is None else (_shape(s[0], "an argument's shape"),
                                            _dtype(s[1], "an argument's dtype"))
                    for s in arg_specs]
    F._arg_kinds = [None if spec is not None else _Static(v)
                    for spec, v in zip(F._arg_specs, statics)]
    if obc != "raise" or type(fuse) is not bool:
        raise _fail(f"on_branch_change {obc!r} / fuse {fuse!r}")
    F.f, F.on_branch_change, F.fuse = None, obc, fuse
    F._backend = _devices.resolve("numpy")
    F._simple = F._x_tree.is_leaf and not F._arg_specs
    F._flat_keys = F._x_tree.keys if F._x_tree.kind == "dict" and all(
        c.is_leaf for c in F._x_tree.children) else None
    F._fast = F._simple
    F._bound, F._learning_rate, F._lr_on_device = {}, np.zeros(()), None
    if type(recordings) is not dict or "first" not in recordings \
            or not set(recordings) <= set(_KINDS):
        raise _fail("the recordings are not a dict with 'first'")
    F._recordings = {}
    for key, rec_data in recordings.items():
        if type(rec_data) is not tuple or len(rec_data) != 1 + len(_REC_FIELDS):
            raise _fail(f"the {key} recording is not {1 + len(_REC_FIELDS)} fields")
        rec = _Recording.__new__(_Recording)
        rec.program = _program(rec_data[0], key)
        size = len(rec.program.shapes)
        fields = dict(zip(_REC_FIELDS, rec_data[1:]))
        rec.out_tree = _tree(fields["out_tree"], "the output structure")
        rec.outputs = _slots(fields["outputs"], size, "an output", optional=False)
        for name in ("gradient", "descended", "hvp", "vjp"):
            setattr(rec, name, _slots(fields[name], size, f"a {name} slot"))
        specs = fields["out_specs"]
        if type(specs) is not list or len(specs) != len(rec.outputs):
            raise _fail("the output specifications do not match the outputs")
        rec.out_specs = [(_shape(s, "an output's shape"), np.dtype(_dtype(
            np.dtype(d).str if isinstance(d, np.dtype) else d, "an output's dtype")))
            for s, d in specs]
        for name in ("n_forward", "guards"):
            if type(fields[name]) is not int or not 0 <= fields[name] <= len(
                    rec.program.instructions):
                raise _fail(f"{name} is {fields[name]!r}")
            setattr(rec, name, fields[name])
        if type(fields["scalar_output"]) is not bool:
            raise _fail("scalar_output is not a bool")
        rec.scalar_output = fields["scalar_output"]
        F._recordings[key] = rec
    for what in ("value", "gradient"):   # compiled here, into this process's cache
        if what == "value" or F._recordings["first"].gradient is not None:
            F._bind(what, [], [])
    return F
