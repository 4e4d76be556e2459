"""Transforms as interpreters (issue 25 item 3): the tensor layer asks a backend's
``interpreter`` what running an operation means, never its ``kind``.

- no ``"meta"``/``"program"`` kind comparison is left in the package (a source scan, shown
  to catch the forms it looks for);
- each backend names its interpreter, and the answers eval_shape and ad.record rely on;
- the mixed-device errors come from the interpreters, each naming its fix;
- a new interpreter on an ordinary backend is asked: its answers change what the tensor
  layer does, values and derivatives checked against numpy.
"""
from __future__ import annotations

import ast
import pathlib
import re

import numpy as np
import pytest

import easyad as ad
from easyad import _core
from easyad.tensor import _interpreters
from easyad.tensor._backend import Backend
from easyad.tensor._meta import META, SHAPES
from easyad.tensor._numpy import NumpyBackend
from easyad.tensor._program import RECORDING, Program, ProgramBackend

PACKAGE = pathlib.Path(ad.__file__).resolve().parent
FAKE_KINDS = {"meta", "program"}
_PXI_KIND = re.compile(r"""kind\s*(?:==|!=|\bin\b|\bnot in\b)[^\n]*["'](?:meta|program)["']""")


def _strings(node: ast.AST) -> set[str]:
    """The string constants of a comparand: itself, or the items of a literal collection
    (or of frozenset/set/tuple of one)."""
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return {node.value}
    if isinstance(node, (ast.Tuple, ast.List, ast.Set)):
        return set().union(*(_strings(e) for e in node.elts)) if node.elts else set()
    if isinstance(node, ast.Call) and getattr(node.func, "id", None) in (
            "frozenset", "set", "tuple") and node.args:
        return _strings(node.args[0])
    return set()


def _reads_kind(node: ast.AST) -> bool:
    """``x.kind`` or ``getattr(x, "kind"...)`` anywhere in an expression."""
    for n in ast.walk(node):
        if isinstance(n, ast.Attribute) and n.attr == "kind":
            return True
        if isinstance(n, ast.Call) and getattr(n.func, "id", None) == "getattr" and \
                len(n.args) > 1 and isinstance(n.args[1], ast.Constant) and \
                n.args[1].value == "kind":
            return True
    return False


def kind_tests(source: str, filename: str = "<source>") -> list[str]:
    """Where ``source`` tests a fake device kind: a comparison of a kind with "meta" or
    "program", or a collection of kind names holding one of them (the old ``_ONE_NODE``)."""
    found = []
    for node in ast.walk(ast.parse(source, filename)):
        if isinstance(node, ast.Compare):
            sides = [node.left, *node.comparators]
            if any(_reads_kind(s) for s in sides) and \
                    any(_strings(s) & FAKE_KINDS for s in sides):
                found.append(f"{filename}:{node.lineno}")
        elif isinstance(node, (ast.Tuple, ast.List, ast.Set)):
            names = _strings(node)
            if names & FAKE_KINDS and names & {"numpy", "opencl"}:
                found.append(f"{filename}:{node.lineno}")
    return found


def test_the_scan_finds_every_form_of_a_kind_test():
    planted = {
        'if be.kind == "meta": pass': 1,
        'x = a._backend.kind in ("meta", "program")': 1,
        'y = getattr(getattr(v, "_backend", None), "kind", None) == "program"': 1,
        '_ONE_NODE = frozenset({"numpy", "opencl", "program"})': 1,
        'ok = "program" != be.kind': 1,
        'fine = be.interpreter.replays; name = "program"; kind = "meta"': 0,
        'ok = be.kind == "numpy"': 0,
    }
    for source, count in planted.items():
        assert len(kind_tests(source)) == count, source
    assert _PXI_KIND.search('if be.kind == "program":')
    assert not _PXI_KIND.search('if be.kind == "numpy":')


def test_no_fake_device_kind_is_tested_in_the_package():
    found = []
    for path in sorted(PACKAGE.rglob("*")):
        if "_generated" in path.parts or not path.is_file():
            continue
        if path.suffix == ".py":
            found += kind_tests(path.read_text(encoding="utf-8"), str(path))
        elif path.suffix in (".pyx", ".pxi", ".pxd"):
            text = path.read_text(encoding="utf-8")
            found += [f"{path}:{text.count(chr(10), 0, m.start()) + 1}"
                      for m in _PXI_KIND.finditer(text)]
    assert not found, ("the tensor layer asks a backend's interpreter (tensor/"
                       "_interpreters.py), not its kind: " + ", ".join(found))


# ---- the interpreters each backend names ----

