"""Optimizer (the base) and SGD, Adam, AdamW, RMSprop with PyTorch's update formulas.

``opt.step(d)`` takes the derivatives of one step: the ``Derivatives`` of the loss (each
parameter's gradient is ``d[p]``, read from the variable the forward pass recorded for it
on ``d``'s list), the loss Record itself (its ``derivatives()`` are taken), or the
gradients as a mapping ``{parameter: array}`` (``nn.utils.clip_grad_norm_``'s
``Gradients``: the parameters it left out are read from the sweep it came from) or a
sequence in parameter order. Parameters
the step did not record are left alone, as PyTorch skips parameters whose ``grad`` is None.
Gradients are never accumulated between steps, so there is no ``zero_grad``.

The updates run in numpy on the parameters' arrays, in place, following PyTorch's
single-tensor implementations operation by operation (``torch/optim/sgd.py``,
``adam.py``, ``rmsprop.py``), defaults included; ``tests/test_nn.py`` compares the
parameters after 50 steps with PyTorch's. For parameters on a device (OpenCL) whose
gradients come from a sweep there, the same operations are one kernel per parameter
(``_device_update``: the new parameter and state as expressions), and parameters,
gradients and state stay on the device (``tests/test_optim_device.py``).
"""
from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

import numpy as np

from easyad import _expr
from easyad._core import Derivatives, Record
from easyad.nn._module import Module
from easyad.nn._parameter import Parameter
from easyad.tensor import host_copy


def _lerp_expr(start: str, end: str, weight: float) -> str:
    """``_lerp`` as an expression (its two roundings, by the weight)."""
    if weight < 0.5:
        return f"{start} + w * ({end} - {start})"
    return f"{end} - ({end} - {start}) * (1.0 - w)"


def _lerp(start: np.ndarray, end: np.ndarray, weight: float) -> None:
    """``start`` moved in place towards ``end`` by ``weight``, as ``torch.lerp`` rounds."""
    if weight < 0.5:
        start += weight * (end - start)
    else:
        start[...] = end - (end - start) * (1.0 - weight)


