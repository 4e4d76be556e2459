"""The host side of a replayed tensor program on OpenCL (easyad/compiler/program/fused_cl.py,
easyad/_recorded.py): device Tensors as x and as arguments used as they are, launches
prepared once, reductions to one number finished by one generated kernel (into a buffer
kept between calls where only kernels read it), and the same results as host inputs, as
the numpy device and as PyTorch, on every OpenCL device, float32 and float64."""
from __future__ import annotations

import numpy as np
import pytest

import easyad as ad
from easyad import nn
from easyad.compiler.program import fused_cl

RNG = np.random.default_rng(5)
TOL = {np.float32: 2e-5, np.float64: 1e-12}


def _close(a, b, dtype):
    np.testing.assert_allclose(np.asarray(a, dtype=np.float64),
                               np.asarray(b, dtype=np.float64), rtol=TOL[dtype],
                               atol=TOL[dtype])


def _sets(monkeypatch):
    """The uploads pyopencl makes (Array.set) while installed."""
    import pyopencl.array as cla
    moved = []
    real = cla.Array.set

    def set_(self, *args, **kw):
        moved.append(self.shape)
        return real(self, *args, **kw)
    monkeypatch.setattr(cla.Array, "set", set_)
    return moved


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("n", [1, 7, 257, 5003])    # one, prime, more partials than a group
def test_reductions_to_one_number_finish_in_one_kernel(opencl_device, dtype, n):
    def f(x, w):
        return ad.sum(ad.tanh(x) * w) + ad.amax(x * w) * 0.5 - ad.amin(x) * 0.25
    x0 = np.zeros(n, dtype=dtype)
    F = ad.record(f, x0, x0, device=opencl_device, tensor=True)
    G = ad.record(f, x0, x0, tensor=True)
    for _ in range(2):      # the kept totals are written again by the next call
        x, w = (RNG.normal(size=n).astype(dtype) for _ in range(2))
        value, g = F.value_and_gradient(x, w)
        ref, ref_g = G.value_and_gradient(x, w)
        _close(value, ref, dtype)
        _close(g, ref_g, dtype)
        _close(F(x, w), ref, dtype)
    bound = F._bound["gradient"]
    assert "easyad_finish_sum" in bound.source and "easyad_finish_max" in bound.source
    # every total finished by its own launch: no backend step (reduce, cast) in between
    assert all(isinstance(step, fused_cl.Launch) for step in bound.steps)
    finishes = [f for launch in bound.steps for f in launch.finish]
    assert len(finishes) >= 3
    assert any(f[5] is not None for f in finishes)      # a total only kernels read: kept


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_a_sum_of_nothing_finishes_as_zero(opencl_device, dtype):
    """No elements: the group kernel is not launched, its partials are not read."""
    F = ad.record(lambda x: ad.sum(ad.tanh(x) * x) + 1.5, np.zeros(0, dtype=dtype),
                  device=opencl_device, tensor=True)
    for _ in range(2):
        value, g = F.value_and_gradient(np.zeros(0, dtype=dtype))
        assert value == 1.5 and g.shape == (0,) and F(np.zeros(0, dtype=dtype)) == 1.5


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_an_output_total_is_a_new_buffer_each_call(opencl_device, dtype):
    """A total that is an output is returned: never a buffer the next call writes."""
    F = ad.record(lambda x: ad.sum(x * x), np.zeros(300, dtype=dtype),
                  device=opencl_device, tensor=True)
    F.value_and_gradient(np.ones(300, dtype=dtype))
    be, bound = F._backend, F._bound["gradient"]
    x1, x2 = (RNG.normal(size=300).astype(dtype) for _ in range(2))
    first = bound.run([be.asarray(x1, dtype), be.asarray(np.zeros(()), np.float64)])
    bound.run([be.asarray(x2, dtype), be.asarray(np.zeros(()), np.float64)])
    _close(be.to_numpy(first[0]), np.sum(x1.astype(np.float64) ** 2), dtype)
    _close(be.to_numpy(first[1]), 2 * x1, dtype)


