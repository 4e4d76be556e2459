"""Shared fixtures: a seeded generator, the three Numeric kinds generic tests run on, and
the tensor devices (numpy always; the first OpenCL device, or a skip saying how to get one)."""
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


_OPENCL = [d.name for d in ad.devices() if d.kind == "opencl"][:1]
DEVICES = ["numpy"] + (_OPENCL or [pytest.param("opencl", marks=pytest.mark.skip(
    reason="no OpenCL device (install the 'opencl' extra: pyopencl + pocl)"))])


@pytest.fixture(params=DEVICES)
def device(request):
    """A tensor device: every tensor test body runs on each backend."""
    return request.param
