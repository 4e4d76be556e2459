"""The one reading of the tape (_tapeview): every kind of entry, its operands (a select's
condition included), constants in partial slots, guards and ancestors, on a hand-built
recording whose structure is known."""
import math

import easyad as ad
from easyad import _tapeview as tv


def test_every_kind_and_what_it_reads():
    lst = ad.WengertList()
    x, y = lst.variable(0.5, name="x"), lst.variable(2.0)
    s = ad.sin(x)                          # rule, one operand
    p = s * 3.0                            # rule, constant operand in its partial slot
    twice = ad.define("twice", lambda t: 2 * t, lambda t: 2.0)
    c = twice(y)                           # custom
    w = ad.where(x < y, p, c)              # compare, then select reading it
    branch = bool(x > 0.0)                 # guard
    out = w + (x if branch else y)
    view = tv.TapeView(lst)
    kinds = [view.kind(e) for e in range(len(view))]
    assert kinds[:2] == [tv.VARIABLE, tv.VARIABLE]
    assert kinds[s.index] == kinds[p.index] == kinds[out.index] == tv.RULE
    assert view.rule(s.index).name == "sin" and view.operands(s.index) == (x.index,)
    assert view.operand(p.index, 1) == -1 and view.constant(p.index, 1) == 3.0
    assert view.partial(p.index, 0) == 3.0
    assert kinds[c.index] == tv.CUSTOM and view.operands(c.index) == (y.index,)
    cond = view.condition(w.index)
    assert kinds[cond] == tv.COMPARE and view.symbol(cond) == "<"
    assert kinds[w.index] == tv.SELECT and view.operands(w.index) == (p.index, c.index, cond)
    assert view.taken(w.index) == 0                       # 0.5 < 2: the first branch
    guards = view.guards()
    assert len(guards) == 1 and view.symbol(guards[0]) == ">"
    assert not view.passes_derivative(cond) and not view.passes_derivative(guards[0])
    assert view.passes_derivative(w.index) and view.computes(w.index)
    assert not view.computes(x.index)
    # the output depends on everything but the guard, which replay evaluates separately
    assert view.ancestors([out.index]) == set(range(len(view))) - set(guards)
    assert view.ancestors([guards[0]]) == {guards[0], x.index}
    # the view agrees with the sweep the core runs
    d = out.derivatives()
    assert math.isclose(d[x], 3.0 * math.cos(0.5) + 1.0)


def test_a_view_of_arrays_is_the_same_reading():
    lst = ad.WengertList()
    x = lst.variable(1.5)
    y = ad.where(x > 1.0, x * x, -x)
    a, b = tv.TapeView(lst), tv.TapeView.of_arrays(lst._arrays())
    assert [a.name(e) for e in range(len(a))] == [b.name(e) for e in range(len(b))]
    assert a.operands(y.index) == b.operands(y.index)
    assert tv.select_condition(y.index) == y.index - 1


def test_the_python_and_c_readings_agree_on_every_opcode():
    from easyad import _core, _rules
    table = _core._conventions_table()
    assert len(table) == len(_rules.OPCODE_NAMES)
    for code, (computes, comparison, guard, passes, rule) in enumerate(table):
        kind = tv.KINDS[code]
        assert computes == (kind not in (tv.VARIABLE, tv.CONSTANT)), kind
        assert comparison == (kind in (tv.COMPARE, tv.GUARD)), kind
        assert guard == (kind == tv.GUARD), kind
        assert passes == (kind not in (tv.VARIABLE, tv.CONSTANT, tv.COMPARE, tv.GUARD)), kind
        assert rule == (kind == tv.RULE), kind
