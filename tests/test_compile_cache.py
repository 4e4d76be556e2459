"""The compile cache (easyad/compiler/tape/library.py ``build``, easyad/_cache.py): private,
verified, never a crash, never planted code, never an exception from a plain call.

Each test has a cache folder of its own (EASYAD_CACHE_DIR under tmp_path). Libraries
that could crash or run planted code are loaded only in child processes. References are
gradients derived by hand; fallbacks must give them too (the VM, unfused tensor replay).
"""
import hashlib
import os
import stat
import subprocess
import sys
import tempfile
import textwrap
import time
import warnings

import numpy as np
import pytest

import easyad as ad
from easyad import _cache
from easyad.compiler.tape import library as tape_library

HAVE_CC = tape_library.compiler() is not None
needs_cc = pytest.mark.skipif(not HAVE_CC, reason="no C compiler on this machine")
ROOT = hasattr(os, "geteuid") and os.geteuid() == 0
X = np.array([0.3, -1.2, 0.7])


def f_of(k):
    """A program per k (a cache entry each): (k + 1) * sum x_i^2 + sin(x_0)."""
    return lambda x: (k + 1) * (x[0] * x[0] + x[1] * x[1] + x[2] * x[2]) + ad.sin(x[0])


def gradient_of(k, x):
    g = 2.0 * (k + 1) * np.asarray(x, dtype=float)
    g[0] += np.cos(x[0])
    return g


@pytest.fixture
def cache(tmp_path, monkeypatch):
    folder = tmp_path / "cache"
    monkeypatch.setenv("EASYAD_CACHE_DIR", str(folder))
    monkeypatch.setattr(tape_library, "_warned", set())
    return folder


def compile_quietly(f, x0=X):
    """F.compile(), and the CompilerWarnings it gave."""
    F = ad.record(f, x0)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        F.compile()
    return F, [w for w in caught if issubclass(w.category, ad.CompilerWarning)]


def assert_falls_back(F, said, *needles, k=0):
    """Not compiled, exactly one CompilerWarning saying each needle, right gradients."""
    assert not F.compiled
    assert len(said) == 1, [str(w.message) for w in said]
    for needle in needles:
        assert needle in str(said[0].message), str(said[0].message)
    np.testing.assert_allclose(F.gradient(X), gradient_of(k, X), rtol=1e-14)


def script(path, text):
    path.write_text("#!/bin/sh\n" + textwrap.dedent(text))
    path.chmod(0o755)
    return str(path)


def child(code, env):
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code)], env=env,
                          capture_output=True, text=True, timeout=240)


def planted_library(folder, marker):
    """A shared object whose constructor writes marker: what an attacker would plant."""
    source = folder / "planted.c"
    source.write_text(textwrap.dedent(f"""
        #include <stdio.h>
        __attribute__((constructor)) static void planted(void) {{
            FILE *f = fopen("{marker}", "w"); if (f) {{ fputs("ran", f); fclose(f); }}
        }}
        double easyad_native_value(void) {{ return 0.0; }}
    """))
    library = folder / "planted.so"
    subprocess.run([*tape_library.compiler(), "-shared", "-fPIC", str(source), "-o",
                    str(library)], check=True, capture_output=True, timeout=120)
    return library


def sidecar_for(data):
    return f"{hashlib.sha256(data).hexdigest()} {len(data)}\n".encode()


# ---- the folder: private, or refused ----

@needs_cc
def test_cache_folders_are_made_private_and_files_verified(tmp_path, monkeypatch):
    monkeypatch.setattr(tape_library, "_warned", set())
    monkeypatch.setenv("EASYAD_CACHE_DIR", str(tmp_path / "a" / "b"))
    F, said = compile_quietly(f_of(0))
    assert F.compiled and not said
    np.testing.assert_allclose(F.gradient(X), gradient_of(0, X), rtol=1e-14)
    for level in (tmp_path / "a", tmp_path / "a" / "b", tmp_path / "a" / "b" / "compiled"):
        assert stat.S_IMODE(level.stat().st_mode) == 0o700, level
    [library] = (tmp_path / "a" / "b" / "compiled").glob("*.so")
    data = library.read_bytes()
    assert library.with_suffix(".sha256").read_bytes() == sidecar_for(data)
    assert not library.stat().st_mode & 0o022
    assert not list(library.parent.glob(".*"))          # no temporary file left