class Optimizer:
    """Base class: parameter groups (``param_groups``, each a dict with ``"params"`` and
    its options, so schedulers can change ``"lr"``), per-parameter ``state``, and ``step``.
    Subclasses define ``_update(p, grad, work, state, group)``."""

    def __init__(self, params: Any, defaults: dict[str, Any]) -> None:
        self.defaults = dict(defaults)
        if isinstance(params, Module):
            params = params.parameters()
        items = list(params)
        if not items:
            raise ValueError("optimizer got an empty parameter list")
        groups = items if isinstance(items[0], dict) else [{"params": items}]
        self.param_groups: list[dict[str, Any]] = []
        self.state: dict[Parameter, dict[str, Any]] = {}
        self._work: dict[Parameter, np.ndarray] = {}   # one scratch array per parameter
        for group in groups:
            self.add_param_group(group)

    def add_param_group(self, group: dict[str, Any]) -> None:
        """Add a group of parameters with its own options (the defaults fill the rest)."""
        params = group["params"]
        params = [params] if isinstance(params, Parameter) else list(params)
        for p in params:
            if not isinstance(p, Parameter):
                raise TypeError(f"optimizers update nn.Parameters, not {type(p).__name__}")
        known = {id(p) for g in self.param_groups for p in g["params"]}
        if any(id(p) in known for p in params) or len({id(p) for p in params}) != len(params):
            raise ValueError("a parameter appears in more than one place in the optimizer")
        full = {**self.defaults, **group, "params": params}
        self._check(full)
        self.param_groups.append(full)

    def _check(self, group: dict[str, Any]) -> None:
        if group["lr"] < 0.0:
            raise ValueError(f"invalid learning rate: {group['lr']}")
        if group.get("weight_decay", 0.0) < 0.0:
            raise ValueError(f"invalid weight_decay value: {group['weight_decay']}")

    @property
    def parameters(self) -> list[Parameter]:
        return [p for g in self.param_groups for p in g["params"]]

    def _gradients(self, gradients: Any) -> dict[int, np.ndarray]:
        """The gradients of this step by ``id`` of parameter."""
        if isinstance(gradients, Record):
            gradients = gradients.derivatives()
        params = self.parameters
        if isinstance(gradients, Derivatives):
            found: dict[int, Any] = {}
            for p in params:
                if not p.requires_grad:
                    continue
                g = p._device_adjoint(gradients)      # a buffer on the parameter's device
                if g is None:
                    g = p._adjoint(gradients)
                if g is not None:
                    found[id(p)] = g
            if not found:
                raise ValueError("none of the optimizer's parameters was recorded on the list "
                                 "these derivatives come from: call the model with that list, "
                                 "model(x, tape=lst), in the step that made the loss")
            return found
        # the gradients are only read: the updates work in their own scratch arrays
        if isinstance(gradients, Mapping):
            given = {id(p): np.asarray(g) for p, g in gradients.items() if g is not None}
            sweep = getattr(gradients, "derivatives", None)   # nn.utils.Gradients' source
            if isinstance(sweep, Derivatives):
                for p in params:         # parameters left out of the clipping: their own
                    if id(p) not in given and p.requires_grad:
                        g = p._device_adjoint(sweep)
                        g = p._adjoint(sweep) if g is None else g
                        if g is not None:
                            given[id(p)] = g
            return given
        if isinstance(gradients, Iterable):
            grads = list(gradients)
            if len(grads) != len(params):
                raise ValueError(f"{len(grads)} gradients for {len(params)} parameters")
            return {id(p): np.asarray(g) for p, g in zip(params, grads) if g is not None}
        raise TypeError(f"step takes Derivatives, a loss Record, or gradients by parameter, "
                        f"not {type(gradients).__name__}")

    def step(self, gradients: Any) -> None:
        """One update of every parameter that has a gradient in ``gradients``."""
        grads = self._gradients(gradients)
        for group in self.param_groups:
            for p in group["params"]:
                g = grads.get(id(p))
                if g is None:
                    continue
                if not isinstance(g, np.ndarray):   # on the parameter's device: stays there
                    state = self.state.setdefault(p, {})
                    p._values.move_state(state, to_device=True)
                    self._update_on_device(p, g, state, group)
                    continue
                p._values.move_state(self.state.get(p, {}), to_device=False)
                if g.shape != p.data.shape:
                    raise ValueError(f"a gradient of shape {g.shape} for a parameter of shape "
                                     f"{p.data.shape}")
                work = self._work.get(p)
                if work is None or work.shape != p.data.shape or work.dtype != p.data.dtype:
                    work = self._work[p] = np.empty_like(p.data)
                if group.get("maximize", False):
                    g = np.negative(g, out=work)
                self._update(p, g, work, self.state.setdefault(p, {}), group)

    def _update(self, p: Parameter, grad: np.ndarray, work: np.ndarray,
                state: dict[str, Any], group: dict[str, Any]) -> None:
        """Update ``p.data`` in place. ``grad`` is read only (it may be the sweep's own
        array, or ``work``); ``work`` is a scratch array of the parameter's shape and dtype,
        kept between steps so a step allocates no arrays of that size."""
        raise NotImplementedError

    def _update_on_device(self, p: Parameter, grad: Any, state: dict[str, Any],
                          group: dict[str, Any]) -> None:
        """The same update on the device: one kernel (``_device_update``'s expressions)
        makes the new parameter and state buffers."""
        names, exprs, numbers = self._device_update(state, group)
        if group.get("maximize", False):
            exprs = tuple(_expr.render(_expr.substitute(e, {"g": "-g"}), "python")
                          for e in exprs)
        p._values.update(f"{type(self).__name__.lower()}_step", exprs, grad, state, names,
                         numbers)

    def _device_update(self, state: dict[str, Any], group: dict[str, Any]
                       ) -> tuple[tuple[str, ...], tuple[str, ...], dict[str, float]]:
        """(the state buffers read and written, in order; the expressions of the new
        parameter then of each of them, over ``p``, ``g``, the state and the numbers;
        the numbers) of one step, advancing host-side counters in ``state``."""
        raise NotImplementedError

    # -- checkpoints --
    def state_dict(self) -> dict[str, Any]:
        """The optimizer's state as PyTorch lays it out: ``{"state": {index: {name: value}},
        "param_groups": [{option: value, "params": [index, ...]}]}``, parameters numbered
        in order over the groups; arrays are copies."""
        index = {id(p): i for i, p in enumerate(self.parameters)}
        state = {index[id(p)]: {k: (v.copy() if isinstance(v, np.ndarray) else
                                    host_copy(v))
                                for k, v in s.items()}
                 for p, s in self.state.items() if s}
        groups = [{**{k: v for k, v in g.items() if k != "params"},
                   "params": [index[id(p)] for p in g["params"]]} for g in self.param_groups]
        return {"state": state, "param_groups": groups}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Restore a ``state_dict()`` of an optimizer of the same kind over parameters of
        the same shapes, in the same groups."""
        groups = state_dict["param_groups"]
        if len(groups) != len(self.param_groups) or any(
                len(g["params"]) != len(own["params"])
                for g, own in zip(groups, self.param_groups)):
            raise ValueError("load_state_dict: the parameter groups differ in number or size")
        params = self.parameters
        for g, own in zip(groups, self.param_groups):
            own.update({k: v for k, v in g.items() if k != "params"})
        self.state = {}
        for i, s in state_dict["state"].items():
            p = params[int(i)]
            restored = {k: (np.array(v, dtype=p.dtype) if isinstance(v, np.ndarray) else v)
                        for k, v in s.items()}
            for k, v in restored.items():
                if isinstance(v, np.ndarray) and v.shape != p.shape:
                    raise ValueError(f"load_state_dict: state {k!r} of parameter {i} has "
                                     f"shape {v.shape}, the parameter {p.shape}")
            self.state[p] = restored

    def __repr__(self) -> str:
        lines = [f"{type(self).__name__} ("]
        for i, g in enumerate(self.param_groups):
            lines.append(f"Parameter Group {i}")
            lines += [f"    {k}: {v}" for k, v in sorted(g.items()) if k != "params"]
        return "\n".join(lines) + "\n)"


class SGD(Optimizer):
    """Stochastic gradient descent, with momentum (Nesterov's optionally) and weight decay,
    as ``torch.optim.SGD``: ``g += wd p; b = μ b + (1 - dampening) g (b = g at first);
    g = g + μ b if nesterov else b; p -= lr g``.

    >>> import numpy as np, easyad as ad
    >>> p = ad.nn.Parameter(np.array([1.0]))
    >>> ad.optim.SGD([p], lr=0.1).step({p: np.array([2.0])})
    >>> p.data
    array([0.8])
    """

    def __init__(self, params: Any, lr: float = 1e-3, momentum: float = 0.0,
                 dampening: float = 0.0, weight_decay: float = 0.0, nesterov: bool = False,
                 *, maximize: bool = False) -> None:
        if momentum < 0.0:
            raise ValueError(f"invalid momentum value: {momentum}")
        if nesterov and (momentum <= 0 or dampening != 0):
            raise ValueError("Nesterov momentum requires a momentum and zero dampening")
        super().__init__(params, dict(lr=lr, momentum=momentum, dampening=dampening,
                                      weight_decay=weight_decay, nesterov=nesterov,
                                      maximize=maximize))

    def _update(self, p: Parameter, grad: np.ndarray, work: np.ndarray,
                state: dict[str, Any], group: dict[str, Any]) -> None:
        wd, momentum = group["weight_decay"], group["momentum"]
        if wd == 0 and momentum == 0:        # p - lr g, PyTorch's p + (-lr) g to the bit
            p.data -= np.multiply(grad, group["lr"], out=work)
            return
        np.copyto(work, grad)
        grad = work
        if wd != 0:
            grad += wd * p.data
        if momentum != 0:
            buf = state.get("momentum_buffer")
            if buf is None:
                buf = state["momentum_buffer"] = grad.copy()
            else:
                buf *= momentum
                buf += (1.0 - group["dampening"]) * grad
            if group["nesterov"]:
                grad += momentum * buf
            else:
                np.copyto(grad, buf)
        grad *= group["lr"]
        p.data -= grad

    def _device_update(self, state: dict[str, Any], group: dict[str, Any]
                       ) -> tuple[tuple[str, ...], tuple[str, ...], dict[str, float]]:
        wd, momentum = group["weight_decay"], group["momentum"]
        numbers = {"lr": float(group["lr"])}
        d = "g"
        if wd != 0:
            d, numbers["wd"] = "(g + wd * p)", float(wd)
        if momentum == 0:
            return (), (f"p - {d} * lr",), numbers
        numbers["mu"], numbers["keep"] = float(momentum), 1.0 - group["dampening"]
        # the buffer is the first step's gradient, then mu b + (1 - dampening) g
        b = d if "momentum_buffer" not in state else f"(momentum_buffer * mu + keep * {d})"
        step = f"({d} + mu * {b})" if group["nesterov"] else b
        return ("momentum_buffer",), (f"p - {step} * lr", b), numbers


class Adam(Optimizer):
    """Adam (Kingma & Ba), as ``torch.optim.Adam``: ``m = lerp(m, g, 1 - β1);
    v = β2 v + (1 - β2) g²; p -= lr / (1 - β1^t) · m / (sqrt(v) / sqrt(1 - β2^t) + eps)``.
    ``weight_decay`` adds ``wd p`` to the gradient (L2); AdamW decouples it.
    ``amsgrad`` uses the running maximum of v."""

    _decoupled = False

    def __init__(self, params: Any, lr: float = 1e-3, betas: tuple[float, float] = (0.9, 0.999),
                 eps: float = 1e-8, weight_decay: float = 0.0, amsgrad: bool = False,
                 *, maximize: bool = False) -> None:
        if not 0.0 <= eps:
            raise ValueError(f"invalid epsilon value: {eps}")
        if not (0.0 <= betas[0] < 1.0 and 0.0 <= betas[1] < 1.0):
            raise ValueError(f"invalid beta parameters: {betas}")
        super().__init__(params, dict(lr=lr, betas=tuple(betas), eps=eps,
                                      weight_decay=weight_decay, amsgrad=amsgrad,
                                      maximize=maximize))

    def _update(self, p: Parameter, grad: np.ndarray, work: np.ndarray,
                state: dict[str, Any], group: dict[str, Any]) -> None:
        lr, (beta1, beta2), eps, wd = group["lr"], group["betas"], group["eps"], \
            group["weight_decay"]
        if not state:
            state["step"] = 0
            state["exp_avg"] = np.zeros_like(p.data)
            state["exp_avg_sq"] = np.zeros_like(p.data)
            if group["amsgrad"]:
                state["max_exp_avg_sq"] = np.zeros_like(p.data)
        state["step"] += 1
        step = state["step"]
        if wd != 0:
            if self._decoupled:
                p.data *= 1.0 - lr * wd
            else:
                grad = grad + wd * p.data
        exp_avg, exp_avg_sq = state["exp_avg"], state["exp_avg_sq"]
        _lerp(exp_avg, grad, 1.0 - beta1)
        exp_avg_sq *= beta2
        exp_avg_sq += (1.0 - beta2) * (grad * grad)
        step_size = lr / (1.0 - beta1 ** step)
        bias_correction2_sqrt = (1.0 - beta2 ** step) ** 0.5
        if group["amsgrad"]:
            np.maximum(state["max_exp_avg_sq"], exp_avg_sq, out=state["max_exp_avg_sq"])
            second = state["max_exp_avg_sq"]
        else:
            second = exp_avg_sq
        denom = np.sqrt(second, out=work)
        denom /= bias_correction2_sqrt
        denom += eps
        np.divide(exp_avg, denom, out=denom)
        denom *= -step_size
        p.data += denom

    def _device_update(self, state: dict[str, Any], group: dict[str, Any]
                       ) -> tuple[tuple[str, ...], tuple[str, ...], dict[str, float]]:
        lr, (beta1, beta2), eps, wd = group["lr"], group["betas"], group["eps"], \
            group["weight_decay"]
        state["step"] = step = state.get("step", 0) + 1
        numbers = {"w": 1.0 - beta1, "b2": float(beta2), "c2": 1.0 - beta2, "eps": float(eps),
                   "bc": (1.0 - beta2 ** step) ** 0.5, "ss": -(lr / (1.0 - beta1 ** step))}
        g, p0 = "g", "p"
        if wd != 0 and self._decoupled:
            p0, numbers["decay"] = "(p * decay)", 1.0 - lr * wd
        elif wd != 0:
            g, numbers["wd"] = "(g + wd * p)", float(wd)
        m = f"({_lerp_expr('exp_avg', g, 1.0 - beta1)})"
        v = f"(exp_avg_sq * b2 + c2 * ({g} * {g}))"
        names, exprs, second = ["exp_avg", "exp_avg_sq"], [m, v], v
        if group["amsgrad"]:
            second = f"maximum(max_exp_avg_sq, {v})"
            names.append("max_exp_avg_sq")
            exprs.append(second)
        return tuple(names), (f"{p0} + ({m} / (sqrt({second}) / bc + eps)) * ss", *exprs), \
            numbers


class AdamW(Adam):
    """Adam with decoupled weight decay (Loshchilov & Hutter), as ``torch.optim.AdamW``:
    ``p *= 1 - lr wd`` before the Adam update; ``weight_decay`` defaults to 1e-2."""

    _decoupled = True

    def __init__(self, params: Any, lr: float = 1e-3, betas: tuple[float, float] = (0.9, 0.999),
                 eps: float = 1e-8, weight_decay: float = 1e-2, amsgrad: bool = False,
                 *, maximize: bool = False) -> None:
        super().__init__(params, lr, betas, eps, weight_decay, amsgrad, maximize=maximize)


class RMSprop(Optimizer):
    """RMSprop, as ``torch.optim.RMSprop``: ``v = α v + (1 - α) g²``; with ``centered``,
    ``a = lerp(a, g, 1 - α)`` and ``v - a²`` under the root; ``p -= lr g / (sqrt(v) + eps)``,
    or through a momentum buffer ``b = μ b + g / (sqrt(v) + eps); p -= lr b``."""

    def __init__(self, params: Any, lr: float = 1e-2, alpha: float = 0.99, eps: float = 1e-8,
                 weight_decay: float = 0.0, momentum: float = 0.0, centered: bool = False,
                 *, maximize: bool = False) -> None:
        if not 0.0 <= alpha:
            raise ValueError(f"invalid alpha value: {alpha}")
        if not 0.0 <= momentum:
            raise ValueError(f"invalid momentum value: {momentum}")
        super().__init__(params, dict(lr=lr, alpha=alpha, eps=eps, weight_decay=weight_decay,
                                      momentum=momentum, centered=centered, maximize=maximize))

    def _update(self, p: Parameter, grad: np.ndarray, work: np.ndarray,
                state: dict[str, Any], group: dict[str, Any]) -> None:
        alpha, eps, momentum = group["alpha"], group["eps"], group["momentum"]
        if not state:
            state["step"] = 0
            state["square_avg"] = np.zeros_like(p.data)
            if momentum > 0:
                state["momentum_buffer"] = np.zeros_like(p.data)
            if group["centered"]:
                state["grad_avg"] = np.zeros_like(p.data)
        state["step"] += 1
        if group["weight_decay"] != 0:
            grad = grad + group["weight_decay"] * p.data
        square_avg = state["square_avg"]
        square_avg *= alpha
        square_avg += (1.0 - alpha) * (grad * grad)
        if group["centered"]:
            grad_avg = state["grad_avg"]
            _lerp(grad_avg, grad, 1.0 - alpha)
            avg = np.sqrt(square_avg - grad_avg * grad_avg)
        else:
            avg = np.sqrt(square_avg)
        avg += eps
        if momentum > 0:
            buf = state["momentum_buffer"]
            buf *= momentum
            buf += grad / avg
            p.data -= group["lr"] * buf
        else:
            np.divide(grad, avg, out=work)
            work *= -group["lr"]
            p.data += work

    def _device_update(self, state: dict[str, Any], group: dict[str, Any]
                       ) -> tuple[tuple[str, ...], tuple[str, ...], dict[str, float]]:
        alpha, eps, momentum, wd = group["alpha"], group["eps"], group["momentum"], \
            group["weight_decay"]
        state["step"] = state.get("step", 0) + 1
        numbers = {"alpha": float(alpha), "c": 1.0 - alpha, "eps": float(eps),
                   "lr": float(group["lr"]), "nlr": -float(group["lr"])}
        g = "g"
        if wd != 0:
            g, numbers["wd"] = "(g + wd * p)", float(wd)
        square = f"(square_avg * alpha + c * ({g} * {g}))"
        names, exprs = ["square_avg"], [square]
        if group["centered"]:
            numbers["w"] = 1.0 - alpha
            mean = f"({_lerp_expr('grad_avg', g, 1.0 - alpha)})"
            names.append("grad_avg")
            exprs.append(mean)
            avg = f"(sqrt({square} - {mean} * {mean}) + eps)"
        else:
            avg = f"(sqrt({square}) + eps)"
        if momentum > 0:
            numbers["mu"] = float(momentum)
            buf = f"(momentum_buffer * mu + {g} / {avg})"
            names.append("momentum_buffer")
            exprs.append(buf)
            return tuple(names), (f"p - lr * {buf}", *exprs), numbers
        return tuple(names), (f"p + ({g} / {avg}) * nlr", *exprs), numbers


