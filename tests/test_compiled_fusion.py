"""Loop fusion in the compiled tape (``easyad/compiler/tape/fusion.py``): consecutive loops
of one trip count become one loop only where every element two of them touch is reached in
the order the separate loops reached it. The rules are checked on hand-made pieces (each
verdict derived by hand from the iterations that touch an element), and end to end: fused
programs give the VM's values and gradients bit for bit, with fewer loops in their C."""
import numpy as np
import pytest

import easyad as ad
from easyad.compiler import tape as tape_compiler
from easyad.compiler.tape import fusion, library
from easyad.compiler.tape.fusion import Access, Piece, fuse

needs_cc = pytest.mark.skipif(tape_compiler.compiler() is None,
                              reason="no C compiler on this machine")


@pytest.fixture(scope="module", autouse=True)
def cache(module_cache):
    return module_cache


def piece(name, count, *accesses, down=False, checked=False, tag=""):
    return Piece(count, name, tuple(Access(*a) for a in accesses), down=down,
                 checked=checked, tag=tag)


def head(count, down):
    return f"for<{count}{'v' if down else '^'}>"


def alone(p):
    return f"[{p.body}]"


def wrap(tag, text):
    return f"if({tag}){text}" if tag else text


def run(*items):
    return fuse(list(items), head, alone, wrap)


def test_reading_what_the_same_iteration_wrote_fuses():
    # B reads v[10 + j], which A wrote at the same j (A first): legal, one loop
    a = piece("A", 9, ("v", 0, 1, False), ("v", 10, 1, True))
    b = piece("B", 9, ("v", 10, 1, False), ("v", 1, 1, False), ("v", 28, 1, True))
    assert run(a, b) == ["    { for<9^> { A B } }\n"]


def test_reading_ahead_of_the_earlier_loop_does_not_fuse():
    # B at j reads v[11 + j], which A writes only at iteration j + 1: after B would read it
    a = piece("A", 9, ("v", 10, 1, True))
    b = piece("B", 9, ("v", 11, 1, False), ("v", 30, 1, True))
    assert run(a, b) == ["[A]", "[B]"]
    # reading behind (v[9 + j]: A's iteration j - 1, already done) is legal
    c = piece("C", 9, ("v", 9, 1, False), ("v", 30, 1, True))
    assert run(a, c) == ["    { for<9^> { A C } }\n"]


def test_an_element_read_at_every_iteration_does_not_fuse_with_its_writer():
    # B reads v[12] at every j; A writes it at j = 2 only
    a = piece("A", 9, ("v", 10, 1, True))
    b = piece("B", 9, ("v", 12, 0, False), ("v", 30, 1, True))
    assert run(a, b) == ["[A]", "[B]"]
    # an element no piece writes may be read at every iteration
    c = piece("C", 9, ("v", 5, 0, False), ("v", 30, 1, True))
    assert len(run(a, c)) == 1


def test_reverse_loops_follow_their_downward_order(monkeypatch):
    monkeypatch.setattr(fusion, "REVERSE_FROM", 0)
    # Rosenbrock's reverse sweep: R3 stores a[1 + j]; R4 adds to a[0 + j]. Element e is
    # R3's at j = e - 1 and R4's at j = e: going down, R4 reaches it first: no fusion
    r3 = piece("R3", 9, ("a", 28, 1, False), ("a", 1, 1, True), ("a", 10, 1, True), down=True)
    r4 = piece("R4", 9, ("a", 19, 1, False), ("a", 0, 1, True), down=True)
    assert run(r3, r4) == ["[R3]", "[R4]"]
    # R5 adds to the same a[0 + j] after R4 at the same j: the sums keep their order
    r5 = piece("R5", 9, ("a", 10, 1, False), ("a", 0, 1, True), down=True)
    assert run(r4, r5) == ["    { for<9v> { R4 R5 } }\n"]
    # an adjoint that collects every iteration (a[3] += ...) fuses with nothing touching it
    r6 = piece("R6", 9, ("a", 3, 0, True), down=True)
    assert run(r4, r6) == ["[R4]", "[R6]"]
    # reverse loops shorter than REVERSE_FROM stay apart (gcc peels each: faster per call)
    monkeypatch.setattr(fusion, "REVERSE_FROM", 10)
    assert run(r4, r5) == ["[R4]", "[R5]"]


