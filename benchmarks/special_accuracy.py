"""Accuracy of the digamma family's C helpers (easyad/_helpers.h) against mpmath at 40
digits, beside scipy's on the same points: every 20th of 3,000 positive and 3,000 negative
non-integer points in (-50, 50); prints the largest relative errors.

    python benchmarks/special_accuracy.py
"""
import mpmath
import numpy as np
import scipy.special as sp

from easyad import _core, _rules


def c(name, *args):
    """The row's value as the compiled core computes it."""
    return _core._rule_values(_rules.OPCODES[name], *args)


def worst(got, ref, mask=None):
    err = np.abs(got - ref) / np.abs(ref)
    return float(np.max(err if mask is None else err[mask]))


def main():
    rng = np.random.default_rng(0)
    x = np.concatenate([rng.uniform(0.01, 50, 3000), -rng.uniform(0.01, 50, 3000)])
    x = x[np.abs(x - np.round(x)) > 1e-3][::20]
    with mpmath.workdps(40):
        ref = np.array([float(mpmath.digamma(v)) for v in x])
        away = np.abs(ref) > 1e-3        # relative error is meaningless at the zeros
        print(f"digamma: easyad {worst(c('digamma', x), ref, away):.2e}, "
              f"scipy {worst(sp.psi(x), ref, away):.2e}")
        for n in (1, 3, 8):
            ref = np.array([float(mpmath.polygamma(n, v)) for v in x])
            print(f"polygamma({n}): easyad {worst(c('polygamma', float(n), x), ref):.2e}, "
                  f"scipy {worst(sp.polygamma(n, x), ref):.2e}")
        ref = np.array([float(mpmath.log(abs(mpmath.gamma(v)))) for v in x])
        away = np.abs(ref) > 1e-3
        print(f"gammaln: easyad {worst(c('gammaln', x), ref, away):.2e}, "
              f"scipy {worst(sp.gammaln(x), ref, away):.2e}")


if __name__ == "__main__":
    main()