@needs_cc
@pytest.mark.parametrize("top, compiled", [(0o777, 0o700), (0o700, 0o777), (0o1777, 0o777)],
                         ids=["world-writable-root", "world-writable-folder", "sticky-root"])
def test_a_folder_others_can_write_is_refused_even_with_a_consistent_plant(
        tmp_path, monkeypatch, top, compiled):
    # the name a real build gets, from a safe cache first
    monkeypatch.setenv("EASYAD_CACHE_DIR", str(tmp_path / "safe"))
    monkeypatch.setattr(tape_library, "_warned", set())
    F, said = compile_quietly(f_of(1))
    assert F.compiled and not said
    [real] = (tmp_path / "safe" / "compiled").glob("*.so")
    # an attacker able to write the shared folder plants a library and its sha256
    shared = tmp_path / "shared"
    (shared / "compiled").mkdir(parents=True)
    marker = tmp_path / "planted-ran"
    data = planted_library(tmp_path, marker).read_bytes()
    (shared / "compiled" / real.name).write_bytes(data)
    (shared / "compiled" / real.with_suffix(".sha256").name).write_bytes(sidecar_for(data))
    shared.chmod(top)
    (shared / "compiled").chmod(compiled)
    monkeypatch.setenv("EASYAD_CACHE_DIR", str(shared))
    G, said = compile_quietly(f_of(1))
    assert_falls_back(G, said, "others can write to", str(shared), "EASYAD_CACHE_DIR", k=1)
    assert not marker.exists()


def test_a_sticky_shared_parent_is_accepted_like_tmp(tmp_path, monkeypatch):
    shared = tmp_path / "shared"
    shared.mkdir()
    shared.chmod(0o1777)
    monkeypatch.setenv("EASYAD_CACHE_DIR", str(shared / "mine"))
    path = _cache.private_directory("compiled")
    assert path == str(shared / "mine" / "compiled")
    assert stat.S_IMODE(os.stat(shared / "mine").st_mode) == 0o700


@pytest.mark.skipif(not ROOT, reason="files of another user can be made only as root")
@pytest.mark.parametrize("case", ["folder", "link", "parent"])
def test_folders_and_links_of_another_user_are_refused(tmp_path, monkeypatch, case):
    other = 65534
    mine = tmp_path / "mine"
    mine.mkdir(mode=0o700)
    if case == "folder":            # a cache folder made by someone else first
        mine.chmod(0o755)
        os.chown(mine, other, other)
        path = mine
    elif case == "link":            # a link someone else controls, to my folder
        path = tmp_path / "link"
        path.symlink_to(mine)
        os.lchown(path, other, other)
    else:                           # inside a folder of someone else's
        parent = tmp_path / "theirs"
        parent.mkdir(mode=0o755)
        (parent / "cache").mkdir(mode=0o700)
        os.chown(parent, other, other)
        path = parent / "cache"
    monkeypatch.setenv("EASYAD_CACHE_DIR", str(path))
    with pytest.raises(_cache.CacheError, match="another user"):
        _cache.private_directory("compiled")


# ---- the files: verified before they are loaded ----

