"""Tapes from outside (issue 12): ad.load and unpickling validate everything, in C, and
raise the one documented ad.TapeFormatError; nothing crashes or loads silently wrong.

References: the reproducers of the issue, turned into tests; the fuzz (tests/_tape_fuzz.py)
runs in a child process so that a crash shows as a failure rather than ending pytest.
"""
import io
import os
import pickle
import subprocess
import sys
import zipfile

import numpy as np
import pytest

import easyad as ad
from easyad import _core
from easyad._rules import OPCODE_NAMES, STRUCTURAL_OPCODES
from easyad.replay import _file_digest

X = np.array([1.0, 2.0])


def issue_function():
    return ad.record(lambda v: v[0] * v[1] + ad.sin(v[0]), [1.0, 2.0])


@pytest.fixture
def saved(tmp_path):
    F = issue_function()
    path = tmp_path / "good.npz"
    F.save(path)
    return F, path


def fields_of(path):
    with np.load(path) as data:
        return {key: data[key].copy() for key in data.files}


def write(path, fields, fix_checksum=True):
    """Save fields as a .npz; with fix_checksum, as a crafted file would (a matching
    checksum), so the structural checks alone must catch the damage."""
    if fix_checksum and "checksum" in fields:
        fields["checksum"] = np.array(_file_digest(fields), dtype=np.int64)
    np.savez(path, **fields)
    return path


# ---- items 1 and 3: damaged operands and opcodes ----

@pytest.mark.parametrize("field, value", [("arg0", 10**9), ("arg1", 2**31 - 1),
                                          ("arg0", 4), ("arg1", -2),
                                          ("ops", len(OPCODE_NAMES)),  # the first unknown
                                          ("ops", 200), ("ops", 255)])
def test_damaged_entry_raises_naming_field_entry_and_value(saved, tmp_path, field, value):
    # item 1 (a segfault before), item 3 (silently wrong before: an unknown opcode, or an
    # operand equal to the length, gave the recorded value and gradient [0, 0])
    F, path = saved
    fields = fields_of(path)
    fields[field][-1] = value
    for fix in (True, False):   # a crafted file, and one whose checksum no longer matches
        with pytest.raises(ad.TapeFormatError, match=rf"entry 4.*{field}\[4\] = {value}.*"
                                                     r"damaged, or is not a saved easyad"):
            ad.load(write(tmp_path / "evil.npz", dict(fields), fix))
    assert isinstance(ad.TapeFormatError("x"), ValueError)
    np.testing.assert_array_equal(ad.load(path).gradient(X), [2.0 + np.cos(1.0), 1.0])


def test_structural_conventions_are_checked(tmp_path):
    F = ad.record(lambda v: ad.where(v[0] > 0, v[0], -v[0]) * v[1], [1.0, 2.0])
    path = tmp_path / "select.npz"
    F.save(path)
    select = list(fields_of(path)["ops"]).index(STRUCTURAL_OPCODES["select"])
    cases = {
        "ops": (select - 1, 17, "not a comparison"),    # the condition made a neg
        "values": (select - 1, 0.5, "outcome 0.5"),      # a comparison's outcome
        "arg1": (0, 0, "variable"),                       # a variable with an operand
    }
    for field, (entry, value, message) in cases.items():
        fields = fields_of(path)
        fields[field][entry] = value
        with pytest.raises(ad.TapeFormatError, match=message):
            ad.load(write(tmp_path / "evil.npz", fields))
    fields = fields_of(path)   # a select moved to entry 0: it would read entry -1
    for key in ("ops", "arg0", "arg1", "values", "partial0", "partial1"):
        fields[key] = fields[key][select:]
    fields["arg0"][0] = fields["arg1"][0] = -1
    with pytest.raises(ad.TapeFormatError, match="entry 0 is a select"):
        ad.load(write(tmp_path / "evil.npz", fields))


def test_in_range_damage_is_caught_by_the_checksum(saved, tmp_path):
    _, path = saved
    fields = fields_of(path)
    fields["arg0"][-1] = 0          # a valid tape, but another function
    with pytest.raises(ad.TapeFormatError, match="checksum"):
        ad.load(write(tmp_path / "evil.npz", fields, fix_checksum=False))
    fields = fields_of(path)
    fields["outputs"][0] = 3
    with pytest.raises(ad.TapeFormatError, match="checksum"):
        ad.load(write(tmp_path / "evil.npz", fields, fix_checksum=False))


