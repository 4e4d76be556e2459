"""Conformance: every row of the rule table through every engine (issue 25 item 4).

The machinery is in ``tests/_conformance.py`` (sample points, engines, checkers); this
file runs it over ``_rules.RULES`` (never a hand list), and over the reductions and
selections several engines implement (sum, amax/amin, maximum/minimum, where), and shows
that the checker catches the fused max bug when it is put back on purpose.

Cost: each tensor engine runs one program of every rule per device and dtype (PoCL and gcc
build once). The longer sweep (more points, seeds, shapes): benchmarks/stress_conformance.py.
"""
from __future__ import annotations

import warnings

import numpy as np
import pytest

import easyad as ad
from easyad import _rules

from _conformance import (Result, check_derivatives, check_scalar, check_tensor,
                          disagreements, eager_tensors, recorded_tensors, replay_engine,
                          samples, scalar_engine, trace_tensors)

RULES = _rules.RULES
IDS = [r.name for r in RULES]
TABLE = {r.name: samples(r) for r in RULES}


def _compiler_works() -> bool:
    F = ad.record(lambda v: v[0] * 2.0, np.array([1.0]))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ad.CompilerWarning)
        return F.compile().compiled


@pytest.fixture(scope="module")
def scalar_results(module_cache):
    """Per rule: Trace, Record, the replay VM and (with a compiler) its compiled C."""
    engines = {"Trace": scalar_engine("trace"), "Record": scalar_engine("record"),
               "VM": replay_engine(False)}
    if _compiler_works():
        engines["compiled"] = replay_engine(True)
    return {r.name: {name: run(r, TABLE[r.name]) for name, run in engines.items()}
            for r in RULES}


@pytest.fixture(scope="module")
def numpy_results(module_cache):
    """Per dtype, per rule, per engine on the numpy device (the fused C compiled once per
    dtype for every rule)."""
    out = {}
    for dtype in (np.float64, np.float32):
        engines = {"eager": eager_tensors(TABLE, "numpy", dtype),
                   "eager strided": eager_tensors(TABLE, "numpy", dtype, "strided"),
                   "eager big-endian": eager_tensors(TABLE, "numpy", dtype, "big-endian"),
                   "TraceTensor": trace_tensors(TABLE, "numpy", dtype),
                   "fused C": recorded_tensors(TABLE, "numpy", dtype, True),
                   "fused C big-endian": recorded_tensors(TABLE, "numpy", dtype, True,
                                                          "big-endian"),
                   "unfused replay": recorded_tensors(TABLE, "numpy", dtype, False,
                                                      "strided")}
        out[np.dtype(dtype)] = {r.name: {e: res[r.name] for e, res in engines.items()}
                                for r in RULES}
    return out


@pytest.mark.parametrize("rule", RULES, ids=IDS)
def test_scalar_engines_conform(rule, scalar_results):
    """Trace, Record, the VM and compiled C: the points Python's floats raise at raise the
    same exception, values are Python's, the VM's values are the recording's bit for bit,
    compiled C is the VM bit for bit, every derivative is the Trace's."""
    assert check_scalar(rule, TABLE[rule.name], scalar_results[rule.name]) == []


@pytest.mark.parametrize("rule", RULES, ids=IDS)
def test_derivatives_match_references(rule, scalar_results):
    """The Trace's derivatives (first, and second through NestedTrace) against sympy's,
    central differences and torch's autograd (ordinary points and ties)."""
    assert check_derivatives(rule, TABLE[rule.name], scalar_results[rule.name]["Trace"]) == []


@pytest.mark.parametrize("dtype", [np.float64, np.float32], ids=["float64", "float32"])
@pytest.mark.parametrize("rule", RULES, ids=IDS)
def test_numpy_tensor_engines_conform(rule, dtype, numpy_results, scalar_results):
    """Eager tensors (contiguous, strided, big-endian inputs), TraceTensor, the fused C and
    the unfused replay on the numpy device, float64 and float32."""
    results = numpy_results[np.dtype(dtype)][rule.name]
    s = TABLE[rule.name]
    lines = check_tensor(rule, s, dtype, results, scalar_results[rule.name]["Trace"],
                         "eager")
    # the same numbers in another layout: the same bits (one input normalisation)
    for same, base in (("eager strided", "eager"), ("eager big-endian", "eager"),
                       ("fused C big-endian", "fused C")):
        for a, b in zip((results[same].values, *results[same].grads),
                        (results[base].values, *results[base].grads)):
            lines += disagreements(a, b, 0, f"{rule.name} {same} vs {base}", s.xs)
    assert lines == []


@pytest.fixture(scope="module")
def opencl_results(opencl_device, module_cache):
    out = {}
    for dtype in (np.float64, np.float32):
        engines = {"eager OpenCL": eager_tensors(TABLE, opencl_device, dtype),
                   "fused OpenCL": recorded_tensors(TABLE, opencl_device, dtype, True,
                                                    "big-endian")}
        out[np.dtype(dtype)] = {r.name: {e: res[r.name] for e, res in engines.items()}
                                for r in RULES}
    return out


@pytest.mark.parametrize("dtype", [np.float64, np.float32], ids=["float64", "float32"])
def test_opencl_engines_conform(dtype, opencl_results, numpy_results, scalar_results):
    """Eager OpenCL tensors and the fused OpenCL kernels (big-endian inputs) against the
    eager numpy tensor, every rule (one test: the device's programs hold every rule)."""
    lines = []
    for rule in RULES:
        results = {"eager": numpy_results[np.dtype(dtype)][rule.name]["eager"],
                   **opencl_results[np.dtype(dtype)][rule.name]}
        lines += check_tensor(rule, TABLE[rule.name], dtype, results,
                              scalar_results[rule.name]["Trace"], "eager")
    assert lines == []
