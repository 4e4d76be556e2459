"""easyad's on-disk caches, private to the user running it.

What easyad keeps on disk (compiled programs in ``compiled/``, the OpenCL probe's verdicts)
is read back later and, for shared objects, loaded into the process: a file someone else
could write or swap would run their code in ours. So a cache folder is used only when no
other user can change it or the path leading to it:

- the folder is made ``0700`` (each level easyad creates), and must be a real folder owned
  by this user that group and others cannot write to;
- every folder on the way to it (followed and, for links, the links themselves) must be
  owned by this user or root, and writable by others only with the sticky bit (``/tmp``),
  so nobody else can rename it away or swap a link on the way;
- files are written to a temporary name in the same folder, flushed to disk and renamed
  (readers see the whole file or none), and read through ``O_NOFOLLOW``, only when they
  are regular files of this user that nobody else can write to.

Anything else raises ``CacheError`` (an ``OSError``) naming the path, what is wrong and
the fix: callers catch it and go on without the cache. The functions here are the one
place for these checks; ``tensor/_probe.py``'s verdict file can use them too.
"""
from __future__ import annotations

import functools
import os
import stat
import tempfile


class CacheError(OSError):
    """A cache folder or file easyad will not use (unsafe, or not a folder/file at all);
    the message says why and what to do."""


# Owners and permission bits as checked here are POSIX's; elsewhere (Windows: ACLs, no
# owner in stat) only the atomic writes and the not-a-folder checks apply
_POSIX = hasattr(os, "geteuid")
_FIX = ("point $EASYAD_CACHE_DIR at a folder of your own (it is created 0700), "
        "e.g. ~/.cache/easyad")


def root() -> str:
    """The cache's top folder: $EASYAD_CACHE_DIR, else $XDG_CACHE_HOME/easyad, else
    ~/.cache/easyad (not created, not checked: see ``private_directory``)."""
    return os.environ.get("EASYAD_CACHE_DIR") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache"),
        "easyad")


@functools.lru_cache(maxsize=None)
def _private_group(gid: int) -> bool:
    """Whether gid is this user's own group with no other member (the "user private
    group" of many distributions, where home folders are group-writable)."""
    if not hasattr(os, "getegid") or gid != os.getegid():
        return False
    try:
        import grp
        import pwd
        me = pwd.getpwuid(os.geteuid()).pw_name
        group = grp.getgrgid(gid)
    except (ImportError, KeyError, OSError):
        return False
    return group.gr_name == me and set(group.gr_mem) <= {me}


def _others_can_write(st: os.stat_result) -> bool:
    if st.st_mode & stat.S_IWOTH:
        return True
    return bool(st.st_mode & stat.S_IWGRP) and not _private_group(st.st_gid)


def _uid() -> int:
    return os.geteuid() if _POSIX else -1



def _check_on_the_way(path: str) -> None:
    """Every folder and link leading to path (path itself excluded): trusted owners, and
    no one else able to rename what is in them (unless the sticky bit forbids it)."""
    trusted = (_uid(), 0)
    parent = os.path.dirname(path)
    while True:
        st = os.lstat(parent)
        if stat.S_ISLNK(st.st_mode) and st.st_uid not in trusted:
            raise CacheError(f"the cache path {path!r} goes through the link {parent!r}, "
                             f"owned by another user (uid {st.st_uid}); {_FIX}")
        st = os.stat(parent)
        if st.st_uid not in trusted:
            raise CacheError(f"the cache path {path!r} is inside {parent!r}, owned by "
                             f"another user (uid {st.st_uid}), who could replace it; {_FIX}")
        if _others_can_write(st) and not st.st_mode & stat.S_ISVTX:
            raise CacheError(f"the cache path {path!r} is inside {parent!r}, which others "
                             f"can write to (mode {stat.S_IMODE(st.st_mode):o}, no sticky "
                             f"bit), so they could swap it for theirs; {_FIX}")
        up = os.path.dirname(parent)
        if up == parent:
            return
        parent = up


