"""The thread pool of easyad's batches: scalar replay's rows (``replay.py``) and tensor
programs' points (``compiler/program/fused_c.py``) run compiled code on it without the GIL."""
from __future__ import annotations

import os
import threading
from concurrent.futures import ThreadPoolExecutor

CORES = os.cpu_count() or 1
_pool: ThreadPoolExecutor | None = None
_lock = threading.Lock()


def threads() -> ThreadPoolExecutor:
    """The pool, one worker per core, made on first use."""
    global _pool
    with _lock:
        if _pool is None:
            _pool = ThreadPoolExecutor(max_workers=CORES, thread_name_prefix="easyad-batch")
        return _pool
