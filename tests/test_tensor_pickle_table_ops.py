"""Recordings holding ops of the op table pickle and come back the same.

Each op's parameters are a typed dataclass; a pickled recording checks every field on
arrival. These dataclasses were refused there ("the data is damaged") although the same
recording had pickled without a word: every recorded CNN, LSTM, cumsum or solve failed
only in the receiving process. The copy must give the original's values and gradients bit
for bit, and those must match an independent reference (torch, or finite differences)."""
from __future__ import annotations

import pickle
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest
import torch

import easyad as ad
from easyad import nn

RNG = np.random.default_rng(11)
W_CONV = RNG.normal(size=(3, 2, 3, 3))
A_SPD = RNG.normal(size=(4, 4))
A_SPD = A_SPD @ A_SPD.T + 4 * np.eye(4)


def _cnn(x: Any) -> Any:
    y = nn.functional.conv2d(x, W_CONV, padding=1)
    return ad.sum(nn.functional.max_pool2d(ad.tanh(y), 2) ** 2)


def _scan(x: Any) -> Any:
    return ad.sum(ad.cumsum(x, axis=1) * ad.flip(x, axis=0))


def _solve(x: Any) -> Any:
    return ad.sum(ad.linalg.solve(A_SPD + ad.diag(x * x), x) ** 2)


def _torch_cnn(x: Any) -> Any:
    y = torch.nn.functional.conv2d(x, torch.tensor(W_CONV), padding=1)
    return (torch.nn.functional.max_pool2d(torch.tanh(y), 2) ** 2).sum()


def _torch_scan(x: Any) -> Any:
    return (torch.cumsum(x, dim=1) * torch.flip(x, dims=(0,))).sum()


def _torch_solve(x: Any) -> Any:
    return (torch.linalg.solve(torch.tensor(A_SPD) + torch.diag(x * x), x) ** 2).sum()


CASES: dict[str, tuple[Callable[[Any], Any], Callable[[Any], Any], tuple[int, ...]]] = {
    "conv2d and max_pool2d": (_cnn, _torch_cnn, (2, 2, 6, 6)),
    "cumsum and flip": (_scan, _torch_scan, (3, 5)),
    "linalg.solve": (_solve, _torch_solve, (4,)),
}


@pytest.mark.parametrize("name", list(CASES))
def test_a_recording_with_table_ops_pickles_and_replays_the_same(name: str) -> None:
    f, tf, shape = CASES[name]
    rng = np.random.default_rng(12)
    F = ad.record(f, rng.normal(size=shape), tensor=True)
    G = pickle.loads(pickle.dumps(F))
    x = rng.normal(size=shape)
    tx = torch.tensor(x, requires_grad=True)
    want = tf(tx)
    want.backward()
    assert float(G(x)) == float(F(x))
    assert np.array_equal(G.gradient(x), F.gradient(x))
    assert float(G(x)) == pytest.approx(want.item(), rel=1e-12)
    np.testing.assert_allclose(G.gradient(x), tx.grad.numpy(), rtol=1e-10, atol=1e-12)


def test_a_forged_parameter_object_is_refused_on_arrival() -> None:
    # only the op table's own parameter classes pass, field by field
    import dataclasses

    from easyad.errors import TapeFormatError
    from easyad.recorded import tensor_pickle

    @dataclasses.dataclass(frozen=True)
    class Forged:
        axis: int = 0
    with pytest.raises(TapeFormatError, match="holds a Forged"):
        tensor_pickle._plain((Forged(),), "instruction 0's params")
    with pytest.raises(TapeFormatError, match="holds a list"):
        tensor_pickle._plain((ad.ops._table.OPS["cumsum"].params(axis=[0]),), "params")
