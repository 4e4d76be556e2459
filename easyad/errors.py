"""Exceptions of easyad. Each names the problem and the fix; none leaves a tape damaged."""


class TapeMismatchError(ValueError):
    """Records of two different WengertLists met in one operation or lookup."""


class StaleRecordError(RuntimeError):
    """A Record (or Derivatives) made before its WengertList was cleared was used."""


__all__ = ["TapeMismatchError", "StaleRecordError"]
