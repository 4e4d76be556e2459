"""Module (the base of every layer) and Sequential (modules applied in order).

A module is a callable ``model(x, tape=None)``. Its parameters are ``Parameter``s (numpy
arrays on the host) found among its attributes, and its submodules are the ``Module``
attributes, in the order they were set, so names come out as in PyTorch (``"0.weight"``
in a Sequential, ``"fc1.bias"`` in a module with ``self.fc1 = nn.Linear(...)``) and a
PyTorch ``state_dict`` converted to numpy loads as it is.

The WengertList of a step is passed to the call: ``model(x, tape=lst)`` records every
parameter the forward pass uses on ``lst`` (see ``Parameter.tensor``). Inside a model
only the first layer needs it: a layer called on a tensor that is already recorded on a
list takes that list, so ``self.fc2(ad.tanh(self.fc1(x, tape)))`` is enough. Without a
list (``model(x)`` on data) the parameters are constants: inference, nothing recorded.
"""
from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import numpy as np

from easyad.nn._parameter import Parameter
from easyad.tensor import Tensor


class Module:
    """Base class of layers and models: write ``forward(self, x, tape)``.

    Examples
    --------
    >>> import numpy as np, easyad as ad
    >>> class Affine(ad.nn.Module):
    ...     def __init__(self):
    ...         self.scale = ad.nn.Parameter(np.array([2.0]))
    ...     def forward(self, x, tape=None):
    ...         return x * self.scale.tensor(tape)
    >>> lst = ad.WengertList()
    >>> model = Affine()
    >>> loss = ad.sum(model(np.array([1.0, 3.0]), tape=lst))
    >>> loss.number, loss.derivatives()[model.scale]
    (8.0, array([4.]))
    """

    training: bool = True

    def forward(self, x: Any, tape: Any = None) -> Any:
        raise NotImplementedError(f"{type(self).__name__} does not define forward(x, tape)")

    def __call__(self, x: Any, tape: Any = None) -> Any:
        """``forward(x, tape)``; ``tape`` defaults to the list ``x`` is recorded on, and
        data (a numpy array or list) becomes a constant tensor on the parameters' device,
        in their dtype."""
        if isinstance(x, Tensor):
            if tape is None:
                tape = x.tape
        elif isinstance(x, (np.ndarray, list, tuple, float, int)):
            x = self._as_input(x)
        return self.forward(x, tape)

    def _as_input(self, x: Any) -> Tensor:
        first = next((p for _, p in self.named_parameters()), None)
        a = np.asarray(x)
        if first is not None:
            return Tensor.constant(a, device=first.device, dtype=first.dtype)
        return Tensor.constant(a, dtype=a.dtype if a.dtype == np.float32 else np.float64)

    # -- the tree of modules and parameters --
    def named_children(self) -> Iterator[tuple[str, "Module"]]:
        """The direct submodules, by attribute name, in the order they were set; a list or
        tuple of modules held in an attribute gives ``name.0``, ``name.1``... (PyTorch's
        ModuleList names)."""
        for name, value in vars(self).items():
            if isinstance(value, Module):
                yield name, value
            elif isinstance(value, (list, tuple)) and value and \
                    all(isinstance(m, Module) for m in value):
                for i, m in enumerate(value):
                    yield f"{name}.{i}", m

    def children(self) -> Iterator["Module"]:
        return (m for _, m in self.named_children())

    def named_modules(self, prefix: str = "") -> Iterator[tuple[str, "Module"]]:
        """This module (name ``prefix``) and every submodule, depth first (a module held
        twice comes once, under its first name)."""
        seen: set[int] = set()
        stack: list[tuple[str, Module]] = [(prefix, self)]   # no recursive closure: no cycle
        while stack:
            name, module = stack.pop()
            if id(module) in seen:
                continue
            seen.add(id(module))
            yield name, module
            children = [(f"{name}.{child}" if name else child, m)
                        for child, m in module.named_children()]
            stack.extend(reversed(children))

    def modules(self) -> Iterator["Module"]:
        return (m for _, m in self.named_modules())

    def _own_parameters(self) -> Iterator[tuple[str, Parameter]]:
        for name, value in vars(self).items():
            if isinstance(value, Parameter):
                yield name, value
            elif isinstance(value, (list, tuple)) and value and \
                    all(isinstance(p, Parameter) for p in value):
                for i, p in enumerate(value):
                    yield f"{name}.{i}", p

    def named_parameters(self, prefix: str = "") -> Iterator[tuple[str, Parameter]]:
        """Every parameter with its dotted name (a parameter shared by two submodules
        comes once, under its first name)."""
        seen: set[int] = set()
        for module_name, module in self.named_modules(prefix):
            for name, p in module._own_parameters():
                if id(p) not in seen:
                    seen.add(id(p))
                    yield (f"{module_name}.{name}" if module_name else name), p

    def parameters(self) -> list[Parameter]:
        """Every parameter (a list: hand it to an optimizer)."""
        return [p for _, p in self.named_parameters()]

    # names of numpy-array attributes that are state but not parameters (BatchNorm's
    # running statistics): saved and loaded with the parameters, never differentiated
    _buffer_names: tuple[str, ...] = ()

    def named_buffers(self, prefix: str = "") -> Iterator[tuple[str, np.ndarray]]:
        """Every buffer (``_buffer_names`` of each module) with its dotted name."""
        for module_name, module in self.named_modules(prefix):
            for name in module._buffer_names:
                value = getattr(module, name, None)
                if value is not None:
                    yield (f"{module_name}.{name}" if module_name else name), value

    # -- modes --
    def train(self, mode: bool = True) -> "Module":
        """Training mode (dropout active, BatchNorm on batch statistics) for this module and
        its submodules."""
        for m in self.modules():
            m.training = bool(mode)
        return self

    def eval(self) -> "Module":
        """Evaluation mode (dropout off, BatchNorm on running statistics); same as
        ``train(False)``."""
        return self.train(False)

    def to(self, device: Any = None, dtype: Any = None) -> "Module":
        """Put the parameters' tensors on ``device`` and/or convert them to ``dtype``."""
        for p in self.parameters():
            if device is not None:
                p.device = device
            if dtype is not None:
                p.data = p.data.astype(dtype)
                p._tensor = None
        return self

    # -- saving and loading --
    def state_dict(self) -> dict[str, np.ndarray]:
        """Copies of the parameters' arrays (and buffers') by dotted name."""
        state = {name: p.data.copy() for name, p in self.named_parameters()}
        state.update((name, b.copy()) for name, b in self.named_buffers())
        return state

    def load_state_dict(self, state: Any, strict: bool = True) -> "Module":
        """Copy arrays (a mapping of dotted names to arrays) into the parameters, in their
        dtype. With ``strict``, the names must be exactly this module's; shapes must match."""
        own: dict[str, Any] = dict(self.named_parameters())
        own.update(self.named_buffers())
        names = list(state.keys())
        if strict:
            missing = sorted(set(own) - set(names))
            unexpected = sorted(set(names) - set(own))
            if missing or unexpected:
                raise KeyError(f"load_state_dict: missing {missing}, unexpected {unexpected}")
        for name in names:
            if name not in own:
                continue
            p = own[name]
            target = p.data if isinstance(p, Parameter) else p     # a buffer: in place
            value = np.asarray(state[name])
            if value.shape != target.shape:
                raise ValueError(f"load_state_dict: {name} has shape {value.shape}, the "
                                 f"parameter {target.shape}")
            target[...] = value
        return self

    def save(self, path: Any) -> None:
        """Write the state dict to an ``.npz`` file (numpy adds the suffix if missing)."""
        savez: Any = np.savez      # its stub reserves the keyword allow_pickle
        savez(path, **self.state_dict())

    def load(self, path: Any, strict: bool = True) -> "Module":
        """Load parameters saved by ``save``; returns this module."""
        with np.load(path) as archive:
            return self.load_state_dict({k: archive[k] for k in archive.files}, strict)

    # -- printing --
    def extra_repr(self) -> str:
        return ""

    def __repr__(self) -> str:
        children = list(self.named_children())
        head = f"{type(self).__name__}({self.extra_repr()}"
        if not children:
            return head + ")"
        lines = [f"  ({name}): " + repr(m).replace("\n", "\n  ") for name, m in children]
        return head + "\n" + "\n".join(lines) + "\n)"


