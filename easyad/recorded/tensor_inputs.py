"""How a ``TensorFunction`` takes the inputs of a call: x's leaves and the float arguments
checked against the recorded structure, shapes and dtypes (ValueError naming what was
recorded), statics compared, and leaves that are already where the program reads them (a
model's Parameters, Tensors on the Function's device) passed without a copy. A mixin of
``TensorFunction`` (``easyad/_recorded.py``): every call goes through it first, and its
fast path (``_plain_inputs``) is a training step's cost.
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np

from easyad import _arrays, _trees
from easyad.recorded.tensor_recording import _flatten_args, _float_leaf, _Resident
from easyad.tensor._base import FLOAT_DTYPES, TensorBase
from easyad.tensor._parameters import ParameterValues

if TYPE_CHECKING:
    from easyad.tensor._backend import Backend


class TensorInputs:
    """The input checks of ``TensorFunction`` (see the module docstring)."""

    # set by TensorFunction.__init__
    _backend: Backend
    _x_tree: Any
    _x_specs: list[tuple[tuple[int, ...], Any]]
    _arg_tree: tuple[Any, ...]
    _arg_kinds: list[Any]
    _arg_specs: list[Any]
    _simple: bool
    _flat_keys: tuple[Any, ...] | None

    @staticmethod
    def _float(v: Any, what: str = "an argument") -> np.ndarray:
        """A float leaf as tensors hold it: float32 stays float32 (in native byte order),
        other reals become float64 (``_arrays.real_array``: complex and the like raise)."""
        if isinstance(v, TensorBase):
            v = v.value
        a = np.asarray(v)
        # np.dtype(type): numpy's own dtype object (a newbyteorder copy is equal but not
        # identical, and the core's fast paths test dtypes by identity)
        native = np.dtype(a.dtype.type) if a.dtype.kind == "f" else a.dtype
        return _arrays.real_array(a, what, native if native in FLOAT_DTYPES else np.float64)

    def _inputs(self, x: Any, args: tuple[Any, ...]) -> tuple[list[np.ndarray], list[Any]]:
        if type(x) is np.ndarray and not args and self._simple:   # one array, no arguments
            shape, dtype = self._x_specs[0]
            if x.shape == shape and x.dtype == dtype:
                return [x], []
        found = self._plain_inputs(x, args)
        if found is not None:
            return found
        leaves, tree = _trees.flatten(x)
        if tree != self._x_tree:
            raise ValueError(f"recorded for {self._x_tree.describe()} as x, got "
                             f"{tree.describe()}")
        xs: list[Any] = []
        for v, (shape, dtype) in zip(leaves, self._x_specs):
            resident = self._resident(v, shape, dtype)
            if resident is not None:
                xs.append(resident)
                continue
            a = _arrays.real_array(v.value if isinstance(v, TensorBase) else v, "x", dtype)
            if a.shape != shape:
                raise ValueError(f"recorded for an input of shape {shape}, got {a.shape}; "
                                 f"record again for another shape")
            xs.append(a)
        arg_leaves, arg_tree = _flatten_args(args)
        if arg_tree != self._arg_tree:
            raise ValueError(f"recorded with {len(self._arg_tree)} arguments after x "
                             f"({', '.join(t.describe() for t in self._arg_tree)}), got "
                             f"{len(arg_tree)} ({', '.join(t.describe() for t in arg_tree)})")
        out: list[Any] = []
        for v, kind, spec in zip(arg_leaves, self._arg_kinds, self._arg_specs):
            if kind is not None:
                if not kind.same(v):
                    _float_leaf(v)      # complex, dates: the TypeError naming the dtype
                    raise ValueError(
                        "an argument that is not a float array (integers, a number, an "
                        "object) is part of the recording and changed; pass values that "
                        "change as float arrays (class labels one-hot), or record again")
                out.append(kind)
            else:
                shape, dtype = spec
                resident = self._resident_argument(v, shape, dtype)
                if resident is not None:
                    out.append(resident)
                    continue
                a = _arrays.real_array(v.value if isinstance(v, TensorBase) else v,
                                       "an argument after x", dtype)
                if a.shape != shape:
                    raise ValueError(f"recorded for an argument of shape {shape}, got "
                                     f"{a.shape}")
                out.append(a)
        return xs, out

    def _resident(self, v: Any, shape: tuple[int, ...], dtype: Any) -> Any:
        """An x leaf whose values stay where they are: a model's Parameter (its host array
        on the numpy device, which sgd_step writes in place; its device buffer elsewhere,
        uploaded once) or a Tensor already on this Function's device. None: copy it."""
        values = getattr(v, "_values", None)
        if not isinstance(values, ParameterValues):
            values = None
            if not (isinstance(v, TensorBase) and v._backend is self._backend
                    and self._backend.kind != "numpy"):
                return None
        got = (values.shape, values.dtype) if values is not None else (v.shape, v.dtype)
        if got != (shape, dtype):
            raise ValueError(f"recorded for an input of shape {shape} and dtype {dtype}, got "
                             f"{got[0]} and {got[1]}; pass that shape and dtype "
                             f"(dtype={np.dtype(dtype).name}) or record again for another")
        if values is not None and self._backend.kind == "numpy":
            return values.writable()
        return _Resident(values.for_tensor(self._backend.device) if values is not None
                         else v._data, values, v)

    def _resident_argument(self, v: Any, shape: tuple[int, ...], dtype: Any) -> Any:
        """A float argument after x that is a Tensor on this Function's (OpenCL) device:
        its buffer goes into the program as it is (no read to the host and upload again).
        Its shape and dtype must be the recorded ones (ValueError: no silent cast, which
        would copy it each call). A Tensor on another device is read to the host and
        uploaded, as a host array is (None)."""
        if not (isinstance(v, TensorBase) and v._backend is self._backend
                and self._backend.kind != "numpy"):
            return None
        if (v.shape, v.dtype) != (shape, dtype):
            raise ValueError(
                f"recorded for an argument of shape {shape} and dtype {dtype}, got a device "
                f"Tensor of shape {v.shape} and dtype {v.dtype}; make it with "
                f"dtype={np.dtype(dtype).name} and that shape (or record again for another)")
        return _Resident(v._data, None, v)

    def _plain_inputs(self, x: Any, args: tuple[Any, ...]
                      ) -> tuple[list[np.ndarray], list[Any]] | None:
        """The common call of a training step, without walking structures: x an array or a
        flat dict of arrays or, on the numpy device, of a model's Parameters (the recorded
        keys, in order), every argument an array, all of the recorded shapes and dtypes.
        None: take the general path (which explains)."""
        keys = self._flat_keys
        if type(x) is dict and keys is not None and tuple(x) == keys:
            values = list(x.values())
        elif type(x) is np.ndarray and self._x_tree.is_leaf:
            values = [x]
        else:
            return None
        if len(args) != len(self._arg_tree) or any(
                type(a) is not np.ndarray or not t.is_leaf for a, t in zip(args, self._arg_tree)):
            return None
        on_host = self._backend.kind == "numpy"
        for i, (v, (shape, dtype)) in enumerate(zip(values, self._x_specs)):
            if type(v) is not np.ndarray:
                # a model's Parameter on the numpy device (sgd_step's usual x): its host
                # array, as _resident gives it, without the general path's walk
                held = getattr(v, "_values", None) if on_host else None
                if not isinstance(held, ParameterValues):
                    return None
                v = values[i] = held.writable()
            if v.shape != shape or v.dtype != dtype or not v.flags.aligned:
                return None
        out: list[Any] = []
        for a, kind, spec in zip(args, self._arg_kinds, self._arg_specs):
            if kind is not None:
                if not kind.same(a):
                    return None
                out.append(kind)
            elif (a.shape, a.dtype) != spec or not a.flags.aligned:
                return None     # (the general path converts it to the recorded dtype)
            else:
                out.append(a)
        return values, out
