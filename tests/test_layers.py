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
             "easyad.tensor._backend", "easyad.tensor._composed",
             # the OpenCL backend and its parts (issue 25's split)
             "easyad.tensor._opencl", "easyad.tensor._cl_memory", "easyad.tensor._cl_matmul",
             "easyad.tensor._cl_errors", "easyad.tensor._kernels", "easyad.tensor._kernels_matmul"]
    above = {"easyad.tensor._tensor", "easyad.tensor._trace", "easyad.tensor._functions"}
    for name in below:
        assert not graph[name] & above, (name, graph[name] & above)



# A class split over modules (issue 25: no hand-written file over ~600 lines): the module
# that holds the class, and the parts it is assembled from (mixins, helpers). A part sits
# below its class: it never imports the class's module, directly or through others.
SPLIT_CLASSES = {
    "easyad.replay": ["easyad.recorded.rows", "easyad.recorded.hessians",
                      "easyad.recorded.compiling", "easyad.recorded.devices",
                      "easyad.recorded.files"],
    "easyad._recorded": ["easyad.recorded.tensor_recording", "easyad.recorded.tensor_inputs",
                         "easyad.recorded.tensor_batches"],
    "easyad.functional": ["easyad._evaluation", "easyad._forward_mode",
                          "easyad._reverse_mode"],
    "easyad.tensor._opencl": ["easyad.tensor._cl_memory", "easyad.tensor._cl_matmul",
                              "easyad.tensor._cl_errors", "easyad.tensor._kernels_matmul"],
}


def _reaches(graph: dict[str, set[str]], start: str) -> set[str]:
    seen: set[str] = set()
    todo = [start]
    while todo:
        for nxt in graph.get(todo.pop(), ()):
            if nxt not in seen:
                seen.add(nxt)
                todo.append(nxt)
    return seen


def test_the_parts_of_a_split_class_sit_below_it():
    graph = module_graph()
    for home, parts in SPLIT_CLASSES.items():
        assert set(parts) <= _reaches(graph, home), home    # it is assembled from them
        for part in parts:
            assert home not in _reaches(graph, part), (part, home)
    # the recorded functions' parts sit below both classes and the transforms
    for name in graph:
        if name.startswith("easyad.recorded."):
            assert not _reaches(graph, name) & {"easyad.replay", "easyad._recorded",
                                                "easyad.functional", "easyad"}, name


def test_a_split_class_still_has_every_method_in_one_place():
    # the class and the mixins of its split define no method twice (the order of the
    # bases would then decide which runs); other bases (ComposedKernels) may be overridden
    import easyad as ad
    from easyad.tensor._opencl import OpenCLBackend
    for cls in (ad.Function, ad.TensorFunction, OpenCLBackend):
        own = {cls.__module__, *SPLIT_CLASSES[cls.__module__]}
        seen: dict[str, type] = {}
        for base in cls.__mro__[:-1]:
            if base.__module__ not in own:
                continue
            for name, member in vars(base).items():
                if callable(member) and not name.startswith("__"):
                    assert name not in seen, (cls.__name__, name, seen.get(name), base)
                    seen[name] = base
    assert ad.Function.hessian.__module__ == "easyad.recorded.hessians"
    assert ad.record.__module__ == ad.Function.__module__ == ad.load.__module__ == \
        "easyad.replay"


def test_every_part_of_the_compiled_core_is_included():
    # each hand-written .pxi under _engine/ is included by _core.pyx (a split part left
    # out would be dead text, or a build error far from its cause), once
    core = (PACKAGE / "_core.pyx").read_text()
    included = re.findall(r'^include "([^"]+)"', core, re.M)
    assert len(included) == len(set(included))
    for part in sorted((PACKAGE / "_engine").rglob("*.pxi")):
        name = part.relative_to(PACKAGE).as_posix()
        # the replay parts are included by their own hub, replay/*.pxi by _core.pyx too
        assert name in included, f"{name} is not included by easyad/_core.pyx"


# ---- no hand-written file over ~600 lines (issue 25) ----

MAX_LINES = 650
SIZED_SUFFIXES = (".py", ".pyx", ".pxi", ".pxd", ".h")
# Files still over the limit, each waiting for a split that another change owns; the lead
# removes an entry once that change is merged (the test fails when an entry is no longer
# over, so the list cannot go stale).
OVER_LIMIT = {
    # the core's C fast paths of the structural operations (the numpy lowering of the op
    # table's reshape, transpose, sum, getitem, matmul): to split along those ops
    "easyad/_engine/structural.pxi",
}


