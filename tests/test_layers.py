"""The layers of easyad: imports run one way (no cycle anywhere in the package, and the
compiled core imports no layer above it), nn uses only the public
tensor API, the backends conform to the Backend Protocol, and the generated rule methods
are up to date and visible to mypy.

Import graph (``module_graph``): read with ``ast`` from the sources, so nothing is
imported. Every ``import`` of an easyad module is an edge, at module level or inside a
function (a function-local import loads lazily, which is allowed, but it is still a
dependency and so cannot hide a cycle); imports under ``if TYPE_CHECKING:`` are left out
(they never run). ``from P import n`` is an edge to the module ``P.n`` when that is a
module, else to ``P`` (its ``__init__``). The implicit import of a module's parent
packages is not an edge: a package's ``__init__`` sits above its modules and re-exports
them. The compiled core (``.pyx``) is read with a regular expression, together with its
``.pxi`` parts.

``CHECKED`` names the packages whose modules may sit on no cycle (all of easyad); a cycle
that must wait for its fix would be listed in ``KNOWN_CYCLES``.
"""
from __future__ import annotations

import ast
import re
import importlib.util
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "easyad"

CHECKED = ("easyad",)
# cycles through CHECKED modules that are known and waiting for their fix (frozensets of
# module names); none today
KNOWN_CYCLES: set[frozenset[str]] = set()


# ---- the import graph ----

def _module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _modules() -> dict[str, Path]:
    """Every easyad module: the Python sources, and the compiled ones (their imports unread)."""
    found = {_module_name(p): p for p in sorted(PACKAGE.rglob("*.pyx"))}
    found.update({_module_name(p): p for p in sorted(PACKAGE.rglob("*.py"))})
    return found


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING"
            or isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")


def _imports(tree: ast.AST, module: str, is_package: bool):
    """(imported module, name or None) for every import statement outside
    ``if TYPE_CHECKING:`` blocks, with relative imports resolved."""
    def visit(node: ast.AST):
        if isinstance(node, ast.If) and _is_type_checking(node.test):
            for child in node.orelse:
                yield from visit(child)
            return
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield alias.name, None
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                package = module if is_package else module.rpartition(".")[0]
                for _ in range(node.level - 1):
                    package = package.rpartition(".")[0]
                base = f"{package}.{base}" if base else package
            for alias in node.names:
                yield base, alias.name
        for child in ast.iter_child_nodes(node):
            yield from visit(child)
    yield from visit(tree)


_CYTHON_IMPORT = re.compile(r"^\s*(?:from\s+(easyad[\w.]*)\s+c?import\s+([\w, ()]+)"
                            r"|c?import\s+(easyad[\w.]*))", re.M)


def _cython_imports(pyx: Path):
    """(module, name) of every easyad import in a .pyx and the .pxi files beside it (Cython
    is not Python: read with a regular expression; function-local imports count too)."""
    for source in [pyx, *sorted(pyx.parent.rglob("*.pxi"))]:
        for m in _CYTHON_IMPORT.finditer(source.read_text()):
            if m.group(3):
                yield m.group(3), None
            else:
                for name in m.group(2).replace("(", " ").replace(")", " ").split(","):
                    yield m.group(1), name.strip() or None


def module_graph() -> dict[str, set[str]]:
    """easyad module -> the easyad modules it imports."""
    modules = _modules()
    graph: dict[str, set[str]] = {}
    for name, path in modules.items():
        edges = graph.setdefault(name, set())
        if path.suffix == ".pyx":   # Cython: its own imports and those of its .pxi parts
            found = _cython_imports(path)
        else:
            found = _imports(ast.parse(path.read_text(), str(path)), name,
                             path.name == "__init__.py")
        for base, imported in found:
            if not base.startswith("easyad"):
                continue
            target = f"{base}.{imported}" if imported and f"{base}.{imported}" in modules \
                else base
            if target in modules and target != name:
                edges.add(target)
    return graph


