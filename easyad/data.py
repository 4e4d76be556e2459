"""Mini-batches of arrays for training loops (``ad.data``): ``DataLoader``.

``DataLoader(x, y, batch_size=32, shuffle=True, seed=0)`` walks arrays that share their
first axis in batches, as ``torch.utils.data.DataLoader`` walks a ``TensorDataset``. It
lives beside ``ad.random`` rather than in ``ad.nn`` because nothing in it is a network: it
takes numpy arrays or easyad Tensors (anything with a first axis and fancy indexing) and
hands back the same kind.

Every ``iter(loader)`` is one epoch. With ``shuffle=True`` epoch ``e`` visits the samples
in the order ``numpy.random.default_rng([seed, e]).permutation(n)``: a function of the
seed and the epoch alone, so a run resumed from a checkpoint (``loader.set_epoch(e)``)
sees the batches the uninterrupted run saw, and two loaders with one seed agree.

>>> import numpy as np, easyad as ad
>>> x, y = np.arange(10.0).reshape(5, 2), np.arange(5)
>>> loader = ad.data.DataLoader(x, y, batch_size=2)
>>> len(loader), [yb.tolist() for _, yb in loader]
(3, [[0, 1], [2, 3], [4]])
"""
from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import numpy as np

from easyad import random as _random

__all__ = ["DataLoader"]


def _length(array: Any, position: int) -> int:
    shape = getattr(array, "shape", None)
    if shape is None or len(shape) == 0:
        raise ValueError(f"DataLoader: array {position} is a scalar (shape {shape}); each "
                         f"array needs a first axis of samples")
    return int(shape[0])


class DataLoader:
    """Batches of ``arrays`` (numpy arrays, easyad Tensors or array-likes, all with the
    same number of samples along axis 0), one epoch per ``iter``. Lists are converted
    with ``numpy.asarray`` once; batches are copies (fancy indexing), so writing into one
    never changes the data.

    Parameters
    ----------
    *arrays : numpy arrays, Tensors or array-likes
        The data; a single array gives batches of it, several give tuples of batches in
        the same order (``for xb, yb in DataLoader(x, y, ...)``).
    batch_size : int
        Samples per batch (positive; torch's default 1).
    shuffle : bool
        A new order every epoch, drawn from ``seed`` and the epoch number.
    seed : int, numpy.random.SeedSequence or None
        A SeedSequence gives epoch ``e`` its child with ``e`` appended to the spawn key.
        None draws an int from ``ad.random``'s generator when the loader is made (so
        ``ad.random.seed(0)`` fixes it too).
    drop_last : bool
        Leave out the last batch when it is smaller than ``batch_size``.

    Examples
    --------
    >>> import numpy as np, easyad as ad
    >>> loader = ad.data.DataLoader(np.arange(6), batch_size=4, shuffle=True, seed=0,
    ...                             drop_last=True)
    >>> [sorted(b.tolist()) == sorted(set(b.tolist())) for b in loader], len(loader)
    ([True], 1)
    """

    def __init__(self, *arrays: Any, batch_size: int = 1, shuffle: bool = False,
                 seed: Any = None, drop_last: bool = False) -> None:
        if not arrays:
            raise ValueError("DataLoader needs at least one array: DataLoader(x, y, "
                             "batch_size=...)")
        if isinstance(batch_size, bool) or not isinstance(batch_size, (int, np.integer)):
            raise TypeError(f"DataLoader: batch_size is a positive int, not "
                            f"{type(batch_size).__name__}")
        if batch_size < 1:
            raise ValueError(f"DataLoader: batch_size must be at least 1, not {batch_size}")
        held = [a if hasattr(a, "shape") and hasattr(a, "__getitem__") else np.asarray(a)
                for a in arrays]
        lengths = [_length(a, i) for i, a in enumerate(held)]
        if len(set(lengths)) > 1:
            raise ValueError(f"DataLoader: the arrays have different numbers of samples "
                             f"along axis 0: {lengths}; every array needs one row per sample")
        if seed is None:
            seed = int(_random.generator().integers(2**63))
        elif not isinstance(seed, (int, np.integer, np.random.SeedSequence)) or \
                isinstance(seed, bool):
            raise TypeError(f"DataLoader: seed is an int, a numpy SeedSequence or None, not "
                            f"{type(seed).__name__} (a Generator's draws would depend on "
                            f"what else used it; pass an int)")
        elif not isinstance(seed, np.random.SeedSequence) and seed < 0:
            raise ValueError(f"DataLoader: seed must be >= 0, not {seed}")
        self.arrays = tuple(held)
        self.batch_size, self.shuffle, self.drop_last = int(batch_size), bool(shuffle), \
            bool(drop_last)
        self.seed = seed
        self.epoch = 0          # the epoch the next iter() runs
        self._n = lengths[0]

    @property
    def num_samples(self) -> int:
        return self._n

    def __len__(self) -> int:
        """Batches per epoch."""
        if self.drop_last:
            return self._n // self.batch_size
        return -(-self._n // self.batch_size)

    def set_epoch(self, epoch: int) -> None:
        """Make the next ``iter`` run epoch ``epoch`` (resuming: its order is the one the
        uninterrupted run had)."""
        if int(epoch) < 0:
            raise ValueError(f"DataLoader: epoch must be >= 0, not {epoch}")
        self.epoch = int(epoch)

    def order(self, epoch: int) -> np.ndarray:
        """The sample indices of epoch ``epoch`` in the order they are visited."""
        if not self.shuffle:
            return np.arange(self._n)
        seed = self.seed
        if isinstance(seed, np.random.SeedSequence):     # the epoch extends its spawn key
            seed = np.random.SeedSequence(seed.entropy, spawn_key=(*seed.spawn_key, int(epoch)),
                                          pool_size=seed.pool_size)
        else:
            seed = [int(seed), int(epoch)]
        return np.random.default_rng(seed).permutation(self._n)

    def __iter__(self) -> Iterator[Any]:
        order = self.order(self.epoch)
        self.epoch += 1
        for k in range(len(self)):
            index = order[k * self.batch_size:(k + 1) * self.batch_size]
            batch = tuple(a[index] for a in self.arrays)
            yield batch[0] if len(batch) == 1 else batch

    def __repr__(self) -> str:
        return (f"DataLoader({len(self.arrays)} arrays, {self._n} samples, "
                f"batch_size={self.batch_size}, shuffle={self.shuffle}, "
                f"drop_last={self.drop_last}, epoch={self.epoch})")
