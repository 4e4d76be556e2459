"""The file format of ``Function.save`` and its reader ``ad.load``: a versioned .npz of
plain arrays with a checksum, read member by member without pickle and without trusting
any size it states. Kept apart from ``Function`` because it is a format, with its own
versions, limits and threats (damaged files, zip bombs), and the function is the same
with or without it. ``easyad.replay`` makes the Function (``read``'s ``build``), so this
module never imports it.
"""
from __future__ import annotations

import math
import os
import zipfile
from collections.abc import Callable
from typing import Any

import numpy as np
from numpy.typing import NDArray

from easyad import _core
from easyad._core import WengertList
from easyad.errors import TapeFormatError

_FORMAT = "easyad.Function"
_FORMAT_VERSION = 2          # 2: with a checksum; 1 (no checksum) is still read
_READ_VERSIONS = (1, 2)
_ENTRY_FIELDS = (("values", "<f8"), ("partial0", "<f8"), ("partial1", "<f8"),
                 ("arg0", "<i4"), ("arg1", "<i4"), ("ops", "|u1"))


def _file_digest(content: dict[str, Any]) -> int:
    """The checksum of a saved Function: its entry arrays and the rest of its fields."""
    parts = [content[key].tobytes() for key, _ in _ENTRY_FIELDS]
    rest = (content["inputs"].tolist(), content["outputs"].tolist(),
            bool(content["scalar"]), str(content["on_branch_change"]),
            content["name_indices"].tolist(), content["name_values"].tolist())
    result: int = _core._tape_digest(parts, rest)
    return result

# what a saved Function holds: name -> (numpy dtype kind(s), number of dimensions)
_FIELDS = {
    "format": ("U", 0), "version": ("iu", 0), "inputs": ("i", 1), "outputs": ("i", 1),
    "scalar": ("b", 0), "on_branch_change": ("U", 0), "name_indices": ("i", 1),
    "name_values": ("U", 1), **{key: ("", 1) for key, _ in _ENTRY_FIELDS},
}

_MAX_HEADER = 10_000

# A deflated member may expand at most this many times (Function.save stores its arrays
# uncompressed; np.savez_compressed of a real tape stays far below): a larger claim is
# damage or a zip bomb, refused before anything is decompressed.
_MAX_EXPANSION = 64


def _read_npy(archive: zipfile.ZipFile, key: str, problem: Callable[[str], Exception],
              size: int, budget: list[int]) -> NDArray[Any]:
    """One array of the archive, parsed without pickle and without trusting its header.
    Every size is checked before memory is taken for it: the member's declared size
    against the file's (``budget``: bytes all members may still expand to), then the
    shape the .npy header states against the member's size; only then is the payload
    read (zipfile checks its CRC-32 at the end)."""
    try:
        info = archive.getinfo(key + ".npy")
    except KeyError:
        raise problem(f"the field {key!r} is missing") from None
    stored = info.compress_type == zipfile.ZIP_STORED
    if info.compress_size > size or info.file_size > budget[0] or (
            stored and info.file_size != info.compress_size) or (
            not stored and info.file_size > _MAX_EXPANSION * info.compress_size + 4096):
        raise problem(f"the field {key!r} claims {info.file_size} bytes in "
                      f"{info.compress_size} (the file has {size}); more than a saved "
                      f"Function holds")
    budget[0] -= info.file_size
    with archive.open(info) as member:
        version = np.lib.format.read_magic(member)
        if version == (1, 0):
            shape, fortran, dtype = np.lib.format.read_array_header_1_0(
                member, max_header_size=_MAX_HEADER)
        elif version == (2, 0):
            shape, fortran, dtype = np.lib.format.read_array_header_2_0(
                member, max_header_size=_MAX_HEADER)
        else:
            raise problem(f"the field {key!r} is in .npy format {version}")
        if dtype.hasobject:
            raise problem(f"the field {key!r} holds Python objects (dtype {dtype})")
        count = math.prod(shape)
        payload = info.file_size - member.tell()    # (the header's end, decompressed)
        if count * dtype.itemsize != payload:
            raise problem(f"the field {key!r} states shape {shape} of {dtype}, "
                          f"{count * dtype.itemsize} bytes, but holds {payload}")
        data = member.read(payload + 1)     # one more: a member longer than declared
        if len(data) != payload:
            raise problem(f"the field {key!r} holds {len(data)} bytes, not {payload}")
        member.read()                       # to the end: zipfile checks the CRC-32 there
    array = np.frombuffer(data, dtype=dtype, count=count)
    return array.reshape(shape, order="F" if fortran else "C")


