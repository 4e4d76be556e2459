"""The op table: each tensor operation that is not elementwise, defined once.

An ``Op`` is one registration holding everything every engine needs:

- ``params``: a frozen dataclass, the op's static parameters with their types (checked
  at each call: ``bind``), not a positional tuple;
- ``rule(params, *shapes) -> (shape, params)``: the shape rule. It checks the
  parameters against the operands' shapes (``ShapeError``/``ValueError`` before any
  kernel runs) and returns the output's shape with the parameters made canonical
  (negative axes made positive...), so everything downstream sees one spelling. The
  dtype is the operands' common float dtype unless ``dtype`` says otherwise;
- ``vjp(params, g, *xs, out)`` and ``jvp(params, tangents, *xs, out)``, written with
  easyad operations (this table's ops included), so that called on recorded tensors they
  record: create_graph, Hessians and any order follow. A ``linear`` op needs no jvp (the
  op applied to the tangents), and its vjp reads only the shapes and dtypes of ``xs`` and
  ``out`` (``ShapeDtype``s: its node keeps no values alive);
- ``batch(params, axis) -> (params, out_axis)``: the batching rule (the operand with an
  extra axis at ``axis``), for vmap;
- lowerings, one per target: ``numpy(params, *arrays)`` (the host reference; with
  ``objects=True`` it also runs on numpy object arrays of Records, Traces or NestedTraces,
  which makes the op a composition of scalar operations in the scalar engines: the scalar
  tape, ``Function.compile``, nested forward mode); ``opencl(backend, params, *bufs)`` (a
  device kernel); ``composite(backend, params, *bufs)`` (written with the Backend
  Protocol's primitives: it then runs on every backend and fuses in recorded programs).
  A backend with neither a lowering of its own nor a composite runs ``numpy`` on host
  copies (``lower``);
- ``sample(rng, dtype) -> (operands, params)``: a small call, with which a child process
  builds, runs and checks the OpenCL kernel against the numpy lowering before any process
  of the user's builds it (``tensor/_proofs``: a driver that crashes on it takes only the
  child down, and the op then runs on the host); or a list of such calls, each checked
  (an op whose lowering takes several routes by shape gives one call per route);
- ``composite_first``: the composite runs on the numpy device too (its primitives are that
  backend's own kernels: the older structural ops, whose eager results stay bit for bit);
  ``numpy`` is then the reference and the object arrays' form;
- ``loop(params, shapes, ctype) -> Loop``: the op as independent lines, for generated
  code (a recorded program's fused C, one C function of its library): ``Loop.count``
  lines, ``Loop.body`` the statements of line ``line`` (a ``long``), reading the operands
  ``x0``, ``x1``... (``shapes``: theirs, C-contiguous) and writing ``y`` (the result,
  C-contiguous), all of element type ``ctype``, in the syntax C99 and OpenCL C share.
  Without it a replayed program runs the op as a step between its C segments;
- ``step(params, cls, be, operands, bufs, out, shape, dtype) -> Step``: the node's step, whose
  call is the vjp lowered to backend buffers (the sweep's fast form: for the older
  structural ops a step class of the compiled core, the same one their C fast paths
  make) and whose ``graph`` calls ``vjp``. Without it the node's step is ``OpStep``,
  which runs ``vjp`` on constant tensors;
- ``numbers``: a 0-d result of a tensor call is a number (a scalar Record or a float), as
  a reduction's; False: a 0-d tensor (reshape, transpose);
- ``casts``: the operands are cast to the result's dtype first. False (where): the
  lowerings take them as they are, a bool condition and Python numbers or scalar
  Records (given as floats) included;
- ``saves``: the composite returns ``(result, saved)``, buffers it made on the way that
  the node's step keeps (matmul's operands as the backend's matmul took them), which
  ``step`` then gets as ``bufs`` (None where no composite ran: eval_shape), so recorded
  programs hold each of them once.

A recording calls a multi-output host function of an op (attention's forward with the
weights it keeps, its vjp) as one host instruction. Registered here as a host kernel
(``register_kernel``) and bound to plain parameters (``host_kernel``), that function is
data, not a closure: the recording pickles (by the kernel's name) and replays it.

Who reads the table: ``easyad.ops._apply`` (the call: eager tensors of every device,
reverse mode and create_graph, forward mode, ``eval_shape``, ``ad.record`` of tensor code,
object arrays of scalars, plain arrays), the backends' ``op`` method (``lower``), the
recorded programs' replay (``tensor._program``: one ``op`` instruction, read back
through the backend's ``op``; in the numpy device's fused C, ``loop`` as a C function:
``compiler/program/table_c.py``) and the batching helper (``batched``).
"""
from __future__ import annotations

