"""Transforms as interpreters (issue 25 item 3): the tensor layer asks a backend's
``interpreter`` what running an operation means, never its ``kind``.

- no ``"meta"``/``"program"`` kind comparison is left in the package (a source scan, shown
  to catch the forms it looks for);
- each backend names its interpreter, and the answers eval_shape and ad.record rely on;
- the mixed-device errors come from the interpreters, each naming its fix;
- a new interpreter on an ordinary backend is asked: its answers change what the tensor
  layer does, values and derivatives checked against numpy;
- one stack of open frames (``_interpreters.interpreting``) decides which backend a new
  tensor goes on: the old per-transform switches are gone (a scan), eval_shape and
  ad.record nest as they always did (pinned case by case), a frame closes when f raises,
  frames stay in their thread, and a third interpreter is honoured by every constructor.
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


# ---- one stack of open frames decides which backend a new tensor goes on ----

OLD_SWITCHES = {"tracing", "capturing", "_TRACING", "_CAPTURING"}
OLD_BLOCKS = {"traced", "captured"}       # their context managers (common words elsewhere)
OLD_HOMES = {"_meta", "_program"}


def switch_uses(source: str, filename: str = "<source>") -> list[str]:
    """Where ``source`` defines, imports or reads one of the old per-transform switches
    (``_meta.tracing``/``traced``, ``_program.capturing``/``captured``)."""
    found = []
    for node in ast.walk(ast.parse(source, filename)):
        hit = False
        if isinstance(node, ast.Name):
            hit = node.id in OLD_SWITCHES
        elif isinstance(node, ast.Attribute):
            hit = node.attr in OLD_SWITCHES or (
                node.attr in OLD_BLOCKS and getattr(node.value, "id", None) in OLD_HOMES)
        elif isinstance(node, (ast.FunctionDef, ast.ClassDef)):
            hit = node.name in OLD_SWITCHES
        elif isinstance(node, ast.ImportFrom):
            names = {a.name for a in node.names}
            hit = bool(names & OLD_SWITCHES) or (
                bool(names & OLD_BLOCKS) and (node.module or "").split(".")[-1] in OLD_HOMES)
        elif isinstance(node, ast.With):
            hit = any(isinstance(i.context_expr, ast.Call) and
                      getattr(i.context_expr.func, "id", None) in OLD_BLOCKS
                      for i in node.items)
        if hit:
            found.append(f"{filename}:{getattr(node, 'lineno', '?')}")
    return found


def test_the_switch_scan_finds_what_it_looks_for():
    planted = {
        "from easyad.tensor._program import capturing": 1,
        "be = _meta.META if _meta.tracing() else None": 1,
        "with _program.captured(be):\n    pass": 1,
        "from easyad.tensor._meta import META, traced": 1,
        "with traced():\n    pass": 1,
        "def tracing():\n    pass": 1,
        "_CAPTURING = None": 1,
        "def traced(*xs):\n    return any(xs)": 0,
        "be = _interpreters.new_tensor_backend() or resolve(device)": 0,
        "tracing_depth = 1; mode = 'capturing'": 0,
    }
    for source, count in planted.items():
        assert len(switch_uses(source)) == count, source


def test_only_the_interpreter_stack_chooses_a_new_tensors_backend():
    own = PACKAGE / "tensor" / "_interpreters.py"
    found = []
    for path in sorted(PACKAGE.rglob("*.py")):
        if "_generated" in path.parts or path == own:
            continue
        text = path.read_text(encoding="utf-8")
        found += switch_uses(text, str(path))
        if path.parent.name in ("tensor", "recorded") and "ContextVar(" in text:
            found.append(f"{path}: a context variable of its own")
    assert not found, ("eval_shape, ad.record and any new transform open a frame with "
                       "_interpreters.interpreting(backend); constructors ask "
                       "new_tensor_backend(): " + ", ".join(found))


def _backend_of_new(make=lambda: ad.Tensor.constant(np.ones(2))):
    return type(make()._backend).__name__


def test_eval_shape_inside_a_recording():
    lin = ad.nn.Linear(3, 2)
    seen = {}

    def inner(y):
        seen["constant"] = _backend_of_new()
        seen["parameter"] = type(lin.weight.tensor(None)._backend).__name__
        seen["replaying"] = _interpreters.replaying()
        return lin(y)

    def f(x):
        seen["before"] = _backend_of_new()
        seen["spec"] = ad.eval_shape(inner, (4, 3))
        seen["after"] = _backend_of_new()
        return (x * x).sum()

    F = ad.record(f, np.array([1.0, 2.0]), tensor=True)
    # the innermost frame without values wins for constants; the open recording still
    # takes module parameters (its program reads them at every replay) and is replaying
    assert seen == {"before": "ProgramBackend", "constant": "MetaBackend",
                    "parameter": "ProgramBackend", "replaying": True,
                    "spec": ad.ShapeDtype((4, 2)), "after": "ProgramBackend"}
    assert F(np.array([3.0, -1.0])) == pytest.approx(10.0, rel=1e-15)
    assert _interpreters.new_tensor_backend() is None
    assert _backend_of_new() == "NumpyBackend"


def test_a_recording_inside_eval_shape():
    lin = ad.nn.Linear(3, 2)
    seen = {}

    def g(x):
        seen["constant"] = _backend_of_new()
        seen["replaying"] = _interpreters.replaying()
        return lin(x).sum()

    def outer(y):
        F = ad.record(g, np.ones((4, 3)), tensor=True)
        seen["after"] = _backend_of_new()
        x1 = np.arange(12.0).reshape(4, 3)
        seen["replayed"] = F(x1)
        seen["expected"] = float((x1 @ np.asarray(lin.weight).T + np.asarray(lin.bias)).sum())
        return y * 2.0

    assert ad.eval_shape(outer, (3,)) == ad.ShapeDtype((3,))
    # eval_shape's frame has no values, so it covers the recording's constants too; the
    # module's parameters are the recording's inputs, which replay with real values
    assert seen["constant"] == "MetaBackend" and seen["after"] == "MetaBackend"
    assert seen["replaying"] is True
    assert seen["replayed"] == pytest.approx(seen["expected"], rel=1e-14)
    assert _backend_of_new() == "NumpyBackend"


def test_an_exception_closes_its_frame():
    def boom(x):
        assert _backend_of_new() in ("MetaBackend", "ProgramBackend")
        raise KeyError("boom")

    with pytest.raises(KeyError, match="boom"):
        ad.eval_shape(boom, (3,))
    assert _interpreters.new_tensor_backend() is None
    with pytest.raises(KeyError, match="boom"):
        ad.record(boom, np.ones(3), tensor=True)
    assert _interpreters.new_tensor_backend() is None and not _interpreters.replaying()
    seen = []

    def f(x):
        with pytest.raises(KeyError):
            ad.eval_shape(boom, (3,))      # caught inside the recording: its frame stays
        seen.append(_backend_of_new())
        return (2.0 * x).sum()

    F = ad.record(f, np.ones(3), tensor=True)
    assert seen == ["ProgramBackend"]
    assert F(np.array([1.0, 2.0, 4.0])) == pytest.approx(14.0, rel=1e-15)
    assert _backend_of_new() == "NumpyBackend"


def test_frames_stay_in_their_thread():
    import contextvars
    import threading
    seen = {}

    def look(key):
        seen[key] = (_backend_of_new(), _interpreters.replaying())

    def run_in_thread(key):
        th = threading.Thread(target=look, args=(key,))
        th.start()
        th.join()

    def shapes(y):
        run_in_thread("eval_shape thread")
        look("eval_shape here")
        contextvars.copy_context().run(look, "eval_shape copied context")
        return y

    def recorded(x):
        run_in_thread("record thread")
        look("record here")
        return x.sum()

    ad.eval_shape(shapes, (2,))
    ad.record(recorded, np.ones(2), tensor=True)
    assert seen == {"eval_shape thread": ("NumpyBackend", False),
                    "eval_shape here": ("MetaBackend", False),
                    "eval_shape copied context": ("MetaBackend", False),
                    "record thread": ("NumpyBackend", False),
                    "record here": ("ProgramBackend", True)}


class Marking(_interpreters.Interpreter):
    """A third transform's interpreter: evaluates eagerly; its backend marks its tensors."""

    name = "marking"


