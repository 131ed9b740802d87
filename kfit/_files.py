"""Writes of kfit's log files and pictures that land whole or not at all, and fail naming the file.

A full disk, a read-only file system or a folder without permission stops a write part-way: Python's own
``write`` then leaves a cut CSV row, half a progress line or a torn TensorBoard record behind, and raises an
``OSError`` that names no file. Here an appended block is written with ``os.write`` and, when that fails, the file
is cut back to its length before it; a file that replaces another is written beside it and renamed over it.
The error is a :class:`WriteError`: an ``OSError`` (its ``errno``, ``strerror`` and ``filename`` are the cause's and
the file's) whose message names the file, the cause and what was kept.
"""

from __future__ import annotations

import contextlib
import errno
import os
from collections.abc import Callable

_CHECK = "Check its disk"
_FIX = {errno.ENOSPC: "Free space on its disk", errno.EDQUOT: "Free space within your disk quota",
        errno.EROFS: "Make its file system writable", errno.EACCES: "Make its folder writable",
        errno.EPERM: "Make its folder writable"}


class WriteError(OSError):
    """A log file or picture could not be written (full disk, read-only file system, no permission).

    Attributes:
        path: the file that was being written (also ``filename``).
        cause: the ``OSError`` that stopped the write.
    """

    def __init__(self, what: str, path: str, cause: OSError, kept: str):
        super().__init__(cause.errno, cause.strerror or str(cause), path)
        self.path = path
        self.cause = cause
        self.message = (f"Cannot write {what} {path!r}: {cause.strerror or cause}. {kept} {_FIX.get(cause.errno, _CHECK)}"
                        " or choose another path, and resume the run from its last checkpoint.")

    def __str__(self) -> str:
        return self.message


def write_all(fd: int, data: bytes) -> None:
    """Writes every byte of ``data`` to ``fd`` (``os.write`` may write fewer)."""
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view):]


def append_whole(fd: int, data: bytes, failed: Callable[[OSError], WriteError]) -> None:
    """Appends ``data`` to the open file ``fd`` whole, or cuts the file back to its length before and raises
    ``failed(cause)``."""
    size = os.fstat(fd).st_size
    try:
        write_all(fd, data)
    except OSError as cause:
        with contextlib.suppress(OSError):
            os.ftruncate(fd, size)
        raise failed(cause) from cause


def append(path: str, data: bytes, what: str, kept: str) -> None:
    """Appends ``data`` to the file ``path`` whole or not at all, making the file and its folder if missing (a
    folder removed while a run writes in it is made again)."""
    try:
        directory = os.path.dirname(path)
        if directory:
            os.makedirs(directory, exist_ok=True)
        fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o666)
    except OSError as cause:
        raise WriteError(what, path, cause, kept) from cause
    try:
        append_whole(fd, data, lambda cause: WriteError(what, path, cause, kept))
    finally:
        os.close(fd)


def replace(path: str, write: Callable[[str], None], what: str, kept: str) -> None:
    """Makes ``path`` by ``write(temporary)`` beside it, then renames it over ``path``: a failed write leaves the
    previous file as it was and no temporary file."""
    temporary = os.path.join(os.path.dirname(path), f".{os.path.basename(path)}.tmp{os.getpid()}")
    try:
        write(temporary)
        os.replace(temporary, path)
    except OSError as cause:
        with contextlib.suppress(OSError):
            os.remove(temporary)
        raise WriteError(what, path, cause, kept) from cause
    except BaseException:
        with contextlib.suppress(OSError):
            os.remove(temporary)
        raise