def _read_members(archive: zipfile.ZipFile, problem: Callable[[str], TapeFormatError],
                  size: int) -> dict[str, NDArray[Any]]:
    """The fields of a saved Function, each read by ``_read_npy`` within one budget: all
    members together may expand to at most ``_MAX_EXPANSION`` times the file."""
    budget = [_MAX_EXPANSION * size + 65536]
    try:
        with archive:
            names = archive.namelist()
            if "format.npy" not in names:
                raise problem("it has no 'format' field")
            data = {key: _read_npy(archive, key, problem, size, budget) for key in _FIELDS}
            if "checksum.npy" in names:
                data["checksum"] = _read_npy(archive, "checksum", problem, size, budget)
    except TapeFormatError:
        raise
    except Exception as error:  # zipfile, zlib and numpy's header parser: all are damage
        raise problem(f"it cannot be read as .npz ({type(error).__name__}: {error})") from error
    return data


def save(function: Any, path: str | os.PathLike[str]) -> None:
    """``Function.save``: the file's fields, then its checksum over them."""
    if function.tape._customs_count():
        raise TypeError("a Function with user-defined primitives cannot be saved to "
                        ".npz; pickle it instead (primitives pickle by reference)")
    arrays = function.tape._arrays()
    names = function.tape._names_dict()
    content: dict[str, Any] = dict(
        format=np.array(_FORMAT), version=np.array(_FORMAT_VERSION, dtype=np.int64),
        inputs=np.array(function.inputs, dtype=np.int64),
        outputs=np.array(function.outputs, dtype=np.int64),
        scalar=np.array(function.scalar),
        on_branch_change=np.array(function.on_branch_change),
        name_indices=np.array(list(names), dtype=np.int64),
        name_values=np.array(list(names.values()), dtype=str), **arrays)
    content["checksum"] = np.array(_file_digest(content), dtype=np.int64)
    np.savez(path, **content)


def read(path: str | os.PathLike[str],
         build: Callable[[WengertList, Any, Any, Any, Any, str], Any]) -> Any:
    """``ad.load``: the Function saved at ``path``, every field checked; ``build``
    (``replay._trusted_function``) makes it from a validated tape, inputs, outputs,
    scalar, on_branch_change and the source's name, before the checksum is checked."""
    source = f"{os.fspath(path)!r}"

    def problem(text: str) -> TapeFormatError:
        return TapeFormatError(f"{source}: {text}. The file is damaged, or is not a saved "
                               f"easyad Function (Function.save writes one)")

    # the file is read member by member (never whole), each checked before it is read
    with open(path, "rb") as handle:    # a missing file is FileNotFoundError, as usual
        size = os.fstat(handle.fileno()).st_size
        try:
            archive = zipfile.ZipFile(handle)
        except Exception as error:
            raise problem(f"it cannot be read as .npz ({type(error).__name__}: "
                          f"{error})") from error
        data = _read_members(archive, problem, size)

    version = data["version"]
    if version.ndim or version.dtype.kind not in "iu":
        raise problem(f"its version is {version.tolist()!r} ({version.dtype}), not an "
                      f"integer: this easyad reads versions "
                      f"{' and '.join(map(str, _READ_VERSIONS))}")
    for key, (kinds, ndim) in _FIELDS.items():
        array = data[key]
        if array.ndim != ndim or (kinds and array.dtype.kind not in kinds):
            raise problem(f"the field {key!r} is {array.dtype} of shape {array.shape}")
    if str(data["format"]) != _FORMAT:
        raise problem(f"its format is {str(data['format'])!r}, not {_FORMAT!r}")
    version_number = int(data["version"])
    if version_number not in _READ_VERSIONS:
        newer = " (saved by a newer easyad: upgrade)" if version_number > _FORMAT_VERSION else ""
        raise problem(f"its version is {version_number}; this easyad reads "
                      f"{' and '.join(map(str, _READ_VERSIONS))}{newer}")
    for key, dtype in _ENTRY_FIELDS:
        if data[key].dtype != np.dtype(dtype):
            raise problem(f"the field {key!r} is {data[key].dtype}, not {np.dtype(dtype)}")
        if len(data[key]) != len(data["ops"]):
            raise problem(f"the field {key!r} has {len(data[key])} entries, 'ops' "
                          f"{len(data['ops'])}")
    if len(data["name_indices"]) != len(data["name_values"]):
        raise problem("the names and their indices differ in number")
    n = len(data["ops"])
    names = dict(zip(data["name_indices"].tolist(), data["name_values"].tolist()))
    if len(names) != len(data["name_indices"]):
        raise problem("one entry is named twice")
    tape = _core._rebuild_wengert_list(
        n, tuple(data[key].tobytes() for key, _ in _ENTRY_FIELDS), names, None, None, None,
        source=source)
    function = build(tape, data["inputs"].tolist(), data["outputs"].tolist(),
                     data["scalar"].item(), str(data["on_branch_change"]), source)
    if version_number >= 2:
        checksum = data.get("checksum")
        if checksum is None or checksum.shape != () or checksum.dtype.kind not in "iu":
            raise problem("the checksum is missing or not an integer")
        expected = _file_digest(data)
        if int(checksum) != expected:
            raise problem(f"the checksum {int(checksum)} does not match the data "
                          f"(expected {expected})")
    return function