class _MarkBackend(NumpyBackend):
    interpreter = Marking()


def test_a_third_interpreter_is_honoured_by_every_tensor_constructor():
    from easyad.tensor import _devices
    be = _MarkBackend(_devices.resolve("numpy").device)
    x0 = np.array([[0.5, -1.0], [2.0, 3.0]])
    lin = ad.nn.Linear(2, 3)
    lst = ad.WengertList()
    with _interpreters.interpreting(be) as frame:
        assert frame.target is be and _interpreters.new_tensor_backend() is be
        trace = ad.TraceTensor.variable(x0, np.ones_like(x0))
        made = {
            "constant": ad.Tensor.constant(x0),
            "constant float32": ad.Tensor.constant(x0, dtype=np.float32),
            "constant on a named device": ad.Tensor.constant(x0, device="numpy"),
            "variable": ad.Tensor.variable(x0, lst),
            "transform input": ad.Tensor._input(x0, lst),
            "trace value": trace._value, "trace tangent": trace._tangent,
            "trace constant": ad.TraceTensor.constant(x0)._value,
            "parameter (variable)": lin.weight.tensor(lst),
            "parameter (constant)": lin.bias.tensor(None),
        }
        out = lin(made["variable"])        # a module's forward: its operations stay there
        # a frame without values inside it still wins (nothing inside eval_shape has any)
        inner = ad.eval_shape(lambda y: ad.Tensor.constant(x0) + y, (2, 2))
        assert inner == ad.ShapeDtype((2, 2))
    for what, t in made.items():
        assert t._backend is be, what
    assert out._backend is be
    w, b = np.asarray(lin.weight), np.asarray(lin.bias)
    np.testing.assert_allclose(out.value, x0 @ w.T + b, rtol=1e-15)
    np.testing.assert_allclose(made["constant float32"].value, x0.astype(np.float32))
    # derivatives through the marked tensors: d sum(lin(x)) / dx = column sums of w
    d = out.sum().derivatives()
    np.testing.assert_allclose(d[made["variable"]], np.tile(w.sum(axis=0), (2, 1)),
                               rtol=1e-15)
    # the frame is closed: the device's own backend again
    assert type(ad.Tensor.constant(x0)._backend) is NumpyBackend


