"""The thread pool of easyad's batches: scalar replay's rows (``replay.py``) and tensor
programs' points (``compiler/program/fused_c.py``) run compiled code on it without the GIL."""
from __future__ import annotations

import os
import threading
import warnings
from concurrent.futures import ThreadPoolExecutor


def _cores() -> int:
    """How many threads a batch runs on: ``EASYAD_NUM_THREADS`` if set (a dask worker
    sharing a machine with others, a benchmark), else the cores this process may run on
    (its affinity: taskset, a container's cpuset), else os.cpu_count()."""
    text = os.environ.get("EASYAD_NUM_THREADS", "").strip()
    if text:
        if text.isdigit() and int(text) >= 1:
            return int(text)
        # at import: a warning, not an exception that would stop ``import easyad``
        warnings.warn(f"EASYAD_NUM_THREADS is {text!r}, not a positive whole number of "
                      "threads: ignored (one thread per core)", RuntimeWarning, stacklevel=2)
    try:
        return len(os.sched_getaffinity(0)) or 1
    except (AttributeError, OSError):     # not on Linux
        return os.cpu_count() or 1


CORES = _cores()
_pool: ThreadPoolExecutor | None = None
_lock = threading.Lock()


def threads() -> ThreadPoolExecutor:
    """The pool, one worker per core, made on first use."""
    global _pool
    with _lock:
        if _pool is None:
            _pool = ThreadPoolExecutor(max_workers=CORES, thread_name_prefix="easyad-batch")
        return _pool
