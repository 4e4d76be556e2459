"""Training on an OpenCL device keeps parameters, gradients and optimizer state there
(easyad/nn/_parameter.py, easyad/optim/_optimizer.py ``_device_update``): the updates
agree with the host's (numpy) updates, a step moves nothing between host and device (the
loss's number comes back when first used: the core's PendingNumber), and reading or
writing ``p.data`` between steps is honoured."""
from __future__ import annotations

import numpy as np
import pytest

import easyad as ad
from easyad import nn, optim

OPTIMIZERS = {
    "SGD": lambda p: optim.SGD(p, lr=0.1),
    "SGD-momentum": lambda p: optim.SGD(p, lr=0.05, momentum=0.9, dampening=0.1,
                                        weight_decay=1e-3),
    "SGD-nesterov-maximize": lambda p: optim.SGD(p, lr=0.05, momentum=0.9, nesterov=True,
                                                 weight_decay=1e-2, maximize=True),
    "Adam": lambda p: optim.Adam(p, lr=0.01),
    "Adam-amsgrad-l2": lambda p: optim.Adam(p, lr=0.02, betas=(0.8, 0.99), eps=1e-6,
                                            weight_decay=0.1, amsgrad=True),
    "AdamW": lambda p: optim.AdamW(p, lr=0.01, betas=(0.3, 0.9)),    # lerp's other form
    "RMSprop": lambda p: optim.RMSprop(p),
    "RMSprop-centered-momentum": lambda p: optim.RMSprop(p, lr=0.005, alpha=0.3,
                                                         momentum=0.5, centered=True,
                                                         weight_decay=0.01),
}


def _model(device, dtype=np.float64):
    ad.random.seed(5)
    return nn.Sequential(nn.Linear(6, 8, dtype=dtype), nn.Tanh(),
                         nn.Linear(8, 3, dtype=dtype)).to(device)


def _data(rng):
    return rng.standard_normal((16, 6)), rng.integers(0, 3, 16)


def _train(model, opt, x, y, steps):
    losses = []
    for _ in range(steps):
        lst = ad.WengertList()
        loss = nn.cross_entropy(model(x, tape=lst), y)
        opt.step(loss.derivatives())
        losses.append(loss.number)
    return losses


@pytest.mark.parametrize("name", sorted(OPTIMIZERS))
def test_device_updates_match_the_host_updates(name, opencl_device):
    rng = np.random.default_rng(1)
    x, y = _data(rng)
    host, dev = _model("numpy"), _model(opencl_device)
    host_opt, dev_opt = OPTIMIZERS[name](host.parameters()), OPTIMIZERS[name](dev.parameters())
    host_losses = _train(host, host_opt, x, y, 6)
    dev_losses = _train(dev, dev_opt, ad.Tensor.constant(x, device=opencl_device), y, 6)
    np.testing.assert_allclose(dev_losses, host_losses, rtol=1e-11)
    for p in dev.parameters():
        assert p._values.on_device() and not p._values._host_valid   # updated there
    for (k, a), b in zip(host.state_dict().items(), dev.state_dict().values()):
        np.testing.assert_allclose(b, a, rtol=1e-11, atol=1e-14, err_msg=k)
    for p in host.parameters():
        assert not p._values.on_device()                       # numpy: no device copy
    host_state, dev_state = host_opt.state_dict(), dev_opt.state_dict()
    for i, entries in host_state["state"].items():
        for key, value in entries.items():
            got = dev_state["state"][i][key]
            if isinstance(value, np.ndarray):
                assert isinstance(got, np.ndarray)
                np.testing.assert_allclose(got, value, rtol=1e-11, atol=1e-14)
            else:
                assert got == value


