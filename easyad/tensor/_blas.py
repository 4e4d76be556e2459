"""The numpy device's matrix product: numpy's BLAS, or easyad's AVX-512 kernels
(``easyad/_gemm.h``) where the BLAS leaves half the CPU's vector width unused.

OpenBLAS (numpy's BLAS on Linux) picks its kernels by CPU model. On a CPU newer than it
knows, such as AMD Zen 5 under openblas 0.3.31, it runs its AVX2 ("Haswell") kernels:
there easyad's kernels take the MLP step's 64x784x128 products in 115 us against 233 us
(float64, one thread; 2048^3: 107 against 61 GFLOP/s). So ``auto`` (the default) uses them
where all of these hold, and numpy's BLAS everywhere else:

- the CPU has AVX-512 (F, VL, DQ) and FMA (``_core.GEMM_SUPPORTED``);
- numpy's BLAS is OpenBLAS and its kernels are not AVX-512 ones (its core name is not
  SkylakeX, Cooperlake or SapphireRapids): other BLAS libraries are left alone;
- the BLAS runs one thread (``threadpoolctl.threadpool_limits(1)``,
  ``OPENBLAS_NUM_THREADS=1``): easyad's kernels run one, and many threads win on big
  products;
- the product is 2-D (or a batch of one), float64 or float32, and has at least
  ``_SMALLEST`` multiply-adds (below that the two take about the same time).

The two round differently (in the last bits), and the choice is made per call from the
BLAS's thread count: eager execution, its fast paths and replayed programs all call
``matmul`` here, so they always agree with each other. ``EASYAD_MATMUL=blas`` (or
``easyad``) fixes the choice.
"""
from __future__ import annotations

import ctypes
import os
from typing import Any

import numpy as np

from easyad import _core

_SMALLEST = 1 << 15             # multiply-adds
_AVX512_CORES = ("skylakex", "cooperlake", "sapphirerapids")


def _openblas_calls() -> Any:
    """OpenBLAS's thread count function and its core name, when numpy's BLAS is an
    OpenBLAS (None otherwise, or where the process's libraries cannot be listed)."""
    try:
        with open("/proc/self/maps") as maps:
            paths = {line.split()[-1] for line in maps
                     if "openblas" in line.lower() and ".so" in line}
    except OSError:
        return None
    for path in sorted(paths):
        try:
            lib = ctypes.CDLL(path)
        except OSError:
            continue
        for prefix, suffix in (("scipy_", "64_"), ("scipy_", ""), ("", "64_"), ("", "")):
            threads = getattr(lib, f"{prefix}openblas_get_num_threads{suffix}", None)
            corename = getattr(lib, f"{prefix}openblas_get_corename{suffix}", None)
            if threads is None or corename is None:
                continue
            threads.restype, threads.argtypes = ctypes.c_int, []
            corename.restype, corename.argtypes = ctypes.c_char_p, []
            return (threads, (corename() or b"").decode(errors="replace").lower(),
                    lib, prefix, suffix)
    return None


def cblas_gemm(dtype: Any) -> Any:
    """OpenBLAS's ``cblas_sgemm`` / ``cblas_dgemm`` (for float32 / float64) as a ctypes
    function of (order, transa, transb, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc),
    the one numpy's matmul calls, or None where numpy's BLAS is not an OpenBLAS this can
    ask (its integers are 64-bit where its build says USE64BITINT, whatever its names)."""
    found = _OPENBLAS
    if found is None:
        return None
    lib, prefix, suffix = found[2:]
    letter = {np.dtype(np.float32): "s", np.dtype(np.float64): "d"}[np.dtype(dtype)]
    gemm = getattr(lib, f"{prefix}cblas_{letter}gemm{suffix}", None)
    config = getattr(lib, f"{prefix}openblas_get_config{suffix}", None)
    if gemm is None or config is None:
        return None
    config.restype, config.argtypes = ctypes.c_char_p, []
    real = ctypes.c_float if letter == "s" else ctypes.c_double
    index = ctypes.c_int64 if b"USE64BITINT" in (config() or b"") else ctypes.c_int
    gemm.restype = None
    gemm.argtypes = [ctypes.c_int, ctypes.c_int, ctypes.c_int, index, index, index, real,
                     ctypes.c_void_p, index, ctypes.c_void_p, index, real, ctypes.c_void_p,
                     index]
    return gemm


def _openblas() -> Any:
    """OpenBLAS's thread count function, when numpy's BLAS is an OpenBLAS without AVX-512
    kernels for this CPU (None otherwise)."""
    found = _OPENBLAS
    if found is None or any(core in found[1] for core in _AVX512_CORES):
        return None
    return found[0]


def blas_threads() -> int | None:
    """The threads numpy's BLAS runs now (threadpoolctl and OPENBLAS_NUM_THREADS change
    it), or None where that BLAS is not an OpenBLAS this can ask."""
    return None if _OPENBLAS is None else int(_OPENBLAS[0]())


def _mode() -> str:
    mode = os.environ.get("EASYAD_MATMUL", "auto").strip().lower() or "auto"
    if mode not in ("auto", "blas", "easyad"):
        raise ValueError(f"EASYAD_MATMUL={mode!r}: use auto, blas or easyad")
    if mode == "easyad" and not _core.GEMM_SUPPORTED:
        return "blas"
    return mode


_MODE = _mode()
_OPENBLAS = _openblas_calls()
_THREADS = _openblas() if _MODE == "auto" and _core.GEMM_SUPPORTED else None


def own_kernels(m: int, k: int, n: int) -> bool:
    """Whether an (m, k) @ (k, n) product runs on easyad's kernels (see the docstring)."""
    if _MODE == "blas" or m * k * n < _SMALLEST:
        return False
    return _MODE == "easyad" or (_THREADS is not None and _THREADS() == 1)


def matmul(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """``np.matmul(a, b)`` for the numpy device (a new array; see the docstring for which
    kernels compute it)."""
    if a.ndim == b.ndim and a.dtype == b.dtype and a.dtype in (np.float64, np.float32) \
            and (a.ndim == 2 or (a.ndim == 3 and a.shape[0] == 1 == b.shape[0])) \
            and a.shape[-1] == b.shape[-2] \
            and own_kernels(a.shape[-2], a.shape[-1], b.shape[-1]):
        if a.ndim == 2:
            return _core._gemm(a, b)
        return _core._gemm(a[0], b[0])[None]
    if a.ndim > 2 and b.ndim >= 2 and a.shape[-1] == 1 and b.shape[-2] == 1:
        # stacks of outer products (per-example gradients under ad.vmap): numpy's matmul
        # loops slowly over k = 1; the broadcast product is the same numbers (no sum)
        return np.multiply(a, b)
    return np.matmul(a, b)
