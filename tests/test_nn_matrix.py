"""Issue 28's validation matrix: every layer of the registry (``tests/_nn_registry.py``) in
every transform, against torch 2.13.0 with the same weights.

One test per row and transform, on the loss ``L = sum(g * y + y * y / 4)`` of the layer's
output ``y`` (``g`` a fixed random cotangent; the square makes second derivatives
nonzero even for linear layers), as a function of ``z = {"p": parameters, "x": input}``
(parameters only for Embedding, whose input is indices):

- ``value``: the layer's output and L, float64, at 1e-10;
- ``reverse``: ``ad.grad`` in the input and every parameter vs ``torch.func.grad``;
- ``float32``: the layer built in float32: output and gradients vs torch's at 1e-5;
- ``forward``: ``ad.jvp`` along a random direction in z vs ``torch.func.jvp``;
- ``hvp``: ``ad.hvp`` vs torch's jvp of its grad;
- ``create_graph``: the input and parameters as variables on a WengertList, the gradient
  taken with ``create_graph=True`` and differentiated again (H v) vs torch's;
- ``replay``: ``ad.record`` of L, replayed at z + v/10 (value and gradient) vs torch there,
  and pickled and unpickled (as to a dask worker): the same bits;
- ``vmap_params``, ``vmap_input``: per-example gradients in the parameters and in the
  input (``ad.vmap(ad.grad(loss, argnums), in_axes=(None, 0))`` over a batch of three
  inputs) vs ``torch.func.vmap`` (an example-by-example loop for torch's recurrent
  kernels, which it cannot batch);
- ``opencl``: the output, L and the reverse sweep with the input and parameters on the
  first OpenCL device (float64), vs torch (skipped, with the reason, where no device works).

A transform a row cannot run is listed in the row's ``raises`` and checked to raise that
exception (never skipped).
"""
from __future__ import annotations

import functools
import pickle

import numpy as np
import pytest
import torch
from torch import func

import easyad as ad
from easyad import nn

from _nn_registry import ROWS, row_ids
from conftest import OPENCL

BY_ID = dict(zip(row_ids(), ROWS))
TRANSFORMS = ["value", "reverse", "float32", "forward", "hvp", "create_graph", "replay",
              "vmap_params", "vmap_input", "opencl"]
TOLERANCE = {np.float64: 1e-10, np.float32: 1e-5}


def _tree(z, f):
    return {k: _tree(v, f) for k, v in z.items()} if isinstance(z, dict) else f(z)


def _leaves(z, prefix=""):
    if isinstance(z, dict):
        return [leaf for k, v in z.items() for leaf in _leaves(v, f"{prefix}{k}.")]
    return [(prefix.rstrip("."), z)]


def _close(ours, theirs, dtype=np.float64, what=""):
    """Trees (or arrays) equal to the dtype's tolerance, relative to the reference's size."""
    got, want = dict(_leaves(ours)), dict(_leaves(theirs))
    assert sorted(got) == sorted(want), (what, sorted(got), sorted(want))
    for name, w in want.items():
        w = w.detach().numpy() if isinstance(w, torch.Tensor) else np.asarray(w)
        tol = TOLERANCE[dtype] * max(1.0, float(np.max(np.abs(w), initial=0.0)))
        np.testing.assert_allclose(np.asarray(got[name], dtype=np.float64), w, rtol=0, atol=tol,
                                   err_msg=f"{what} {name}")


class Case:
    """A row built in one dtype: both layers, the sample z, the cotangent g, a direction v,
    both losses."""

    def __init__(self, rid, dtype):
        row = self.row = BY_ID[rid]
        self.dtype = dtype
        self.ours, self.theirs = row.build(dtype)
        rng = np.random.default_rng(sum(map(ord, rid)))
        if row.integer:
            self.data = rng.integers(0, row.integer, size=row.shape)
            self.batch = rng.integers(0, row.integer, size=(3, *row.shape))
        else:
            self.data = rng.uniform(-1.0, 1.0, size=row.shape).astype(dtype)
            self.batch = rng.uniform(-1.0, 1.0, size=(3, *row.shape)).astype(dtype)
        self.z = {"p": {n: p.data.copy() for n, p in self.ours.named_parameters()}}
        if not row.integer:
            self.z["x"] = self.data
        shape = tuple(self.theirs(torch.tensor(self.data)).shape)
        self.g = rng.normal(size=shape).astype(dtype)
        self.v = _tree(self.z, lambda a: rng.normal(size=a.shape).astype(dtype))

    def output(self, z, x=None):
        x = z.get("x", self.data) if x is None else x
        return nn.functional_call(self.ours, z["p"], x)

    def loss(self, z, x=None):
        y = self.output(z, x)
        return ad.sum(y * self.g + 0.25 * (y * y))

    def toutput(self, tz, x=None):
        x = tz.get("x", torch.tensor(self.data)) if x is None else x
        return func.functional_call(self.theirs, tz["p"], (x,))

    def tloss(self, tz, x=None):
        y = self.toutput(tz, x)
        return (y * torch.tensor(self.g) + 0.25 * (y * y)).sum()

    @staticmethod
    def torch(z):
        return _tree(z, torch.tensor)


