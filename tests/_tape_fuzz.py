"""Fuzzing of the ways a tape enters easyad from outside: ``ad.load`` of a mutated .npz and
unpickling of mutated WengertList and Function data.

Every mutated input must either load into a Function equal to the original (same values,
Jacobians and Hessians, bit for bit, at a few points) or raise ``ad.TapeFormatError``;
anything else (another exception, a different Function, a crash) is a failure. Run as a
script it fuzzes in this process and exits 0, or 1 with the failing case printed; a
segfault shows as the process dying, which is why tests/test_tape_format.py and
benchmarks/stress_tape_fuzz.py run it as a child process.

    python tests/_tape_fuzz.py --examples 300 --seed 0    # a fixed number of examples
    python tests/_tape_fuzz.py --seconds 600              # until the time is up

Mutations: bytes of the .npz file (flips, overwrites, insertions, deletions, truncation);
one field of the file (an element set to an edge value, the field deleted, its dtype,
length or shape changed, replaced by a scalar or a str); the fields of a pickled
WengertList (length, each part's bytes, type and size, names, max_entries, user
primitives, checksum, the number of fields) and of a pickled Function (tape, inputs,
outputs, scalar, on_branch_change, checksum).
"""
from __future__ import annotations

import argparse
import io
import json
import os
import pickle
import sys
import tempfile
import time
import traceback

import numpy as np
from hypothesis import HealthCheck, given, seed, settings
from hypothesis import strategies as st

import easyad as ad
from easyad import _core
from easyad.replay import _rebuild_function

# ---- the originals: small Functions that use every structural feature a file holds ----


def _named() -> ad.Function:
    lst = ad.WengertList()
    x, y = lst.variable(0.5, name="x"), lst.variable(1.5, name="y")
    z = ad.where(x < y, ad.exp(x) * y, y - x) + ad.atan2(x, 2.0) - 3.0 / y
    return ad.Function(lst, [x.index, y.index], [z.index])


def _several(v):
    s = ad.where(v[0] > 0, ad.sqrt(v[0]), 0.0) * v[1]
    t = v[1] ** 2 if v[1] > 0 else -v[1]        # a guard
    return [s, t + ad.hypot(v[0], v[1]), 3.0]   # a constant output too


ORIGINALS = {
    "issue": lambda: ad.record(lambda v: v[0] * v[1] + ad.sin(v[0]), [1.0, 2.0]),
    "named": _named,
    "several": lambda: ad.record(_several, [0.7, 1.3]),
}
POINTS = np.array([[0.7, 1.3], [2.0, 0.5], [1.25, 1.75]])


def fingerprint(F: ad.Function) -> list[np.ndarray]:
    """What 'equal to the original' means: shape, values, Jacobians and (scalar)
    Hessians at POINTS, compared bit for bit."""
    out = [np.array([F.n_inputs, F.n_outputs, F.scalar]), np.asarray(F(POINTS)),
           F.jacobian(POINTS)]
    if F.scalar:
        out.append(F.hessian(POINTS))
    return out


def same(a: list[np.ndarray], b: list[np.ndarray]) -> bool:
    return len(a) == len(b) and all(
        x.shape == y.shape and np.array_equal(x, y, equal_nan=True) for x, y in zip(a, b))


class _Reduced:
    """Pickles as ``function(*args)``: how mutated __reduce__ data goes through pickle."""

    def __init__(self, function, args):
        self.function, self.args = function, args

    def __reduce__(self):
        return self.function, tuple(self.args)


# ---- mutations ----

EDGE_INTS = [-2**31, -2**31 + 1, -5, -2, -1, 0, 1, 2, 3, 4, 5, 6, 7, 8, 16, 17, 48, 49, 50,
             200, 255, 256, 2**31 - 2, 2**31 - 1, 2**31, 2**32, 10**9, 2**63 - 1]
DTYPES = ["<i1", "<u1", "<i2", "<i4", ">i4", "<u4", "<i8", ">i8", "<f4", "<f8", ">f8", "?",
          "<U3", "<c16", "S4"]
JUNK = [None, 0, -1, 1.5, "x", b"", b"\x00" * 8, [], (), {}, [0], (0,), {0: "x"}, True,
        np.int64(1), np.float64(1.0), object(), float("nan")]


def _mutate_bytes(data: bytes, edits: list[tuple[str, float, int]]) -> bytes:
    b = bytearray(data)
    for kind, where, value in edits:
        k = min(int(where * len(b)), max(len(b) - 1, 0))
        if kind == "flip" and b:
            b[k] ^= 1 << (value % 8)
        elif kind == "set" and b:
            b[k] = value
        elif kind == "insert":
            b[k:k] = bytes([value]) * (1 + value % 8)
        elif kind == "delete" and b:
            del b[k:k + 1 + value % 8]
        elif kind == "truncate":
            del b[k:]
    return bytes(b)


byte_edits = st.lists(st.tuples(st.sampled_from(["flip", "set", "insert", "delete", "truncate"]),
                                st.floats(0, 1), st.integers(0, 255)), min_size=1, max_size=4)


