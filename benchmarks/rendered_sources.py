"""Every generated source a set of tests renders, written to a folder, and two such folders
compared: the check that a change of the renderers changes no byte of their output.

    python -m pytest -q -p no:cacheprovider -n 0 -p benchmarks.rendered_sources \\
        tests/test_compiled.py ...        # with RENDERED_SOURCES=/tmp/before
    python benchmarks/rendered_sources.py /tmp/before /tmp/after

As a pytest plugin (``-p benchmarks.rendered_sources``) it wraps the two doors every
generated source goes through: ``compiler.tape.library.build`` (the scalar tape's C and the
fused tensor C) and the OpenCL backend's ``kernel`` (the replay kernel, fused kernels, the
elementwise ones), and writes each source once, numbered in the order first seen, under
``$RENDERED_SOURCES``. It also renders ``random_program(seed)`` for seeds 0..199 as C
(gradient, and with Hessian seeds) and as the OpenCL replay kernel, outside any test.
As a script it compares two folders file by file and prints the counts.
"""
from __future__ import annotations

import hashlib
import os
import sys

_seen: dict[str, str] = {}


def _write(kind: str, source: str) -> None:
    folder = os.environ.get("RENDERED_SOURCES")
    digest = hashlib.sha256(source.encode()).hexdigest()
    if not folder or digest in _seen:
        return
    name = f"{len(_seen):05d}.{kind}"
    _seen[digest] = name
    os.makedirs(folder, exist_ok=True)
    with open(os.path.join(folder, name), "w", encoding="utf-8") as handle:
        handle.write(source)


def pytest_configure(config: object) -> None:
    from easyad.compiler.tape import library
    from easyad.tensor import _opencl

    build = library.build

    def recording_build(source: str, *args: object, **kwargs: object) -> object:
        _write("c", source)
        return build(source, *args, **kwargs)
    library.build = recording_build

    kernel = _opencl.OpenCLBackend.kernel

    def recording_kernel(self: object, source: str, *args: object) -> object:
        _write("cl", source)
        return kernel(self, source, *args)
    _opencl.OpenCLBackend.kernel = recording_kernel


def pytest_sessionfinish(session: object) -> None:
    """The random programs, rendered without running them (scalar C and the OpenCL
    replay kernel)."""
    if not os.environ.get("RENDERED_SOURCES"):
        return
    import numpy as np

    sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(__file__)), "tests"))
    from test_replay import random_program

    import easyad as ad
    from easyad import _core, compiler
    from easyad.compiler import tape as ctape
    try:
        from easyad.compiler.tape.render_cl import render_replay_kernel
    except ImportError:        # (before issue 25's move)
        from easyad.tensor._replay_cl import render_replay_kernel  # type: ignore
    del compiler
    for seed in range(200):
        n = 3 + seed % 5
        f = ad.record(random_program(seed, n), np.random.default_rng(seed).uniform(-1, 1, n))
        lst, inputs, outputs = f.tape, tuple(f.inputs), tuple(f.outputs)
        made = ctape.optimise(lst, inputs, outputs)
        if made is None:
            continue
        tape, new_inputs, new_outputs = made
        layout = _core._Replayer(tape, list(new_inputs), list(new_outputs))._layout()
        _write("c", ctape.render(layout, "seed", None))
        _write("c", ctape.render(layout, "seed", np.eye(len(new_inputs))))
        _write("cl", render_replay_kernel(tape._arrays(), list(new_inputs),
                                          int(new_outputs[0])))


def compare(before: str, after: str) -> int:
    names = sorted(set(os.listdir(before)) | set(os.listdir(after)))
    same, changed, missing = 0, [], []
    for name in names:
        a, b = (os.path.join(folder, name) for folder in (before, after))
        if not (os.path.exists(a) and os.path.exists(b)):
            missing.append(name)
            continue
        with open(a, encoding="utf-8") as fa, open(b, encoding="utf-8") as fb:
            if fa.read() == fb.read():
                same += 1
            else:
                changed.append(name)
    print(f"{len(names)} sources: {same} byte-identical, {len(changed)} changed, "
          f"{len(missing)} in one folder only")
    for name in changed[:20]:
        print("  changed:", name)
    for name in missing[:20]:
        print("  one side only:", name)
    return 0 if not changed and not missing else 1


if __name__ == "__main__":
    sys.exit(compare(sys.argv[1], sys.argv[2]))