def test_counts_tags_statements_and_the_cap_separate_groups():
    a = piece("A", 9, ("v", 10, 1, True))
    assert run(a, piece("B", 8, ("v", 30, 1, True))) == ["[A]", "[B]"]
    assert run(a, piece("B", 9, ("v", 30, 1, True), tag="all")) == ["[A]", "[B]"]
    assert run(a, "    x;\n", piece("B", 9, ("v", 30, 1, True))) == ["[A]", "    x;\n", "[B]"]
    many = [piece(f"P{k}", 9, ("v", 100 + 9 * k, 1, True)) for k in range(fusion.MOST + 1)]
    assert len(run(*many)) == 2
    checked = piece("B", 9, ("v", 30, 1, True), checked=True, tag="all")
    text = run(piece("A", 9, ("v", 10, 1, True), tag="all"), checked)
    assert text == ["if(all)    { double bad = 0.0; for<9^> { A B } if (bad != 0.0) "
                    "flags |= 2; }\n"]


def test_a_longer_run_is_cut_into_pieces_of_the_loop_s_count():
    a = piece("A", 9, ("v", 10, 1, True))
    long = piece("L", 18, ("v", 10, 1, False), ("v", 40, 1, True))
    long.split = lambda m: [piece(f"L{k}", m, ("v", 10 + k, 1, False), ("v", 40 + k, 1, True))
                            for k in range(0, 18, m)]
    assert run(a, long) == ["    { for<9^> { A L0 L9 } }\n"]
    # a piece that would read ahead keeps the run whole, in a loop of its own
    long.split = lambda m: [piece(f"L{k}", m, ("v", 11 + k, 1, False), ("v", 40 + k, 1, True))
                            for k in range(0, 18, m)]
    assert run(a, long) == ["[A]", "[L]"]


def _shifts(x):
    s = 0.0
    for i in range(len(x) - 2):
        s = s + ad.sin(x[i]) * x[i + 1] + ad.exp(x[i + 2] - x[i]) / (1.5 + x[i + 1] ** 2)
    return s


def _rosenbrock(x):
    s = 0.0
    for i in range(len(x) - 1):
        s = s + 100 * (x[i + 1] - x[i] ** 2) ** 2 + (1 - x[i]) ** 2
    return s


def _sources(f, x0, most):
    """The C of f's compiled program with fusion.MOST = most (gcc not run)."""
    made = []
    saved, build = fusion.MOST, library.build
    fusion.MOST = most
    library.build = lambda source, *args, **kwargs: made.append(source)
    try:
        ad.record(f, x0).compile()
    finally:
        fusion.MOST, library.build = saved, build
    return made[0]


@needs_cc
@pytest.mark.parametrize("f, n", [(_rosenbrock, 10), (_rosenbrock, 37), (_shifts, 12)])
def test_fused_programs_equal_the_vm_bit_for_bit(f, n):
    rng = np.random.default_rng(n)
    x0 = rng.uniform(-1, 1, n)
    fused, alone = _sources(f, x0, fusion.MOST), _sources(f, x0, 1)
    assert fused.count("for (j") < alone.count("for (j")
    F = ad.record(f, x0)
    C = ad.record(f, x0)
    C.compile()
    assert C.compiled
    X = rng.uniform(-2, 2, (64, n))
    for x in X[:8]:
        g_vm, g_c = F.gradient(x), C.gradient(x)
        assert g_vm.tobytes() == g_c.tobytes()
        assert np.float64(F(x)).tobytes() == np.float64(C(x)).tobytes()
        assert C._native.point(x, True) is not None     # ran compiled, not handed back
    assert F.gradient(X).tobytes() == C.gradient(X).tobytes()
    # and the gradient itself, against central differences
    x, h = X[0], 1e-6
    fd = [(F(x + h * e) - F(x - h * e)) / (2 * h) for e in np.eye(n)]
    np.testing.assert_allclose(C.gradient(x), fd, rtol=1e-6, atol=1e-6)