class Function(Module):
    """A function of one argument as a module without parameters (``ad.tanh``, a lambda)."""

    def __init__(self, function: Any) -> None:
        self.function = function

    def forward(self, x: Any, tape: Any = None) -> Any:
        return self.function(x)

    def extra_repr(self) -> str:
        return getattr(self.function, "__name__", repr(self.function))


def as_module(item: Any) -> Module:
    """A Module as it is; a tuple or list of modules as a ``Sequential`` of them (nested
    ones too); any other callable as a ``Function``."""
    if isinstance(item, Module):
        return item
    if isinstance(item, (tuple, list)):
        return Sequential(*item)
    if callable(item):
        return Function(item)
    raise TypeError(f"not a module: {type(item).__name__}")


class Sequential(Module):
    """Modules applied in order: ``Sequential(Linear(2, 8), Tanh(), Linear(8, 1))``.

    Tuples and lists compose too, as in dfdx: ``Sequential((Linear(2, 8), Tanh()),
    Linear(8, 1))`` nests a Sequential, and ``Sequential([a, b, c])`` is ``Sequential(a, b,
    c)``. Plain functions (``ad.tanh``) become parameterless layers. Indexing and slicing
    give the layers; parameters are named ``"0.weight"``, ``"2.bias"``... as in PyTorch.
    """

    def __init__(self, *layers: Any) -> None:
        if len(layers) == 1 and isinstance(layers[0], list):
            layers = tuple(layers[0])
        self._layers = [as_module(m) for m in layers]

    def named_children(self) -> Iterator[tuple[str, Module]]:
        return ((str(i), m) for i, m in enumerate(self._layers))

    def forward(self, x: Any, tape: Any = None) -> Any:
        for layer in self._layers:
            x = layer(x, tape)
        return x

    def __len__(self) -> int:
        return len(self._layers)

    def __iter__(self) -> Iterator[Module]:
        return iter(self._layers)

    def __getitem__(self, index: Any) -> Any:
        if isinstance(index, slice):
            return Sequential(*self._layers[index])
        return self._layers[index]

    def append(self, module: Any) -> "Sequential":
        self._layers.append(as_module(module))
        return self


