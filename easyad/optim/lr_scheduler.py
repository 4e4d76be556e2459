"""Learning-rate schedulers with PyTorch's semantics: StepLR, CosineAnnealingLR, LinearLR
(warm-up), SequentialLR (one schedule after another), OneCycleLR and ReduceLROnPlateau.

A scheduler sets ``group["lr"]`` of its optimizer's parameter groups; call
``scheduler.step()`` after ``opt.step(...)`` (once per epoch, or once per batch for
OneCycleLR; ``ReduceLROnPlateau.step(metric)`` with the validation loss). Construction
performs the initial step (``last_epoch`` becomes 0 and each group's ``initial_lr`` is
recorded), and the rates are updated by PyTorch's recursive (chainable) formulas, with its
closed forms where PyTorch uses them (SequentialLR's milestones), so the sequences match
``torch.optim.lr_scheduler`` number for number (``tests/test_schedulers.py``: to 1e-12
over hundreds of steps).

>>> import numpy as np, easyad as ad
>>> opt = ad.optim.SGD([ad.nn.Parameter(np.zeros(1))], lr=1.0)
>>> warmup = ad.optim.LinearLR(opt, start_factor=0.25, total_iters=3)
>>> cosine = ad.optim.CosineAnnealingLR(opt, T_max=4)
>>> sched = ad.optim.SequentialLR(opt, [warmup, cosine], milestones=[3])
>>> lrs = []
>>> for _ in range(6):
...     lrs.append(round(sched.get_last_lr()[0], 4)); sched.step()
>>> lrs
[0.25, 0.5, 0.75, 1.0, 0.8536, 0.5]
"""
from __future__ import annotations

import math
from bisect import bisect_right
from typing import Any

from easyad.optim._optimizer import Optimizer


def _check_optimizer(optimizer: Any) -> None:
    if not isinstance(optimizer, Optimizer):
        raise TypeError(f"a scheduler drives an ad.optim optimizer, not "
                        f"{type(optimizer).__name__}")