@functools.cache
def _case(rid, dtype=np.float64):
    return Case(rid, dtype)


def _value(c: Case):
    y = c.output(c.z)
    ty = c.toutput(c.torch(c.z))
    assert y.dtype == c.dtype and tuple(y.shape) == tuple(ty.shape)
    _close(y.value, ty, c.dtype, "output")
    _close(float(c.loss(c.z)), c.tloss(c.torch(c.z)).item(), c.dtype, "loss")


def _reverse(c: Case):
    got = ad.grad(c.loss)(c.z)
    assert all(np.asarray(a).dtype == c.dtype for _, a in _leaves(got))
    _close(got, func.grad(c.tloss)(c.torch(c.z)), c.dtype, "gradient")


def _forward(c: Case):
    value, tangent = ad.jvp(c.loss, c.z, c.v)
    tvalue, ttangent = func.jvp(c.tloss, (c.torch(c.z),), (c.torch(c.v),))
    if c.row.jvp_from_grad:         # torch's jvp is not its gradient's (the row says why)
        tg, tv = dict(_leaves(func.grad(c.tloss)(c.torch(c.z)))), dict(_leaves(c.v))
        ttangent = sum(float(np.sum(tg[n].numpy() * tv[n])) for n in tg)
    _close(value, tvalue, what="value")
    _close(tangent, ttangent, what="jvp")


def _torch_hvp(c: Case, tz):
    return func.jvp(func.grad(c.tloss), (tz,), (c.torch(c.v),))[1]


def _hvp(c: Case):
    _close(ad.hvp(c.loss, c.z, c.v), _torch_hvp(c, c.torch(c.z)), what="hvp")


def _create_graph(c: Case):
    lst = ad.WengertList()
    variables = _tree(c.z, lambda a: ad.Tensor.variable(a, lst))
    d = c.loss(variables).derivatives(create_graph=True)
    leaves = dict(_leaves(variables))
    directions = dict(_leaves(c.v))
    first = {n: d[t].value for n, t in leaves.items()}
    _close(first, dict(_leaves(func.grad(c.tloss)(c.torch(c.z)))), what="gradient")
    inner = sum((ad.sum(d[t] * directions[n]) for n, t in leaves.items()), start=0.0)
    second = inner.derivatives()
    _close({n: second[t] for n, t in leaves.items()},
           dict(_leaves(_torch_hvp(c, c.torch(c.z)))), what="H v")


def _replay(c: Case):
    recorded = ad.record(c.loss, c.z)
    z1 = _tree_add(c.z, c.v)
    value, gradient = recorded.value_and_gradient(z1)
    tz1 = c.torch(z1)
    _close(value, c.tloss(tz1).item(), what="replayed value")
    _close(gradient, func.grad(c.tloss)(tz1), what="replayed gradient")
    # the recording travels (pickled, as to a dask worker) and gives the same bits there;
    # only training-mode BatchNorm refuses, its running statistics being live arrays
    if c.row.train:
        with pytest.raises(TypeError, match="live arrays"):
            pickle.dumps(recorded)
        return
    again = pickle.loads(pickle.dumps(recorded)).value_and_gradient(z1)
    assert again[0] == value
    for (name, a), (_, b) in zip(_leaves(again[1]), _leaves(gradient)):
        assert np.array_equal(a, b), f"unpickled gradient {name}"


def _tree_add(z, v):
    if isinstance(z, dict):
        return {k: _tree_add(z[k], v[k]) for k in z}
    return z + 0.1 * v


