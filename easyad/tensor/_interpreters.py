"""Interpreters: what running a tensor operation means, asked by method, never by kind.

A tensor's backend says where its buffers live and how a kernel runs (the Backend
Protocol, ``_backend.py``). Its ``interpreter`` says what running an operation *means*:

- ``EVALUATE`` (this module): compute the values now. The numpy and OpenCL backends.
- ``SHAPES`` (``_meta.py``): shapes and dtypes only, no values (``ad.eval_shape``).
- ``RECORDING`` (``_program.py``): compute at the recording point and append every kernel
  to a program that replays at other points (``ad.record(..., tensor=True)``).

The tensor layer never tests which one it has (``backend.kind`` is for messages only,
``tests/test_layers.py`` fails if a ``"meta"``/``"program"`` comparison comes back): it asks
the questions below, and a new transform that runs f on tensors of its own backend
answers them by subclassing ``Interpreter``. vmap is the other kind of interpreter: its
batched tensors wrap ordinary ones and the op table's ``ops.apply`` hands each op to its
batching rule (``transforms/vmap_batched.py``); it asks ``replays`` of the tensors it holds.

Which backend a tensor made from data goes on (``Tensor.constant``, ``Tensor.variable``,
a module's parameters, a transform's inputs) is decided here, once: a transform that runs
f on tensors of its own backend opens a *frame* with ``interpreting(backend)`` (eval_shape
with ``META``, ad.record with its ``ProgramBackend``), and every constructor asks
``new_tensor_backend()``. The frames form one stack in one context variable, so they nest,
unwind on an exception and stay in their thread (a new thread starts with none open).

Layering: a leaf of the devices layer (nothing of easyad imported at run time), so the
backends, which name their interpreter as a class attribute, import it from below.
"""
from __future__ import annotations

import contextlib
import contextvars
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any, TypeVar

if TYPE_CHECKING:
    from easyad.tensor._backend import Backend

B = TypeVar("B")


class Interpreter:
    """The questions the tensor layer asks about how an operation runs; the defaults are
    eager evaluation's answers (``EVALUATE``)."""

    #: for messages and reports only: nothing branches on it
    name = "evaluate"
    #: whether buffers hold numbers (False: reading a value raises; repr shows no values)
    has_values = True
    #: whether a single-number result (a loss) stays a 0-d tensor, made by ``number``,
    #: instead of becoming a float or a scalar Record
    numbers_stay_tensors = False
    #: whether the values seen now are those of one recording point that replays at
    #: others: nothing may be decided on the host from them (it would be baked into the
    #: replay), host arrays of recorded tensors are refused, and derivative transforms
    #: inside are not recorded yet
    replays = False
    #: whether an operation with one of this interpreter's tensors runs here whatever
    #: device its other tensors are on (``adopt`` takes them)
    takes_any_device = False
    #: whether fused one-entry tape steps that read values apply (softmax's SoftmaxStep);
    #: False: the operation is composed of its parts
    fuses = True
    #: whether ``ad.checkpoint`` saves memory here; False: f runs as it is
    checkpoints = True

    def adopt(self, backend: Backend, tensor: Any) -> Any:
        """A buffer of ``backend`` (this interpreter's) standing for ``tensor``, a tensor of
        another backend met in one operation, or the error saying why it cannot be."""
        raise ValueError(tensor._backend.interpreter.mixed_message(tensor, backend))

    def mixed_message(self, tensor: Any, backend: Backend) -> str:
        """Why ``tensor`` (of this interpreter) cannot join an operation on ``backend``."""
        return (f"tensors on different devices ({tensor._backend.device} and "
                f"{backend.device}); move one with .to(device)")

    def number(self, cls: type, label: str, backend: Backend, value: Any, tape: Any,
               inputs: tuple[int, ...], vjp: Any, graph: Any) -> Any:
        """A single-number result as a 0-d tensor (asked only where
        ``numbers_stay_tensors``)."""
        raise NotImplementedError(f"the {self.name} interpreter reads numbers as floats")

    def primitive(self, prim: Any, args: tuple[Any, ...], ops: list[Any], dtype: Any,
                  cls: type, kwargs: dict[str, Any], backend: Backend) -> Any:
        """A user array primitive (``ad.primitive``) run here, or NotImplemented: its
        function then runs now on host copies, recorded as one node (``tensor/_custom``)."""
        return NotImplemented

    def __repr__(self) -> str:
        return f"<{self.name} interpreter>"


EVALUATE = Interpreter()


def of(value: Any) -> Interpreter | None:
    """The interpreter of a tensor (its backend's), or None for anything else."""
    backend = getattr(value, "_backend", None)
    return None if backend is None else getattr(backend, "interpreter", None)


# ---- the open frames: which backend new tensors go on ----

class Frame:
    """One open ``interpreting(backend)`` block: the transform's ``backend``, the frame it
    opened inside (``outer``) and ``target``, the backend of the tensors made inside."""

    __slots__ = ("backend", "outer", "target")

    def __init__(self, backend: Backend, outer: Frame | None) -> None:
        self.backend, self.outer = backend, outer
        # inside a frame whose tensors have no values (eval_shape), nothing gets values:
        # a recording opened there makes shape-only constants too, as eval_shape promises
        self.target: Backend = backend if outer is None or \
            outer.target.interpreter.has_values else outer.target


_OPEN: contextvars.ContextVar[Frame | None] = contextvars.ContextVar("easyad_interpreters",
                                                                    default=None)


@contextlib.contextmanager
def interpreting(backend: Backend) -> Iterator[Frame]:
    """Run the block with ``backend`` (its interpreter a transform's: eval_shape's,
    ad.record's) as the innermost open frame; the outer one again afterwards, also when
    the block raises."""
    frame = Frame(backend, _OPEN.get())
    token = _OPEN.set(frame)
    try:
        yield frame
    finally:
        _OPEN.reset(token)


def new_tensor_backend() -> Backend | None:
    """The backend a tensor made from data goes on now, or None where no frame is open
    (the device's own backend, which the caller resolves)."""
    frame = _OPEN.get()
    return None if frame is None else frame.target


def new_tensors_have_values() -> bool:
    """Whether a tensor made from data now holds numbers (False inside eval_shape), so a
    caller may hand it host memory or read it."""
    frame = _OPEN.get()
    return frame is None or frame.target.interpreter.has_values


def innermost(cls: type[B]) -> B | None:
    """The backend of the innermost open frame whose backend is a ``cls`` (the open
    recording: ``innermost(ProgramBackend)``), whatever frames opened inside it."""
    frame = _OPEN.get()
    while frame is not None:
        if isinstance(frame.backend, cls):
            return frame.backend
        frame = frame.outer
    return None


def replaying() -> bool:
    """Whether an open frame's interpreter ``replays`` (a recording is under way, maybe
    with an eval_shape inside it): numbers computed now must stay values it records."""
    frame = _OPEN.get()
    while frame is not None:
        if frame.backend.interpreter.replays:
            return True
        frame = frame.outer
    return False
