"""The layer sections of the GPU table (``bench_gpu.py``; issue 30's "conv2d and attention
on the GPU", issue 28's speed cases): easyad on an OpenCL device against PyTorch (CUDA on
a GPU), float32, every variant checked against PyTorch before it is timed.

- **conv2d** (issue 28's case): batch 64, 32 channels in and out, 28x28, 3x3, padding 1,
  bias. Forward (constant tensors), and forward + backward: the gradients of input,
  weight and bias of ``sum(conv2d(x, w, b) * g)``, left on the device (``d.tensor``).
  easyad eager on a fresh tape per call (inputs on the device, made once, used without a
  copy); easyad replayed (``ad.record`` of the loss by ``{w, b}``, x and g device Tensors
  given as arguments: weight and bias gradients); PyTorch eager (cuDNN) with leaves made
  once, in float32 and with TF32 (cuDNN's default for convolutions on this GPU: 10-bit
  mantissas in the products, so about 1e-3 relative error, where float32 gives 1e-6).
  Checked against float64 on the CPU (torch), so TF32's error is not held against either.
- **attention**: ``scaled_dot_product_attention`` of batch 32 x 8 heads, sequence 128,
  d 64, causal; forward + backward (q, k, v gradients of ``sum(out * g)``, left on the
  device). PyTorch's
  fused kernel (its fastest public path) and its math path (``softmax(q kᵀ) v`` written
  out, what easyad computes).
- **TensorFunction batch with products**: ``sum(tanh(tanh(x W1) W2))`` with x in R^64 and
  64x64 weights, value and gradient at B points given as a host array: easyad's batch on
  the device against the numpy device's batch and ``torch.func.vmap(grad_and_value)``.
"""
from __future__ import annotations

import numpy as np

import easyad as ad
from easyad import nn

TOLERANCE = 1e-4       # float32, relative to the largest magnitude
CONV = (64, 32, 28, 28, 3)          # batch, channels, height, width, kernel
CONV_SMALL = (8, 8, 14, 14, 3)      # on a CPU device (EASYAD_GPU_BENCH=any)
ATTENTION = (32, 8, 128, 64)        # batch, heads, sequence, d
ATTENTION_SMALL = (4, 2, 32, 16)
BATCH_POINTS = (2000, 64)           # points, features
BATCH_POINTS_SMALL = (200, 32)


def _finish(device):
    device.backend.queue.finish()


def _close(name, got, want):
    got, want = np.asarray(got, np.float64), np.asarray(want, np.float64)
    scale = max(float(np.abs(want).max()), 1e-30)
    error = float(np.abs(got - want).max()) / scale
    if not error <= TOLERANCE:
        raise SystemExit(f"{name}: differs from PyTorch by {error:.1e} (relative to the "
                         "largest value): not benchmarking")


def _torch_sync(torch, tdev):
    return torch.cuda.synchronize if tdev == "cuda" else (lambda: None)


def conv_variants(torch, tdev, device, gpu):
    """(title, variants, base name) of the conv2d section."""
    n, c, h, w_, k = CONV if gpu else CONV_SMALL
    rng = np.random.default_rng(4)
    x = rng.standard_normal((n, c, h, w_)).astype(np.float32)
    w = (rng.standard_normal((c, c, k, k)) / (3 * k)).astype(np.float32)
    b = rng.standard_normal(c).astype(np.float32)
    g = rng.standard_normal((n, c, h, w_)).astype(np.float32)
    be, name, F = device.backend, device.name, nn.functional
    xd, wd, bd, gd = (be.asarray(a, np.float32) for a in (x, w, b, g))
    cx, cw, cb = (ad.Tensor.constant(a, device=name, dtype=np.float32) for a in (xd, wd, bd))
    cg = ad.Tensor.constant(gd, device=name, dtype=np.float32)

    def forward():
        y = F.conv2d(cx, cw, cb, padding=1)
        _finish(device)
        return y

    def backward():
        lst = ad.WengertList()
        X, W, B = (ad.Tensor.variable(a, lst, device=name, dtype=np.float32)
                   for a in (xd, wd, bd))
        d = ad.sum(F.conv2d(X, W, B, padding=1) * cg).derivatives()
        grads = d.tensor(X), d.tensor(W), d.tensor(B)     # left on the device
        _finish(device)
        return grads

    def loss_of(params, xs, gs):
        return ad.sum(F.conv2d(xs, params["w"], params["b"], padding=1) * gs)
    recorded = ad.record(loss_of, {"w": w, "b": b}, cx, cg, device=name)

    def replayed():
        return recorded.value_and_gradient({"w": w, "b": b}, cx, cg)

    tx, tw, tb = (torch.tensor(a, device=tdev, requires_grad=True) for a in (x, w, b))
    tg = torch.tensor(g, device=tdev)
    sync = _torch_sync(torch, tdev)
    cudnn = torch.backends.cudnn

    def torch_forward(tf32):
        def call():
            cudnn.allow_tf32 = tf32
            with torch.no_grad():
                y = torch.nn.functional.conv2d(tx, tw, tb, padding=1)
            sync()
            return y
        return call

    def torch_backward(tf32):
        def call():
            cudnn.allow_tf32 = tf32
            for t in (tx, tw, tb):
                t.grad = None
            (torch.nn.functional.conv2d(tx, tw, tb, padding=1) * tg).sum().backward()
            sync()
            return tx.grad, tw.grad, tb.grad
        return call

    # the reference: float64 on the CPU
    rx, rw, rb = (torch.tensor(a, dtype=torch.float64, requires_grad=True) for a in (x, w, b))
    ry = torch.nn.functional.conv2d(rx, rw, rb, padding=1)
    (ry * torch.tensor(g, dtype=torch.float64)).sum().backward()
    _close("conv2d forward", forward().value, ry.detach().numpy())
    _close("PyTorch's float32 conv2d forward", torch_forward(False)().cpu().numpy(),
           ry.detach().numpy())
    for label, a, t in zip("xwb", backward(), (rx.grad, rw.grad, rb.grad)):
        _close(f"conv2d gradient of {label}", a.value, t.numpy())
    _, grads = replayed()
    _close("conv2d replayed gradient of w", grads["w"], rw.grad.numpy())
    title = f"conv2d {k}x{k}, padding 1, batch {n}, {c} channels in and out, {h}x{w_}"
    return title, {"easyad eager, forward": forward,
                   "PyTorch, forward": torch_forward(False),
                   "PyTorch TF32 (its default), forward": torch_forward(True),
                   "easyad eager, forward + backward": backward,
                   "easyad replayed, value + w, b gradients": replayed,
                   "PyTorch, forward + backward": torch_backward(False),
                   "PyTorch TF32 (its default), forward + backward": torch_backward(True)}