import dataclasses
import typing
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, cast

import numpy as np

if TYPE_CHECKING:
    from easyad.tensor._backend import Backend
    from easyad.tensor._numpy import NumpyBackend
    from easyad.tensor._opencl import OpenCLBackend

OPS: dict[str, Op] = {}
KERNELS: dict[str, Kernel] = {}       # the host kernels, by name
_HINTS: dict[type, dict[str, Any]] = {}      # each params class's field types


class Loop(typing.NamedTuple):
    """An op's lowering to generated code (``Op.loop``): ``lines`` independent lines,
    ``body`` the statements of line ``line``."""
    lines: int
    body: str


@dataclasses.dataclass(frozen=True, eq=False)
class Op:
    """One non-elementwise operation (see the module's docstring for each field)."""

    name: str
    params: type
    rule: Callable[..., tuple[tuple[int, ...], Any]]
    numpy: Callable[..., Any]
    vjp: Callable[..., tuple[Any, ...]]
    jvp: Callable[..., Any] | None = None
    batch: Callable[..., tuple[Any, int]] | None = None
    opencl: Callable[..., Any] | None = None
    composite: Callable[..., Any] | None = None
    dtype: Callable[..., Any] | None = None
    sample: Callable[..., tuple[tuple[Any, ...], dict[str, Any]]] | None = None
    step: Callable[..., Any] | None = None
    loop: Callable[..., Loop] | None = None
    linear: bool = False
    objects: bool = False
    composite_first: bool = False
    numbers: bool = True
    casts: bool = True
    saves: bool = False
    doc: str = ""

    def __repr__(self) -> str:
        return f"<easyad op {self.name!r}>"

    def __reduce__(self) -> Any:       # pickled by name: the table is the one definition
        return (get, (self.name,))

    def lower(self, be: Backend, params: Any, bufs: list[Any], shape: tuple[int, ...],
              dtype: Any) -> Any:
        """This op on backend ``be``'s buffers (the numpy and OpenCL backends' ``op``): the
        backend's own lowering, else the composite of its primitives, else ``numpy`` on host
        copies, the result put back on ``be`` (a device with no kernel for it)."""
        kind = be.kind
        if kind == "opencl" and self.opencl is not None and \
                cast("OpenCLBackend", be).proven_op(self, dtype):
            return self.opencl(be, params, *bufs)
        if self.composite is not None and (kind != "numpy" or self.composite_first):
            return self.composite(be, params, *bufs)
        hosts = bufs if kind == "numpy" else [np.asarray(be.to_numpy(b)) for b in bufs]
        made = self.numpy(params, *hosts)
        # asarray, not ascontiguousarray: that makes a 0-d result (det of one matrix) 1-d
        out = np.asarray(made, dtype=dtype, order="C")
        if out.shape != shape:
            raise AssertionError(f"op {self.name!r}: its numpy lowering made shape "
                                 f"{out.shape} where its shape rule says {shape} (the two "
                                 f"disagree: fix the op)")
        if kind == "numpy" and out.flags.owndata and out.flags.writeable and \
                not any(out is h for h in hosts):
            # a new array of the lowering's own: no second copy
            return cast("NumpyBackend", be).adopt(out)
        return be.asarray(out, dtype)

    def bind(self, kwargs: dict[str, Any]) -> Any:
        """The call's keyword arguments as this op's typed parameters."""
        hints = _HINTS.get(self.params)
        if hints is None:         # (read once per class: get_type_hints costs microseconds)
            hints = _HINTS[self.params] = typing.get_type_hints(self.params)
        unknown = sorted(set(kwargs) - set(hints))
        if unknown:
            raise TypeError(f"{self.name}() got unexpected parameter(s) {unknown}; it takes "
                            f"{sorted(hints)}")
        values = {k: _checked(self.name, k, v, hints[k]) for k, v in kwargs.items()}
        try:
            return self.params(**values)
        except TypeError as error:
            raise TypeError(f"{self.name}(): {error}") from None