def test_a_float64_program_finishes_a_float32_total_as_float32(opencl_device):
    def f(x, w):       # w float64: the kernels' real_t is double, the sum's dtype float32
        return ad.sum(x * x) + ad.sum(w)
    x, w = np.zeros(129, np.float32), np.zeros(3)
    F = ad.record(f, x, w, device=opencl_device, tensor=True)
    x, w = RNG.normal(size=129).astype(np.float32), RNG.normal(size=3)
    value, g = F.value_and_gradient(x, w)
    source = F._bound["gradient"].source
    assert "typedef double real_t" in source and "easyad_finish_sum_float" in source
    _close(value, ad.record(f, x, w, tensor=True)(x, w), np.float32)
    assert g.dtype == np.float32
    _close(g, 2 * x, np.float32)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_device_inputs_give_what_host_inputs_give(opencl_device, dtype, monkeypatch):
    """x and every float argument as Tensors on the program's device: no upload, the same
    value, gradient and HVP as the same values from the host; a Tensor of another dtype
    or shape is refused naming what to pass, and nothing changes."""
    def f(x, a, b):
        return ad.sum(ad.sin(x) * a) + ad.sum((x * b) ** 2)
    x, a, b = (RNG.normal(size=s).astype(dtype) for s in (11, 11, (1,)))
    F = ad.record(f, x, a, b, device=opencl_device, tensor=True)
    on = [ad.Tensor.constant(v, device=opencl_device, dtype=dtype) for v in (x, a, b)]
    want = F.value_and_gradient(x, a, b), F(x, a, b), F.hvp(x, a, a, b)
    moved = _sets(monkeypatch)
    got = F.value_and_gradient(*on), F(*on), F.hvp(on[0], a, on[1], on[2])
    monkeypatch.undo()
    assert moved == [(11,)]          # only hvp's v, a host array
    assert got[0][0] == want[0][0] and got[1] == want[1]
    np.testing.assert_array_equal(got[0][1], want[0][1])
    np.testing.assert_array_equal(got[2], want[2])
    other = np.float64 if dtype == np.float32 else np.float32
    wrong = ad.Tensor.constant(a, device=opencl_device, dtype=other)
    with pytest.raises(ValueError, match=f"dtype={np.dtype(dtype).name}"):
        F(on[0], wrong, on[2])
    with pytest.raises(ValueError, match=r"shape \(11,\)"):
        F(on[0], ad.Tensor.constant(a[:4], device=opencl_device, dtype=dtype), on[2])
    assert F(*on) == want[1]


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_replayed_mlp_steps_on_device_inputs_match_numpy_and_torch(opencl_device, dtype):
    """The benchmark's replayed MLP step (bench_gpu._mlp_variants) with the batch on the
    device: losses and updated weights as the numpy device's replay and as PyTorch's SGD
    from the same weights, three steps."""
    torch = pytest.importorskip("torch")
    H, B, lr = 13, 7, 0.1
    ad.random.seed(3)
    model = nn.Sequential(nn.Linear(29, H, dtype=dtype), nn.Tanh(),
                          nn.Linear(H, 10, dtype=dtype)).to(opencl_device)
    init = {k: v.copy() for k, v in model.state_dict().items()}
    named = dict(model.named_parameters())
    x = RNG.normal(size=(B, 29)).astype(dtype)
    y = RNG.integers(0, 10, B)
    onehot = np.eye(10, dtype=dtype)[y]

    def loss_of(params, xs, ys):
        return nn.functional.cross_entropy(nn.functional_call(model, params, xs), ys)
    F = ad.record(loss_of, {k: p.data.copy() for k, p in named.items()}, x, onehot,
                  device=opencl_device)
    G = ad.record(loss_of, {k: p.data.copy() for k, p in named.items()}, x, onehot)
    host = {k: v.copy() for k, v in init.items()}
    tmodel = torch.nn.Sequential(torch.nn.Linear(29, H), torch.nn.Tanh(),
                                 torch.nn.Linear(H, 10)).to(torch.float64)
    tmodel.load_state_dict({k: torch.tensor(v, dtype=torch.float64) for k, v in init.items()})
    topt = torch.optim.SGD(tmodel.parameters(), lr=lr)
    xt = ad.Tensor.constant(x, device=opencl_device, dtype=dtype)
    ot = ad.Tensor.constant(onehot, device=opencl_device, dtype=dtype)
    for _ in range(3):
        loss = F.sgd_step(named, xt, ot, lr=lr)
        ref = G.sgd_step(host, x, onehot, lr=lr)
        topt.zero_grad()
        tloss = torch.nn.functional.cross_entropy(tmodel(torch.tensor(x, dtype=torch.float64)),
                                                  torch.tensor(y))
        tloss.backward()
        topt.step()
        _close(loss, ref, dtype)
        _close(loss, tloss.item(), dtype)
    for k, p in named.items():
        _close(p.data, host[k], dtype)
        np.testing.assert_allclose(p.data, tmodel.state_dict()[k].numpy(), rtol=1e-4,
                                   atol=1e-5, err_msg=k)
    assert isinstance(F._bound["sgd_step"], fused_cl.FusedCLProgram)


