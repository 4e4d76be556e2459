"""The registry of issue 26's numpy and linear algebra functions: one row per function,
with the call easyad answers, a sample input and torch's reference.

``tests/test_coverage.py`` is generated from it (one test per row and transform: reverse
mode, forward mode, create_graph's second order, ``ad.record(tensor=True)`` replayed, and
eager and replayed on OpenCL), and so is the coverage table of docs/scientific.md
(``python tests/_coverage.py`` prints it; a test checks the docs hold exactly that text).

A row's ``call`` takes the variable (an ndarray, a Tensor or a TraceTensor) and calls
numpy's own function on it, so numpy's dispatch is what is tested, and the same call on
an ndarray is the reference value. ``torch`` is the same computation in torch (float64),
whose torch.func derivatives are the references. ``host`` names the table ops that have no
OpenCL kernel (nor a composite of device primitives): on an OpenCL tensor they run on host
copies and the result goes back to the device. The test checks this list against the ops
that really ran on the host.
"""
from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

import numpy as np
import scipy.special as sp
import torch

import easyad as ad
from easyad import _rules

I3 = np.eye(3)
T3 = torch.eye(3, dtype=torch.float64)


@dataclasses.dataclass(frozen=True)
class Row:
    name: str                        # how a user spells it: np.prod, np.linalg.solve
    kind: str                        # the table's section
    call: Callable[[Any], Any]       # x -> the function of x (numpy's call, dispatched)
    torch: Callable[[Any], Any]      # t -> the same in torch
    shape: tuple[int, ...] = (3, 4)  # the sample: uniform in (-1, 1)
    host: tuple[str, ...] = ()       # table ops run on host copies on OpenCL
    # 1e-10 but where torch's reference is less accurate than that (the reason in note)
    tol: float = 1e-10
    note: str = ""                   # said in the docs table


ROWS: list[Row] = []


def _add(*rows: Row) -> None:
    ROWS.extend(rows)


# ---- ufuncs: every rule with a numpy (or scipy.special) ufunc -----------------------------

_SCIPY = {"erf", "erfc", "expit", "logit", "gammaln", "digamma", "xlogy", "xlog1py"}
_TORCH_NAME = {"abs": "abs", "cbrt": None, "digamma": "special.digamma",
               "gammaln": "special.gammaln", "expit": "special.expit",
               "logit": "special.logit", "erfc": "special.erfc", "erf": "special.erf",
               "xlogy": "special.xlogy", "xlog1py": "special.xlog1py"}


# torch's polygamma (trigamma and up) is ~1e-9 from SciPy's and mpmath's, where ours agree
# to ~1e-13 (tests/test_special_rows.py): the second derivatives of these rows are
# compared at 1e-8
_TORCH_TRIGAMMA = {"gammaln", "digamma"}
_ROUGH = "vs torch at 1e-8 (torch's polygamma is ~1e-9 off)"


def _torch_of(rule: Any) -> Callable[..., Any]:
    spelling = _TORCH_NAME.get(rule.name, rule.name)
    if rule.name == "cbrt":
        return lambda t: torch.sign(t) * torch.abs(t) ** (1.0 / 3.0)
    if rule.name == "copysign":
        return torch.copysign
    f: Any = torch
    for part in spelling.split("."):
        f = getattr(f, part)
    return f


def _into(domain: tuple[float, float]) -> Callable[[Any], Any]:
    # the sample u in (-1, 1) mapped well inside the open interval (scaled by 0.7: the
    # replay point u + v/10 stays inside too)
    lo, hi = domain
    if lo == -np.inf and hi == np.inf:
        return lambda u: u
    if hi == np.inf:
        return lambda u: (lo + 1.0) + 0.7 * u
    mid, half = (lo + hi) / 2.0, (hi - lo) / 2.0
    return lambda u: mid + 0.7 * half * u


