"""The built library: C compiled with the compiler found at run time (``$CC`` or Python's;
-O3 -march=native, -O1 from ``_BIG`` entries or ``_BIG_SOURCE`` bytes of C on) into the
cache (``$EASYAD_CACHE_DIR/compiled`` or ``~/.cache/easyad/compiled``: a private folder,
checked by ``easyad._cache``), keyed by a hash of all that changes the binary (the source,
the headers it includes, easyad's version, the compiler's command and ``--version``, the
flags, the CPU). Each shared object is written atomically with its sha256 beside it and
loaded only when the two agree, so a damaged, truncated or planted file is compiled again,
never loaded; a second process loads it without compiling. The compiler runs with a
timeout and a memory limit, a long compile is announced first (the ``easyad`` logger), a
program too big is not compiled. Anything that fails (no compiler, a bad $CC, the
compiler, the cache): one ``CompilerWarning`` and the VM (or unfused tensor replay) goes
on. Used by both compilers: the scalar tape's and the tensor program's
(``easyad.compiler.program.fused_c``)."""
from __future__ import annotations

import ctypes
import functools
import hashlib
import logging
import math
import os
import platform
import re
import shlex
import shutil
import signal
import subprocess
import sys
import sysconfig
import tempfile
import threading
import time
import warnings
from typing import Any

from easyad import _cache
from easyad._version import __version__
from easyad.compiler import libm
from easyad.errors import CompilerWarning

_FORMAT = 5                       # bump when the rendered C changes meaning (5: no libm folds)
# No flag changes a result: no fused multiply-adds (-ffp-contract=off), no reassociation;
# vector instructions round as scalar ones do, and libm is called as the VM calls it.
# -march=native: AVX2/AVX-512 loops (2x faster than SSE2 here); the cache key then holds
# the CPU's flags, and where the compiler refuses it the build is tried without.
# -fno-builtin-<f>: gcc evaluates libm's functions of constants itself, correctly rounded
# (MPFR), where glibc's run-time result may be an ulp away: a value reaching tanh through a
# select with a constant operand (fmin(x, c): gcc threads the branch where it is c) came
# out an ulp from the VM's. Only functions that libm does not round correctly are listed
# (sqrt, fabs, floor... stay builtins: their folds are exact; compiler/libm.py says which).
_NOT_FOLDED = libm.NOT_FOLDED          # (the table of libm functions: compiler/libm.py)
_FLAGS = ("-fPIC", "-shared", "-fno-trapping-math", "-fno-math-errno", "-ffp-contract=off",
          "-fno-tree-slp-vectorize", "-std=gnu99", "-w",
          *(f"-fno-builtin-{f}" for f in _NOT_FOLDED))
_NATIVE = "-march=native"
# How the shared object is linked (not how its code is compiled): on Linux without the C
# library's start files and linker scripts (-nostdlib), libm named and libgcc for any
# helper gcc calls; libc's few symbols (memcpy) come from the process that loads it, as
# every Python process has libc loaded. The linker then reads three files, not a dozen:
# ~0.006 s of a ~0.08 s compile at n = 10. Elsewhere the compiler's ordinary link.
# A toolchain that refuses it (clang with compiler-rt and no libgcc) links the ordinary way.
_PLAIN_LINK = ("-lm",)
_LINK = ("-nostdlib", "-lm", "-lgcc") if sys.platform.startswith("linux") else _PLAIN_LINK
_BIG = 30_000                     # entries from which -O1 (compile time) replaces -O3
_EASYAD = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
_lock = threading.Lock()
_loaded: dict[str, Any] = {}      # shared object path -> ctypes library (one per process)
_warned: set[str] = set()


def _warn_once(reason: str, text: str) -> None:
    """One CompilerWarning per reason and process, shown at the user's line (the first
    frame outside easyad)."""
    if reason in _warned:
        return
    _warned.add(reason)
    package = _EASYAD + os.sep
    level, frame = 2, sys._getframe(1)     # 2: _warn_once's caller
    while frame is not None and frame.f_code.co_filename.startswith(package):
        level, frame = level + 1, frame.f_back
    warnings.warn(text, CompilerWarning, stacklevel=level)


_TIMEOUT_S = 300.0          # default EASYAD_COMPILE_TIMEOUT: a compile that runs longer
                            # is stopped and the VM goes on
_MAX_ENTRIES = 200_000      # default EASYAD_COMPILE_MAX_ENTRIES: bigger programs stay in
                            # the VM (gcc's time and memory grow too fast beyond)