def _checked(op: str, name: str, value: Any, hint: Any) -> Any:
    """``value`` as the parameter's declared type (numpy ints as ints, lists as tuples),
    or a TypeError naming the op, the parameter and what it takes."""
    if type(value) is hint or hint is Any:   # the common case: already an int, a bool...
        return value
    origin = typing.get_origin(hint)
    options = typing.get_args(hint) if origin in (typing.Union, getattr(
        __import__("types"), "UnionType", typing.Union)) else (hint,)
    for option in options:
        if option is type(None) and value is None:
            return None
        if option is int and isinstance(value, (int, np.integer)) and \
                not isinstance(value, (bool, np.bool_)):
            return int(value)
        if option is bool and isinstance(value, (bool, np.bool_)):
            return bool(value)
        if option is float and isinstance(value, (int, float, np.integer, np.floating)) and \
                not isinstance(value, bool):
            return float(value)
        if typing.get_origin(option) is tuple and isinstance(value, (tuple, list)) and \
                all(isinstance(v, (int, np.integer)) and not isinstance(v, bool)
                    for v in value):
            return tuple(int(v) for v in value)
    raise TypeError(f"{op}(): parameter {name!r} must be {_spelt(hint)}, got {value!r}")


def _spelt(hint: Any) -> str:
    text = hint.__name__ if isinstance(hint, type) else str(hint)
    return text.replace("typing.", "").replace("NoneType", "None")


def register(op: Op) -> Op:
    """Add ``op`` to the table (a name is registered once)."""
    if not op.name.isidentifier():
        raise ValueError(f"an op's name is an identifier, got {op.name!r}")
    if op.name in OPS:
        raise ValueError(f"op {op.name!r} is registered already")
    if not (isinstance(op.params, type) and dataclasses.is_dataclass(op.params)):
        raise TypeError(f"op {op.name!r}: params must be a dataclass type")
    if op.jvp is None and not op.linear:
        raise TypeError(f"op {op.name!r}: give a jvp (only a linear op may leave it out)")
    if op.opencl is not None and op.sample is None:
        raise TypeError(f"op {op.name!r}: an OpenCL kernel needs a sample call (sample=...), "
                        f"with which a child process proves the kernel before it is built "
                        f"here")
    OPS[op.name] = op
    return op


def unregister(name: str) -> None:
    """Remove op ``name`` from the table (tests that register an op of their own)."""
    del OPS[name]


def get(name: str) -> Op:
    try:
        return OPS[name]
    except KeyError:
        raise KeyError(f"no op {name!r} in the table; registered: {sorted(OPS)}") from None


class Kernel(typing.NamedTuple):
    """A registered host kernel: ``fn(params, *arrays) -> list of new arrays`` (it reads
    its arguments and writes none of them), its parameters' dataclass, and ``batches``:
    the leading axes of its operands are independent and broadcast as numpy's, so given
    every operand with one more leading axis (the points of a batch; an operand of lower
    rank padded with ones after it, so the axes still line up) it returns each result with
    the points first
    (row-major: point b's values the b-th of B equal parts), each point's the same as
    alone. A recording's batch then calls it once for all its points."""
    fn: Callable[..., list[Any]]
    params: type
    batches: bool


def register_kernel(name: str, fn: Callable[..., list[Any]], params: type,
                    batches: bool = False) -> None:
    """Register host kernel ``name`` (see ``Kernel``)."""
    if name in KERNELS:
        raise ValueError(f"host kernel {name!r} is registered already")
    if not (isinstance(params, type) and dataclasses.is_dataclass(params)):
        raise TypeError(f"host kernel {name!r}: params must be a dataclass type")
    KERNELS[name] = Kernel(fn, params, batches)


@dataclasses.dataclass(frozen=True)
class HostKernel:
    """A registered host kernel bound to its parameters: what a recording's host
    instruction calls. It borrows (reads its arguments, returns new arrays: the numpy
    device lends it the slots) and pickles by name."""

    name: str
    params: Any
    borrows: typing.ClassVar[bool] = True

    def __call__(self, *arrays: Any) -> list[Any]:
        return KERNELS[self.name].fn(self.params, *arrays)

    @property
    def batches(self) -> bool:
        return KERNELS[self.name].batches

    def __reduce__(self) -> Any:
        return (host_kernel, (self.name, self.params))


def host_kernel(name: str, params: Any) -> HostKernel:
    """Host kernel ``name`` bound to ``params`` (an instance of its params dataclass)."""
    if name not in KERNELS:
        raise KeyError(f"no host kernel {name!r}; registered: {sorted(KERNELS)}")
    if type(params) is not KERNELS[name].params:
        raise TypeError(f"host kernel {name!r} takes {KERNELS[name].params.__name__}, got "
                        f"{type(params).__name__}")
    return HostKernel(name, params)


def params_types() -> set[type]:
    """The parameter dataclasses of every op and host kernel (what a pickled recording may
    hold besides plain data)."""
    return {op.params for op in OPS.values()} | {k.params for k in KERNELS.values()}
