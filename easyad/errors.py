"""Exceptions of easyad. Each names the problem and the fix; none leaves a tape damaged."""


class TapeMismatchError(ValueError):
    """Records of two different WengertLists met in one operation or lookup."""


class StaleRecordError(RuntimeError):
    """A Record (or Derivatives) made before its WengertList was cleared was used."""


class GradientCheckError(AssertionError):
    """check_gradients found derivatives that disagree with finite differences."""


class BranchChangedError(ValueError):
    """A recorded Function, replayed at a new point, would take another branch."""


class AnomalyError(FloatingPointError):
    """Under ad.detect_anomaly(): an operation produced a NaN or inf value or derivative."""


class ShapeError(ValueError):
    """Operands of a tensor operation have shapes that do not fit together."""


__all__ = ["TapeMismatchError", "StaleRecordError", "GradientCheckError", "BranchChangedError",
           "ShapeError", "AnomalyError"]