def _ufunc_rows() -> list[Row]:
    rows = []
    for rule in _rules.RULES:
        if not rule.generic or rule.stops_gradient or rule.integer_order:
            continue
        scipy_ = rule.name in _SCIPY
        ufunc = getattr(sp if scipy_ else np, rule.spelling("numpy") or rule.name, None)
        if ufunc is None:
            continue
        name = f"{'scipy.special' if scipy_ else 'np'}.{ufunc.__name__}"
        maps = [_into(d) for d in rule.domain]
        rough = rule.name in _TORCH_TRIGAMMA
        rows.append(Row(name, "ufunc", _mapped(ufunc, maps), _mapped(_torch_of(rule), maps),
                        (3, 4) if rule.arity == 1 else (2, 3, 2),
                        tol=1e-8 if rough else 1e-10, note=_ROUGH if rough else ""))
    return rows


def _mapped(f: Callable[..., Any], maps: list[Callable[[Any], Any]]) -> Callable[[Any], Any]:
    if len(maps) == 1:
        return lambda x: f(maps[0](x))
    return lambda x: f(maps[0](x[0]), maps[1](x[1]))   # two operands: the rows of x


_add(*_ufunc_rows())
_add(Row("ad.polygamma", "ufunc", lambda x: ad.polygamma(1, x + 2.0),
         lambda t: torch.special.polygamma(1, t + 2.0), tol=1e-8,
         note="scipy.special.polygamma is not a ufunc: call ad.polygamma; " + _ROUGH))
_add(Row("np.negative", "ufunc", np.negative, torch.neg),
     Row("np.add", "ufunc", lambda x: np.add(x[0], x[1]), lambda t: t[0] + t[1], (2, 3)),
     Row("np.subtract", "ufunc", lambda x: np.subtract(x[0], x[1]), lambda t: t[0] - t[1],
         (2, 3)),
     Row("np.multiply", "ufunc", lambda x: np.multiply(x[0], x[1]), lambda t: t[0] * t[1],
         (2, 3)),
     Row("np.divide", "ufunc", lambda x: np.divide(x[0], x[1] + 2.0),
         lambda t: t[0] / (t[1] + 2.0), (2, 3)))

# ---- reductions ----------------------------------------------------------------------

_add(Row("np.sum", "reduction", lambda x: np.sum(x, axis=0), lambda t: t.sum(0)),
     Row("np.prod", "reduction", lambda x: np.prod(x, axis=1), lambda t: t.prod(1)),
     Row("np.mean", "reduction", lambda x: np.mean(x, axis=1), lambda t: t.mean(1)),
     Row("np.var", "reduction", lambda x: np.var(x, axis=0, ddof=1),
         lambda t: torch.var(t, 0, correction=1)),
     Row("np.std", "reduction", lambda x: np.std(x, axis=1),
         lambda t: torch.std(t, 1, correction=0)),
     Row("np.max", "reduction", lambda x: np.max(x, axis=1), lambda t: t.amax(1)),
     Row("np.min", "reduction", lambda x: np.min(x, axis=0), lambda t: t.amin(0)),
     Row("np.cumsum", "reduction", lambda x: np.cumsum(x, axis=1), lambda t: t.cumsum(1)),
     Row("np.cumprod", "reduction", lambda x: np.cumprod(x, axis=1), lambda t: t.cumprod(1)),
     Row("np.argmax", "reduction", lambda x: np.take(x, np.argmax(x)),
         lambda t: t.reshape(-1)[torch.argmax(t)], note="not differentiable (an index)"),
     Row("np.argmin", "reduction", lambda x: np.take(x, np.argmin(x)),
         lambda t: t.reshape(-1)[torch.argmin(t)], note="not differentiable (an index)"),
     Row("np.argsort", "reduction",
         lambda x: np.take_along_axis(x, np.argsort(x, axis=1), axis=1),
         lambda t: torch.take_along_dim(t, torch.argsort(t, 1), 1),
         note="not differentiable (indices)"))

# ---- shape functions -----------------------------------------------------------------