def functional_call(module: Module, parameters: Any, *args: Any, **kwargs: Any) -> Any:
    """``module(*args, **kwargs)`` with its parameters replaced by ``parameters`` (a dict
    of dotted names, as ``named_parameters`` gives them, to Tensors, TraceTensors or
    arrays), as ``torch.func.functional_call``: the way to differentiate a model with
    respect to its parameters with the transforms (``ad.grad``, ``ad.hessian``...).
    Parameters left out keep their own values (as constants). The module is unchanged
    afterwards.

    >>> import numpy as np, easyad as ad
    >>> model = ad.nn.Linear(2, 1, generator=0)
    >>> params = {k: p.data for k, p in model.named_parameters()}
    >>> x = np.array([[1.0, 2.0]])
    >>> loss = lambda p: ad.sum(ad.nn.functional_call(model, p, x))
    >>> g = ad.grad(loss)(params)
    >>> g["weight"].tolist(), g["bias"].tolist()
    ([[1.0, 2.0]], [1.0])
    """
    own = dict(module.named_parameters())
    unknown = sorted(set(parameters) - set(own))
    if unknown:
        raise KeyError(f"functional_call: no parameters named {unknown} in this module "
                       f"(its parameters: {sorted(own)})")
    given = [(own[name], value) for name, value in parameters.items()]
    for p, value in given:
        if tuple(getattr(value, "shape", np.shape(value))) != p.shape:
            raise ValueError(f"functional_call: a value of shape {np.shape(value)} for a "
                             f"parameter of shape {p.shape}")
    previous = [p._override for p, _ in given]
    try:
        for p, value in given:
            p._override = value if hasattr(value, "shape") and not isinstance(
                value, np.ndarray) else Tensor.constant(value, device=p.device)
        return module(*args, **kwargs)
    finally:
        for (p, _), old in zip(given, previous):
            p._override = old