@pytest.mark.parametrize("field, value, message", [
    ("inputs", [0, 0], "twice"), ("inputs", [0, 4], "not a variable"),
    ("outputs", [5], "not an entry"), ("outputs", [], "no outputs"),
    ("name_indices", [4], "not a variable"), ("scalar", 1, "'scalar' is int64"),
    ("on_branch_change", "ignore", "on_branch_change"),
    ("ops", np.zeros(5, dtype=np.int32), "'ops' is int32"),
    ("arg0", np.zeros((1, 5), dtype=np.int32), "shape"),
    ("values", np.zeros(4), "4 entries"),
])
def test_every_field_is_checked(saved, tmp_path, field, value, message):
    _, path = saved
    fields = fields_of(path)
    if field == "name_indices":
        fields["name_values"] = np.array(["x"])
    fields[field] = np.array(value) if not isinstance(value, np.ndarray) else value
    if field in ("inputs", "outputs", "name_indices"):
        fields[field] = fields[field].astype(np.int64)
    with pytest.raises(ad.TapeFormatError, match=message):
        ad.load(write(tmp_path / "evil.npz", fields))


# ---- item 2: pickles ----

def test_pickled_tape_with_a_wild_operand_is_refused():
    F = issue_function()
    function, state = F.tape.__reduce__()
    parts = list(state[1])
    arg0 = np.frombuffer(parts[3], dtype=np.int32).copy()
    arg0[-1] = 10**8
    parts[3] = arg0.tobytes()
    for checksum in (state[5], None):    # with a checksum, and an old pickle without one
        with pytest.raises(ad.TapeFormatError, match=r"arg0\[4\] = 100000000"):
            function(state[0], tuple(parts), *state[2:5], checksum)
    np.testing.assert_array_equal(pickle.loads(pickle.dumps(F)).gradient(X), F.gradient(X))
    lst = pickle.loads(pickle.dumps(F.tape))
    y = lst._record_at(4)
    assert y.derivatives()[lst._record_at(0)] == 2.0 + np.cos(1.0)


def test_pickled_record_and_function_fields_are_checked():
    F = issue_function()
    with pytest.raises(ad.TapeFormatError, match="index 99"):
        _core._rebuild_record(F.tape, 99)
    function, state = F.__reduce__()
    with pytest.raises(ad.TapeFormatError, match=r"outputs\[0\] = 7"):
        function(state[0], state[1], (7,), *state[3:])
    with pytest.raises(ad.TapeFormatError, match="checksum"):
        function(state[0], state[1], (3,), *state[3:])      # in range: the checksum
    with pytest.raises(ad.TapeFormatError, match="fields"):
        function(*state[:3])
    with pytest.raises(ad.TapeFormatError, match="not a WengertList"):
        function("tape", *state[1:])


# ---- item 4: versions ----

@pytest.mark.parametrize("version, message", [
    (0, "version is 0"), (-5, "version is -5"), ("1", r"version is '1' \(<U1\), not an int"),
    (1.9, "version is 1.9"), (3, "newer easyad"), (2**40, "newer easyad")])
def test_only_versions_this_easyad_reads_load(saved, tmp_path, version, message):
    _, path = saved
    fields = fields_of(path)
    fields["version"] = np.array(version)
    with pytest.raises(ad.TapeFormatError, match=message):
        ad.load(write(tmp_path / "evil.npz", fields))


def test_version_1_files_without_a_checksum_still_load(saved, tmp_path):
    F, path = saved
    fields = fields_of(path)
    del fields["checksum"]
    fields["version"] = np.array(1)
    G = ad.load(write(tmp_path / "v1.npz", fields))
    np.testing.assert_array_equal(G.gradient(X), F.gradient(X))
    fields["version"] = np.array(2)      # version 2 must carry its checksum
    with pytest.raises(ad.TapeFormatError, match="checksum is missing"):
        ad.load(write(tmp_path / "v2.npz", fields))