_add(Row("np.reshape", "shape", lambda x: np.reshape(x, (2, 6)), lambda t: t.reshape(2, 6)),
     Row("np.transpose", "shape", lambda x: np.transpose(x), lambda t: t.T),
     Row("np.ravel", "shape", lambda x: np.ravel(x) * np.ravel(x[::-1]),
         lambda t: torch.ravel(t) * torch.ravel(t.flip(0))),
     Row("np.hstack", "shape", lambda x: np.hstack([x[0], 2.0 * x[1]]) * np.hstack([x, x])[1],
         lambda t: torch.hstack([t[0], 2.0 * t[1]]) * torch.hstack([t, t])[1]),
     Row("np.vstack", "shape", lambda x: np.vstack([x[0], x[1:] * x[0]]),
         lambda t: torch.vstack([t[0], t[1:] * t[0]])),
     Row("np.moveaxis", "shape", lambda x: np.moveaxis(x, 0, 2),
         lambda t: torch.movedim(t, 0, 2), (2, 3, 2)),
     Row("np.swapaxes", "shape", lambda x: np.swapaxes(x, 0, 2),
         lambda t: torch.swapaxes(t, 0, 2), (2, 3, 2)),
     Row("np.squeeze", "shape", lambda x: np.squeeze(x, 1), lambda t: t.squeeze(1), (3, 1, 2)),
     Row("np.expand_dims", "shape", lambda x: np.expand_dims(x, 1), lambda t: t.unsqueeze(1)),
     Row("np.broadcast_to", "shape", lambda x: np.broadcast_to(x, (2, 3, 4)),
         lambda t: torch.broadcast_to(t, (2, 3, 4))),
     Row("np.concatenate", "shape", lambda x: np.concatenate([x, 2.0 * x[:1]], axis=0),
         lambda t: torch.cat([t, 2.0 * t[:1]], 0)),
     Row("np.stack", "shape", lambda x: np.stack([x[0], x[2] * x[1]], axis=1),
         lambda t: torch.stack([t[0], t[2] * t[1]], 1)),
     Row("np.split", "shape", lambda x: np.split(x, 2, axis=1)[1] * np.split(x, 2, axis=1)[0],
         lambda t: torch.split(t, 2, 1)[1] * torch.split(t, 2, 1)[0]),
     Row("np.tile", "shape", lambda x: np.tile(x, (2, 1)), lambda t: t.tile(2, 1), (2, 3)),
     Row("np.repeat", "shape", lambda x: np.repeat(x, 2, axis=1),
         lambda t: t.repeat_interleave(2, 1), (2, 3)),
     Row("np.flip", "shape", lambda x: np.flip(x, 1), lambda t: t.flip(1)),
     Row("np.roll", "shape", lambda x: np.roll(x, 1, axis=1), lambda t: t.roll(1, 1)),
     Row("np.pad", "shape", lambda x: np.pad(x, ((1, 0), (0, 2)), constant_values=0.5),
         lambda t: torch.nn.functional.pad(t, (0, 2, 1, 0), value=0.5), (2, 3)),
     Row("np.diag", "shape", lambda x: np.diag(x[0]) + np.diag(x[1, :3], 1)[:4, :4],
         lambda t: torch.diag(t[0]) + torch.diag(t[1, :3], 1)[:4, :4]),
     Row("np.diagonal", "shape", lambda x: np.diagonal(x, 1), lambda t: torch.diagonal(t, 1)),
     Row("np.trace", "shape", lambda x: np.trace(x) * x, lambda t: torch.trace(t) * t),
     Row("np.triu", "shape", lambda x: np.triu(x, -1), lambda t: torch.triu(t, -1)),
     Row("np.tril", "shape", lambda x: np.tril(x), lambda t: torch.tril(t)),
     Row("np.where", "shape", lambda x: np.where(x > 0.0, x, 2.0 * x),
         lambda t: torch.where(t > 0.0, t, 2.0 * t)),
     Row("np.clip", "shape", lambda x: np.clip(x, -0.5, 0.6), lambda t: t.clamp(-0.5, 0.6)),
     Row("np.sort", "shape", lambda x: np.sort(x, axis=1), lambda t: t.sort(1).values),
     Row("np.take", "shape", lambda x: np.take(x, [2, 0, 2], axis=1),
         lambda t: t[:, [2, 0, 2]]),
     Row("np.take_along_axis", "shape",
         lambda x: np.take_along_axis(x, np.array([[1], [0], [3]]), axis=1),
         lambda t: torch.take_along_dim(t, torch.tensor([[1], [0], [3]]), 1)))

