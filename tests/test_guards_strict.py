"""Every read of a recorded value either records a guard or raises in strict mode (issue 24,
item 6), strict mode belongs to one recording (threads), and pickles keep every attribute
of a WengertList and a Function (issue 24, item 9).

References: the functions' own values written out by hand (3x or 2x on either side of a
branch), replay at a point on the other side of the branch, and the unpickled object
compared field by field with the original.
"""
from __future__ import annotations

import copy
import math
import operator
import pickle
import re
import threading

import numpy as np
import pytest

import easyad as ad
from easyad import _tapeview

# ---- Comparisons: every read of the outcome is a guard ----

READS_OF_A_COMPARISON = {
    "outcome": lambda c: c.outcome,
    "bool": bool,
    "repr": repr,
    "str": str,
    "format": lambda c: f"{c}",
    "hash": hash,
    "int": int,
    "float": float,
    "index": operator.index,
    "== True": lambda c: c == True,  # noqa: E712  (the comparison operator is what is tested)
    "and": lambda c: c & True,
    "invert": lambda c: not ~c,
    "add": lambda c: c + 0,
    "pickle": pickle.dumps,
}


def _branchy(read):
    # 3x where x > 1, else 2x; the branch is taken by Python on what ``read`` returns
    def f(v):
        c = v[0] > 1.0
        seen = read(c)
        if seen in (True, 1, 1.0, "True") or (isinstance(seen, bytes)
                                               and pickle.loads(seen) is True):
            return v[0] * 3.0
        return v[0] * 2.0
    return f


@pytest.mark.parametrize("how", sorted(READS_OF_A_COMPARISON))
def test_every_read_of_a_comparison_is_a_guard(how):
    F = ad.record(_branchy(READS_OF_A_COMPARISON[how]), [2.0])
    assert F([3.0]) == 9.0                       # same side: the recorded branch, 3x
    with pytest.raises(ad.BranchChangedError, match=r"x\[0\] > 1.0"):
        F([0.5])                                 # f gives 1.0 there, the recording 1.5
    G = ad.record(_branchy(READS_OF_A_COMPARISON[how]), [2.0], on_branch_change="retape")
    assert G([0.5]) == 1.0 and G([3.0]) == 9.0


def test_an_unread_comparison_is_no_guard():
    def f(v):
        v[0] > 1.0                               # noqa: B015  (made, never read)
        return v[0] * 2.0
    F = ad.record(f, [2.0])
    assert F([0.5]) == 1.0
    assert _tapeview.TapeView(F.tape).guards() == []


# ---- Records: strict mode refuses every read that records no guard ----

READS_OF_A_RECORD = {
    ".number": lambda r: r.number,
    "repr() or str()": repr,
    "repr() or str() ": str,       # (the same message: str is repr)
    "repr() or str()  ": lambda r: f"{r}",
    ".number ": lambda r: f"{r:.3f}",
    "a pickle": pickle.dumps,
    # derivatives are floats computed from the values: a branch on them is no guard either
    "a derivative (d[x])": lambda r: (r * r).derivatives()[r],
    "a derivative (d.by_name)": lambda r: (r * r).derivatives().by_name("x"),
    "derivatives (d.as_dict)": lambda r: (r * r).derivatives().as_dict(),
}


@pytest.mark.parametrize("how", sorted(READS_OF_A_RECORD))
def test_strict_mode_refuses_every_unguarded_read_of_a_record(how):
    read = READS_OF_A_RECORD[how]

    def f(v):
        read(v[0])
        return v[0] * 2.0
    with pytest.raises(RuntimeError, match=rf"test_guards_strict.py:\d+ reads "
                                           rf"{re.escape(how.strip())} of a recorded "
                                           rf"variable.*strict=True"):
        ad.record(f, [1.0], strict=True)
    if "by_name" not in how:                     # (recorded variables have no names)
        F = ad.record(f, [1.0])                  # not strict: the documented silent read
        assert F([4.0]) == 8.0


def test_repr_of_a_record_shows_its_value_outside_strict_mode():
    lst = ad.WengertList()
    x = lst.variable(2.5, name="x")
    assert repr(x).startswith("Record(number=2.5, index=0, name='x'")
    assert str(x * 2.0).startswith("Record(number=5.0")