def _vmap(c: Case, argnums):
    """Per-example gradients over a batch of three inputs: in the parameters (argnums 0)
    or the input (1)."""
    def per_example(p, x):
        return c.loss({"p": p}, x)

    def tper_example(p, x):
        return c.tloss({"p": p}, x)
    got = ad.vmap(ad.grad(per_example, argnums=argnums), in_axes=(None, 0))(c.z["p"],
                                                                            c.batch)
    tp, txs = c.torch(c.z["p"]), torch.tensor(c.batch)
    tgrad = func.grad(tper_example, argnums=argnums)
    if c.row.torch_vmap:
        want = func.vmap(tgrad, in_dims=(None, 0))(tp, txs)
    else:       # torch's recurrent kernels do not batch: one example at a time
        each = [tgrad(tp, x) for x in txs]
        want = torch.stack(each) if argnums else \
            {k: torch.stack([e[k] for e in each]) for k in each[0]}
    _close(got, want, what="per-example gradient")


def _opencl(c: Case):
    """Value and reverse sweep with every leaf on the device: the layer's kernels there."""
    lst = ad.WengertList()
    device = OPENCL[0]
    variables = _tree(c.z, lambda a: ad.Tensor.variable(a, lst, device=device))
    y = c.output(variables)          # (an Embedding's indices: numpy integers, data)
    assert str(y.device) == device, y.device
    L = ad.sum(y * c.g + 0.25 * (y * y))
    d = L.derivatives()
    tz = c.torch(c.z)
    _close(y.value, c.toutput(tz), what="output on " + device)
    _close(L.number, c.tloss(tz).item(), what="loss on " + device)
    _close(_tree(variables, lambda t: d[t]), func.grad(c.tloss)(tz),
           what="gradient on " + device)


RUN = {"value": _value, "reverse": _reverse, "forward": _forward, "hvp": _hvp,
       "create_graph": _create_graph, "replay": _replay,
       "vmap_params": lambda c: _vmap(c, 0), "vmap_input": lambda c: _vmap(c, 1),
       "opencl": _opencl}


def _cells():
    """Every (row, transform); a known bug is a strict expected failure with its reason."""
    for rid, row in BY_ID.items():
        for t in TRANSFORMS:
            marks = [pytest.mark.xfail(strict=True, reason=row.xfail[t])] \
                if t in row.xfail else []
            if t == "opencl" and not OPENCL:
                marks = [pytest.mark.skip(reason="no working OpenCL device")]
            yield pytest.param(rid, t, marks=marks, id=f"{rid}-{t}")


@pytest.mark.parametrize(("rid", "transform"), list(_cells()))
def test_layer_in_transform(rid, transform):
    row = BY_ID[rid]
    if transform == "float32":
        c = _case(rid, np.float32)
        _value(c)
        _reverse(c)
        return
    c = _case(rid)
    if transform in row.raises:
        error, message, _why = row.raises[transform]
        with pytest.raises(error, match=message):
            RUN[transform](c)
        return
    RUN[transform](c)


def test_every_layer_of_the_issue_has_a_row():
    listed = ("Linear Conv1d Conv2d ConvTranspose2d MaxPool2d AvgPool2d AdaptiveAvgPool2d "
              "Flatten BatchNorm1d BatchNorm2d LayerNorm GroupNorm Embedding sdpa "
              "MultiheadAttention LSTM GRU LSTMCell GRUCell BasicBlock ReLU Tanh Sigmoid GELU "
              "Softmax LogSoftmax Dropout").split()
    names = {rid.split("-")[0] for rid in BY_ID}
    assert [n for n in listed if n not in names] == []
    conv = [rid for rid in BY_ID if rid.startswith("Conv2d")]
    assert len(conv) >= 3          # stride/padding/dilation and groups variants


def test_per_example_weight_gradients_of_single_images():
    """vmap over images without a batch axis of their own (C, H, W): the grouped
    convolution of per-example weights with no leading axes, conv and its transpose."""
    rng = np.random.default_rng(3)
    w, wt = rng.normal(size=(4, 2, 3, 3)), rng.normal(size=(2, 3, 3, 3))
    xs = rng.normal(size=(3, 4, 5, 5))
    F, TF = nn.functional, torch.nn.functional

    def ours(w, wt, x):
        y = F.conv2d(x, w, padding=1, groups=2)
        return ad.sum(ad.tanh(F.conv_transpose2d(y[:2], wt, stride=2)))

    def theirs(w, wt, x):
        y = TF.conv2d(x, w, padding=1, groups=2)
        return torch.tanh(TF.conv_transpose2d(y[:2], wt, stride=2)).sum()
    got = ad.vmap(ad.grad(ours, argnums=(0, 1)), in_axes=(None, None, 0))(w, wt, xs)
    want = func.vmap(func.grad(theirs, argnums=(0, 1)), in_dims=(None, None, 0))(
        torch.tensor(w), torch.tensor(wt), torch.tensor(xs))
    _close({"w": got[0], "wt": got[1]}, {"w": want[0], "wt": want[1]})
