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

Layering: a leaf of the devices layer (nothing of easyad imported at run time), so the
backends, which name their interpreter as a class attribute, import it from below.
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from easyad.tensor._backend import Backend


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