def cycles(graph: dict[str, set[str]]) -> list[frozenset[str]]:
    """The strongly connected components of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[frozenset[str]] = []

    def connect(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph.get(v, ())):
            if w not in index:
                connect(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = set()
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.add(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(frozenset(component))

    for v in sorted(graph):
        if v not in index:
            connect(v)
    return found


def _checked(module: str) -> bool:
    return any(module == p or module.startswith(p + ".") for p in CHECKED)


def test_the_cycle_finder_finds_cycles():
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}, "e": set()}
    assert cycles(graph) == [frozenset({"a", "b", "c"})]
    assert cycles({"a": {"b"}, "b": set()}) == []


def test_the_graph_reads_imports():
    graph = module_graph()
    assert "easyad.tensor._base" in graph["easyad.tensor._tensor"]
    assert "easyad.tensor._structural" in graph["easyad.tensor._tensor"]
    assert "easyad.tensor._numpy" in graph["easyad.tensor._devices"]   # a lazy import
    assert "easyad.tensor" in graph["easyad.nn._parameter"]             # the package's API


def test_no_import_cycles_in_the_checked_packages():
    found = [c for c in cycles(module_graph()) if any(_checked(m) for m in c)]
    unknown = [sorted(c) for c in found if c not in KNOWN_CYCLES]
    assert not unknown, f"import cycles: {unknown}"


def test_no_module_of_the_tensor_layer_imports_its_package():
    # `from easyad.tensor import X` inside easyad.tensor would run the package's __init__,
    # the top of the layer, from below it
    graph = module_graph()
    for name, edges in graph.items():
        if name.startswith("easyad.tensor."):
            assert "easyad.tensor" not in edges, name


def test_the_tensor_operations_sit_below_the_tensor_class():
    graph = module_graph()
    below = ["easyad.tensor._base", "easyad.tensor._elementwise", "easyad.tensor._structural",
             "easyad.tensor._fused", "easyad.tensor._generic", "easyad._generated.tensor_methods",
             "easyad.tensor._backend", "easyad.tensor._composed"]
    above = {"easyad.tensor._tensor", "easyad.tensor._trace", "easyad.tensor._functions"}
    for name in below:
        assert not graph[name] & above, (name, graph[name] & above)


# ---- nn uses the tensor layer's public API only ----

def _nn_sources():
    for package in ("nn", "optim"):
        yield from sorted((PACKAGE / package).rglob("*.py"))


@pytest.mark.parametrize("path", list(_nn_sources()), ids=lambda p: p.name)
def test_nn_uses_only_public_tensor_names(path):
    tree = ast.parse(path.read_text())
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module and \
                node.module.startswith("easyad.tensor"):
            assert node.module == "easyad.tensor", f"{path.name} imports {node.module}"
            for alias in node.names:
                assert not alias.name.startswith("_"), f"{path.name} imports {alias.name}"
        if isinstance(node, ast.Import):
            for alias in node.names:
                assert not alias.name.startswith("easyad.tensor."), alias.name
        if isinstance(node, ast.Attribute):
            # a tensor's private state, or a branch on the kind of its device
            assert node.attr not in ("_data", "_backend", "_index", "_tape", "_generation"), \
                f"{path.name}:{node.lineno} reads .{node.attr}"
            assert not (node.attr == "kind" and isinstance(node.value, ast.Attribute)
                        and node.value.attr == "device"), f"{path.name}:{node.lineno}"


# ---- the Backend Protocol ----

def _backends():
    from easyad.tensor import _devices
    from easyad.tensor._meta import META
    found = [("meta", META), ("numpy", _devices.resolve("numpy"))]
    try:
        found.append(("opencl", _devices.resolve("opencl")))
    except Exception:   # no OpenCL device here: the other two are still checked
        pass
    return found


def test_every_backend_conforms_at_run_time():
    from easyad.tensor._backend import Backend
    found = _backends()
    assert {kind for kind, _ in found} >= {"meta", "numpy"}
    for kind, backend in found:
        assert isinstance(backend, Backend), kind
        assert backend.kind == kind


def test_a_class_missing_a_member_does_not_conform():
    from easyad.tensor._backend import Backend
    from easyad.tensor._meta import MetaBackend
    members = [n for n in vars(Backend) if not n.startswith("_")]
    assert {"map", "matmul", "scatter_add", "cross_entropy", "live_buffers"} <= set(members)
    for missing in members:
        partial = type("Partial", (), {n: getattr(MetaBackend, n) for n in members
                                       if n != missing})
        assert not isinstance(partial(), Backend), missing
    assert isinstance(type("Whole", (), {n: getattr(MetaBackend, n) for n in members})(),
                      Backend)


def test_the_fused_kernels_agree_on_every_backend(rng):
    z = rng.standard_normal((5, 4)) * 3.0
    z[2, :] = [1e300, 1.0, 2.0, 3.0]            # a huge logit: shifted, stays finite
    target = np.array([0, 3, 0, 1, 2])
    shift = np.max(z, axis=1, keepdims=True)
    expected = np.sum(np.log(np.sum(np.exp(z - shift), axis=1)) + shift[:, 0]
                      - z[np.arange(5), target]) / 5.0
    p = np.exp(z - shift) / np.sum(np.exp(z - shift), axis=1, keepdims=True)
    p[np.arange(5), target] -= 1.0
    for kind, be in _backends():
        buf = be.asarray(z, np.float64)
        loss, saved = be.cross_entropy(buf, target, 5.0)
        g = be.cross_entropy_vjp(saved, target, 0.5)
        if kind == "meta":
            assert loss.shape == () and g.shape == (5, 4)
            continue
        assert float(be.to_numpy(loss)) == pytest.approx(expected, rel=1e-12), kind
        np.testing.assert_allclose(be.to_numpy(g), 0.5 * p, rtol=1e-12, atol=1e-15)
        x, w, bias, g2 = (rng.standard_normal(s) for s in ((3, 2), (4, 2), (4,), (3, 4)))
        out = be.linear(be.asarray(x, np.float64), be.asarray(w, np.float64),
                        be.asarray(bias, np.float64))
        np.testing.assert_allclose(be.to_numpy(out), x @ w.T + bias, rtol=1e-12)
        gx, gw, gb = be.linear_vjp(be.asarray(g2, np.float64), be.asarray(x, np.float64),
                                   be.asarray(w, np.float64), (True, True, True))
        for got, want in ((gx, g2 @ w), (gw, g2.T @ x), (gb, g2.sum(axis=0))):
            np.testing.assert_allclose(be.to_numpy(got), want, rtol=1e-12)
        a, b = rng.standard_normal((1, 3, 2)), rng.standard_normal((1, 3, 4))
        out = be.to_numpy(be.matmul(be.asarray(a, np.float64), be.asarray(b, np.float64),
                                    transpose_a=True))
        np.testing.assert_allclose(out[0], a[0].T @ b[0], rtol=1e-12)


def test_every_backend_conforms_for_mypy(tmp_path):
    pytest.importorskip("mypy")
    snippet = tmp_path / "backends.py"
    snippet.write_text(textwrap.dedent("""\
        from easyad.tensor._backend import Backend
        from easyad.tensor._meta import MetaBackend
        from easyad.tensor._numpy import NumpyBackend
        from easyad.tensor._opencl import OpenCLBackend


        def conforming(n: NumpyBackend, o: OpenCLBackend, m: MetaBackend) -> list[Backend]:
            return [n, o, m]
        """))
    result = _mypy("--follow-imports=silent", "--ignore-missing-imports", str(snippet))
    assert result.returncode == 0, result.stdout + result.stderr


# ---- the rule-table methods: generated, current, visible ----

def test_the_generated_files_are_current():
    # every file of easyad/_generated is what codegen/ renders from the table now (a table
    # edited without a rebuild leaves them, and the core, stale)
    result = subprocess.run([sys.executable, "-m", "codegen", "--check"], cwd=ROOT,
                            capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stdout + result.stderr
    for path in (ROOT / "easyad" / "_generated").iterdir():
        if path.is_file():
            assert "GENERATED" in path.read_text().splitlines()[0], path


def test_every_rule_has_its_methods_on_both_tensor_classes():
    import easyad as ad
    from easyad import _rules
    from easyad._generated.tensor_methods import RuleMethods
    for rule in _rules.RULES:
        names = [rule.name, *rule.aliases]
        if rule.arity == 2:
            names += [f"_r{n}" for n in names]
        if rule.operator:
            names.append(f"__{rule.operator}__")
            if rule.arity == 2:
                names.append(f"__r{rule.operator}__")
        for name in names:
            assert name in vars(RuleMethods), name     # in the class body, not setattr
            for cls in (ad.Tensor, ad.TraceTensor):
                if name == "detach":
                    # the tensors' own detach (a constant of the same storage, nothing
                    # recorded) comes first; ad.stop_gradient(t) is the rule's
                    assert getattr(cls, name) is not vars(RuleMethods)[name], cls
                    continue
                assert getattr(cls, name) is vars(RuleMethods)[name], (cls, name)
    x = ad.Tensor.constant(np.array([0.5, 2.0]))
    np.testing.assert_allclose(x.hypot(1.0).value, np.hypot([0.5, 2.0], 1.0))
    np.testing.assert_allclose((2.0 ** x).value, 2.0 ** np.array([0.5, 2.0]))
    t = ad.TraceTensor.variable(np.array([0.5, 2.0]))
    np.testing.assert_allclose(t.arctan().tangent, 1.0 / (1.0 + np.array([0.25, 4.0])))


def test_tensor_methods_type_check(tmp_path):
    pytest.importorskip("mypy")
    snippet = tmp_path / "methods.py"
    snippet.write_text(textwrap.dedent("""\
        import numpy as np

        import easyad as ad
        from easyad.tensor import Tensor, TraceTensor


        def f(t: Tensor) -> Tensor:
            return (t.sin() * 2.0 + t.exp()).hypot(t).arcsin()


        def g(t: TraceTensor) -> TraceTensor:
            return -t.tanh() ** 2.0


        def h(t: Tensor) -> None:
            t.no_such_method()  # E: attr-defined
        y = f(ad.Tensor.constant(np.ones(2)))
        """))
    result = _mypy("--strict", "--follow-imports=silent", "--ignore-missing-imports",
                   str(snippet))
    lines = [line for line in result.stdout.splitlines() if ": error:" in line]
    assert len(lines) == 1 and "no_such_method" in lines[0] and "attr-defined" in lines[0], \
        result.stdout + result.stderr


def _mypy(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "mypy", "--no-incremental",
                           "--cache-dir", "/dev/null", *args], cwd=ROOT, capture_output=True,
                          text=True, timeout=600)


def test_the_compiled_core_imports_no_layer_above_it():
    # the layers above register what the core calls (anomaly reports, DOT, create_graph,
    # the Primitive class) through _core._register_service at their import
    assert module_graph()["easyad._core"] <= {"easyad.errors", "easyad._rules"}


def test_the_generator_loads_the_table_without_the_package():
    # codegen/table.py imports easyad/_rules.py and _expr.py without running easyad's
    # __init__ (the build has no core yet) and leaves sys.path and sys.modules as they were
    spec = importlib.util.spec_from_file_location("_codegen_table", ROOT / "codegen" / "table.py")
    table = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(table)
    import easyad._expr
    import easyad._rules
    path, modules = list(sys.path), dict(sys.modules)
    rules, expr = table.load()
    assert sys.path == path and sys.modules == modules
    assert rules is not easyad._rules and expr is not easyad._expr   # fresh copies
    assert [r.name for r in rules.RULES] == [r.name for r in easyad._rules.RULES]
    assert expr.render("sin(x) / x", "c") == easyad._expr.render("sin(x) / x", "c")
