"""Exceptions of easyad. Each names the problem and the fix; none leaves a tape damaged."""


class TapeMismatchError(ValueError):
    """Records of two different WengertLists met in one operation or lookup.

    >>> import easyad as ad
    >>> a, b = ad.WengertList().variable(1.0), ad.WengertList().variable(2.0)
    >>> try:
    ...     a + b
    ... except ad.TapeMismatchError:
    ...     print("record a whole computation on one WengertList")
    record a whole computation on one WengertList
    """


class StaleRecordError(RuntimeError):
    """A Record (or Derivatives) made before its WengertList was cleared was used.

    >>> import easyad as ad
    >>> lst = ad.WengertList()
    >>> x = lst.variable(1.0)
    >>> lst.clear()
    >>> try:
    ...     x * 2.0
    ... except ad.StaleRecordError:
    ...     print("make the inputs again after clear()")
    make the inputs again after clear()
    """


class GradientCheckError(AssertionError):
    """check_gradients found derivatives that disagree with finite differences.

    >>> import math, easyad as ad
    >>> wrong = ad.define("wrong_sin", math.sin, lambda t: 2 * math.cos(t))
    >>> try:
    ...     ad.check_gradients(lambda x: wrong(x[0]), [0.3])
    ... except ad.GradientCheckError:
    ...     print("the derivative of wrong_sin disagrees with finite differences")
    the derivative of wrong_sin disagrees with finite differences
    """


class BranchChangedError(ValueError):
    """A recorded Function, replayed at a new point, would take another branch.

    >>> import easyad as ad
    >>> F = ad.record(lambda x: x[0] * x[0] if x[0] > 0 else -x[0], [1.0])
    >>> try:
    ...     F.gradient([-2.0])
    ... except ad.BranchChangedError:
    ...     print("record again there, or write the branch with ad.where")
    record again there, or write the branch with ad.where
    """


class AnomalyError(FloatingPointError):
    """Under ad.detect_anomaly(): an operation produced a NaN or inf value or derivative.

    >>> import easyad as ad
    >>> try:
    ...     with ad.detect_anomaly():
    ...         ad.log(ad.Trace.variable(0.0) + 1e-320)
    ... except ad.AnomalyError as error:
    ...     print(str(error).split(" in ")[0])
    log produced a derivative of inf
    """


class ShapeError(ValueError):
    """Operands of a tensor operation have shapes that do not fit together.

    >>> import easyad as ad
    >>> try:
    ...     ad.eval_shape(lambda a, b: a @ b, (3, 4), (5, 2))
    ... except ad.ShapeError:
    ...     print("the inner dimensions differ")
    the inner dimensions differ
    """


class TapeFormatError(ValueError):
    """A saved file or a pickle does not hold a valid easyad tape: it is damaged (truncated,
    changed), or was never written by easyad. Raised by ``ad.load`` and by unpickling a
    WengertList or Function; the message names the field, the entry and the bad value.

    >>> import easyad as ad
    >>> try:
    ...     ad.load(__file__)        # any file that is not a saved Function
    ... except ad.TapeFormatError:
    ...     print("damaged, or not a saved easyad Function")
    damaged, or not a saved easyad Function
    """


