"""Counting a backend's live buffers: what the memory tests read to see that clearing a
WengertList (or dropping its tensors) really releases device and host memory."""
from __future__ import annotations

import weakref
from typing import Any, TypeVar

_T = TypeVar("_T")


class LiveBuffers:
    """Mixin for backends: ``_track(buffer)`` counts it until it is garbage-collected.

    A plain weak reference per buffer, kept in a dict until its callback drops it: a
    fraction of ``weakref.finalize``'s cost. Counting starts at the first read of
    ``live_buffers``: an operation pays no bookkeeping at all until a memory check asks
    (which compares counts taken after its first read).
    """

    tracking = False    # whether _track counts now (the core's dispatch reads it first)
    __refs: dict[int, Any] | None = None

    def _track(self, buffer: _T) -> _T:
        refs = self.__refs
        if refs is None:
            if not self.tracking:
                return buffer
            refs = self.__refs = {}
        ref = weakref.ref(buffer, self._release)
        refs[id(ref)] = ref
        return buffer

    def _release(self, ref: Any) -> None:
        refs = self.__refs
        if refs is not None:
            refs.pop(id(ref), None)

    @property
    def live_buffers(self) -> int:
        """Buffers this backend made that are still alive (counted from the first read)."""
        if self.__refs is None:
            self.__refs = {}
            self.tracking = True
        return len(self.__refs)