_MEMORY_MB = 4096           # default EASYAD_COMPILE_MEMORY_MB: the compiler's address space
_NOTICE_S = 10.0            # compiles expected to take longer are announced first
_BIG_SOURCE = 4_000_000     # bytes of C from which -O1 too (second-order code is long)
# gcc's seconds per MB of C on one idle core (measured: gradients 10-11 at -O3, 6 at -O1,
# Hessians 15-36 at -O3, 9 at -O1): for the notice, an estimate
_SECONDS_PER_MB = {"-O3": 20.0, "-O1": 8.0}
_INCLUDE = re.compile(r'^[ \t]*#[ \t]*include[ \t]*"([^"]+)"', re.MULTILINE)
_WHO = {"function": ("Function.compile()", "replay goes on in the VM"),
        "tensor": ("tensor replay (fused C)", "the program runs unfused, step by step")}
_log = logging.getLogger("easyad")


class _Refusal(Exception):
    """Why this compile cannot go on: a reason (one warning each per process) and the
    warning's text (without who and fallback)."""

    def __init__(self, reason: str, text: str) -> None:
        super().__init__(text)
        self.reason = reason


def _setting(name: str, default: float) -> float:
    """A positive number from the environment, else the default (with a warning)."""
    text = os.environ.get(name)
    if not text:
        return default
    try:
        value = float(text)
        if value > 0 and math.isfinite(value):
            return value
    except ValueError:
        pass
    _warn_once(f"setting {name}={text}", f"${name}={text!r} is not a positive number; "
               f"using {default:g}. Set it to a number (or unset it).")
    return default


def _compiler_argv() -> tuple[list[str] | None, str]:
    """The compiler command, or None and why not (the warning's text)."""
    text = os.environ.get("CC")
    where = "$CC"
    if not text:
        text, where = sysconfig.get_config_var("CC") or "cc", "Python's build configuration"
    try:
        argv = shlex.split(text)
    except ValueError as error:
        return None, (f"the C compiler command {text!r} (from {where}) cannot be read "
                      f"({error}). Fix its quoting (e.g. CC=gcc, or CC=\"ccache gcc\") or "
                      f"unset CC.")
    if not argv or shutil.which(argv[0]) is None:
        return None, (f"no C compiler found (looked for {text!r}, from {where}). Install "
                      f"one (gcc or clang: apt install gcc, dnf install gcc, xcode-select "
                      f"--install) or point $CC at it.")
    return argv, ""


def compiler() -> list[str] | None:
    """The C compiler command: $CC, else the one Python was built with, else cc; None
    when it is not found on PATH or cannot be read (unbalanced quotes)."""
    return _compiler_argv()[0]


@functools.lru_cache(maxsize=16)
def _compiler_identity(argv: tuple[str, ...]) -> str:
    """What the compiler is (its resolved path and ``--version``), once per process: the
    cache key changes when the compiler does."""
    try:
        done = subprocess.run([*argv, "--version"], capture_output=True, timeout=30,
                              stdin=subprocess.DEVNULL, text=True, errors="replace")
        said = f"{done.stdout}\nexit {done.returncode}"
    except (OSError, subprocess.SubprocessError) as error:
        said = f"unknown ({type(error).__name__})"
    return f"{os.path.realpath(shutil.which(argv[0]) or argv[0])}\n{said}"


@functools.lru_cache(maxsize=1)
def _cpu() -> str:
    """What -march=native means here: the CPU's model and flags (Linux), else the
    processor's name."""
    try:
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as handle:
            lines = {line for line in handle
                     if line.startswith(("flags", "model name", "Features"))}
        return "".join(sorted(lines))
    except OSError:
        return platform.processor()


def _header_folders() -> list[str]:
    """Where the headers the rendered C includes are: easyad's folder, its _generated."""
    return [_EASYAD, os.path.join(_EASYAD, "_generated")]


def _included(source: str) -> tuple[list[str], list[tuple[str, bytes]]]:
    """The -I flags and every header the source includes with quotes, followed through
    the headers' own includes (names and contents: the cache key covers them, so a
    changed rule gives a new shared object)."""
    folders = _header_folders()
    found: dict[str, bytes] = {}
    pending = _INCLUDE.findall(source)
    while pending:
        name = pending.pop()
        if name in found:
            continue
        for folder in folders:
            path = os.path.join(folder, name)
            if os.path.isfile(path):
                with open(path, "rb") as handle:
                    found[name] = handle.read()
                break
        else:
            raise _Refusal("headers", f"easyad's C header {name} is not installed beside it "
                           f"(looked in {', '.join(folders)}). Reinstall easyad from its "
                           f"source.")
        pending += _INCLUDE.findall(found[name].decode("utf-8", "replace"))
    return [f"-I{folder}" for folder in folders], sorted(found.items())


