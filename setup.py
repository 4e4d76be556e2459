"""Build easyad's compiled core.

Renders the rule table (easyad/_rules.py) into Cython sources with easyad/_codegen.py, then
cythonizes easyad/_core.pyx. ``pip install .`` runs all of it.
"""
import os
import runpy

import numpy
from setuptools import Extension, setup

HERE = os.path.dirname(os.path.abspath(__file__))

runpy.run_path(os.path.join(HERE, "easyad", "_codegen.py"), run_name="__main__")

from Cython.Build import cythonize  # noqa: E402  (after codegen, which needs no Cython import)

extensions = [
    Extension(
        "easyad._core",
        ["easyad/_core.pyx"],
        include_dirs=["easyad", numpy.get_include()],
        depends=["easyad/_ops.h", "easyad/_helpers.h", "easyad/_status.h"],
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