class _Transfers:
    """Counts every host <-> device transfer pyopencl makes while installed."""

    def __init__(self, monkeypatch):
        import pyopencl
        import pyopencl.array as cla
        self.moved = []
        real_copy, real_get, real_set = pyopencl.enqueue_copy, cla.Array.get, cla.Array.set
        moved = self.moved

        def copy(queue, dest, src, **kw):
            moved.append(("copy", type(dest).__name__, type(src).__name__,
                          getattr(dest, "size", None)))
            return real_copy(queue, dest, src, **kw)

        def get(self, *args, **kw):
            moved.append(("get", self.shape))
            return real_get(self, *args, **kw)

        def set_(self, *args, **kw):
            moved.append(("set", self.shape))
            return real_set(self, *args, **kw)
        monkeypatch.setattr(pyopencl, "enqueue_copy", copy)
        monkeypatch.setattr(cla.Array, "get", get)
        monkeypatch.setattr(cla.Array, "set", set_)

    def reads(self):
        return [m for m in self.moved if m[0] == "get"]


def _trained(opencl_device, seed=2):
    rng = np.random.default_rng(seed)
    x, y = _data(rng)
    model = _model(opencl_device)
    opt = optim.Adam(model.parameters(), lr=0.01)
    xt = ad.Tensor.constant(x, device=opencl_device)
    _train(model, opt, xt, y, 1)       # uploads and kernel builds happen here
    return model, opt, xt, y


def test_a_step_moves_nothing_until_the_loss_is_read(opencl_device, monkeypatch):
    """After a first step (uploads, kernel builds): a step moves nothing at all; the
    loss's one number comes back when it is first used, once."""
    model, opt, xt, y = _trained(opencl_device)
    expected = nn.cross_entropy(model(xt), y)     # no list: read at once, a float
    transfers = _Transfers(monkeypatch)
    lst = ad.WengertList()
    loss = nn.cross_entropy(model(xt, tape=lst), y)
    d = loss.derivatives()
    assert d[loss] == 1.0                  # a sweep and its lookups need no value
    opt.step(d)
    assert transfers.moved == []
    assert loss.number == pytest.approx(expected, rel=1e-12)
    assert transfers.reads() == [("get", ())]
    assert loss.number == loss.number and repr(loss)      # read once, kept
    assert transfers.reads() == [("get", ())]
    monkeypatch.undo()
    assert all(p._values.on_device() for p in model.parameters())


def test_a_number_left_on_the_device_acts_as_its_value(opencl_device):
    """Arithmetic, comparisons, where(), functions, tensor operands and second derivatives
    on a loss whose number is still on the device read it first, and agree with the same
    code on the host (numpy) device."""
    rng = np.random.default_rng(6)
    x, y = _data(rng)

    def uses(device):
        model = _model(device)
        out = []
        for use in (lambda r: r * 2.0, lambda r: 1.0 - r, lambda r: r / r, lambda r: -r,
                    lambda r: ad.sin(r), lambda r: r ** 2, lambda r: float(r > 0.5),
                    lambda r: float(0.5 <= r), lambda r: ad.where(r > 10.0, r, 3.0 * r),
                    lambda r: r + r, lambda r: bool(r), lambda r: r.number):
            lst = ad.WengertList()
            loss = nn.cross_entropy(model(x, tape=lst), y)
            got = use(loss)
            if isinstance(got, ad.Record):
                d = got.derivatives()
                out.append((got.number, np.asarray(d[model[0].weight]).copy()))
            else:
                out.append((float(got), None))
        lst = ad.WengertList()                 # a tensor operand, then a number from it
        loss = nn.cross_entropy(model(x, tape=lst), y)
        t = (ad.Tensor.constant(np.arange(3.0), device=device) * loss).sum()
        out.append((t.number, np.asarray(t.derivatives()[model[2].bias]).copy()))
        lst = ad.WengertList()                 # a second derivative through the loss
        xv = ad.Tensor.variable(x, lst, device=device)
        loss = nn.cross_entropy(model(xv), y)
        g = loss.derivatives(create_graph=True)[xv]
        h = (g * g).sum().derivatives()[xv]
        out.append((float(np.asarray(g).sum()), np.asarray(h).copy()))
        return out

    for (a, da), (b, db) in zip(uses("numpy"), uses(opencl_device), strict=True):
        assert b == pytest.approx(a, rel=1e-12)
        if da is not None:
            np.testing.assert_allclose(db, da, rtol=1e-11, atol=1e-14)