@pytest.mark.parametrize("strict", [False, True])
@pytest.mark.parametrize("convert", [float, int, round, math.floor, math.ceil, math.trunc,
                                     operator.index, np.float64,
                                     lambda r: np.asarray(r, dtype=float), lambda r: [0][r]],
                         ids=["float", "int", "round", "floor", "ceil", "trunc", "index",
                              "np.float64", "np.asarray", "subscript"])
def test_conversions_of_a_record_never_read_its_value_silently(convert, strict):
    # a Record is no float: each of these raises TypeError saying so, strict or not
    def f(v):
        convert(v[0])
        return v[0]
    with pytest.raises(TypeError, match="of a Record would read its value with no guard.*"
                                        "Compare Records"):
        ad.record(f, [1.5], strict=strict)
    with pytest.raises(TypeError, match="unhashable"):
        ad.record(lambda v: hash(v[0]), [1.5], strict=strict)


def test_a_format_spec_formats_the_value_outside_strict_mode():
    lst = ad.WengertList()
    x = lst.variable(2.0 / 3.0)
    assert f"{x:.3f}" == "0.667" and f"{x * 3.0:08.2e}" == format(2.0, "08.2e")
    assert f"{x}" == repr(x)


def test_strict_mode_keeps_guarded_reads_and_ends_with_the_recording():
    F = ad.record(lambda v: v[0] * 3.0 if (v[0] > 1.0).outcome else v[0] * 2.0, [2.0],
                  strict=True)
    with pytest.raises(ad.BranchChangedError):
        F([0.5])
    kept = []

    def failing(v):
        kept.append(v[0])
        raise KeyError("f failed")
    with pytest.raises(KeyError):
        ad.record(failing, [7.0], strict=True)
    assert kept[0].number == 7.0 and "7.0" in repr(kept[0])   # strict ended with f
    assert F.tape is not None and _tapeview.entry(F.tape, 0).value == 2.0


# ---- strict mode is per recording: threads recording at once ----

def test_strict_mode_belongs_to_each_recording_across_threads():
    # Two strict recordings and a plain one run f at the same time; each thread's reads
    # of .number are judged by its own recording alone, also after another one ended.
    barrier = threading.Barrier(3, timeout=30)
    plain_done = threading.Event()
    results: dict[str, list[str]] = {"strict_a": [], "strict_b": [], "plain": []}

    def read(v, name):
        try:
            v[0].number
            results[name].append("read")
        except RuntimeError as error:
            assert "strict=True" in str(error)
            results[name].append("refused")

    def worker(name, strict):
        def f(v):
            barrier.wait()             # all three are inside f
            read(v, name)
            barrier.wait()             # all three have read once
            if name == "plain":
                return v[0] * 2.0      # this recording ends first...
            plain_done.wait(30)
            if name == "strict_a":
                barrier_ab.wait()      # ...then strict_b's, while strict_a still records
                read(v, name)
            else:
                read(v, name)
                barrier_ab.wait()
            return v[0] * 2.0
        ad.record(f, [1.0], strict=strict)
        if name == "plain":
            plain_done.set()

    barrier_ab = threading.Barrier(2, timeout=30)
    threads = [threading.Thread(target=worker, args=(name, name != "plain"))
               for name in results]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert results == {"strict_a": ["refused", "refused"], "strict_b": ["refused", "refused"],
                       "plain": ["read"]}


# ---- tensor code: every host read of a recorded tensor is a guard ----

READS_OF_A_TENSOR = {
    "value": lambda t: t.value,
    "float": float,
    "item": lambda t: t.item(),
    "bool": lambda t: bool(t > 0.0),
    "repr": repr,
}
# np.asarray of a recorded tensor is refused while recording (tests/test_silent_conversions.py):
# the SciPy functions that call it would drop the derivative with no error


@pytest.mark.parametrize("how", sorted(READS_OF_A_TENSOR))
def test_every_host_read_of_a_recorded_tensor_is_a_guard(how):
    read = READS_OF_A_TENSOR[how]

    def f(x):
        read(ad.sum(x))
        return ad.sum(x * x)
    F = ad.record(f, np.ones(3), tensor=True)
    np.testing.assert_allclose(F(np.ones(3)), 3.0)
    with pytest.raises(ad.BranchChangedError):
        F(np.array([1.0, 2.0, -5.0]))
    G = ad.record(lambda x: ad.sum(x * x), np.ones(3), tensor=True)   # no read: no guard
    np.testing.assert_allclose(G(np.array([1.0, 2.0, -5.0])), 30.0)