def _generated(path: Path) -> bool:
    head = path.read_text(encoding="utf-8", errors="replace").splitlines()[:3]
    return any("GENERATED" in line for line in head)


def _hand_written() -> list[Path]:
    return sorted(p for p in PACKAGE.rglob("*") if p.suffix in SIZED_SUFFIXES
                  and "_generated" not in p.relative_to(PACKAGE).parts and p.is_file()
                  and not _generated(p))


def test_no_hand_written_file_is_over_the_limit():
    sizes = {p.relative_to(ROOT).as_posix(): len(p.read_text(encoding="utf-8").splitlines())
             for p in _hand_written()}
    assert "easyad/replay.py" in sizes and "easyad/_engine/tape.pxi" in sizes
    over = {name: n for name, n in sizes.items() if n > MAX_LINES}
    unknown = {name: n for name, n in over.items() if name not in OVER_LIMIT}
    assert not unknown, (f"hand-written files over {MAX_LINES} lines: {unknown}; split them "
                         f"along their seams (docs/internals.md, 'The map of the package')")
    stale = sorted(name for name in OVER_LIMIT if name not in over)
    assert not stale, f"no longer over {MAX_LINES} lines: remove {stale} from OVER_LIMIT"


def test_the_size_check_sees_generated_banners(tmp_path):
    written = tmp_path / "written.py"
    written.write_text("x = 1\n" * 3)
    made = tmp_path / "made.py"
    made.write_text("# GENERATED from easyad/_rules.py by codegen/, do not edit\nx = 1\n")
    assert not _generated(written) and _generated(made)


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


def _mapped_paths(section: str | None = None) -> set[str]:
    """The paths (relative to easyad/) that docs/internals.md's map of the package names:
    a bullet's backticked file names, under the directory it opens with (``ops/``: ...)."""
    if section is None:
        text = (ROOT / "docs" / "internals.md").read_text(encoding="utf-8")
        section = text.split("## The map of the package", 1)[1].split("\n## ", 1)[0]
    named: set[str] = set()
    for line in section.splitlines():
        if not line.startswith("- "):
            continue
        tokens = re.findall(r"`([^`]+)`", line)
        prefix = tokens[0] if line.startswith("- ") and tokens[0].endswith("/") else ""
        for token in tokens:
            if token.endswith("/"):
                named.add(token + "__init__.py")
            elif token.endswith(SIZED_SUFFIXES):
                named.add(token if "/" in token else prefix + token)
    return named


def test_the_map_of_the_package_names_every_file():
    # docs/internals.md, "The map of the package": one line per file, none stale
    named = _mapped_paths()
    files = {p.relative_to(PACKAGE).as_posix() for p in _hand_written()}
    missing = sorted(files - named)
    assert not missing, f"docs/internals.md's map of the package does not name {missing}"
    stale = sorted(n for n in named - files if not (PACKAGE / n).exists()
                   and not n.endswith("__init__.py"))
    assert not stale, f"docs/internals.md's map names files that do not exist: {stale}"


def _map_layers() -> list[tuple[str, set[str]]]:
    """docs/internals.md's map of the package as layers, bottom first: each bold heading
    opens a layer, whose modules are the files its bullets name."""
    text = (ROOT / "docs" / "internals.md").read_text(encoding="utf-8")
    section = text.split("## The map of the package", 1)[1].split("\n## ", 1)[0]
    layers: list[tuple[str, set[str]]] = []
    for block in re.split(r"\n(?=\*\*)", section)[1:]:
        title = block[2:block.index("**", 2)]
        named = _mapped_paths(block)
        modules = {_module_name(PACKAGE / n) for n in named
                   if n.endswith((".py", ".pyx")) and (PACKAGE / n).exists()}
        layers.append((title, modules))
    return layers


def test_the_map_of_the_package_is_its_layers():
    # a module imports only modules of its own layer of the map or of the layers before it
    layers = _map_layers()
    assert [t for t, _ in layers][:3] == ["Tables", "Engine", "Devices"], layers
    rank = {m: k for k, (_, modules) in enumerate(layers) for m in modules}
    graph = module_graph()
    assert set(graph) - set(rank) <= {m for m in graph if m.startswith("easyad._generated")}
    upward = sorted(f"{m} ({layers[rank[m]][0]}) imports {n} ({layers[rank[n]][0]})"
                    for m, edges in graph.items() if m in rank
                    for n in edges if n in rank and rank[n] > rank[m])
    assert not upward, "imports against the map's layers:\n" + "\n".join(upward)