def attention_variants(torch, tdev, device, gpu):
    """(title, variants) of the attention section."""
    batch, heads, length, d = ATTENTION if gpu else ATTENTION_SMALL
    rng = np.random.default_rng(5)
    shape = (batch, heads, length, d)
    arrays = [rng.standard_normal(shape).astype(np.float32) for _ in range(4)]
    be, name = device.backend, device.name
    qd, kd, vd, gd = (be.asarray(a, np.float32) for a in arrays)
    cg = ad.Tensor.constant(gd, device=name, dtype=np.float32)

    def ours():
        lst = ad.WengertList()
        q, k, v = (ad.Tensor.variable(a, lst, device=name, dtype=np.float32)
                   for a in (qd, kd, vd))
        out = nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)
        d = ad.sum(out * cg).derivatives()
        grads = d.tensor(q), d.tensor(k), d.tensor(v)     # left on the device
        _finish(device)
        return grads

    tq, tk, tv = (torch.tensor(a, device=tdev, requires_grad=True) for a in arrays[:3])
    tg = torch.tensor(arrays[3], device=tdev)
    sync = _torch_sync(torch, tdev)
    mask = torch.ones(length, length, dtype=torch.bool, device=tdev).tril()

    def theirs(fused):
        def call():
            for t in (tq, tk, tv):
                t.grad = None
            if fused:
                out = torch.nn.functional.scaled_dot_product_attention(tq, tk, tv,
                                                                       is_causal=True)
            else:
                s = (tq @ tk.transpose(-1, -2)) / d ** 0.5
                out = torch.softmax(s.masked_fill(~mask, float("-inf")), -1) @ tv
            (out * tg).sum().backward()
            sync()
            return tq.grad, tk.grad, tv.grad
        return call

    want = theirs(True)()
    for label, a, t in zip("qkv", ours(), want):
        _close(f"attention gradient of {label}", a.value, t.cpu().numpy())
    title = (f"scaled_dot_product_attention, causal, batch {batch} x {heads} heads, sequence "
             f"{length}, d {d}: forward + backward")
    return title, {"easyad eager": ours, "PyTorch, fused kernel": theirs(True),
                   "PyTorch, math path": theirs(False)}


def _mlp_of_point(x, w1, w2, m):
    return m.sum(m.tanh(m.tanh(x @ w1) @ w2))


def batch_variants(torch, tdev, device, gpu):
    """(title, variants) of the TensorFunction batch with products; the title says
    whether the device ran it as one batched program."""
    points, n = BATCH_POINTS if gpu else BATCH_POINTS_SMALL
    rng = np.random.default_rng(6)
    w1, w2 = (rng.standard_normal((n, n)) / n ** 0.5 for _ in range(2))
    X = rng.standard_normal((points, n))

    def f(x):
        return _mlp_of_point(x, w1, w2, ad)
    on_device = ad.record(f, X[0], tensor=True, device=device.name)
    on_host = ad.record(f, X[0], tensor=True)
    tw1, tw2 = (torch.tensor(a, device=tdev) for a in (w1, w2))
    vg = torch.func.vmap(torch.func.grad_and_value(lambda x: _mlp_of_point(x, tw1, tw2,
                                                                           torch)))

    def torch_batch():
        g, v = vg(torch.tensor(X, device=tdev))
        return v.cpu().numpy(), g.cpu().numpy()

    v_ref, g_ref = on_host.value_and_gradient(X)
    for label, (v, g) in (("device", on_device.value_and_gradient(X)),
                          ("torch", torch_batch())):
        np.testing.assert_allclose(v, v_ref, rtol=1e-10, err_msg=label)
        np.testing.assert_allclose(g, g_ref, rtol=1e-10, atol=1e-12, err_msg=label)
    from easyad.compiler.program import batch_cl
    how = "one batched program" if batch_cl.batched(on_device._bound["gradient"]) \
        else "a replay per point"
    title = (f"TensorFunction value and gradient at {points:,} points: "
             f"sum(tanh(tanh(x W1) W2)), x in R^{n}, float64, host arrays in and out")
    return title, {f"easyad on {device.name} ({how})": lambda: on_device.value_and_gradient(X),
                   "easyad, numpy device": lambda: on_host.value_and_gradient(X),
                   "torch.func.vmap(grad_and_value)": torch_batch}
