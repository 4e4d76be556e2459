"""A short tour of easyad: ``python -m easyad``.

1. One generic function, ``cartesian(r, angle)``, run on floats, Traces and Records.
2. Forward vs reverse mode: the cost of a full gradient as the number of inputs grows.
3. Record once, replay many: a recorded tape evaluated at a batch of new points in C.
4. Taylor mode: many derivatives of a scalar function in one pass.
5. Tensors and devices: the devices found (and why any is unusable), one tensor gradient on
   the default device.

``python -m easyad devices`` prints only the device report (``--require-opencl``: exit
status 1 when no OpenCL device works, for set-up scripts).
"""
from __future__ import annotations

import math
import sys
import time

import easyad as ad


def cartesian(r, angle):
    """Polar to Cartesian coordinates, written once for every Numeric kind."""
    x = r * ad.cos(angle)
    y = r * ad.sin(angle)
    return x, y


def tour_cartesian(r: float = 1.0, angle: float = 2.0) -> None:
    print("1. One function, three kinds of number: cartesian(r, angle) = (r cos a, r sin a)")
    print(f"   at r = {r}, a = {angle}\n")

    x, y = cartesian(r, angle)
    print(f"   floats:  x = {x:.6f}, y = {y:.6f}")

    # Forward mode: one pass per input, seeding that input's derivative with 1.
    x_r, y_r = cartesian(ad.Trace.variable(r), ad.Trace.constant(angle))
    x_a, y_a = cartesian(ad.Trace.constant(r), ad.Trace.variable(angle))
    forward = {"dx/dr": x_r.derivative, "dy/dr": y_r.derivative,
               "dx/da": x_a.derivative, "dy/da": y_a.derivative}

    # Reverse mode: record once, one backward sweep per output.
    lst = ad.WengertList()
    r_rec, a_rec = lst.variable(r, name="r"), lst.variable(angle, name="a")
    x_rec, y_rec = cartesian(r_rec, a_rec)
    dx, dy = x_rec.derivatives(), y_rec.derivatives()
    reverse = {"dx/dr": dx[r_rec], "dy/dr": dy[r_rec], "dx/da": dx[a_rec], "dy/da": dy[a_rec]}

    exact = {"dx/dr": math.cos(angle), "dy/dr": math.sin(angle),
             "dx/da": -r * math.sin(angle), "dy/da": r * math.cos(angle)}
    print(f"   {'':6} {'forward (Trace)':>16} {'reverse (Record)':>17} {'by hand':>12}")
    for key in forward:
        print(f"   {key:6} {forward[key]:16.6f} {reverse[key]:17.6f} {exact[key]:12.6f}")
    print(f"\n   The tape holds {len(lst)} entries in {lst.nbytes} bytes of C memory "
          f"(room for 64); derivatives by name: {dx.as_dict()}\n")


def chain(xs):
    """A generic function of n inputs: sum of sin(x_i) * x_(i+1) + exp(x_i / n)."""
    n = len(xs)
    total = 0.0
    for i in range(n):
        total = total + ad.sin(xs[i]) * xs[(i + 1) % n] + ad.exp(xs[i] / n)
    return total


def forward_gradient(xs):
    grad = []
    for k in range(len(xs)):  # one forward pass per input
        seeded = [ad.Trace.variable(v) if i == k else ad.Trace.constant(v)
                  for i, v in enumerate(xs)]
        grad.append(chain(seeded).derivative)
    return grad


def reverse_gradient(xs):
    lst = ad.WengertList()
    records = [lst.variable(v) for v in xs]
    d = chain(records).derivatives()  # one backward sweep for all inputs
    return [d[r] for r in records]


def best_time(fn, arg, budget: float = 0.05) -> float:
    best = math.inf
    deadline = time.perf_counter() + budget
    while True:
        start = time.perf_counter()
        fn(arg)
        best = min(best, time.perf_counter() - start)
        if time.perf_counter() > deadline:
            return best


def tour_forward_vs_reverse() -> None:
    print("2. Forward vs reverse mode: time for the whole gradient of chain(x_1..x_n)")
    print(f"   {'n':>5} {'forward (n passes)':>20} {'reverse (1 sweep)':>19} "
          f"{'forward/reverse':>16}")
    for n in (1, 4, 16, 64, 256):
        xs = [0.1 * (i + 1) for i in range(n)]
        fwd, rev = forward_gradient(xs), reverse_gradient(xs)
        assert all(abs(f - r) <= 1e-9 * (1 + abs(f)) for f, r in zip(fwd, rev))
        tf, tr = best_time(forward_gradient, xs), best_time(reverse_gradient, xs)
        print(f"   {n:5d} {tf * 1e6:17.1f} us {tr * 1e6:16.1f} us {tf / tr:15.1f}x")
    print("   Forward mode costs one pass per input; reverse mode one sweep per output.\n")


