"""Matrix products on the OpenCL backend: the choice of kernel (``gemm``: the GEMM of
``_kernels_matmul.render_gemm`` reading transposed operands in place, the older tiled kernel, or
the CPU's ``nt`` kernel) and the GEMM's launch planned once per shape and layout
(``_kernels_matmul.gemm_plan``: tile configuration and split K). A mixin of ``OpenCLBackend``
(``_opencl.py``): the one backend operation with a planner of its own.
"""
from __future__ import annotations

import os
from typing import Any

import numpy as np

from easyad.tensor import _kernels as kernels
from easyad.tensor import _kernels_matmul as matmul_kernels
from easyad.tensor._cl_errors import _device_errors
from easyad.tensor._cl_memory import _LONG


@_device_errors
class Matmul:
    """``matmul`` of ``OpenCLBackend`` (see the module docstring), guarded as the backend's
    methods are (``_device_errors``)."""

    def _transpose3(self, buf: Any) -> Any:
        b, r, c = buf.shape
        return self.strided(buf, 0, (b, c, r), (r * c, 1, c))

    # Which matmul kernel: "new" (render_gemm: reads transposed operands in place),
    # "tiled" (the old render_matmul, transposes copied first) or "nt" (render_matmul_nt, the
    # CPU kernel); None: $EASYAD_OPENCL_GEMM, else "new" on GPUs and "nt" elsewhere. An
    # attribute so that a benchmark can compare them in one process. "new" at every size
    # on GPUs: a small product costs its launches, and it has one where "tiled" has a copy
    # of each transposed operand too (and its thin tiles waste less on a 10-wide side).
    gemm: str | None = None

    def matmul(self, a: Any, b: Any, transpose_a: bool = False, transpose_b: bool = False
               ) -> Any:
        """(B|1, M, K) @ (B|1, K, N) -> (B, M, N), float64 or float32; with
        ``transpose_a`` a is given as (B|1, K, M), with ``transpose_b`` b as (B|1, N, K)."""
        ba, M, K = (a.shape[0], a.shape[2], a.shape[1]) if transpose_a else a.shape
        bb = b.shape[0]
        N = b.shape[1] if transpose_b else b.shape[2]
        batch = max(ba, bb)
        if batch * M * N == 0:
            return self._empty((batch, M, N), a.dtype)
        if K == 0:
            return self.full((batch, M, N), 0.0, a.dtype)
        real = kernels.c_type(a.dtype)
        choice = self.gemm or os.environ.get("EASYAD_OPENCL_GEMM") or (
            "new" if self.device.is_gpu else "nt")
        if choice == "new":
            return self._gemm(a, b, transpose_a, transpose_b, (batch, M, N, K),
                              (ba > 1, bb > 1))
        if choice not in ("nt", "tiled"):
            raise ValueError(f"EASYAD_OPENCL_GEMM (or the backend's gemm) is {choice!r}: "
                             "expected 'new', 'tiled' or 'nt'")
        if transpose_a:
            a = self._transpose3(a)
        out = self._empty((batch, M, N), a.dtype)
        if choice == "nt":
            # C = A (B^T)^T with both operands read along K (see _kernels)
            bt = b if transpose_b else self._transpose3(b)
            # 32-byte vectors (AVX2): a wider vector than the CPU has makes PoCL build the
            # program without the kernel (and abort at exit), and PoCL's LLVM may not know
            # a CPU has AVX-512 (it builds Zen 4 as Zen 3)
            k = self.kernel(matmul_kernels.render_matmul_nt(real, 32), "easyad_matmul_nt",
                            [None, None, None, np.int32, np.int32, np.int32, _LONG, _LONG])
            blk = matmul_kernels.MATMUL_NT_BLOCK
            group = matmul_kernels.MATMUL_NT_GROUP
            items = (-(-N // blk["RN"]), -(-M // blk["RM"]))
            global_size = (-(-items[0] // group[0]) * group[0],
                           -(-items[1] // group[1]) * group[1], batch)
            k(self.queue, global_size, (group[0], group[1], 1), out.data, a.data, bt.data,
              M, N, K, M * K if ba > 1 else 0, K * N if bb > 1 else 0)
            return out
        if transpose_b:
            b = self._transpose3(b)
        k = self.kernel(matmul_kernels.render_matmul(real), "easyad_matmul",
                        [None, None, None, np.int32, np.int32, np.int32, _LONG, _LONG])
        t = matmul_kernels.MATMUL_TILE
        local = (t["TN"] // t["WN"], t["TM"] // t["WM"], 1)
        global_size = (-(-N // t["TN"]) * local[0], -(-M // t["TM"]) * local[1], batch)
        k(self.queue, global_size, local, out.data, a.data, b.data, M, N, K,
          M * K if ba > 1 else 0, K * N if bb > 1 else 0)
        return out

    def _gemm(self, a: Any, b: Any, ta: bool, tb: bool, dims: tuple[int, int, int, int],
              batched: tuple[bool, bool], config: str | None = None,
              split: int | None = None) -> Any:
        """render_gemm's product; ``config`` and ``split`` override gemm_plan's
        choice (tests). The launch is planned once per shape and layout: rendering the
        source to look its kernel up would cost more host time than the launch."""
        key = (a.dtype, ta, tb, dims, config, split)
        cache = self.__dict__.setdefault("_gemm_plans", {})
        plan = cache.get(key)
        if plan is None:
            if len(cache) > 1024:       # shapes that keep changing: don't grow forever
                cache.clear()
            plan = cache[key] = self._plan_gemm(a.dtype, ta, tb, dims, config, split)
        k, global_size, local, ks, slices = plan
        batch, M, N, K = dims
        size = batch * M * N
        out = self._empty((batch, M, N) if slices == 1 else (slices, size), a.dtype)
        k(self.queue, global_size, local, out.data, a.data, b.data, M, N, K,
          M * K if batched[0] else 0, K * N if batched[1] else 0, ks, slices, batch)
        if slices == 1:
            return out
        return self.reshape(self.reduce("sum", out, (0,)), (batch, M, N))

    def _plan_gemm(self, dtype: Any, ta: bool, tb: bool, dims: tuple[int, int, int, int],
                   config: str | None, split: int | None) -> tuple[Any, ...]:
        batch, M, N, K = dims
        real = kernels.c_type(dtype)
        name, slices = matmul_kernels.gemm_plan(real, batch, M, N, K,
                                                int(self.device._handle.max_compute_units))
        name, slices = config or name, split or slices
        cfg = matmul_kernels.GEMM_CONFIGS[real][name]
        # whole slabs per slice, and no empty slice
        ks = -(-K // slices)
        ks = -(-ks // cfg["BK"]) * cfg["BK"]
        slices = -(-K // ks)
        k = self.kernel(matmul_kernels.render_gemm(real, cfg, ta, tb, slices > 1),
                        "easyad_gemm",
                        [None, None, None, np.int32, np.int32, np.int32, _LONG, _LONG,
                         np.int32, np.int32, _LONG])
        tx, ty = matmul_kernels.gemm_group(cfg)
        global_size = (-(-N // cfg["BN"]) * tx, -(-M // cfg["BM"]) * ty, batch * slices)
        return k, global_size, (tx, ty, 1), ks, slices