class LRScheduler:
    """Base class: ``step()``, ``get_last_lr()``, ``last_epoch``, ``base_lrs``."""

    _initial = False        # True during the step construction performs

    def __init__(self, optimizer: Any, last_epoch: int = -1) -> None:
        _check_optimizer(optimizer)
        self.optimizer = optimizer
        for i, group in enumerate(optimizer.param_groups):
            if last_epoch == -1:
                group.setdefault("initial_lr", group["lr"])
            elif "initial_lr" not in group:
                raise KeyError(f"param_groups[{i}] has no 'initial_lr': a scheduler resumed "
                               f"with last_epoch={last_epoch} needs one")
        self.base_lrs = [group["initial_lr"] for group in optimizer.param_groups]
        self.last_epoch = last_epoch
        self._initial_step()

    def _initial_step(self) -> None:
        self._step_count = 0
        self._initial = True
        try:
            self.step()
        finally:
            self._initial = False

    def get_lr(self) -> list[float]:
        raise NotImplementedError

    def step(self) -> None:
        """Advance one epoch and set the optimizer's learning rates."""
        self._step_count += 1
        self._update_lr()

    def _update_lr(self, epoch: int | None = None) -> None:
        """Set the rates of the next epoch (``epoch`` None), or of epoch ``epoch`` by the
        closed form where the scheduler has one (what SequentialLR does at a milestone)."""
        if epoch is None:
            self.last_epoch += 1
            values = self.get_lr()
        else:
            self.last_epoch = epoch
            closed = getattr(self, "_get_closed_form_lr", None)
            values = closed() if closed is not None else self.get_lr()
        for group, lr in zip(self.optimizer.param_groups, values):
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

    def _get_closed_form_lr(self) -> list[float]:
        return [base * self.gamma ** (self.last_epoch // self.step_size)
                for base in self.base_lrs]


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

    def _get_closed_form_lr(self) -> list[float]:
        return [self.eta_min + (base - self.eta_min) *
                (1 + math.cos(math.pi * self.last_epoch / self.T_max)) / 2
                for base in self.base_lrs]


class LinearLR(LRScheduler):
    """Scale the learning rate by a factor going linearly from ``start_factor`` to
    ``end_factor`` over ``total_iters`` epochs, then keep it: the usual warm-up
    (``LinearLR(opt, start_factor=0.01, total_iters=5)``), by PyTorch's recursive formula."""

    def __init__(self, optimizer: Any, start_factor: float = 1.0 / 3, end_factor: float = 1.0,
                 total_iters: int = 5, last_epoch: int = -1) -> None:
        if not 0.0 < start_factor <= 1.0:
            raise ValueError(f"LinearLR: start_factor must be in (0, 1], not {start_factor}")
        if not 0.0 <= end_factor <= 1.0:
            raise ValueError(f"LinearLR: end_factor must be in [0, 1], not {end_factor}")
        if isinstance(total_iters, bool) or int(total_iters) != total_iters or total_iters < 1:
            raise ValueError(f"LinearLR: total_iters is a positive integer, not {total_iters}")
        self.start_factor, self.end_factor = float(start_factor), float(end_factor)
        self.total_iters = int(total_iters)
        super().__init__(optimizer, last_epoch)

    def get_lr(self) -> list[float]:
        t, s, e = self.last_epoch, self.start_factor, self.end_factor
        if t == 0:
            return [lr * s for lr in self._current()]
        if self._initial or t > self.total_iters:
            return self._current()
        return [lr * (1.0 + (e - s) / (self.total_iters * s + (t - 1) * (e - s)))
                for lr in self._current()]

    def _get_closed_form_lr(self) -> list[float]:
        s, e = self.start_factor, self.end_factor
        return [base * (s + (e - s) * min(self.total_iters, self.last_epoch) / self.total_iters)
                for base in self.base_lrs]


class SequentialLR(LRScheduler):
    """Run ``schedulers`` one after another, switching at the epochs ``milestones``
    (one fewer than the schedulers): ``SequentialLR(opt, [LinearLR(...),
    CosineAnnealingLR(...)], milestones=[5])`` warms up for 5 epochs, then anneals. At a
    milestone the next scheduler starts from its epoch 0 (its closed form, as PyTorch)."""

    def __init__(self, optimizer: Any, schedulers: list[LRScheduler], milestones: list[int],
                 last_epoch: int = -1) -> None:
        _check_optimizer(optimizer)
        schedulers = list(schedulers)
        if not schedulers:
            raise ValueError("SequentialLR needs at least one scheduler")
        for i, sched in enumerate(schedulers):
            if isinstance(sched, ReduceLROnPlateau):
                raise ValueError(f"SequentialLR: the scheduler at index {i} is a "
                                 f"ReduceLROnPlateau, whose step needs the metric; step it "
                                 f"yourself after the sequence")
            if isinstance(sched, SequentialLR):
                raise NotImplementedError(f"SequentialLR: the scheduler at index {i} is a "
                                          f"SequentialLR; list its schedulers in this one "
                                          f"instead, with their milestones")
            if not isinstance(sched, LRScheduler):
                raise TypeError(f"SequentialLR: the scheduler at index {i} is a "
                                f"{type(sched).__name__}, not an LRScheduler")
            if sched.optimizer is not optimizer:
                raise ValueError(f"SequentialLR: the scheduler at index {i} "
                                 f"({type(sched).__name__}) drives another optimizer")
        milestones = [int(m) for m in milestones]
        if len(milestones) != len(schedulers) - 1:
            raise ValueError(f"SequentialLR: {len(schedulers)} schedulers need "
                             f"{len(schedulers) - 1} milestones, not {len(milestones)}")
        if any(b <= a for a, b in zip([0, *milestones], milestones)):
            raise ValueError(f"SequentialLR: milestones must be positive and increasing, "
                             f"not {milestones}")
        self._schedulers, self._milestones = schedulers, milestones
        self.last_epoch = last_epoch + 1
        self.optimizer = optimizer
        # undo what the schedulers' own construction did, then start the first one
        for group in optimizer.param_groups:
            group["lr"] = group["initial_lr"]
        for sched in schedulers:
            sched.last_epoch -= 1
        first = schedulers[bisect_right(milestones, 0)]
        first._initial_step()
        self._last_lr = first.get_last_lr()

    def step(self) -> None:
        self.last_epoch += 1
        index = bisect_right(self._milestones, self.last_epoch)
        sched = self._schedulers[index]
        if index > 0 and self._milestones[index - 1] == self.last_epoch:
            sched._update_lr(0)
        else:
            sched.step()
        self._last_lr = sched.get_last_lr()

    def state_dict(self) -> dict[str, Any]:
        """Its own state and each scheduler's, in order."""
        state = {k: (list(v) if isinstance(v, list) else v) for k, v in vars(self).items()
                 if k not in ("optimizer", "_schedulers")}
        state["_schedulers"] = [s.state_dict() for s in self._schedulers]
        return state

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        inner = state_dict["_schedulers"]
        if len(inner) != len(self._schedulers):
            raise ValueError(f"SequentialLR.load_state_dict: {len(inner)} schedulers saved, "
                             f"this sequence has {len(self._schedulers)}")
        self.__dict__.update({k: v for k, v in state_dict.items() if k != "_schedulers"})
        for sched, s in zip(self._schedulers, inner):
            sched.load_state_dict(s)


def _per_group(name: str, optimizer: Any, value: Any) -> list[float]:
    groups = len(optimizer.param_groups)
    if isinstance(value, (list, tuple)):
        if len(value) != groups:
            raise ValueError(f"{name}: {len(value)} values for {groups} parameter groups")
        return [float(v) for v in value]
    return [float(value)] * groups


class OneCycleLR(LRScheduler):
    """The 1cycle policy (Smith & Topin), stepped once per batch: the rate goes from
    ``max_lr / div_factor`` up to ``max_lr`` over the first ``pct_start`` of
    ``total_steps`` (or ``epochs * steps_per_epoch``), then down to
    ``initial_lr / final_div_factor``, along a cosine (``anneal_strategy="cos"``) or a line
    (``"linear"``); ``three_phase`` comes back to the initial rate before the final descent.
    With ``cycle_momentum`` the momentum (SGD, RMSprop) or Adam's beta1 moves the opposite
    way between ``max_momentum`` and ``base_momentum``. PyTorch's arguments and numbers."""

    def __init__(self, optimizer: Any, max_lr: Any, total_steps: int | None = None,
                 epochs: int | None = None, steps_per_epoch: int | None = None,
                 pct_start: float = 0.3, anneal_strategy: str = "cos",
                 cycle_momentum: bool = True, base_momentum: Any = 0.85,
                 max_momentum: Any = 0.95, div_factor: float = 25.0,
                 final_div_factor: float = 1e4, three_phase: bool = False,
                 last_epoch: int = -1) -> None:
        _check_optimizer(optimizer)
        self.optimizer = optimizer

        def positive(name: str, v: Any) -> int:
            if isinstance(v, bool) or int(v) != v or v <= 0:
                raise ValueError(f"OneCycleLR: {name} is a positive integer, not {v}")
            return int(v)
        if total_steps is not None:
            self.total_steps = positive("total_steps", total_steps)
        elif epochs is not None and steps_per_epoch is not None:
            self.total_steps = positive("epochs", epochs) * positive("steps_per_epoch",
                                                                     steps_per_epoch)
        else:
            raise ValueError("OneCycleLR: give total_steps, or epochs and steps_per_epoch")
        if not 0.0 <= pct_start <= 1.0:
            raise ValueError(f"OneCycleLR: pct_start is between 0 and 1, not {pct_start}")
        if anneal_strategy not in ("cos", "linear"):
            raise ValueError(f"OneCycleLR: anneal_strategy is 'cos' or 'linear', not "
                             f"{anneal_strategy!r}")
        self.anneal_strategy = anneal_strategy
        up = float(pct_start * self.total_steps) - 1
        # (end step, start and end rate, start and end momentum) of each phase
        self._phases: list[list[Any]] = [
            [up, "initial_lr", "max_lr", "max_momentum", "base_momentum"]]
        if three_phase:
            self._phases.append([float(2 * pct_start * self.total_steps) - 2, "max_lr",
                                 "initial_lr", "base_momentum", "max_momentum"])
            self._phases.append([self.total_steps - 1, "initial_lr", "min_lr",
                                 "max_momentum", "max_momentum"])
        else:
            self._phases.append([self.total_steps - 1, "max_lr", "min_lr", "base_momentum",
                                 "max_momentum"])
        max_lrs = _per_group("OneCycleLR max_lr", optimizer, max_lr)
        if last_epoch == -1:
            for top, group in zip(max_lrs, optimizer.param_groups):
                group["initial_lr"] = top / div_factor
                group["max_lr"] = top
                group["min_lr"] = group["initial_lr"] / final_div_factor
        self.cycle_momentum = bool(cycle_momentum)
        if self.cycle_momentum:
            if "momentum" not in optimizer.defaults and "betas" not in optimizer.defaults:
                raise ValueError(f"OneCycleLR: cycle_momentum needs an optimizer with a "
                                 f"momentum or betas, not {type(optimizer).__name__} (pass "
                                 f"cycle_momentum=False)")
            self.use_beta1 = "betas" in optimizer.defaults
            tops = _per_group("OneCycleLR max_momentum", optimizer, max_momentum)
            bases = _per_group("OneCycleLR base_momentum", optimizer, base_momentum)
            if last_epoch == -1:
                for top, base, group in zip(tops, bases, optimizer.param_groups):
                    if self.use_beta1:
                        group["betas"] = (top, *group["betas"][1:])
                    else:
                        group["momentum"] = top
                    group["max_momentum"], group["base_momentum"] = top, base
        super().__init__(optimizer, last_epoch)

    def _anneal(self, start: float, end: float, pct: float) -> float:
        if self.anneal_strategy == "cos":
            return end + (start - end) / 2.0 * (math.cos(math.pi * pct) + 1)
        return (end - start) * pct + start

    def get_lr(self) -> list[float]:
        step = self.last_epoch
        if step > self.total_steps:
            raise ValueError(f"OneCycleLR: stepped {step} times, past total_steps="
                             f"{self.total_steps}; make it as long as the training")
        lrs = []
        for group in self.optimizer.param_groups:
            start = 0.0
            for i, (end, lr0, lr1, m0, m1) in enumerate(self._phases):
                if step <= end or i == len(self._phases) - 1:
                    pct = (step - start) / (end - start)
                    lrs.append(self._anneal(group[lr0], group[lr1], pct))
                    if self.cycle_momentum:
                        m = self._anneal(group[m0], group[m1], pct)
                        if self.use_beta1:
                            group["betas"] = (m, *group["betas"][1:])
                        else:
                            group["momentum"] = m
                    break
                start = end
        return lrs


class ReduceLROnPlateau(LRScheduler):
    """Multiply the learning rate by ``factor`` when a metric has not improved for
    ``patience`` epochs: ``sched.step(val_loss)``. ``mode`` "min" (a loss) or "max" (an
    accuracy); an improvement is beyond ``threshold``, relative (``threshold_mode="rel"``:
    ``best * (1 - threshold)`` in min mode) or absolute; after a reduction ``cooldown``
    epochs are not counted; rates never go under ``min_lr`` (one or one per group), and a
    change smaller than ``eps`` is not made. PyTorch's rules and defaults.

    >>> import numpy as np, easyad as ad
    >>> opt = ad.optim.SGD([ad.nn.Parameter(np.zeros(1))], lr=1.0)
    >>> sched = ad.optim.ReduceLROnPlateau(opt, factor=0.5, patience=1)
    >>> for loss in [3.0, 2.0, 2.0, 2.0, 1.0]:
    ...     sched.step(loss)
    >>> sched.get_last_lr()
    [0.5]
    """

    def __init__(self, optimizer: Any, mode: str = "min", factor: float = 0.1,
                 patience: int = 10, threshold: float = 1e-4, threshold_mode: str = "rel",
                 cooldown: int = 0, min_lr: Any = 0, eps: float = 1e-8) -> None:
        _check_optimizer(optimizer)
        if factor >= 1.0:
            raise ValueError(f"ReduceLROnPlateau: factor must be < 1, not {factor}")
        if mode not in ("min", "max"):
            raise ValueError(f"ReduceLROnPlateau: mode is 'min' or 'max', not {mode!r}")
        if threshold_mode not in ("rel", "abs"):
            raise ValueError(f"ReduceLROnPlateau: threshold_mode is 'rel' or 'abs', not "
                             f"{threshold_mode!r}")
        self.optimizer, self.factor = optimizer, factor
        self.default_min_lr = None if isinstance(min_lr, (list, tuple)) else min_lr
        self.min_lrs = _per_group("ReduceLROnPlateau min_lr", optimizer, min_lr)
        self.patience, self.cooldown, self.eps = patience, cooldown, eps
        self.mode, self.threshold, self.threshold_mode = mode, threshold, threshold_mode
        self.last_epoch = 0
        self._last_lr = self._current()
        self.best = math.inf if mode == "min" else -math.inf
        self.cooldown_counter = 0
        self.num_bad_epochs = 0

    def step(self, metrics: Any) -> None:  # type: ignore[override]
        """One epoch's ``metrics`` (a number: the validation loss, an accuracy)."""
        current = float(metrics)
        if math.isnan(current):
            raise ValueError("ReduceLROnPlateau.step: the metric is nan (has the training "
                             "diverged?); a nan cannot be compared with the best value")
        self.last_epoch += 1
        if self._is_better(current):
            self.best, self.num_bad_epochs = current, 0
        else:
            self.num_bad_epochs += 1
        if self.cooldown_counter > 0:
            self.cooldown_counter -= 1
            self.num_bad_epochs = 0
        if self.num_bad_epochs > self.patience:
            self._reduce()
            self.cooldown_counter, self.num_bad_epochs = self.cooldown, 0
        self._last_lr = self._current()

    def _is_better(self, a: float) -> bool:
        best, t = self.best, self.threshold
        if self.mode == "min":
            return a < best * (1.0 - t) if self.threshold_mode == "rel" else a < best - t
        return a > best * (t + 1.0) if self.threshold_mode == "rel" else a > best + t

    def _reduce(self) -> None:
        groups = self.optimizer.param_groups
        if len(groups) != len(self.min_lrs):
            if self.default_min_lr is None:
                raise ValueError(f"ReduceLROnPlateau: the optimizer has {len(groups)} "
                                 f"parameter groups, min_lr gave {len(self.min_lrs)}: set "
                                 f"sched.min_lrs to one per group")
            self.min_lrs = [self.default_min_lr] * len(groups)
        for group, low in zip(groups, self.min_lrs):
            old = float(group["lr"])
            new = max(old * self.factor, low)
            if old - new > self.eps:
                group["lr"] = new