# ---- products ------------------------------------------------------------------------

_add(Row("np.outer", "product", lambda x: np.outer(x[0], x[1]),
         lambda t: torch.outer(t[0], t[1])),
     Row("np.inner", "product", lambda x: np.inner(x, x), lambda t: torch.inner(t, t)),
     Row("np.dot", "product", lambda x: np.dot(x, x.T), lambda t: t @ t.T),
     Row("np.matmul", "product", lambda x: np.matmul(x[:, :3], x), lambda t: t[:, :3] @ t),
     Row("np.einsum", "product", lambda x: np.einsum("ij,kj->ik", x, x * x),
         lambda t: torch.einsum("ij,kj->ik", t, t * t)),
     Row("np.tensordot", "product", lambda x: np.tensordot(x, x, axes=([0, 2], [2, 0])),
         lambda t: torch.tensordot(t, t, dims=([0, 2], [2, 0])), (2, 3, 2)),
     Row("np.kron", "product", lambda x: np.kron(x[0], x[1]),
         lambda t: torch.kron(t[0], t[1]), (2, 2, 2)))

# ---- numpy.linalg and ad.linalg (well-conditioned samples: x + 4 I, x x^T + 3 I) -------

L = ad.linalg


def _spd(x: Any) -> Any:
    return x @ x.T + 3.0 * (T3 if isinstance(x, torch.Tensor) else I3)


def _sym(x: Any) -> Any:
    return x + x.T + np.diag([0.0, 2.0, 4.0]) if not isinstance(x, torch.Tensor) else \
        x + x.T + torch.diag(torch.tensor([0.0, 2.0, 4.0], dtype=torch.float64))


def _shifted(x: Any) -> Any:
    return x + 4.0 * (T3 if isinstance(x, torch.Tensor) else I3)


