"""Optimizers and learning-rate schedulers for ``ad.nn`` parameters (``ad.optim``).

``SGD``, ``Adam``, ``AdamW`` and ``RMSprop`` follow PyTorch's update formulas and
defaults; ``StepLR``, ``CosineAnnealingLR``, ``LinearLR``, ``SequentialLR``,
``OneCycleLR`` and ``ReduceLROnPlateau`` its schedules. A step takes the loss's
derivatives: ``opt.step(loss.derivatives())`` (or ``opt.step(loss)``).

Examples
--------
>>> import numpy as np, easyad as ad
>>> from easyad import nn, optim
>>> _ = ad.random.seed(0)
>>> model = nn.Linear(2, 1)
>>> opt = optim.SGD(model.parameters(), lr=0.1)
>>> x, y = np.array([[1.0, 2.0]]), np.array([[0.0]])
>>> before = nn.mse_loss(model(x), y)          # no list: a plain float
>>> lst = ad.WengertList()
>>> opt.step(nn.mse_loss(model(x, tape=lst), y).derivatives())
>>> nn.mse_loss(model(x), y) < before
True
"""
from easyad.optim import lr_scheduler
from easyad.optim._optimizer import SGD, Adam, AdamW, Optimizer, RMSprop
from easyad.optim.lr_scheduler import (CosineAnnealingLR, LinearLR, LRScheduler, OneCycleLR,
                                       ReduceLROnPlateau, SequentialLR, StepLR)

__all__ = ["Adam", "AdamW", "CosineAnnealingLR", "LRScheduler", "LinearLR", "OneCycleLR",
           "Optimizer", "RMSprop", "ReduceLROnPlateau", "SGD", "SequentialLR", "StepLR",
           "lr_scheduler"]
