"""Build easyad's compiled core.

Renders the rule table (easyad/_rules.py) with the build-time generator codegen/ into
easyad/_generated/ (and the stub easyad/_core.pyi), then cythonizes easyad/_core.pyx.
``pip install .`` runs all of it. codegen/ is not shipped: it is loaded here by path, as a
package of its own, so no build backend needs the source folder on sys.path.
"""
import importlib.util
import os
import sys

import numpy
from setuptools import Extension, setup

HERE = os.path.dirname(os.path.abspath(__file__))


def _codegen():
    folder = os.path.join(HERE, "codegen")
    spec = importlib.util.spec_from_file_location(
        "codegen", os.path.join(folder, "__init__.py"), submodule_search_locations=[folder])
    module = importlib.util.module_from_spec(spec)
    sys.modules["codegen"] = module  # its submodules import each other relatively
    spec.loader.exec_module(module)
    return module


_codegen().generate()

from Cython.Build import cythonize  # noqa: E402  (after codegen, which needs no Cython import)

GENERATED = "easyad/_generated"
extensions = [
    Extension(
        "easyad._core",
        ["easyad/_core.pyx"],
        include_dirs=["easyad", GENERATED, numpy.get_include()],
        depends=[f"{GENERATED}/_ops.h", "easyad/_helpers.h", "easyad/_status.h",
                 "easyad/_gemm.h"],
        # no-trapping-math: the sweeps' selects (mul0's strong zero) may be computed as
        # blends, so affine runs vectorise; no result changes (easyad reads no FP flags)
        extra_compile_args=["-O3", "-fno-trapping-math"],
        define_macros=[("NPY_NO_DEPRECATED_API", "NPY_1_7_API_VERSION")],
    )
]

setup(
    ext_modules=cythonize(
        extensions,
        compiler_directives={"language_level": 3},
        annotate=bool(os.environ.get("EASYAD_ANNOTATE")),
    ),
)
