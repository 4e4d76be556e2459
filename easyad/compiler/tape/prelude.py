"""What a compiled tape's C starts with (``prelude``): the rule functions it calls, copied
from ``_generated/_rule_functions.h`` (not the whole table), ``_helpers.h``, and for gcc
and clang the few libm functions declared here instead of ``<math.h>``. At n = 10 gcc's
time is mostly its start and parsing: ``<math.h>`` and the table cost ~0.01 s of ~0.085.
The functions are the very text the VM's build compiles, and the declarations are those
``<math.h>`` makes (the same builtins, the same libm calls): the machine code is the same
(checked by tests/test_compiled.py). A body that calls anything not known here gets the
headers themselves, so nothing is ever called undeclared."""
from __future__ import annotations

import functools
import os
import re

from easyad.compiler import libm
from easyad.compiler.tape import library

DECLARED = libm.DECLARED      # libm's declarations, from the one table of them
# <math.h>'s classification macros and constants, as glibc spells them for gcc
_MACROS = ("#define isnan(x) __builtin_isnan(x)\n#define isinf(x) __builtin_isinf_sign(x)\n"
           "#define isfinite(x) __builtin_isfinite(x)\n#define NAN (__builtin_nanf(\"\"))\n"
           "#define INFINITY (__builtin_inff())\n")
_KNOWN = frozenset("if for while return sizeof switch defined isnan isinf isfinite memcpy "
                   "memset easyad_keep __asm__ __attribute__ noinline _Pragma".split())
HEADERS = '#include <math.h>\n#include "_rule_functions.h"\n'
_COMMENT = re.compile(r"/\*.*?\*/", re.S)
_CALL = re.compile(r"\b([A-Za-z_]\w*)\s*\(")
_RULE_FUNCTION = re.compile(r"\beasyad_(\w+?)_(?:value|d0|d1|t0|t1)\b")
_NAME = re.compile(r"[A-Za-z_]\w*")
_DEFINE = re.compile(r"^#define (\w+)(.*)$", re.M)


def _path(name: str) -> str:
    """Where the header is (the folders ``library`` compiles with)."""
    for folder in library._header_folders():
        path = os.path.join(folder, name)
        if os.path.isfile(path):
            return path
    raise FileNotFoundError(name)


def _table() -> tuple[str, dict[str, str], frozenset[str]]:
    """_helpers.h's and _rule_functions.h's pieces (``_parse``), read again when a file
    changes (a rebuilt table: the new text is in the source, so in the cache key)."""
    paths = (_path("_helpers.h"), _path("_rule_functions.h"))
    return _parse(*((p, os.stat(p).st_mtime_ns, os.stat(p).st_size) for p in paths))


@functools.lru_cache(maxsize=4)
def _parse(helpers_file: tuple[str, int, int], rules_file: tuple[str, int, int]
           ) -> tuple[str, dict[str, str], frozenset[str]]:
    """_helpers.h without its <math.h>; each rule's functions' text by name; the names
    _helpers.h defines (functions and macros)."""
    with open(helpers_file[0], encoding="utf-8") as handle:
        helpers = handle.read().replace("#include <math.h>\n", "", 1)
    with open(rules_file[0], encoding="utf-8") as handle:
        lines = handle.read().splitlines(keepends=True)
    functions: dict[str, str] = {}
    k = 0
    while k < len(lines):
        match = re.match(r"static inline double (easyad_\w+)\(", lines[k])
        if not match:
            k += 1
            continue
        start, depth = k, 0
        while True:             # to the line that closes the function's braces
            depth += lines[k].count("{") - lines[k].count("}")
            k += 1
            if depth <= 0:
                break
        functions[match.group(1)] = "".join(lines[start:k])
    defined = frozenset(re.findall(r"#define (\w+)", helpers)
                        + re.findall(r"static inline \w+ (\w+)\(", helpers))
    return helpers, functions, defined


def _blocks(text: str) -> list[tuple[str, int, int]]:
    """The top-level ``static inline`` functions of a header: (name, start, end) spans of
    their text (to the line closing their braces)."""
    spans, offset, start, name, depth = [], 0, 0, "", 0
    for line in text.splitlines(keepends=True):
        match = None if name else re.match(r"static inline \w+ (\w+)\(", line)
        if match:
            name, start, depth = match.group(1), offset, 0
        if name:
            depth += line.count("{") - line.count("}")
            if depth <= 0 and "{" in text[start:offset + len(line)]:
                spans.append((name, start, offset + len(line)))
                name = ""
        offset += len(line)
    return spans


@functools.lru_cache(maxsize=64)
def _used_helpers(helpers: str, names: frozenset[str]) -> str:
    """_helpers.h without the functions nothing in ``names`` (the identifiers of the body
    and its rule functions) reaches, directly or through the header's macros and other
    functions: gcc parses ~a third of the header less (digamma, polygamma, hypot...)."""
    macros = {m.group(1): set(_NAME.findall(m.group(2))) for m in _DEFINE.finditer(helpers)}
    blocks = _blocks(helpers)
    texts = {name: set(_NAME.findall(_COMMENT.sub(" ", helpers[a:b]))) for name, a, b in blocks}
    wanted, pending = set(), set(names)
    while pending:
        name = pending.pop()
        if name in wanted:
            continue
        wanted.add(name)
        pending |= (macros.get(name, set()) | texts.get(name, set())) - wanted
    kept, last = [], 0
    for name, a, b in blocks:
        if name not in wanted:
            kept.append(helpers[last:a])
            last = b
    return "".join(kept) + helpers[last:]


def prelude(body: str) -> str:
    """The C before body: the rule functions body calls, the helpers and libm's
    declarations (for gcc and clang; <math.h> for other compilers); the headers
    themselves (``HEADERS``) where body or those functions call a name not known here."""
    try:
        helpers, functions, defined = _table()
    except (OSError, UnicodeDecodeError):
        return HEADERS        # build() names the missing header, and refuses
    wanted: set[str] = set()
    pending = {m.group(0) for m in _RULE_FUNCTION.finditer(body)} & functions.keys()
    while pending:             # with the rule functions those call (none today)
        wanted |= pending
        pending = {m.group(0) for name in pending
                   for m in _RULE_FUNCTION.finditer(functions[name])} \
            & functions.keys() - wanted
    kept = "".join(functions[name] for name in functions if name in wanted)
    helpers = _used_helpers(helpers, frozenset(_NAME.findall(_COMMENT.sub(" ", body + kept))))
    code = _COMMENT.sub(" ", body + kept + helpers)
    calls = set(_CALL.findall(code))
    unknown = calls - _KNOWN - DECLARED.keys() - defined - functions.keys() \
        - {name for name in calls if name.startswith("__builtin_")} \
        - set(re.findall(r"\b(?:void|int|double) (\w+)\(", code)) \
        - set(re.findall(r"#\s*define (\w+)", code))
    if unknown:
        return HEADERS
    declarations = "".join(DECLARED[name] + "\n" for name in sorted(calls & DECLARED.keys()))
    return (f"#if defined(__GNUC__)\n{declarations}{_MACROS}#else\n#include <math.h>\n"
            f"#endif\n{helpers}{kept}")