def _key(source: str, headers: list[tuple[str, bytes]], argv: list[str], flags: list[str],
         native: bool) -> str:
    """The cache name: a hash of everything that changes the shared object."""
    digest = hashlib.sha256()
    for part in [str(_FORMAT), __version__, source, " ".join(argv), " ".join(_LINK),
                 _compiler_identity(tuple(argv)), " ".join(flags), platform.machine(),
                 _cpu() if native else "", sys.platform, sys.implementation.cache_tag or "",
                 *(os.environ.get(v, "") for v in ("CPATH", "C_INCLUDE_PATH",
                                                    "GCC_EXEC_PREFIX", "COMPILER_PATH"))]:
        digest.update(part.encode("utf-8", "surrogateescape") + b"\0")
    for name, text in headers:
        digest.update(name.encode() + b"\0" + hashlib.sha256(text).digest())
    return "easyad-" + digest.hexdigest()[:32]


def _verified(folder: str, name: str) -> bool:
    """Whether folder/name.so is the shared object this user compiled: its sha256 and size
    as recorded beside it (name.sha256) when it was written. Anything else (missing,
    truncated, empty, damaged, planted, a link, another user's) is never loaded: the
    caller compiles it again, over it."""
    try:
        recorded = _cache.read_private(os.path.join(folder, name + ".sha256")).split()
        data = _cache.read_private(os.path.join(folder, name + ".so"))
    except OSError:
        return False
    return len(recorded) == 2 and len(data) > 0 and recorded[1] == str(len(data)).encode() \
        and recorded[0] == hashlib.sha256(data).hexdigest().encode()


def build(source: str, entries: int, extra: tuple[str, ...] = (), purpose: str = "function"
          ) -> str | None:
    """The path of the shared object compiled from source (from the cache when there and
    verified), or None, with one CompilerWarning, when it cannot be compiled or cached:
    no compiler, a $CC that cannot be read, a compiler that fails, runs out of memory or
    time, a program too big, a cache folder that is unsafe or cannot be written. Never
    raises for those. ``extra``: more flags (tried first; the build is tried again
    without them if the compiler refuses). ``purpose``: "function" or "tensor" (the
    warning's wording)."""
    who, fallback = _WHO[purpose]
    try:
        return _build(source, entries, extra, who)
    except _Refusal as refusal:
        reason, text = refusal.reason, str(refusal)
    except _cache.CacheError as error:
        reason, text = "cache", f"the compile cache is not used: {error}."
    except OSError as error:     # a folder or file of the cache that cannot be written
        place = getattr(error, "filename", None) or _cache.root()
        reason = "cache"
        text = (f"the compile cache cannot be used ({error.strerror or error}: {place}). "
                f"Make it writable, or point $EASYAD_CACHE_DIR at a folder of your own.")
    _warn_once(reason, f"{who}: {text} Meanwhile {fallback}.")
    return None


def _build(source: str, entries: int, extra: tuple[str, ...], who: str) -> str | None:
    argv, problem = _compiler_argv()
    if argv is None:
        raise _Refusal("compiler", problem)
    limit = _setting("EASYAD_COMPILE_MAX_ENTRIES", _MAX_ENTRIES)
    if entries > limit:
        raise _Refusal("size", f"the program has {entries:,} entries, more than "
                       f"$EASYAD_COMPILE_MAX_ENTRIES ({limit:,.0f}), above which the C "
                       f"compiler takes minutes and gigabytes. Raise the limit to compile it "
                       f"anyway.")
    includes, headers = _included(source)
    folder = _cache.private_directory("compiled")
    big = entries >= _BIG or len(source) >= _BIG_SOURCE
    level = ["-O1", "-ftree-loop-vectorize"] if big else ["-O3"]
    choices = []
    tries = [(True, extra)] + ([(True, ())] if extra else []) + [(False, ())]
    for native, more in tries:
        flags = [*level, *_FLAGS, *more, *([_NATIVE] if native else [])]
        name = _key(source, headers, argv, flags, native)
        target = os.path.join(folder, name + ".so")
        if target in _loaded or _verified(folder, name):
            return target
        choices.append((flags, name))
    timeout = _setting("EASYAD_COMPILE_TIMEOUT", _TIMEOUT_S)
    expected = len(source) / 1e6 * _SECONDS_PER_MB[level[0]]
    if expected >= _NOTICE_S:
        _log.warning("easyad: %s compiles a program of %s entries to C: about %.0f s on one "
                     "core (stopped after $EASYAD_COMPILE_TIMEOUT = %g s; cached for next "
                     "time) ...", who, f"{entries:,}", expected, timeout)
    refused: list[str] = []
    deadline = time.monotonic() + timeout   # for all tries together
    for flags, name in choices:
        if _compile(argv, flags, includes, source, folder, name, timeout, deadline, refused):
            return os.path.join(folder, name + ".so")
        if refused[-1] == "ran":     # the compiler could not run at all, or timed out
            break
    raise _Refusal("failed", refused[0])