@st.composite
def field_mutation(draw, fields: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    d = dict(fields)
    key = draw(st.sampled_from(sorted(d)))
    a = d[key]
    action = draw(st.sampled_from(["set", "set", "set", "delete", "dtype", "grow", "shrink",
                                   "reshape", "scalar", "str", "float"]))
    if action == "set" and a.size:
        a = a.copy()
        flat = a.reshape(-1)
        k = draw(st.integers(0, a.size - 1))
        if a.dtype.kind in "iub":
            value = draw(st.sampled_from(EDGE_INTS + [len(d["ops"]), len(d["ops"]) - 1]))
            info = np.iinfo(a.dtype) if a.dtype.kind in "iu" else None
            if info is not None and not info.min <= value <= info.max:
                value = info.max
            flat[k] = value if info is not None else bool(value)
        elif a.dtype.kind == "f":
            flat[k] = draw(st.floats(allow_nan=True, allow_infinity=True))
        else:
            flat[k] = draw(st.sampled_from(["", "raise", "mask", "x", "easyad.Function2"]))
        d[key] = a
    elif action == "delete":
        del d[key]
    elif action == "dtype":
        dtype = draw(st.sampled_from(DTYPES))
        try:
            d[key] = a.astype(dtype)
        except (ValueError, TypeError, OverflowError):
            d[key] = np.array(["x"])
    elif action == "grow":
        d[key] = np.concatenate([a.reshape(-1), a.reshape(-1)[:draw(st.integers(1, 3))]]) \
            if a.size else np.zeros(1, a.dtype)
    elif action == "shrink":
        d[key] = a.reshape(-1)[:max(a.size - draw(st.integers(1, 3)), 0)]
    elif action == "reshape":
        d[key] = a.reshape(1, -1) if a.ndim else a.reshape(1)
    elif action == "scalar":
        d[key] = np.array(draw(st.sampled_from(EDGE_INTS[:-1])))
    elif action == "str":
        d[key] = np.array(draw(st.sampled_from(["1", "", "easyad.Function", "raise"])))
    else:
        d[key] = np.array(draw(st.sampled_from([1.9, 2.0, -0.0, float("nan")])))
    return d


@st.composite
def tape_state_mutation(draw, state: tuple) -> list:
    s = list(state)
    n = s[0]
    which = draw(st.integers(0, 6))
    if which == 0:      # the length
        s[0] = draw(st.sampled_from(EDGE_INTS + [n + 1, n - 1] + JUNK[:6]))
    elif which == 1:    # one part: its bytes, size or type; or the tuple itself
        parts = list(s[1])
        k = draw(st.integers(0, 5))
        how = draw(st.sampled_from(["bytes", "bytes", "bytes", "type", "tuple"]))
        if how == "bytes":
            parts[k] = _mutate_bytes(parts[k], draw(byte_edits))
        elif how == "type":
            parts[k] = draw(st.sampled_from([bytearray(parts[k]), parts[k].decode("latin-1"),
                                             None, memoryview(parts[k]).tolist()[:4], 0]))
        else:
            parts = draw(st.sampled_from([parts[:5], parts + [b""], parts[::-1]]))
        s[1] = tuple(parts) if draw(st.booleans()) or how != "tuple" else parts
    elif which == 2:    # names
        s[2] = draw(st.sampled_from([{0: "x", 1: "x"}, {n: "x"}, {-1: "x"}, {0: 5},
                                     {"0": "x"}, {2: "y"}, {0: "y", 1: "x"}, [], None,
                                     {True: "x"}, {2**40: "x"}]))
    elif which == 3:    # max_entries
        s[3] = draw(st.sampled_from([0, -1, 1, n - 1, n, 2**31 - 1, 2**31, 2**40, "5", 1.5,
                                     True, None]))
    elif which == 4:    # user primitives
        s[4] = draw(st.sampled_from([{0: ad.define("p", np.sin, np.cos)}, {n: None},
                                     {-1: None}, {0: "sin"}, [], None, {}]))
    elif which == 5:    # the checksum
        s[5] = draw(st.sampled_from([s[5] + 1, s[5] ^ 1, 0, -1, str(s[5]), float(s[5]),
                                     np.int64(s[5]), None, 2**64]))
    else:               # the number of fields
        s = s[:draw(st.integers(0, 5))] if draw(st.booleans()) else s + [0]
    return s


@st.composite
def function_state_mutation(draw, state: tuple, tape_state: tuple) -> list:
    s = list(state)
    which = draw(st.integers(0, 6))
    if which == 0:
        s[0] = draw(st.sampled_from([None, "tape", 5, _Reduced(
            _core._rebuild_wengert_list, draw(tape_state_mutation(tape_state)))]))
    elif which in (1, 2):
        n = tape_state[0]
        s[which] = draw(st.sampled_from([(), (0,), (0, 0), (1, 0), (n,), (n - 1,), (-1,),
                                         (2**31,), ("0",), (0.0,), (True,), [0, 1], None,
                                         np.array([0, 1]), (2, 3), (0, 1, 2)]))
    elif which == 3:
        s[3] = draw(st.sampled_from([1, 0, "yes", None, np.bool_(not s[3]), not s[3]]))
    elif which == 4:
        s[4] = draw(st.sampled_from(["", "RAISE", "retape", "mask", None, 1, ["raise"]]))
    elif which == 5:
        s[5] = draw(st.sampled_from([s[5] + 1, None, "1", 0, float(s[5])]))
    else:
        s = s[:draw(st.integers(0, 4))] if draw(st.booleans()) else s + [None]
    return s


# ---- one case: mutate, load, judge ----

class FuzzFailure(AssertionError):
    pass


class Fuzzer:
    def __init__(self, directory: str):
        self.directory = directory
        self.cases = {}
        for name, make in ORIGINALS.items():
            F = make()
            path = os.path.join(directory, f"{name}.npz")
            F.save(path)
            with open(path, "rb") as handle:
                blob = handle.read()
            with np.load(path) as data:
                fields = {key: data[key] for key in data.files}
            _, tape_state = F.tape.__reduce__()
            _, function_state = F.__reduce__()
            self.cases[name] = (fingerprint(F), blob, fields, tape_state, function_state)
        self.counts = {"equal": 0, "rejected": 0}

    def judge(self, name: str, what: str, load) -> None:
        reference = self.cases[name][0]
        try:
            F = load()
        except ad.TapeFormatError:
            self.counts["rejected"] += 1
            return
        except Exception as error:
            raise FuzzFailure(f"{name}, {what}: raised {type(error).__name__}: {error}\n"
                              f"{traceback.format_exc()}") from error
        try:
            got = fingerprint(F)
        except Exception as error:
            raise FuzzFailure(f"{name}, {what}: loaded, then raised {type(error).__name__}: "
                              f"{error}") from error
        if not same(got, reference):
            raise FuzzFailure(f"{name}, {what}: loaded a Function that differs from the "
                              f"original: {got} vs {reference}")
        self.counts["equal"] += 1

    def load_bytes(self, blob: bytes):
        path = os.path.join(self.directory, "mutated.npz")
        with open(path, "wb") as handle:
            handle.write(blob)
        return ad.load(path)

    def save_fields(self, fields: dict[str, np.ndarray]) -> bytes:
        buffer = io.BytesIO()
        np.savez(buffer, **fields)
        return buffer.getvalue()

    def strategy(self):
        names = sorted(self.cases)

        @st.composite
        def case(draw):
            name = draw(st.sampled_from(names))
            _, blob, fields, tape_state, function_state = self.cases[name]
            kind = draw(st.sampled_from(["bytes", "field", "tape", "function"]))
            if kind == "bytes":
                edits = draw(byte_edits)
                return name, f"bytes {edits}", lambda: self.load_bytes(_mutate_bytes(blob, edits))
            if kind == "field":
                mutated = draw(field_mutation(fields))
                blob2 = self.save_fields(mutated)
                changed = {k: v for k, v in mutated.items()
                           if k not in fields or v is not fields[k]}
                gone = sorted(set(fields) - set(mutated))
                return name, f"field {changed} deleted {gone}", lambda: self.load_bytes(blob2)
            if kind == "tape":
                state = draw(tape_state_mutation(tape_state))
                data = pickle.dumps(_Reduced(_core._rebuild_wengert_list, state))

                def load_tape():
                    tape = pickle.loads(data)
                    rest = function_state[1:5]
                    return _rebuild_function(tape, *rest)  # no checksum: the tape's is judged
                return name, f"pickled WengertList {state!r}", load_tape
            state = draw(function_state_mutation(function_state, tape_state))
            data = pickle.dumps(_Reduced(_rebuild_function, state))
            return name, f"pickled Function {state!r}", lambda: pickle.loads(data)
        return case()


def run(examples: int, seed_value: int, fuzzer: Fuzzer) -> None:
    @seed(seed_value)
    @settings(max_examples=examples, deadline=None, database=None, derandomize=False,
              suppress_health_check=list(HealthCheck))
    @given(fuzzer.strategy())
    def one(case):
        name, what, load = case
        fuzzer.judge(name, what, load)
    one()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--examples", type=int, default=300, help="examples per batch")
    parser.add_argument("--seconds", type=float, default=0.0,
                        help="run batches until this much time has passed (0: one batch)")
    parser.add_argument("--seed", type=int, default=0, help="seed of the first batch")
    args = parser.parse_args(argv)
    start = time.monotonic()
    batches = 0
    with tempfile.TemporaryDirectory() as directory:
        fuzzer = Fuzzer(directory)
        try:
            while True:
                run(args.examples, args.seed + batches, fuzzer)
                batches += 1
                if time.monotonic() - start >= args.seconds:
                    break
        except FuzzFailure as failure:
            print(f"FAILURE (batch seed {args.seed + batches}): {failure}", file=sys.stderr)
            return 1
    summary = dict(batches=batches, examples=sum(fuzzer.counts.values()), **fuzzer.counts,
                   seconds=round(time.monotonic() - start, 1))
    print(json.dumps(summary))
    return 0


if __name__ == "__main__":
    sys.exit(main())