def test_frames_nest_innermost_first():
    from easyad.tensor import _devices
    be = _MarkBackend(_devices.resolve("numpy").device)
    recorder = ProgramBackend(_devices.resolve("numpy"), Program())
    with _interpreters.interpreting(recorder):
        with _interpreters.interpreting(be):
            # an outer frame with values yields to the inner one for new tensors ...
            assert _interpreters.new_tensor_backend() is be
            # ... while the open recording is still found, and still replaying
            assert _interpreters.innermost(ProgramBackend) is recorder
            assert _interpreters.replaying() and _interpreters.new_tensors_have_values()
            with _interpreters.interpreting(META):
                assert _interpreters.new_tensor_backend() is META
                assert not _interpreters.new_tensors_have_values()
                with _interpreters.interpreting(be) as frame:
                    assert frame.target is META          # no values inside eval_shape
                assert _interpreters.innermost(_MarkBackend) is be
            assert _interpreters.new_tensor_backend() is be
        assert _interpreters.new_tensor_backend() is recorder
    assert _interpreters.new_tensor_backend() is None
    assert _interpreters.innermost(ProgramBackend) is None
    assert not _interpreters.replaying() and _interpreters.new_tensors_have_values()


# ---- backends are typed by the Protocol ----

BACKEND_NAMES = {"be", "backend", "_backend"}


def untyped_backends(source: str, filename: str = "<source>") -> list[str]:
    """Where a parameter or an attribute named be/backend/_backend is annotated ``Any``
    (mypy then checks nothing done with it: type it ``Backend`` or the backend class)."""
    found = []
    for node in ast.walk(ast.parse(source, filename)):
        if isinstance(node, ast.arg):
            name, annotation = node.arg, node.annotation
        elif isinstance(node, ast.AnnAssign):
            target = node.target
            name = target.attr if isinstance(target, ast.Attribute) else \
                getattr(target, "id", "")
            annotation = node.annotation
        else:
            continue
        if name in BACKEND_NAMES and isinstance(annotation, ast.Name) and \
                annotation.id == "Any":
            found.append(f"{filename}:{node.lineno}")
    return found


def test_the_typing_scan_finds_an_untyped_backend():
    assert len(untyped_backends("def f(be: Any, x: Any) -> None: pass")) == 1
    assert len(untyped_backends("class A:\n    _backend: Any\n")) == 1
    assert len(untyped_backends("def g(self):\n    self.backend: Any = None\n")) == 1
    assert not untyped_backends("def f(be: Backend, data: Any, backend: OpenCLBackend): pass")


def test_backends_are_typed_by_the_protocol():
    # the compiled core's stub keeps Any: the core sits below the tensor layer
    found = []
    for path in sorted(PACKAGE.rglob("*.py")):
        if "_generated" not in path.parts:
            found += untyped_backends(path.read_text(encoding="utf-8"), str(path))
    assert not found, "type backends with tensor._backend.Backend: " + ", ".join(found)


def test_a_transform_at_a_constant_point_inside_a_recording():
    # ad.grad at a numpy point inside ad.record: its input and g's own constants must land
    # on the recording's backend alike (its input once took the host's fast path and met
    # g's constant on another backend: "tensors on different devices (numpy and numpy)")
    c = np.array([1.0, 2.0, 3.0])

    def g(x):
        return ad.sum(x * x * ad.Tensor.constant(c))

    def f(y):
        return ad.sum(y * ad.grad(g)(np.ones(3)))        # grad = 2 c at ones

    F = ad.record(f, np.arange(3.0), tensor=True)
    for y in (np.array([1.0, 2.0, 5.0]), np.array([-0.5, 4.0, 0.25])):
        assert F(y) == pytest.approx(float(np.dot(y, 2.0 * c)), rel=1e-15)
        assert np.allclose(F.gradient(y), 2.0 * c, rtol=1e-15)