def test_a_number_on_the_device_outlives_clear(opencl_device):
    """A loss kept past ``lst.clear()`` still reads its own number (not the entry that
    took its place); the list's arrays, read whole, hold the numbers too."""
    model, opt, xt, y = _trained(opencl_device, seed=7)
    lst = ad.WengertList()
    first = nn.cross_entropy(model(xt, tape=lst), y)
    arrays_loss = nn.cross_entropy(model(xt), y)          # no list: a float at once
    assert isinstance(arrays_loss, float)
    lst.clear()
    scaled = nn.cross_entropy(model(xt * 3.0, tape=lst), y)
    assert first.number == pytest.approx(arrays_loss, rel=1e-12)
    assert scaled.number != pytest.approx(arrays_loss, rel=1e-6)
    with pytest.raises(ad.StaleRecordError):
        first * 2.0
    lst.clear()
    loss = nn.cross_entropy(model(xt, tape=lst), y)
    values = lst._arrays()["values"]
    assert values[loss.index] == pytest.approx(arrays_loss, rel=1e-12)
    assert loss.number == values[loss.index]


def test_a_failed_read_loses_nothing(opencl_device, monkeypatch):
    """A device read that fails raises where the number is used; the number is still there
    for the next use."""
    import pyopencl.array as cla
    model, opt, xt, y = _trained(opencl_device, seed=8)
    expected = nn.cross_entropy(model(xt), y)
    lst = ad.WengertList()
    loss = nn.cross_entropy(model(xt, tape=lst), y)
    n = len(lst)

    def fail(self, *args, **kw):
        raise RuntimeError("simulated device failure")
    monkeypatch.setattr(cla.Array, "get", fail)
    with pytest.raises(RuntimeError, match="simulated"):
        loss.number
    with pytest.raises(RuntimeError, match="simulated"):
        loss + 1.0
    assert len(lst) == n                                           # nothing appended
    monkeypatch.undo()
    assert (loss + 1.0).number == pytest.approx(expected + 1.0, rel=1e-12)
    assert loss.number == pytest.approx(expected, rel=1e-12)


def test_reading_and_writing_data_between_steps(opencl_device):
    """``p.data`` brings the values back; writing into it counts for the next step (the
    device copy is dropped and uploaded again)."""
    rng = np.random.default_rng(3)
    x, y = _data(rng)
    host, dev = _model("numpy"), _model(opencl_device)
    host_opt, dev_opt = optim.SGD(host.parameters(), lr=0.1, momentum=0.5), \
        optim.SGD(dev.parameters(), lr=0.1, momentum=0.5)
    _train(host, host_opt, x, y, 2)
    _train(dev, dev_opt, x, y, 2)
    w_host, w_dev = host[0].weight, dev[0].weight
    assert repr(w_dev) == repr(w_host) or np.allclose(np.asarray(w_dev), np.asarray(w_host))
    assert w_dev._values.on_device()                  # repr and __array__ keep the copy
    w_dev.data[...] = 0.25                            # in place, through the host array
    w_host.data[...] = 0.25
    assert not w_dev._values.on_device()
    _train(host, host_opt, x, y, 2)
    _train(dev, dev_opt, x, y, 2)
    for a, b in zip(host.parameters(), dev.parameters()):
        np.testing.assert_allclose(b.data, a.data, rtol=1e-11, atol=1e-14)


def test_a_host_step_after_device_steps_takes_the_state_back(opencl_device):
    """Gradients given as arrays (not a sweep on the device) update on the host, with the
    momentum the device steps left; then device steps go on from there."""
    rng = np.random.default_rng(4)
    x, y = _data(rng)
    host, dev = _model("numpy"), _model(opencl_device)
    host_opt, dev_opt = optim.RMSprop(host.parameters(), momentum=0.3), \
        optim.RMSprop(dev.parameters(), momentum=0.3)
    _train(host, host_opt, x, y, 2)
    _train(dev, dev_opt, x, y, 2)
    grads = [rng.standard_normal(p.shape) for p in host.parameters()]
    host_opt.step(grads)
    dev_opt.step(grads)
    _train(host, host_opt, x, y, 2)
    _train(dev, dev_opt, x, y, 2)
    for a, b in zip(host.parameters(), dev.parameters()):
        np.testing.assert_allclose(b.data, a.data, rtol=1e-11, atol=1e-14)