def test_each_backend_names_its_interpreter():
    from easyad.tensor import _devices
    numpy_be = _devices.resolve("numpy")
    recorder = ProgramBackend(numpy_be, Program())
    assert numpy_be.interpreter is _interpreters.EVALUATE
    assert META.interpreter is SHAPES
    assert recorder.interpreter is RECORDING
    assert isinstance(recorder, Backend)     # the recorder is a backend like the others
    for it in (_interpreters.EVALUATE, SHAPES, RECORDING):
        assert isinstance(it, _interpreters.Interpreter)
    # (has_values, numbers_stay_tensors, replays, takes_any_device, fuses, checkpoints)
    answers = {it.name: (it.has_values, it.numbers_stay_tensors, it.replays,
                         it.takes_any_device, it.fuses, it.checkpoints)
               for it in (_interpreters.EVALUATE, SHAPES, RECORDING)}
    assert answers == {"evaluate": (True, False, False, False, True, True),
                       "eval_shape": (False, True, False, True, False, False),
                       "ad.record": (True, True, True, False, True, False)}
    assert _interpreters.of(ad.Tensor.constant(np.ones(2))) is _interpreters.EVALUATE
    assert _interpreters.of(np.ones(2)) is None


def test_a_number_under_each_interpreter():
    x0 = np.array([1.0, -2.0, 3.0])
    # evaluate: a scalar Record whose derivative is 2x
    lst = ad.WengertList()
    x = ad.Tensor.variable(x0, lst)
    loss = (x * x).sum()
    assert type(loss) is ad.Record and loss.number == pytest.approx(14.0)
    np.testing.assert_allclose(loss.derivatives()[x], 2 * x0)
    # eval_shape: a 0-d shape
    assert ad.eval_shape(lambda x: (x * x).sum(), (3,)) == ad.ShapeDtype(())
    # ad.record: the number stays a tensor of the program, so replay sees new values
    F = ad.record(lambda x: (x * x).sum() * x, x0, tensor=True)
    x1 = np.array([0.5, 2.0, -1.0])
    np.testing.assert_allclose(F(x1), (x1 @ x1) * x1, rtol=1e-14)


def test_mixed_devices_errors_name_the_interpreter_and_the_fix():
    outside = ad.Tensor.constant(np.ones((3, 4)))
    # eval_shape takes a tensor of any device by its shape where a traced tensor leads ...
    assert ad.eval_shape(lambda x: x + outside, (3, 4)) == ad.ShapeDtype((3, 4))
    # ... and says what to do where the outside tensor leads
    with pytest.raises(ValueError, match="eval_shape: a tensor on .* made outside the "
                                         "traced function.*pass it in"):
        ad.eval_shape(lambda x: outside + x, (3, 4))
    with pytest.raises(ValueError, match="made outside f.*pass it to f as an argument"):
        ad.record(lambda x: (x * outside).sum(), np.ones((3, 4)), tensor=True)


# ---- a new interpreter is asked ----

class KeepNumbers(_interpreters.Interpreter):
    """Eager values, but single numbers stay recorded 0-d tensors (and a primitive is
    refused): what a new transform would declare."""

    name = "keep-numbers"
    numbers_stay_tensors = True

    def number(self, cls, label, backend, value, tape, inputs, vjp, graph):
        return _core.record(cls, label, backend, value, (), value.dtype, tape, inputs, vjp,
                            graph)

    def primitive(self, prim, args, ops, dtype, cls, kwargs, backend):
        raise NotImplementedError(f"{prim.name} under {self.name}")


class _KeepBackend(NumpyBackend):
    interpreter = KeepNumbers()


def test_a_new_interpreter_is_asked_by_the_tensor_layer():
    from easyad.tensor import _devices
    be = _KeepBackend(_devices.resolve("numpy").device)
    lst = ad.WengertList()
    x0 = np.array([[1.0, 2.0], [-3.0, 0.5]])
    handle = lst._push_node(_core.Node("variable", (), lambda g: ()))
    x = _core.wrap(ad.Tensor, be, be.asarray(x0, np.dtype(np.float64)), x0.shape,
                   np.dtype(np.float64), lst, handle)
    loss = (x.sin() * x).sum()          # a number: kept a tensor by the interpreter
    assert isinstance(loss, ad.Tensor) and loss.shape == ()
    np.testing.assert_allclose(loss.value, np.sum(np.sin(x0) * x0), rtol=1e-15)
    d = loss.derivatives()
    np.testing.assert_allclose(d[x], np.cos(x0) * x0 + np.sin(x0), rtol=1e-14)
    prim = ad.primitive(vjp=lambda g, a, out: g * 2.0)(lambda a: a * 2.0)
    with pytest.raises(NotImplementedError, match="under keep-numbers"):
        prim(x)
    # a tensor of the default numpy backend in one operation: the devices message
    with pytest.raises(ValueError, match="different devices"):
        x + ad.Tensor.constant(np.ones((2, 2)))