def _run(command: list[str], cwd: str, timeout: float) -> tuple[int, str]:
    """Run the compiler in a session of its own, its address space bounded
    (EASYAD_COMPILE_MEMORY_MB, by the shell's ulimit, so no Python runs between fork and
    exec), the whole group killed at the timeout (gcc's cc1 is a grandchild)."""
    memory = int(_setting("EASYAD_COMPILE_MEMORY_MB", _MEMORY_MB))
    if os.name == "posix" and os.path.exists("/bin/sh"):
        command = ["/bin/sh", "-c", 'ulimit -v "$1" 2>/dev/null; shift; exec "$@"', "sh",
                   str(memory * 1024), *command]
    process = subprocess.Popen(command, cwd=cwd, stdin=subprocess.DEVNULL,
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                               errors="replace", start_new_session=os.name == "posix")
    try:
        _, said = process.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        if os.name == "posix":
            try:
                os.killpg(process.pid, signal.SIGKILL)
            except OSError:
                pass
        process.kill()
        process.communicate()
        raise
    return process.returncode, said


def _compile(argv: list[str], flags: list[str], includes: list[str], source: str,
             folder: str, name: str, timeout: float, deadline: float,
             refused: list[str]) -> bool:
    """Compile source into folder/name.so, with its sha256 beside it (each written to a
    temporary name, flushed and renamed: another process finds the whole file or none);
    False, with the reason added to refused, if the compiler fails ("ran" last where it
    could not run or ran out of time)."""
    work = tempfile.mkdtemp(prefix=".build-", dir=folder)
    try:
        with open(os.path.join(work, "program.c"), "w", encoding="utf-8") as handle:
            handle.write(source)
        # relative names: the object holds no temporary path, so builds are identical;
        # -pipe: the assembler reads the compiler's output as it comes (no file between
        # them; the same object)
        command = [*argv, *flags, "-pipe", *includes, "program.c", "-o", "program.so", *_LINK]
        try:
            code, said = _run(command, work, max(0.1, deadline - time.monotonic()))
            if code != 0 and _LINK != _PLAIN_LINK:     # the ordinary link, once more
                command[-len(_LINK):] = _PLAIN_LINK
                code, said = _run(command, work, max(0.1, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            refused += [f"the C compiler {argv[0]!r} did not finish within {timeout:g} s "
                        f"(the program is too big to compile in that time). Raise "
                        f"$EASYAD_COMPILE_TIMEOUT to let it finish.", "ran"]
            return False
        except (OSError, subprocess.SubprocessError) as error:
            refused += [f"the C compiler {argv[0]!r} could not run ({error}). Install gcc "
                        f"or clang, or point $CC at a working one.", "ran"]
            return False
        built = os.path.join(work, "program.so")
        if code != 0 or not os.path.isfile(built):
            how = f"exit {code}"
            if code < 0:
                how = f"killed by {signal.Signals(-code).name}" \
                    if -code in signal.valid_signals() else f"killed by signal {-code}"
            if code == -signal.SIGKILL or "memory" in said or "Killed signal" in said:
                how += "; out of memory? raise $EASYAD_COMPILE_MEMORY_MB"
            said = f": {said.strip()[:500]}" if said.strip() else ""
            refused.append(f"the C compiler {argv[0]!r} failed ({how}){said}. Install a "
                           f"working gcc or clang, or point $CC at one.")
            return False
        with open(built, "rb") as handle:
            data = handle.read()
        # not fsync'd (3 x ~4 ms, a tenth of a small compile): a crash can leave a file
        # empty or torn, and _verified then compiles it again rather than load it
        _cache.write_atomic(folder, name + ".c", source.encode("utf-8"),  # for reading
                            durable=False)
        _cache.write_atomic(folder, name + ".so", data, mode=0o700, durable=False)
        _cache.write_atomic(folder, name + ".sha256",
                            f"{hashlib.sha256(data).hexdigest()} {len(data)}\n".encode(),
                            durable=False)
        return True
    finally:
        shutil.rmtree(work, ignore_errors=True)


def load(path: str, purpose: str = "function") -> Any:
    """The shared object at path (a path ``build`` returned), loaded once per process; None,
    with one CompilerWarning, where the loader refuses it."""
    with _lock:
        library = _loaded.get(path)
        if library is None:
            try:
                library = _loaded[path] = ctypes.CDLL(path)
            except OSError as error:
                who, fallback = _WHO[purpose]
                _warn_once("load", f"{who}: the compiled program {path} cannot be loaded "
                           f"({error}). Delete the folder to clear the cache. Meanwhile "
                           f"{fallback}.")
                return None
        return library
