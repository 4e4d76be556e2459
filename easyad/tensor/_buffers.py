"""Counting a backend's live buffers: what the memory tests read to see that clearing a
WengertList (or dropping its tensors) really releases device and host memory."""
from __future__ import annotations

import weakref
from typing import TypeVar

_T = TypeVar("_T")


class LiveBuffers:
    """Mixin for backends: ``_track(buffer)`` counts it until it is garbage-collected."""

    _live = 0

    def _track(self, buffer: _T) -> _T:
        self._live += 1
        weakref.finalize(buffer, self._release)
        return buffer

    def _release(self) -> None:
        self._live -= 1

    @property
    def live_buffers(self) -> int:
        """Buffers this backend made that are still alive."""
        return self._live