class PowDomainError(ValueError, ZeroDivisionError):
    """0.0 (or -0.0) raised to a negative finite power: the result would be infinite.

    Python has two errors for it: ``math.pow(0.0, -1.0)`` raises ValueError and
    ``0.0 ** -1.0`` raises ZeroDivisionError. A recorded tape keeps one pow for both
    spellings, so a replay cannot tell which was written; so every easyad engine that
    checks errors raises this one, which both spellings' ``except`` clauses catch: ``ad.pow``
    and ``**`` on floats, Trace, Record, nested Traces and Taylor series, and a recorded
    Function in the VM or compiled. Tensors and numpy arrays follow numpy instead: inf,
    no exception. ``base``, ``exponent`` and ``operator`` (spelt ``**``) say what failed
    (None when it was made from a message alone, ``PowDomainError(text)``, as code that
    re-raises with context does).

    >>> import easyad as ad
    >>> F = ad.record(lambda v: ad.pow(v[0], v[1]), [1.0, 2.0])
    >>> try:
    ...     F([0.0, -1.0])
    ... except ZeroDivisionError:             # or ValueError: both catch it
    ...     print("keep the base away from 0")
    keep the base away from 0
    """

    base: float | None
    exponent: float | None

    def __init__(self, base: float | str, exponent: float | None = None,
                 operator: bool = False, where: str = ""):
        self.operator, self.where = operator, where
        if isinstance(base, str):
            # a message alone: code that re-raises with context, type(error)(text)
            self.base = self.exponent = None
            super().__init__(base)
            return
        self.base, self.exponent = base, exponent
        spelt = f"{base!r} ** {exponent!r}" if operator else f"pow({base!r}, {exponent!r})"
        super().__init__(f"{spelt}{where}: 0.0 cannot be raised to a negative power (the "
                         f"result would be infinite); keep the base away from 0 (select a "
                         f"safe base before the power: ad.where(b == 0, 1.0, b) ** y), or "
                         f"catch ad.PowDomainError (a ValueError and a ZeroDivisionError)")

    def __reduce__(self) -> tuple[type, tuple[object, ...]]:
        if self.base is None:
            return type(self), (str(self),)
        return type(self), (self.base, self.exponent, self.operator, self.where)


class ConvergenceError(RuntimeError):
    """An iterative solver did not converge, so no answer (and no derivative) is given:
    the root finders and fixed-point iterations of ``ad.custom_root`` and
    ``ad.fixed_point``, and the matrix-free linear solves (``ad.linalg.cg``,
    ``ad.linalg.gmres``, the implicit function theorem's solves). The message names the
    solver, the residual reached and what to change.

    >>> import easyad as ad
    >>> try:
    ...     ad.fixed_point(lambda x: 2.0 * x + 1.0, 0.0)     # x -> 2x + 1 diverges
    ... except ad.ConvergenceError:
    ...     print("no fixed point reached")
    no fixed point reached
    """


class CompilerWarning(UserWarning):
    """``Function.compile()`` could not compile: no C compiler was found (or it failed).
    The Function goes on in the replay VM, with the same results, only slower; the
    message says what to install (gcc or clang) or to point ``$CC`` at a compiler.

    >>> import warnings, easyad as ad
    >>> with warnings.catch_warnings():
    ...     warnings.simplefilter("error", ad.CompilerWarning)  # make it an error in CI
    ...     print(issubclass(ad.CompilerWarning, UserWarning))
    True
    """


class KernelFallbackWarning(UserWarning):
    """A kind of OpenCL kernel failed its proof on a device (built and run in a child
    process first, so a driver that crashes on it crashes there), and easyad uses a safer
    kind instead: narrower vectors, scalar kernels, or one kernel per instruction. Results
    are the same; the message says what failed, what is used instead, and how to override.

    >>> import easyad as ad
    >>> issubclass(ad.KernelFallbackWarning, UserWarning)
    True
    """


__all__ = ["TapeMismatchError", "StaleRecordError", "GradientCheckError", "BranchChangedError",
           "ShapeError", "AnomalyError", "TapeFormatError", "DeviceError", "PowDomainError",
           "CompilerWarning", "KernelFallbackWarning",
           "ConvergenceError"]


class DeviceError(RuntimeError):
    """A device cannot do what was asked: it failed the probe (its driver cannot build
    kernels), ran out of memory, or was lost. The message names the device, the operation
    and the fix; the failed operation added nothing to the tape.

    >>> import easyad as ad
    >>> try:
    ...     ad.set_device("opencl:99")
    ... except (ad.DeviceError, ValueError):
    ...     print("list the devices with ad.device_report()")
    list the devices with ad.device_report()
    """

    def __init__(self, message: str, device: object = None, operation: str | None = None):
        super().__init__(message)
        self.device = device
        self.operation = operation