@pytest.mark.parametrize("device", ["numpy", "opencl"])
def test_a_lazy_sgd_step_returns_the_loss_unread(device, opencl_device):
    """``lazy=True``: the same steps, the losses as 0-d Tensors on the device, read when
    used; a non-bool lazy is refused before anything changes."""
    device = opencl_device if device == "opencl" else device
    f = lambda w, x: ad.sum(ad.tanh(w * x) ** 2)      # noqa: E731
    w0, x = RNG.normal(size=9), RNG.normal(size=9)
    F = ad.record(f, w0, x, device=device, tensor=True)
    G = ad.record(f, w0, x, device=device, tensor=True)
    a, b = w0.copy(), w0.copy()
    losses = [F.sgd_step(a, x, lr=0.3, lazy=True) for _ in range(4)]
    want = [G.sgd_step(b, x, lr=0.3) for _ in range(4)]
    assert all(isinstance(t, ad.Tensor) and t.shape == () for t in losses)
    assert [float(t) for t in losses] == want
    np.testing.assert_array_equal(a, b)
    with pytest.raises(TypeError, match="lazy is True or False"):
        F.sgd_step(a, x, lr=0.3, lazy=1)
    np.testing.assert_array_equal(a, b)


@pytest.mark.parametrize("fast_view", [True, False])
def test_linear_steps_with_and_without_the_fast_views(opencl_device, fast_view, monkeypatch):
    """The replay's linear and linear_vjp steps (views made by pyopencl's fast constructor,
    or by reshape where it has none), with and without a bias: the numpy device's
    value and gradient."""
    monkeypatch.setattr(fused_cl, "_FAST_VIEW", fast_view)
    ad.random.seed(4)
    model = nn.Sequential(nn.Linear(5, 7, bias=False), nn.Tanh(), nn.Linear(7, 3))
    params = {k: v.copy() for k, v in model.state_dict().items()}

    def f(p, x):
        return ad.sum(nn.functional_call(model, p, x) ** 2)
    x = RNG.normal(size=(4, 5))
    F = ad.record(f, params, x, device=opencl_device)
    G = ad.record(f, params, x)
    for _ in range(2):
        x = RNG.normal(size=(4, 5))
        (value, g), (ref, ref_g) = F.value_and_gradient(params, x), G.value_and_gradient(
            params, x)
        _close(value, ref, np.float64)
        for k in params:
            _close(g[k], ref_g[k], np.float64)
    names = [getattr(step.run, "__name__", "") for step in F._bound["gradient"].steps
             if isinstance(step, fused_cl.HostStep)]
    assert "run_linear" in names and "run_linear_vjp" in names


def test_a_total_a_backend_step_reads_is_not_kept_between_calls(opencl_device):
    """A reduction a backend step reads (here a host primitive) is a new buffer each
    call: the step sees each call's own total."""
    cube = ad.primitive(vjp=lambda g, x, out: 3 * x * x * g, differentiable=True)(
        lambda x: x ** 3)

    def f(x):
        return ad.sum(cube(ad.sum(x * x, keepdims=True))) + ad.sum(x)
    F = ad.record(f, np.ones(40), device=opencl_device, tensor=True)
    for _ in range(3):
        x = RNG.normal(size=40)
        s = np.sum(x * x)
        value, g = F.value_and_gradient(x)
        _close(value, s ** 3 + np.sum(x), np.float64)
        _close(g, 3 * s * s * 2 * x + 1, np.float64)
    bound = F._bound["gradient"]
    # f[5]: the buffer kept between calls; None: a new one each call
    assert any(f[5] is None for launch in bound.steps
               if isinstance(launch, fused_cl.Launch) for f in launch.finish)