_add(Row("np.linalg.norm", "linalg", lambda x: np.linalg.norm(x, axis=1) * x[:, 0],
         lambda t: torch.linalg.vector_norm(t, dim=1) * t[:, 0], note="vector 2-norm"),
     Row("np.linalg.norm", "linalg", lambda x: np.linalg.norm(x, "fro") * x,
         lambda t: torch.linalg.matrix_norm(t, "fro") * t, note="Frobenius"),
     Row("np.linalg.norm", "linalg", lambda x: np.linalg.norm(x, 2) * x,
         lambda t: torch.linalg.matrix_norm(t, 2) * t, host=("svd", "svdvals"), note="ord=2"),
     Row("np.linalg.solve", "linalg", lambda x: np.linalg.solve(_shifted(x[:, :3]), x),
         lambda t: torch.linalg.solve(_shifted(t[:, :3]), t), host=("solve",)),
     Row("np.linalg.inv", "linalg", lambda x: np.linalg.inv(_shifted(x)),
         lambda t: torch.linalg.inv(_shifted(t)), (3, 3), host=("inv",)),
     Row("np.linalg.det", "linalg", lambda x: np.linalg.det(_shifted(x)) * x,
         lambda t: torch.linalg.det(_shifted(t)) * t, (3, 3), host=("det", "inv")),
     Row("np.linalg.slogdet", "linalg", lambda x: np.linalg.slogdet(_shifted(x))[1] * x,
         lambda t: torch.linalg.slogdet(_shifted(t))[1] * t, (3, 3), host=("inv", "slogdet")),
     Row("np.linalg.cholesky", "linalg", lambda x: np.linalg.cholesky(_spd(x)),
         lambda t: torch.linalg.cholesky(_spd(t)), (3, 3), host=("cholesky", "solve_triangular")),
     Row("np.linalg.eigh", "linalg",
         lambda x: np.linalg.eigh(_sym(x))[1] ** 2 * np.linalg.eigh(_sym(x))[0],
         lambda t: torch.linalg.eigh(_sym(t))[1] ** 2 * torch.linalg.eigh(_sym(t))[0],
         (3, 3), host=("eigh",), note="eigenvectors up to sign: squared"),
     Row("np.linalg.eigvalsh", "linalg", lambda x: np.linalg.eigvalsh(_sym(x)),
         lambda t: torch.linalg.eigvalsh(_sym(t)), (3, 3), host=("eigh", "eigvalsh")),
     Row("np.linalg.svd", "linalg",
         lambda x: np.linalg.svd(x, full_matrices=False)[0] ** 2
         * np.linalg.svd(x, full_matrices=False)[1],
         lambda t: torch.linalg.svd(t, full_matrices=False)[0] ** 2
         * torch.linalg.svd(t, full_matrices=False)[1],
         (4, 3), host=("svd",), note="singular vectors up to sign: squared"),
     Row("np.linalg.qr", "linalg",
         lambda x: np.linalg.qr(x)[0] ** 2 + np.linalg.qr(x)[1][:1] ** 2,
         lambda t: torch.linalg.qr(t)[0] ** 2 + torch.linalg.qr(t)[1][:1] ** 2,
         (4, 3), host=("qr", "solve_triangular"), note="signs as LAPACK's: squared"),
     Row("np.linalg.lstsq", "linalg",
         lambda x: np.linalg.lstsq(x[:, :2], x[:, 2:], rcond=None)[0],
         lambda t: torch.linalg.pinv(t[:, :2]) @ t[:, 2:], (4, 3), host=("pinv", "svdvals")),
     Row("np.linalg.pinv", "linalg", lambda x: np.linalg.pinv(x),
         lambda t: torch.linalg.pinv(t), (4, 2), host=("pinv",)),
     Row("np.linalg.matrix_power", "linalg", lambda x: np.linalg.matrix_power(x, 3),
         lambda t: torch.linalg.matrix_power(t, 3), (3, 3)),
     Row("ad.linalg.expm", "linalg", lambda x: L.expm(x), torch.linalg.matrix_exp, (3, 3),
         host=("expm",), note="scipy.linalg.expm"),
     Row("ad.linalg.solve_triangular", "linalg",
         lambda x: L.solve_triangular(_shifted(x[:, :3]), x, lower=True),
         lambda t: torch.linalg.solve_triangular(torch.tril(_shifted(t[:, :3])), t,
                                                 upper=False),
         host=("solve_triangular",), note="scipy.linalg.solve_triangular"),
     Row("ad.linalg.cho_solve", "linalg",
         lambda x: L.cho_solve(L.cho_factor(_spd(x[:, :3])), x),
         lambda t: torch.cholesky_solve(t, torch.linalg.cholesky(_spd(t[:, :3]))),
         host=("cholesky", "solve_triangular"), note="with cho_factor, as scipy.linalg's"),
     Row("ad.linalg.lu_solve", "linalg",
         lambda x: L.lu_solve(L.lu_factor(_shifted(x[:, :3])), x),
         lambda t: torch.linalg.solve(_shifted(t[:, :3]), t),
         host=("lu_factor", "solve_triangular"), note="with lu_factor, as scipy.linalg's"))


def row_ids() -> list[str]:
    """Unique test ids: the name, and the note where a name has several rows."""
    seen: dict[str, int] = {}
    ids = []
    for row in ROWS:
        seen[row.name] = seen.get(row.name, 0) + 1
        ids.append(row.name if seen[row.name] == 1 else f"{row.name}#{seen[row.name]}")
    return ids


MARK = "<!-- coverage table: generated by tests/_coverage.py -->"


def table() -> str:
    """The coverage table of docs/scientific.md (between two MARK lines there)."""
    lines = [MARK, "", "| function | kind | on OpenCL | note |", "|---|---|---|---|"]
    done: dict[str, list[Row]] = {}
    for row in ROWS:
        done.setdefault(row.name, []).append(row)
    for name, rows in done.items():
        host = sorted({op for row in rows for op in row.host})
        opencl = "kernels" if not host else "host: " + ", ".join(host)
        notes = "; ".join(row.note for row in rows if row.note)
        lines.append(f"| `{name}` | {rows[0].kind} | {opencl} | {notes} |")
    return "\n".join([*lines, "", MARK])


if __name__ == "__main__":
    print(table())
