"""Seeded random numbers for reproducible models: ``ad.random.seed(0)``.

Sits beside the tensors, under ``easyad.nn``: whatever draws random numbers (the
initialisation of ``nn.Linear``, the masks of ``nn.Dropout``, the examples' data) takes a
``generator=`` argument (a ``numpy.random.Generator``) and, when it is left out, draws from
the module-level generator here. ``seed(n)`` replaces that generator with a fresh
``numpy.random.default_rng(n)``, so a script that calls it first is reproducible.

>>> import easyad as ad
>>> _ = ad.random.seed(0)
>>> a = ad.random.generator().random()
>>> _ = ad.random.seed(0)
>>> ad.random.generator().random() == a
True
"""
from __future__ import annotations

from typing import Any

import numpy as np

__all__ = ["generator", "resolve", "seed"]

_state: list[np.random.Generator] = []   # made on first use (numpy.random loads lazily)


def seed(value: Any = None) -> np.random.Generator:
    """Start the module-level generator afresh from ``value`` (an int, a sequence of
    ints or a ``numpy.random.SeedSequence``; None: fresh entropy). Returns the generator."""
    _state[:] = [np.random.default_rng(value)]
    return _state[0]


def generator() -> np.random.Generator:
    """The module-level generator (what ``generator=None`` means everywhere)."""
    if not _state:
        _state.append(np.random.default_rng())
    return _state[0]


def resolve(generator_: Any = None) -> np.random.Generator:
    """``generator_`` itself when it is a numpy Generator, the module-level generator for
    None, and a new ``default_rng(generator_)`` for an int seed."""
    if generator_ is None:
        return generator()
    if isinstance(generator_, np.random.Generator):
        return generator_
    if isinstance(generator_, (int, np.integer, np.random.SeedSequence)):
        return np.random.default_rng(generator_)
    raise TypeError(f"generator must be a numpy.random.Generator, an int seed or None, "
                    f"not {type(generator_).__name__}")
