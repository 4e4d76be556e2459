"""Shared fixtures: a seeded generator, the three Numeric kinds generic tests run on, and
the tensor devices: numpy always, and every OpenCL device that passes the probe (both PoCLs
where both work, a GPU where there is one). With no working OpenCL device the OpenCL tests
are skipped with the reason, except where EASYAD_REQUIRE_OPENCL=1 (CI, set by .ci/run):
there the run stops with the device report instead."""
import os

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


OPENCL = [d.name for d in ad.devices() if d.kind == "opencl"]
_NO_OPENCL = pytest.mark.skip(reason="no working OpenCL device: " + " | ".join(
    ad.device_report().splitlines()[1:]))


def pytest_sessionstart(session):
    if os.environ.get("EASYAD_REQUIRE_OPENCL") == "1" and not OPENCL:
        raise pytest.UsageError("EASYAD_REQUIRE_OPENCL=1 but no OpenCL device works here; "
                                "the OpenCL tests would be skipped:\n" + ad.device_report())


DEVICES = ["numpy"] + (OPENCL or [pytest.param("opencl", marks=_NO_OPENCL)])


@pytest.fixture(params=DEVICES)
def device(request):
    """A tensor device: every tensor test body runs on each backend."""
    return request.param


@pytest.fixture(params=OPENCL or [pytest.param("opencl", marks=_NO_OPENCL)])
def opencl_device(request):
    """Each working OpenCL device (for tests of OpenCL-only features)."""
    return request.param


@pytest.fixture(scope="module")
def module_cache(tmp_path_factory):
    """A compile cache of the test module's own ($EASYAD_CACHE_DIR), for modules that
    compile programs: shared by their tests, cold for the module."""
    folder = tmp_path_factory.mktemp("easyad-cache")
    old = os.environ.get("EASYAD_CACHE_DIR")
    os.environ["EASYAD_CACHE_DIR"] = str(folder)
    yield folder
    if old is None:
        os.environ.pop("EASYAD_CACHE_DIR", None)
    else:
        os.environ["EASYAD_CACHE_DIR"] = old
