"""Random scalar programs written once and run on several number systems: easyad's
generic functions (floats, Traces, Records), sympy (exact derivatives and structure) and
mpmath (high-precision values for derivative references).

A program is a sum of terms; each term is a short random expression of a few inputs
(``group``), so its Hessian has a known block structure: entries can be non-zero only
between inputs of one term. Operations are smooth on the whole real line (denominators
and the arguments of log and sqrt kept positive), so every reference is defined
everywhere.
"""
from __future__ import annotations

import math

import numpy as np

UNARY = ["sin", "cos", "tanh", "exp_half", "log1sq", "sqrt1sq", "square", "cube"]
BINARY = ["add", "sub", "mul", "ratio", "scale", "shift"]


class Library:
    """The elementary functions of one number system."""

    def __init__(self, sin, cos, tanh, exp, log, sqrt):
        self.sin, self.cos, self.tanh = sin, cos, tanh
        self.exp, self.log, self.sqrt = exp, log, sqrt


def easyad_library():
    import easyad as ad
    return Library(ad.sin, ad.cos, ad.tanh, ad.exp, ad.log, ad.sqrt)


def sympy_library():
    import sympy
    return Library(sympy.sin, sympy.cos, sympy.tanh, sympy.exp, sympy.log, sympy.sqrt)


def mpmath_library():
    import mpmath
    return Library(mpmath.sin, mpmath.cos, mpmath.tanh, mpmath.exp, mpmath.log, mpmath.sqrt)


def _unary(lib, name, u):
    if name == "exp_half":
        return lib.exp(u * 0.5)
    if name == "log1sq":
        return lib.log(1.0 + u * u)
    if name == "sqrt1sq":
        return lib.sqrt(1.0 + u * u)
    if name == "square":
        return u * u
    if name == "cube":
        return u ** 3
    return getattr(lib, name)(u)


def _binary(name, u, v, c):
    if name == "add":
        return u + v
    if name == "sub":
        return u - v
    if name == "mul":
        return u * v
    if name == "ratio":
        return u / (2.0 + v * v)
    if name == "scale":
        return c * u
    return u + c


class Program:
    """``terms`` random terms over ``n`` inputs, each reading ``width`` of them (seeded)."""

    def __init__(self, seed: int, n: int = 6, terms: int = 4, width: int = 2, steps: int = 5):
        rng = np.random.default_rng(seed)
        self.n = n
        self.groups = [tuple(sorted(rng.choice(n, size=width, replace=False).tolist()))
                       for _ in range(terms)]
        self.plans = []
        for _ in self.groups:
            plan = []
            for _ in range(steps):
                if rng.random() < 0.5:
                    plan.append(("u", str(rng.choice(UNARY)), int(rng.integers(1 << 20)), 0, 0.0))
                else:
                    plan.append(("b", str(rng.choice(BINARY)), int(rng.integers(1 << 20)),
                                 int(rng.integers(1 << 20)), round(float(rng.uniform(-2, 2)), 3)))
            self.plans.append(plan)

    def __call__(self, x, lib=None):
        lib = lib or easyad_library()
        total = 0.0
        for group, plan in zip(self.groups, self.plans):
            nodes = [x[i] for i in group]
            for kind, name, a, b, c in plan:
                u = nodes[a % len(nodes)]
                if kind == "u":
                    nodes.append(_unary(lib, name, u))
                else:
                    nodes.append(_binary(name, u, nodes[b % len(nodes)], c))
            term = nodes[len(group):]
            total = total + (term[-1] + 0.25 * term[0] if term else nodes[0])
        return total

    def coupled(self) -> set[tuple[int, int]]:
        """Every (p, q) that share a term: the only places a Hessian entry can be non-zero."""
        return {(p, q) for group in self.groups for p in group for q in group}

    def sympy_hessian(self):
        """(symbols, exact Hessian as a sympy Matrix)."""
        import sympy
        xs = sympy.symbols(f"x0:{self.n}", real=True)
        f = self(list(xs), sympy_library())
        return xs, sympy.hessian(f, xs)

    def mp_derivatives(self, x, dps: int = 40):
        """Value, gradient and Hessian at x by mpmath's numerical differentiation at dps
        digits: accurate far beyond double precision."""
        import mpmath
        lib = mpmath_library()
        with mpmath.workdps(dps):
            point = [mpmath.mpf(float(v)) for v in x]

            def f(*args):
                return self(list(args), lib)
            value = float(f(*point))
            n = self.n
            gradient = np.array([float(mpmath.diff(f, point, tuple(int(i == k) for i in range(n))))
                                 for k in range(n)])
            hessian = np.zeros((n, n))
            for p in range(n):
                for q in range(p, n):
                    order = [0] * n
                    order[p] += 1
                    order[q] += 1
                    hessian[p, q] = hessian[q, p] = float(mpmath.diff(f, point, tuple(order)))
        return value, gradient, hessian


def math_value(program: Program, x) -> float:
    """The program on plain floats with the math module (no easyad function involved)."""
    return float(program(list(map(float, x)), Library(math.sin, math.cos, math.tanh, math.exp,
                                                      math.log, math.sqrt)))