@needs_cc
def test_planted_damaged_truncated_and_empty_libraries_are_rebuilt_not_loaded(tmp_path):
    folder = tmp_path / "cache"
    marker = tmp_path / "planted-ran"
    planted = planted_library(tmp_path, marker)
    env = dict(os.environ, EASYAD_CACHE_DIR=str(folder),
               PYTHONPATH=os.pathsep.join(sys.path))
    setup = """
        import sys, warnings, numpy as np, easyad as ad
        warnings.simplefilter("error", ad.CompilerWarning)
        X = np.array([0.3, -1.2, 0.7])
        def f_of(k):
            return lambda x: (k + 1) * (x[0] * x[0] + x[1] * x[1] + x[2] * x[2]) + ad.sin(x[0])
    """
    made = child(setup + """
        import os
        seen = set()
        for k in range(6):
            assert ad.record(f_of(k), X).compile().compiled
            now = {n for n in os.listdir(sys.argv[0]) if n.endswith(".so")}
            print(*(now - seen)); seen = now
    """.replace("sys.argv[0]", repr(str(folder / "compiled"))), env)
    assert made.returncode == 0, made.stderr
    names = made.stdout.split()
    assert len(names) == 6
    so = [folder / "compiled" / n for n in names]
    data = planted.read_bytes()
    so[0].write_bytes(data)                                   # planted, old sha256 kept
    so[1].write_bytes(so[1].read_bytes()[: so[1].stat().st_size // 2])    # truncated
    so[2].write_bytes(b"")                                    # empty
    so[3].write_bytes(data)                                   # planted, no sha256
    so[3].with_suffix(".sha256").unlink()
    so[4].unlink()                                            # a link to a planted one,
    so[4].symlink_to(planted)                                 # with its right sha256
    so[4].with_suffix(".sha256").write_bytes(sidecar_for(data))
    raw = bytearray(so[5].read_bytes())                       # one byte flipped
    raw[len(raw) // 3] ^= 0x40
    so[5].write_bytes(bytes(raw))
    used = child(setup + f"""
        import ctypes, os
        for k in range(6):
            F = ad.record(f_of(k), X).compile()
            assert F.compiled
            g = 2.0 * (k + 1) * X
            g[0] += np.cos(X[0])
            assert np.allclose(F.gradient(X), g, rtol=1e-14, atol=0), k
        assert not os.path.exists({str(marker)!r})
        print("clean")
        ctypes.CDLL({str(planted)!r})      # the plant does run its code when loaded
        assert os.path.exists({str(marker)!r})
        print("planted code runs when loaded")
    """, env)
    assert used.returncode == 0, used.stderr            # no SIGBUS, no exception
    assert used.stdout.split("\n")[:2] == ["clean", "planted code runs when loaded"]
    for path in so:                                     # each rebuilt, with its record
        assert not path.is_symlink()
        assert path.with_suffix(".sha256").read_bytes() == sidecar_for(path.read_bytes())


# ---- failures: one warning, the fallback, right numbers ----

@pytest.mark.parametrize("case", ["file", "file-inside", "unwritable", "cannot-create"])
def test_an_unusable_cache_warns_once_and_replay_goes_on(cache, monkeypatch, case):
    if case == "file":                  # EASYAD_CACHE_DIR names a file
        cache.write_text("not a folder")
    elif case == "file-inside":
        cache.mkdir(mode=0o700)
        (cache / "compiled").write_text("not a folder")
    elif case == "unwritable":
        if ROOT:
            pytest.skip("root writes into read-only folders")
        (cache / "compiled").mkdir(parents=True, mode=0o700)
        (cache / "compiled").chmod(0o500)
    else:                               # what a read-only file system does, as root too
        def refuse(*args, **kwargs):
            raise PermissionError(13, "Permission denied", str(cache / "compiled"))
        monkeypatch.setattr(tempfile, "mkdtemp", refuse)
    F, said = compile_quietly(f_of(2))
    assert_falls_back(F, said, str(cache), "EASYAD_CACHE_DIR", "goes on in the VM", k=2)
    G, again = compile_quietly(f_of(3))              # one warning per process
    assert not G.compiled and not again


def test_a_tensor_function_falls_back_on_its_first_call(cache):
    cache.write_text("not a folder")
    F = ad.record(lambda x: ad.sum(100 * (x[1:] - x[:-1] ** 2) ** 2 + (1 - x[:-1]) ** 2),
                  np.zeros(6), tensor=True)
    x = np.array([0.5, -0.3, 1.1, 0.9, -1.4, 0.2])
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        g = F.gradient(x)
    said = [w for w in caught if issubclass(w.category, ad.CompilerWarning)]
    assert len(said) == 1 and "tensor replay" in str(said[0].message)
    assert "runs unfused" in str(said[0].message) and str(cache) in str(said[0].message)
    a = x[1:] - x[:-1] ** 2                           # by hand
    expected = np.zeros(6)
    expected[:-1] += -400 * x[:-1] * a - 2 * (1 - x[:-1])
    expected[1:] += 200 * a
    np.testing.assert_allclose(g, expected, rtol=1e-13)
    assert type(F._bound["gradient"]).__name__ == "BoundProgram"


def test_a_cc_with_bad_quoting_warns_and_the_vm_goes_on(cache, monkeypatch):
    monkeypatch.setenv("CC", "gcc '")
    assert tape_library.compiler() is None
    F, said = compile_quietly(f_of(4))
    assert_falls_back(F, said, "cannot be read", "No closing quotation", "$CC", k=4)


def test_a_compiler_past_its_timeout_is_stopped_and_the_vm_goes_on(cache, tmp_path,
                                                                   monkeypatch):
    pid_file = tmp_path / "pid"
    slow = script(tmp_path / "slow-cc", f"""
        [ "$1" = --version ] && echo "slow-cc 1.0" && exit 0
        sleep 60 &
        echo $! > {pid_file}
        wait
    """)
    monkeypatch.setenv("CC", slow)
    monkeypatch.setenv("EASYAD_COMPILE_TIMEOUT", "1")
    start = time.perf_counter()
    F, said = compile_quietly(f_of(5))
    assert time.perf_counter() - start < 20
    assert_falls_back(F, said, "did not finish within 1 s", "EASYAD_COMPILE_TIMEOUT", k=5)
    pid = int(pid_file.read_text())
    for _ in range(50):                 # the compiler's own children are stopped too
        try:
            with open(f"/proc/{pid}/stat") as handle:
                state = handle.read().rsplit(")", 1)[1].split()[0]
        except FileNotFoundError:
            break
        if state == "Z":
            break
        time.sleep(0.1)
    else:
        pytest.fail(f"the compiler's child {pid} still runs")


@pytest.mark.skipif(not os.path.exists("/bin/sh"), reason="the limit is set by /bin/sh")
def test_the_compiler_runs_with_bounded_memory(cache, tmp_path, monkeypatch):
    seen = tmp_path / "limit"
    monkeypatch.setenv("CC", script(tmp_path / "cc", f"""
        [ "$1" = --version ] && echo "limit-cc 1.0" && exit 0
        ulimit -v > {seen}
        exit 1
    """))
    monkeypatch.setenv("EASYAD_COMPILE_MEMORY_MB", "1500")
    F, said = compile_quietly(f_of(6))
    assert_falls_back(F, said, "failed (exit 1)", k=6)
    assert seen.read_text().strip() == str(1500 * 1024)


def test_a_compiler_that_crashes_is_named_and_the_vm_goes_on(cache, tmp_path, monkeypatch):
    monkeypatch.setenv("CC", script(tmp_path / "crashing-cc", """
        [ "$1" = --version ] && echo "crashing-cc 1.0" && exit 0
        kill -SEGV $$
    """))
    F, said = compile_quietly(f_of(10))
    assert_falls_back(F, said, "crashing-cc' failed (killed by SIGSEGV)", k=10)


@needs_cc
def test_a_program_over_the_size_limit_stays_in_the_vm(cache, monkeypatch):
    monkeypatch.setenv("EASYAD_COMPILE_MAX_ENTRIES", "5")
    F, said = compile_quietly(f_of(7))
    assert_falls_back(F, said, "EASYAD_COMPILE_MAX_ENTRIES", "entries", k=7)
    assert not list(cache.glob("compiled/*.so"))


def test_a_long_compile_is_announced_first(cache, tmp_path, monkeypatch, caplog):
    monkeypatch.setenv("CC", script(tmp_path / "cc", """
        [ "$1" = --version ] && echo "fake-cc 1.0" && exit 0
        echo "fake compile error" >&2
        exit 1
    """))
    monkeypatch.setattr(tape_library, "_SECONDS_PER_MB", {"-O3": 1e6, "-O1": 1e6})
    monkeypatch.setenv("EASYAD_COMPILE_TIMEOUT", "900")
    with caplog.at_level("WARNING", logger="easyad"):
        F, said = compile_quietly(f_of(8))
    [notice] = [r.getMessage() for r in caplog.records if r.name == "easyad"]
    assert "entries to C: about" in notice and "900 s" in notice
    assert_falls_back(F, said, "fake compile error", k=8)


def test_a_bad_setting_is_named_and_the_default_used(cache, tmp_path, monkeypatch):
    monkeypatch.setenv("CC", script(tmp_path / "cc", """
        [ "$1" = --version ] && echo "fake-cc 1.0" && exit 0
        exit 1
    """))
    monkeypatch.setenv("EASYAD_COMPILE_TIMEOUT", "soon")
    F, said = compile_quietly(f_of(9))
    assert not F.compiled
    assert [str(w.message).split(";")[0] for w in said] == [
        "$EASYAD_COMPILE_TIMEOUT='soon' is not a positive number",
        "Function.compile(): the C compiler " + repr(os.environ["CC"]) + " failed (exit 1). "
        "Install a working gcc or clang, or point $CC at one. Meanwhile replay goes on in "
        "the VM."]
    assert "using 300" in str(said[0].message)


def test_a_library_the_loader_refuses_is_a_warning_not_an_exception(cache, tmp_path):
    garbage = tmp_path / "easyad-garbage.so"
    garbage.write_bytes(b"not a shared object")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        assert tape_library.load(str(garbage), purpose="tensor") is None
    [said] = [w for w in caught if issubclass(w.category, ad.CompilerWarning)]
    assert "cannot be loaded" in str(said.message) and "runs unfused" in str(said.message)


# ---- the key: everything that changes the binary ----

@needs_cc
def test_a_changed_header_gives_a_new_library_not_the_stale_one(cache, tmp_path,
                                                               monkeypatch):
    here = os.path.dirname(ad.__file__)
    headers = tmp_path / "headers"
    (headers / "_generated").mkdir(parents=True)
    for name in ("_helpers.h", "_status.h", "_gemm.h"):
        (headers / name).write_bytes(open(os.path.join(here, name), "rb").read())
    # what the compiled C includes: the rules' functions, not the sweeps of _ops.h
    rules = open(os.path.join(here, "_generated", "_rule_functions.h"), encoding="utf-8").read()
    (headers / "_generated" / "_rule_functions.h").write_text(rules)
    monkeypatch.setattr(tape_library, "_header_folders",
                        lambda: [str(headers), str(headers / "_generated")])

    def f(x):
        return ad.sin(x[0]) * x[1]
    x = np.array([0.4, 1.7])
    F, said = compile_quietly(f, x)
    assert F.compiled and not said
    assert F(x) == np.sin(0.4) * 1.7
    # the rule changes (as after an edit of _rules.py and a rebuild): sin doubled
    old = "static inline double easyad_sin_value(double x, double y) { return sin(x); }"
    assert old in rules
    (headers / "_generated" / "_rule_functions.h").write_text(
        rules.replace(old, old.replace("return sin(x);", "return 2.0 * sin(x);")))
    G, said = compile_quietly(f, x)
    assert G.compiled and not said
    assert G(x) == 2.0 * np.sin(0.4) * 1.7          # compiled again, with the new header
    assert len(list(cache.glob("compiled/*.so"))) == 2


@needs_cc
def test_a_link_the_toolchain_refuses_falls_back_to_the_ordinary_one(cache, monkeypatch):
    """library._LINK (-nostdlib on Linux) is tried first; where the linker refuses it (here
    a library that does not exist) the ordinary link follows, and the program works."""
    monkeypatch.setattr(tape_library, "_LINK", ("-nostdlib", "-lm", "-leasyad_no_such_lib"))
    with warnings.catch_warnings():
        warnings.simplefilter("error", ad.CompilerWarning)
        F = ad.record(lambda x: x[0] ** 2 * ad.exp(x[1]), [1.0, 0.5]).compile()
    assert F.compiled
    x = np.array([1.5, -0.25])
    np.testing.assert_allclose(F.gradient(x), [3.0 * np.exp(-0.25), 2.25 * np.exp(-0.25)],
                               rtol=1e-15)


def test_the_key_covers_compiler_flags_version_and_cpu(monkeypatch):
    source = '#include "_ops.h"\nint main(void) { return 0; }\n'
    _, headers = tape_library._included(source)
    assert {name for name, _ in headers} >= {"_ops.h", "_rule_functions.h", "_helpers.h",
                                             "_status.h"}
    monkeypatch.setattr(tape_library, "_compiler_identity", lambda argv: "gcc 12.2.0")
    monkeypatch.setattr(tape_library, "_cpu", lambda: "flags: avx2")

    def key(**change):
        parts = dict(source=source, headers=headers, argv=["cc"], flags=["-O3"],
                     native=True)
        parts.update(change)
        return tape_library._key(**parts)
    base = key()
    assert base == key()
    changed = [key(source=source + " "), key(argv=["clang"]), key(flags=["-O1"]),
               key(native=False),
               key(headers=[(n, t + b" ") if n == "_status.h" else (n, t)
                            for n, t in headers])]
    monkeypatch.setattr(tape_library, "_compiler_identity", lambda argv: "gcc 13.1.0")
    changed.append(key())
    monkeypatch.setattr(tape_library, "_cpu", lambda: "flags: avx512f")
    changed.append(key())
    monkeypatch.setattr(tape_library, "__version__", "99.0")  # as imported there
    changed.append(key())
    assert len({base, *changed}) == len(changed) + 1


# ---- _cache's file helpers ----

def test_read_private_refuses_links_fifos_and_files_others_can_write(tmp_path):
    good = _cache.write_atomic(str(tmp_path), "good", b"data")
    assert _cache.read_private(good) == b"data"
    assert stat.S_IMODE(os.stat(good).st_mode) == 0o600
    assert [p.name for p in tmp_path.iterdir()] == ["good"]   # no temporary left
    link = tmp_path / "link"
    link.symlink_to(good)
    with pytest.raises(_cache.CacheError, match="is a link"):
        _cache.read_private(str(link))
    shared = tmp_path / "shared"
    shared.write_bytes(b"data")
    shared.chmod(0o666)
    with pytest.raises(_cache.CacheError, match="not written by this user"):
        _cache.read_private(str(shared))
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    with pytest.raises(_cache.CacheError, match="not a regular file"):
        _cache.read_private(str(fifo))      # without blocking on the pipe


def test_a_cache_path_through_a_file_names_the_file(tmp_path, monkeypatch):
    (tmp_path / "plain").write_text("x")
    monkeypatch.setenv("EASYAD_CACHE_DIR", str(tmp_path / "plain" / "deeper"))
    with pytest.raises(_cache.CacheError, match="is a file .or a broken link., not a folder"):
        _cache.private_directory("compiled")