# ---- pickling keeps every attribute ----

def _fields(lst):
    arrays = {key: array.tobytes() for key, array in lst._arrays().items()}
    return arrays, lst.max_entries, lst._names_dict(), len(lst), lst._customs_count()


def _roundtrips(obj):
    yield pickle.loads(pickle.dumps(obj))
    yield copy.deepcopy(obj)


def test_a_pickled_wengert_list_keeps_every_attribute():
    cube = ad.define("cube_for_pickle", _cube, _cube_d, _cube_d2)
    lst = ad.WengertList(max_entries=8)
    x, y = lst.variable(1.5, name="x"), lst.variable(-2.0, name="y")
    z = cube(x) * y + ad.where(x > y, x, y)
    for copied, zc in _roundtrips((lst, z)):
        assert _fields(copied) == _fields(lst) and copied.max_entries == 8
        assert zc.tape is copied and zc.index == z.index
        d = zc.derivatives()                   # the user primitive's partials came along
        assert d.by_name("x") == 3 * 1.5 ** 2 * -2.0 + 1.0
        assert d.by_name("y") == 1.5 ** 3


def _cube(t):
    return t ** 3


def _cube_d(t):
    return 3 * t * t


def _cube_d2(t):
    return 6 * t


@pytest.mark.parametrize("recorded", [0, 3, 6])
def test_max_entries_still_holds_after_unpickling(recorded):
    lst = ad.WengertList(max_entries=8)
    x = lst.variable(1.0)
    for _ in range(recorded):
        x = x + 1.0
    for copied in _roundtrips(lst):
        assert copied.max_entries == 8
        r = copied.variable(0.0)
        for _ in range(8 - len(copied)):
            r = r * 2.0
        with pytest.raises(MemoryError, match=r"is full \(8 entries\)"):
            r * 2.0
        assert len(copied) == 8   # the failed entry left no trace


def test_max_entries_holds_when_a_list_reuses_a_freed_lists_memory():
    # a freed large list leaves its pages for the next one that grows into mapped arrays:
    # those are larger than a small max_entries, which must still be the limit
    big = ad.WengertList()
    r = big.variable(0.0)
    for _ in range(20_000):
        r = r + 1.0
    del big, r
    limit = 5_000
    lst = ad.WengertList(max_entries=limit)
    r = lst.variable(0.0)
    with pytest.raises(MemoryError, match=rf"is full \({limit} entries\)"):
        for _ in range(limit):
            r = r + 1.0
    assert len(lst) == limit


def test_a_pickled_function_keeps_every_attribute():
    def f(v):
        return [v[0] * v[1] + ad.sin(v[1]), ad.where(v[0] > 0.0, v[0], -v[0])]
    F = ad.record(f, [1.0, 2.0], on_branch_change="mask")
    for G in _roundtrips(F):
        assert (G.inputs, G.outputs, G.scalar, G.on_branch_change, G.n_inputs, G.n_outputs) \
            == (F.inputs, F.outputs, F.scalar, F.on_branch_change, F.n_inputs, F.n_outputs)
        assert _fields(G.tape) == _fields(F.tape)
        point = np.array([-0.5, 3.0])
        expected = [-0.5 * 3.0 + math.sin(3.0), 0.5]
        value, mask = G(point)                   # "mask" came along
        np.testing.assert_allclose(value, expected, rtol=1e-15)
        assert not np.any(mask)
        jacobian, mask = G.jacobian(point)
        np.testing.assert_allclose(jacobian, [[3.0, -0.5 + math.cos(3.0)], [-1.0, 0.0]],
                                   rtol=1e-15)
        with pytest.raises(Exception, match="clear"):   # still owned by the Function
            G.tape.clear()


def test_a_tensor_function_pickles_as_its_program_without_f():
    F = ad.record(lambda x: ad.sum(x * x), np.ones(3), tensor=True)
    G = pickle.loads(pickle.dumps(F))          # tests/test_travel.py: the rest
    assert G.f is None
    np.testing.assert_array_equal(G.gradient(np.array([1.0, -2.0, 3.0])), [2.0, -4.0, 6.0])
