"""Optimizers and learning-rate schedulers for ``ad.nn`` parameters (``ad.optim``).

``SGD``, ``Adam``, ``AdamW`` and ``RMSprop`` follow PyTorch's update formulas and
defaults; ``StepLR`` and ``CosineAnnealingLR`` its schedules. A step takes the loss's
derivatives: ``opt.step(loss.derivatives())`` (or ``opt.step(loss)``).
"""
from easyad.optim import lr_scheduler
from easyad.optim._optimizer import SGD, Adam, AdamW, Optimizer, RMSprop
from easyad.optim.lr_scheduler import CosineAnnealingLR, LRScheduler, StepLR

__all__ = ["Adam", "AdamW", "CosineAnnealingLR", "LRScheduler", "Optimizer", "RMSprop", "SGD",
           "StepLR", "lr_scheduler"]