def rosenbrock(x):
    """The extended Rosenbrock function, written once (generic)."""
    total = 0.0
    for i in range(len(x) - 1):
        total = total + 100.0 * (x[i + 1] - x[i] ** 2) ** 2 + (1.0 - x[i]) ** 2
    return total


def tour_replay(n: int = 100, rows: int = 10_000) -> None:
    import numpy as np

    print(f"3. Record once, replay many: gradients of Rosenbrock (n = {n}) at {rows} points")
    X = np.random.default_rng(0).uniform(0.0, 2.0, (rows, n))
    start = time.perf_counter()
    F = ad.record(rosenbrock, X[0])
    recorded = time.perf_counter() - start
    start = time.perf_counter()
    G = F.gradient(X)                      # every row: C sweeps on all cores, no Python
    replayed = time.perf_counter() - start
    start = time.perf_counter()
    again = [ad.grad(rosenbrock)(x) for x in X[:200]]    # recording anew at each point
    per_point = (time.perf_counter() - start) / 200
    assert all(np.allclose(g, G[k]) for k, g in enumerate(again))
    print(f"   record once: {recorded * 1e3:.1f} ms ({len(F)} entries); replay all "
          f"{rows} gradients: {replayed * 1e3:.1f} ms ({replayed / rows * 1e6:.1f} us a point)")
    print(f"   recording anew at each point: {per_point * 1e6:.0f} us a point, "
          f"{per_point * rows / replayed:.0f}x slower; F.hessian, F.hvp, F.jacobian likewise\n")


def tour_taylor(x0: float = 0.5, order: int = 6) -> None:
    print(f"4. Taylor mode: d^k/dx^k of exp(sin x) at x = {x0}, k = 0..{order}, in one pass")
    derivatives = ad.taylor(lambda x: ad.exp(ad.sin(x)), x0, order)
    # by hand for k = 1, 2: (e^sin)' = cos e^sin, (e^sin)'' = (cos^2 - sin) e^sin
    e = math.exp(math.sin(x0))
    hand = [e, math.cos(x0) * e, (math.cos(x0) ** 2 - math.sin(x0)) * e]
    print("   " + "  ".join(f"{d:.6f}" for d in derivatives))
    print("   by hand (k <= 2): " + "  ".join(f"{h:.6f}" for h in hand) + "\n")


def tour_tensors() -> None:
    import numpy as np

    print("5. Tensors: arrays on a device, on the same tape as scalars")
    print("   devices found (python -m easyad devices):")
    for line in ad.device_report().splitlines():
        print(f"     {line}")
    working = [d for d in ad.devices() if d.kind == "opencl"]
    device = ad.set_device("opencl") if working else ad.get_device()
    W = np.random.default_rng(1).normal(size=(3, 4))
    lst = ad.WengertList()
    x = ad.Tensor.variable(np.linspace(-1.0, 1.0, 4), lst, name="x", device=device)
    loss = ad.sum(ad.tanh(ad.Tensor.constant(W, device=device) @ x) ** 2)
    grad = loss.derivatives()[x]
    h = np.tanh(W @ x.value)
    by_hand = W.T @ (2.0 * h * (1.0 - h * h))
    print(f"   on {device.name}: d/dx sum(tanh(W x)^2) = {np.array2string(grad, precision=6)}")
    pad = " " * (len(device.name) + 13)
    print(f"   by hand (numpy):{pad}{np.array2string(by_hand, precision=6)}"
          f"  (max difference {np.max(np.abs(grad - by_hand)):.1e})\n")
    ad.set_device("numpy")


def devices_command(args: list[str]) -> int:
    print(ad.device_report())
    if "--require-opencl" in args and not any(d.kind == "opencl" for d in ad.devices()):
        print("no OpenCL device works here (see the fix above)", file=sys.stderr)
        return 1
    return 0


def main() -> None:
    if sys.argv[1:2] == ["devices"]:
        sys.exit(devices_command(sys.argv[2:]))
    print(f"easyad {ad.__version__}: exact derivatives of ordinary numeric Python\n")
    tour_cartesian()
    tour_forward_vs_reverse()
    tour_replay()
    tour_taylor()
    tour_tensors()
    print("Neural networks: ad.nn modules and losses, ad.optim optimizers; examples/"
          "regression.py and examples/classifier.py train MLPs and plot them (make examples).")
    print("More: README.md (usage), make docs (the documentation site), "
          "benchmarks/ (make bench), tests/ (make test).")


if __name__ == "__main__":
    main()