def test_float32_parameters_stay_float32_on_the_device(opencl_device):
    rng = np.random.default_rng(5)
    x, y = _data(rng)
    host, dev = _model("numpy", np.float32), _model(opencl_device, np.float32)
    _train(host, optim.Adam(host.parameters(), lr=0.01), x.astype(np.float32), y, 3)
    _train(dev, optim.Adam(dev.parameters(), lr=0.01), x.astype(np.float32), y, 3)
    for a, b in zip(host.parameters(), dev.parameters()):
        assert b._values._buffer.dtype == np.float32 and b.dtype == np.float32
        np.testing.assert_allclose(b.data, a.data, rtol=2e-5, atol=1e-6)


def test_a_trained_model_pickles_and_copies_with_its_device_values(opencl_device):
    import copy
    import pickle
    rng = np.random.default_rng(6)
    x, y = _data(rng)
    model = _model(opencl_device)
    _train(model, optim.SGD(model.parameters(), lr=0.1), x, y, 2)   # values on the device
    for clone in (pickle.loads(pickle.dumps(model)), copy.deepcopy(model)):
        for a, b in zip(model.parameters(), clone.parameters()):
            assert not b._values.on_device() and b.device == a.device
            np.testing.assert_array_equal(b.data, np.asarray(a))
        lst = ad.WengertList()
        loss = nn.cross_entropy(clone(x, tape=lst), y)        # it trains on
        optim.SGD(clone.parameters(), lr=0.1).step(loss.derivatives())


# ---- a recorded training step replayed with the Parameters themselves ----

def _replayed(device, use_parameters, steps=4, seed=11):
    ad.random.seed(0)
    model = nn.Sequential(nn.Linear(6, 8), nn.Tanh(), nn.Linear(8, 3)).to(device)
    named = dict(model.named_parameters())
    rng = np.random.default_rng(seed)

    def batch():
        x = rng.standard_normal((16, 6))
        return x, np.eye(3)[rng.integers(0, 3, 16)]

    def loss(params, x, y):
        return nn.functional.cross_entropy(nn.functional_call(model, params, x), y)

    step = ad.record(loss, {k: p.data.copy() for k, p in named.items()}, *batch(),
                     device=device)
    losses = [step.sgd_step(named if use_parameters else {k: p.data for k, p in
                                                          named.items()},
                            *batch(), lr=0.2) for _ in range(steps)]
    return model, named, step, losses, batch


@pytest.mark.parametrize("device", ["numpy", "opencl"])
def test_sgd_step_takes_the_parameters_themselves(device, opencl_device):
    """``F.sgd_step(named_parameters, ...)`` equals the step on their ``.data`` (numpy
    device, eager-checked elsewhere) on every device; on OpenCL the Parameters stay on the
    device, and a step then uploads only the batch and reads only the loss."""
    device = opencl_device if device == "opencl" else device
    _, _, _, ref_losses, _ = _replayed("numpy", False)
    model, named, _, losses, _ = _replayed(device, True)
    np.testing.assert_allclose(losses, ref_losses, rtol=1e-12)
    on_device = device != "numpy"
    assert all(p._values.on_device() == on_device for p in named.values())
    ref_model, *_ = _replayed("numpy", False)
    for (k, a), b in zip(ref_model.state_dict().items(), model.state_dict().values()):
        np.testing.assert_allclose(b, a, rtol=1e-12, atol=1e-15, err_msg=k)