# ---- item 5: truncated, garbage, bit-flipped files and missing keys ----

def test_unreadable_files_raise_the_one_error(saved, tmp_path):
    _, path = saved
    blob = path.read_bytes()
    cases = {"truncated": blob[:len(blob) // 2], "empty": b"", "garbage": os.urandom(999),
             "text": b"hello, not a zip file\n"}
    flipped = bytearray(blob)
    flipped[len(blob) // 3] ^= 0x10   # inside an array: the zip's CRC-32 no longer matches
    cases["bit flip"] = bytes(flipped)
    version = bytearray(blob)
    central = blob.index(b"PK\x01\x02")
    version[central + 6] = 210        # "zip file version 21.0" (NotImplementedError before)
    cases["zip version"] = bytes(version)
    for label, data in cases.items():
        evil = tmp_path / f"{label}.npz"
        evil.write_bytes(data)
        with pytest.raises(ad.TapeFormatError, match="damaged, or is not a saved easyad"):
            ad.load(evil)
    fields = fields_of(path)
    del fields["ops"]
    with pytest.raises(ad.TapeFormatError, match="field 'ops' is missing"):
        ad.load(write(tmp_path / "missing.npz", fields, fix_checksum=False))
    with pytest.raises(FileNotFoundError):   # a wrong path is not a damaged file
        ad.load(tmp_path / "nowhere.npz")


def test_a_header_that_lies_about_its_shape_is_refused(saved, tmp_path):
    # a crafted member (valid CRC) whose header claims more entries than it holds
    _, path = saved
    buffer = io.BytesIO()
    with zipfile.ZipFile(path) as source, zipfile.ZipFile(buffer, "w") as target:
        for info in source.infolist():
            data = source.read(info)
            if info.filename == "values.npy":
                data = data.replace(b"'shape': (5,)", b"'shape': (9,)")
            target.writestr(info.filename, data)
    (tmp_path / "lies.npz").write_bytes(buffer.getvalue())
    with pytest.raises(ad.TapeFormatError, match="states shape"):
        ad.load(tmp_path / "lies.npz")


# ---- item 7: a Function owns its tape ----

def test_the_tape_of_a_function_cannot_be_cleared(tmp_path):
    F = ad.record(lambda v: v[0] ** 3 * v[1], [1.0, 2.0])
    with pytest.raises(RuntimeError, match="tape of a Function"):
        F.tape.clear()
    np.testing.assert_allclose(F.hessian(X), [[12.0, 3.0], [3.0, 0.0]])   # 6 x y, 3 x^2
    assert "digraph" in F.to_dot()
    F.save(tmp_path / "f.npz")
    np.testing.assert_array_equal(ad.load(tmp_path / "f.npz").hessian(X), F.hessian(X))
    lst = ad.WengertList()     # a list that no Function holds still clears
    lst.variable(1.0)
    lst.clear()
    assert len(lst) == 0


# ---- item 11: the safe path reads no pickle ----

def test_load_runs_no_pickle(saved, tmp_path):
    _, path = saved
    fields = fields_of(path)
    fields["name_values"] = np.array([{"a": 1}], dtype=object)   # only pickle can hold this
    fields["name_indices"] = np.array([0], dtype=np.int64)
    np.savez(tmp_path / "objects.npz", **fields)
    with pytest.raises(ad.TapeFormatError, match="Python objects"):
        ad.load(tmp_path / "objects.npz")


# ---- the fuzz: mutated files and pickles load equal or raise TapeFormatError ----

def test_fuzz_mutated_files_and_pickles():
    # a child process: a crash (segfault) would show as a failed exit status here
    root = os.path.dirname(os.path.dirname(os.path.abspath(ad.__file__)))
    env = dict(os.environ, PYTHONPATH=root + os.pathsep + os.environ.get("PYTHONPATH", ""))
    script = os.path.join(os.path.dirname(__file__), "_tape_fuzz.py")
    done = subprocess.run([sys.executable, "-X", "faulthandler", script, "--examples", "1000",
                           "--seed", "12"], capture_output=True, text=True, env=env,
                          timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr
    assert '"examples": 1000' in done.stdout