def private_directory(*parts: str) -> str:
    """The cache folder root()/parts..., created (0700) where missing and checked (see the
    module's docstring); raises CacheError where it is not safe or not a folder."""
    path = os.path.abspath(os.path.join(root(), *parts))
    _make(path)
    if not _POSIX:
        if not os.path.isdir(path):
            raise CacheError(f"the cache folder {path!r} is not a folder; {_FIX}")
        return path
    for where in (path, os.path.realpath(path)):
        _check_on_the_way(where)
        st = os.lstat(where)
        if stat.S_ISLNK(st.st_mode):
            if st.st_uid not in (_uid(), 0):
                raise CacheError(f"the cache folder {where!r} is a link owned by another "
                                 f"user (uid {st.st_uid}); {_FIX}")
            continue        # the folder it names is checked as the real path
        if not stat.S_ISDIR(st.st_mode):
            raise CacheError(f"the cache folder {where!r} is not a folder; {_FIX}")
        if st.st_uid != _uid():
            raise CacheError(f"the cache folder {where!r} belongs to another user (uid "
                             f"{st.st_uid}); files in it could run their code in yours; "
                             f"{_FIX}")
        if _others_can_write(st):
            raise CacheError(f"others can write to the cache folder {where!r} (mode "
                             f"{stat.S_IMODE(st.st_mode):o}), who could plant files easyad "
                             f"loads; `chmod 700 {where}`, or {_FIX}")
    return path


def _make(path: str) -> None:
    """Create the missing levels of path, each 0700 (os.makedirs gives the levels above
    the last the umask's permissions)."""
    missing = []
    probe = path
    while not os.path.lexists(probe):
        missing.append(probe)
        up = os.path.dirname(probe)
        if up == probe:
            break
        probe = up
    if os.path.lexists(probe) and not os.path.isdir(probe):
        raise CacheError(f"the cache path {path!r} cannot be made: {probe!r} is a file "
                         f"(or a broken link), not a folder; {_FIX}")
    for level in reversed(missing):
        try:
            os.mkdir(level, 0o700)
        except FileExistsError:
            pass        # made meanwhile (another process): checked like any other
        except OSError as error:
            raise CacheError(f"the cache folder {level!r} cannot be made "
                             f"({error.strerror or error}); {_FIX}") from error


def read_private(path: str) -> bytes:
    """The bytes of a cache file, only where it is a regular file of this user that no one
    else can write (opened without following a link, checked on the open file)."""
    flags = os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_NONBLOCK", 0) \
        | getattr(os, "O_CLOEXEC", 0)
    try:
        fd = os.open(path, flags)
    except OSError as error:
        if getattr(os, "O_NOFOLLOW", 0) and os.path.islink(path):
            raise CacheError(f"the cache file {path!r} is a link; easyad reads only its "
                             f"own files") from error
        raise
    with os.fdopen(fd, "rb") as handle:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise CacheError(f"the cache file {path!r} is not a regular file")
        if _POSIX and (st.st_uid != _uid() or _others_can_write(st)):
            raise CacheError(f"the cache file {path!r} was not written by this user (owner "
                             f"uid {st.st_uid}, mode {stat.S_IMODE(st.st_mode):o})")
        return handle.read()


def write_atomic(directory: str, name: str, data: bytes, mode: int = 0o600,
                 durable: bool = True) -> str:
    """Write data to directory/name atomically: a temporary file in the same folder
    (0600, made exclusively), flushed to disk (``durable``; without, a crash may leave the
    file empty or torn, which only a reader that verifies it may accept), then renamed
    over the name. Another process sees the whole file or none either way. Returns the
    path."""
    fd, temporary = tempfile.mkstemp(dir=directory, prefix=f".{name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as handle:
            handle.write(data)
            handle.flush()
            if durable:
                os.fsync(handle.fileno())
        os.chmod(temporary, mode)
        target = os.path.join(directory, name)
        os.replace(temporary, target)
    except BaseException:
        try:
            os.unlink(temporary)
        except OSError:
            pass
        raise
    return target


def remove(path: str) -> None:
    """Delete a cache file if it is there (a damaged or foreign one, before rebuilding)."""
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass


__all__ = ["CacheError", "root", "private_directory", "read_private", "write_atomic",
           "remove"]
