"""Shared fixtures: a seeded generator and the three Numeric kinds generic tests run on."""
import numpy as np
import pytest

import easyad as ad


@pytest.fixture
def rng():
    return np.random.default_rng(20261121)


class Kind:
    """How one Numeric kind makes an input and reads value and derivative back."""

    name = "float"

    def run(self, f, *xs, wrt=0):
        """Value of f(*xs) and d f / d xs[wrt] (None for plain floats)."""
        return f(*xs), None


class FloatKind(Kind):
    name = "float"


class TraceKind(Kind):
    name = "Trace"

    def run(self, f, *xs, wrt=0):
        args = [ad.Trace.variable(x) if i == wrt else ad.Trace.constant(x)
                for i, x in enumerate(xs)]
        z = f(*args)
        return z.number, z.derivative


class RecordKind(Kind):
    name = "Record"

    def run(self, f, *xs, wrt=0):
        lst = ad.WengertList()
        args = [lst.variable(x) for x in xs]
        z = f(*args)
        return z.number, z.derivatives()[args[wrt]]


KINDS = {"float": FloatKind(), "Trace": TraceKind(), "Record": RecordKind()}


@pytest.fixture(params=["float", "Trace", "Record"])
def kind(request):
    return KINDS[request.param]


@pytest.fixture(params=["Trace", "Record"])
def mode(request):
    """An AD mode (forward or reverse), as a Kind."""
    return KINDS[request.param]
