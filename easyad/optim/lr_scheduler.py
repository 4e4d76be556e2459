"""Learning-rate schedulers: StepLR and CosineAnnealingLR, with PyTorch's semantics.

A scheduler sets ``group["lr"]`` of its optimizer's parameter groups; call
``scheduler.step()`` once per epoch, after ``opt.step(...)``. Construction performs the
initial step (``last_epoch`` becomes 0 and each group's ``initial_lr`` is recorded), and
the rates are updated by PyTorch's recursive (chainable) formulas, so the sequence matches
``torch.optim.lr_scheduler`` number for number, past ``T_max`` included.
"""
from __future__ import annotations

import math
from typing import Any


class LRScheduler:
    """Base class: ``step()``, ``get_last_lr()``, ``last_epoch``, ``base_lrs``."""

    def __init__(self, optimizer: Any, last_epoch: int = -1) -> None:
        self.optimizer = optimizer
        for i, group in enumerate(optimizer.param_groups):
            if last_epoch == -1:
                group.setdefault("initial_lr", group["lr"])
            elif "initial_lr" not in group:
                raise KeyError(f"param_groups[{i}] has no 'initial_lr': a scheduler resumed "
                               f"with last_epoch={last_epoch} needs one")
        self.base_lrs = [group["initial_lr"] for group in optimizer.param_groups]
        self.last_epoch = last_epoch
        self._step_count = 0
        self._initial = True
        self.step()
        self._initial = False

    def get_lr(self) -> list[float]:
        raise NotImplementedError

    def step(self) -> None:
        """Advance one epoch and set the optimizer's learning rates."""
        self._step_count += 1
        self.last_epoch += 1
        for group, lr in zip(self.optimizer.param_groups, self.get_lr()):
            group["lr"] = lr
        self._last_lr = [group["lr"] for group in self.optimizer.param_groups]

    def state_dict(self) -> dict[str, Any]:
        """Everything but the optimizer (epoch, step count, base and last rates)."""
        return {k: (list(v) if isinstance(v, list) else v) for k, v in vars(self).items()
                if k != "optimizer"}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self.__dict__.update(state_dict)

    def get_last_lr(self) -> list[float]:
        """The learning rates the last ``step`` set."""
        return list(self._last_lr)

    def _current(self) -> list[float]:
        return [group["lr"] for group in self.optimizer.param_groups]


class StepLR(LRScheduler):
    """Multiply the learning rate by ``gamma`` every ``step_size`` epochs.

    >>> import numpy as np, easyad as ad
    >>> opt = ad.optim.SGD([ad.nn.Parameter(np.zeros(1))], lr=1.0)
    >>> sched = ad.optim.StepLR(opt, step_size=2, gamma=0.5)
    >>> lrs = []
    >>> for _ in range(5):
    ...     lrs.append(sched.get_last_lr()[0]); sched.step()
    >>> lrs
    [1.0, 1.0, 0.5, 0.5, 0.25]
    """

    def __init__(self, optimizer: Any, step_size: int, gamma: float = 0.1,
                 last_epoch: int = -1) -> None:
        if int(step_size) <= 0:
            raise ValueError(f"step_size is a positive integer, not {step_size}")
        self.step_size, self.gamma = int(step_size), float(gamma)
        super().__init__(optimizer, last_epoch)

    def get_lr(self) -> list[float]:
        if self.last_epoch == 0 or self.last_epoch % self.step_size != 0:
            return self._current()
        return [lr * self.gamma for lr in self._current()]


class CosineAnnealingLR(LRScheduler):
    """Anneal the learning rate from its initial value to ``eta_min`` along half a cosine
    over ``T_max`` epochs (then back up, periodically), by PyTorch's recursive formula:
    ``eta_min + (base - eta_min)(1 + cos(π t / T_max)) / 2`` at epoch t."""

    def __init__(self, optimizer: Any, T_max: int, eta_min: float = 0.0,
                 last_epoch: int = -1) -> None:
        if int(T_max) <= 0:
            raise ValueError(f"T_max is a positive integer, not {T_max}")
        self.T_max, self.eta_min = int(T_max), float(eta_min)
        super().__init__(optimizer, last_epoch)

    def get_lr(self) -> list[float]:
        t, T, low = self.last_epoch, self.T_max, self.eta_min
        if self._initial:
            return self._current()
        if self._step_count == 1 and t > 0:
            return [low + (base - low) * (1 + math.cos(t * math.pi / T)) / 2
                    for base in self.base_lrs]
        if (t - 1 - T) % (2 * T) == 0:
            return [lr + (base - low) * (1 - math.cos(math.pi / T)) / 2
                    for base, lr in zip(self.base_lrs, self._current())]
        return [(1 + math.cos(math.pi * t / T)) / (1 + math.cos(math.pi * (t - 1) / T))
                * (lr - low) + low for lr in self._current()]
