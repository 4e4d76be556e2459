"""Build easyad's compiled core.

Renders the rule table (easyad/_rules.py) with the build-time generator codegen/ into
easyad/_generated/ (and the stub easyad/_core.pyi), then cythonizes easyad/_core.pyx.
``pip install .`` runs all of it. codegen/ is not shipped: it is loaded here by path, as a
package of its own, so no build backend needs the source folder on sys.path.

The two long steps say what they do before they start (a fresh build takes a minute or
more and would otherwise print nothing): Cython's translation (about 10 s of CPU) and the
C compiler on the 8 MB it writes (most of the time).
"""
import importlib.util
import os
import sys
import time

import numpy
from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext

HERE = os.path.dirname(os.path.abspath(__file__))


def _say(text):
    print(f"easyad: {text}", file=sys.stderr, flush=True)


def _codegen():
    folder = os.path.join(HERE, "codegen")
    spec = importlib.util.spec_from_file_location(
        "codegen", os.path.join(folder, "__init__.py"), submodule_search_locations=[folder])
    module = importlib.util.module_from_spec(spec)
    sys.modules["codegen"] = module  # its submodules import each other relatively
    spec.loader.exec_module(module)
    return module


def _not_folded():
    """-fno-builtin-<f> for every libm function glibc does not round correctly
    (easyad/compiler/libm.py, loaded by path): gcc would otherwise fold such a call at a
    value it can prove, e.g. erfc(-1.0) where Cython's float conversion tests its -1
    error sentinel, correctly rounded, while the same call at run time gives glibc's
    result one ulp away: two paths of one rule disagreeing (as library._FLAGS does for
    generated code)."""
    spec = importlib.util.spec_from_file_location(
        "easyad_build_libm", os.path.join(HERE, "easyad", "compiler", "libm.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return [f"-fno-builtin-{f}" for f in module.NOT_FOLDED]


def _newest(paths):
    return max((os.path.getmtime(p) for p in paths if os.path.exists(p)), default=0.0)


def _cython_sources():
    found = []
    for folder, _, names in os.walk(os.path.join(HERE, "easyad")):
        found += [os.path.join(folder, n) for n in names if n.endswith((".pyx", ".pxd", ".pxi"))]
    return found


class _BuildCore(build_ext):
    """setuptools' build_ext, announcing the compile of the core (when it is out of date)
    and saying how long it took."""

    def build_extension(self, ext):
        target = self.get_ext_fullpath(ext.name)
        inputs = [*ext.sources, *ext.depends]
        if not (self.force or _newest(inputs) > _newest([target])):
            return super().build_extension(ext)
        size = sum(os.path.getsize(s) for s in ext.sources if os.path.exists(s)) / 1e6
        _say(f"compiling easyad's core ({size:.0f} MB of C from Cython) with the C compiler: "
             f"about 1 minute on an idle machine, several on a busy one ...")
        start = time.perf_counter()
        super().build_extension(ext)
        _say(f"easyad's core compiled in {time.perf_counter() - start:.0f} s")

    def copy_file(self, infile, outfile, *args, **kwargs):
        """The built core copied into the source tree as a new file renamed over the old
        one: a process running the old core keeps its mapping intact (copying in place
        truncates the file under it: SIGBUS)."""
        temporary = f"{outfile}.{os.getpid()}.tmp"
        _, copied = super().copy_file(infile, temporary, *args, **kwargs)
        if os.path.exists(temporary):
            os.replace(temporary, outfile)
        return outfile, copied


_codegen().generate()

from Cython.Build import cythonize  # noqa: E402  (after codegen, which needs no Cython import)

def _optimisation() -> str:
    level = os.environ.get("EASYAD_BUILD_OPT", "-O3")
    if level not in ("-O0", "-O1", "-O2", "-O3"):
        raise SystemExit(f"EASYAD_BUILD_OPT={level!r}: use one of -O0, -O1, -O2, -O3")
    return level


GENERATED = "easyad/_generated"
extensions = [
    Extension(
        "easyad._core",
        ["easyad/_core.pyx"],
        include_dirs=["easyad", GENERATED, numpy.get_include()],
        depends=[f"{GENERATED}/_ops.h", f"{GENERATED}/_rule_functions.h", "easyad/_helpers.h",
                 "easyad/_status.h", "easyad/_gemm.h", "easyad/_lstm.h", "easyad/_winograd.h"],
        # no-trapping-math: the sweeps' selects (mul0's strong zero) may be computed as
        # blends, so affine runs vectorise; no result changes (easyad reads no FP flags).
        # -g0: Python's CFLAGS ask for debug information, which for these 8 MB of C costs
        # 30% of gcc's time (82 s of CPU against 58) and 36% of its memory (764 MB
        # against 491), and changes no instruction (EASYAD_DEBUG=1 keeps it)
        # EASYAD_BUILD_OPT=-O0: a throwaway build (tests/test_add_a_function.py builds a copy
        # of the core to test the build itself: 5 s of gcc instead of ~40; same IEEE results,
        # as nothing here contracts or reorders floating-point operations at any level)
        extra_compile_args=[_optimisation(), "-fno-trapping-math", *_not_folded(),
                            *([] if os.environ.get("EASYAD_DEBUG") else ["-g0"])],
        define_macros=[("NPY_NO_DEPRECATED_API", "NPY_1_7_API_VERSION")],
    )
]

if _newest(_cython_sources()) > _newest([os.path.join(HERE, "easyad", "_core.c")]):
    _say("translating easyad/_core.pyx to C with Cython (about 10 s on an idle machine) ...")

setup(
    ext_modules=cythonize(
        extensions,
        compiler_directives={"language_level": 3},
        annotate=bool(os.environ.get("EASYAD_ANNOTATE")),
    ),
    cmdclass={"build_ext": _BuildCore},
)