def test_a_replayed_step_on_the_device_moves_the_batch_and_the_loss(opencl_device,
                                                                    monkeypatch):
    model, named, step, _, batch = _replayed(opencl_device, True, steps=1)
    x, y = batch()
    transfers = _Transfers(monkeypatch)
    value = step.sgd_step(named, x, y, lr=0.2)
    uploaded = sum(int(np.prod(m[1])) for m in transfers.moved if m[0] == "set")
    assert uploaded == x.size + y.size, transfers.moved    # the batch (lr: as before)
    assert transfers.reads() == [("get", ())], transfers.moved  # the loss
    to_host = [m[3] for m in transfers.moved if m[0] == "copy" and m[1] == "ndarray"]
    assert to_host == [1], transfers.moved                     # one number, nothing else
    step.sgd_step(named, x, y, lr=0.1)                         # a new lr: uploaded once
    uploaded = sum(int(np.prod(m[1])) for m in transfers.moved if m[0] == "set")
    assert uploaded == 2 * (x.size + y.size) + 1, transfers.moved
    monkeypatch.undo()
    assert all(p._values.on_device() for p in named.values())
    eager = nn.cross_entropy(model(x), y.argmax(axis=1))     # eager execution goes on
    assert np.isfinite(eager) and np.isfinite(value)


def test_a_replayed_step_takes_a_batch_on_the_device_as_it_is(opencl_device, monkeypatch):
    """x and y already on the device (Tensors of the recorded shapes and dtypes) go into
    the program as they are: a step then moves nothing but the loss, and computes what
    the same batch from the host does."""
    _, named, step, _, batch = _replayed(opencl_device, True, steps=1)
    _, host_named, host_step, _, _ = _replayed(opencl_device, True, steps=1)
    x, y = batch()
    xt, yt = (ad.Tensor.constant(a, device=opencl_device) for a in (x, y))
    transfers = _Transfers(monkeypatch)
    value = step.sgd_step(named, xt, yt, lr=0.2)
    assert [m for m in transfers.moved if m[0] == "set"] == [], transfers.moved
    to_host = [m[3] for m in transfers.moved if m[0] == "copy" and m[1] == "ndarray"]
    assert to_host == [1], transfers.moved                     # the loss, nothing else
    monkeypatch.undo()
    assert value == host_step.sgd_step(host_named, x, y, lr=0.2)
    for k, p in named.items():
        np.testing.assert_array_equal(p.data, host_named[k].data, err_msg=k)
    assert step(named, xt, yt) == host_step(host_named, x, y)
    got, want = step.value_and_gradient(named, xt, yt), host_step.value_and_gradient(
        host_named, x, y)
    assert got[0] == want[0]
    for k in named:
        np.testing.assert_array_equal(got[1][k], want[1][k], err_msg=k)
    # a wrong dtype or shape is refused, naming what to pass; the parameters are untouched
    before = {k: p.data.copy() for k, p in named.items()}
    with pytest.raises(ValueError, match="dtype=float64"):
        step.sgd_step(named, ad.Tensor.constant(x, device=opencl_device, dtype=np.float32),
                      yt, lr=0.2)
    with pytest.raises(ValueError, match=r"shape \(16, 3\)"):
        step.sgd_step(named, xt, ad.Tensor.constant(y[:5], device=opencl_device), lr=0.2)
    for k, p in named.items():
        np.testing.assert_array_equal(p.data, before[k], err_msg=k)
    # a Tensor on another device (numpy) is read and uploaded, as a host array
    assert step.sgd_step(named, ad.Tensor.constant(x), yt, lr=0.2) == \
        host_step.sgd_step(host_named, x, y, lr=0.2)


def test_sgd_step_refuses_what_it_cannot_update(opencl_device):
    model, named, step, _, batch = _replayed(opencl_device, True, steps=1)
    tensors = {k: ad.Tensor.constant(p.data, device=opencl_device) for k, p in named.items()}
    with pytest.raises(ValueError, match="a Tensor does not change"):
        step.sgd_step(tensors, *batch(), lr=0.1)
    value, grads = step.value_and_gradient(tensors, *batch())    # reading them is fine
    assert np.isfinite(value) and set(grads) == set(named)
    wrong = dict(named)
    wrong["0.weight"] = nn.Parameter(np.zeros((3, 3)))
    with pytest.raises(ValueError, match="recorded for an input of shape"):
        step.sgd_step(wrong, *batch(), lr=0.1)
