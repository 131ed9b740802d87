"""One writer per checkpoint path: a lock file ``PATH.lock`` held with ``flock`` while a writer uses it.

Two writers on one path would delete each other's files (a ``keep=1`` writer prunes a ``keep=3`` one's
numbered files; each removes the other's temporary files as stale). The lock file holds the holder's pid,
host and role, so that the refusal can name it. ``flock`` locks belong to an open file: a second writer in
the same process is refused as surely as one in another process, and a lock is released when its process
dies, however it dies (a stale lock file of a dead process is taken over). The file is removed on release.
"""

from __future__ import annotations

import datetime
import json
import os
import socket
import threading
import warnings
import weakref
from collections.abc import Callable
from typing import Any

from kfit.checkpoint._format import CheckpointLockedError, CheckpointWriteError

try:
    import fcntl
except ImportError:  # Windows: no flock; writers are not checked there
    fcntl = None

# Lock file -> its holder in this process. Weak: a holder that is thrown away (say, the Checkpoint of an
# interrupted run in a notebook) closes its file when collected, which releases the lock.
_held: weakref.WeakValueDictionary[str, PathLock] = weakref.WeakValueDictionary()
_guard = threading.Lock()


def lock_path(path: str | os.PathLike) -> str:
    """The lock file of a checkpoint path."""
    return os.fspath(path) + ".lock"


class PathLock:
    """The right to write the checkpoint files of one path, for one writer.

    Args:
        path: the checkpoint path.
        owner: who holds it, for the message another writer gets (e.g. "Checkpoint callback 'checkpoint'").
        active: tells whether the holder still uses the path; a holder in this process that does not (say,
            the Checkpoint of a run that ended with an exception) is released when another writer asks.
        taken_over: called (with no lock held) when another writer in this process took the path from this
            holder because it was not active: the holder ends what it still holds (e.g. its signal handlers).

    Use ``acquire()`` / ``release()``, or ``with PathLock(path, owner):``. Acquiring again is a no-op.
    """

    def __init__(self, path: str | os.PathLike, owner: str, active: Callable[[], bool] | None = None,
                 taken_over: Callable[[], None] | None = None):
        self.path = os.fspath(path)
        self.file = lock_path(self.path)
        self.owner = owner
        self.active = active
        self.taken_over = taken_over
        self._fd: int | None = None

    @property
    def held(self) -> bool:
        return self._fd is not None

    def acquire(self) -> None:
        """Takes the lock, or raises naming its holder.

        Raises:
            CheckpointLockedError: another writer holds the path (in this process or another).
            CheckpointWriteError: the lock file cannot be created (e.g. a read-only directory).
        """
        if self._fd is not None or fcntl is None:
            return
        key = os.path.abspath(self.file)
        with _guard:
            holder, stale = _held.get(key), None
            if holder is not None and holder is not self and holder.active is not None and not holder.active():
                holder._release_unguarded()
                holder, stale = None, holder
            if holder is not None and holder is not self:
                raise CheckpointLockedError(
                    f"The checkpoint path {self.path!r} is in use by {holder.owner} in this process "
                    f"(pid {os.getpid()}): two writers on one path would delete each other's files. Give each "
                    "writer its own path, or end the other one first (a Checkpoint callback releases its path "
                    "when training ends, or with its release() method)."
                )
            self._fd = self._lock(key)
            _held[key] = self
        if stale is not None and stale.taken_over is not None:
            stale.taken_over()

    def _lock(self, key: str) -> int:
        while True:
            try:
                fd = os.open(self.file, os.O_RDWR | os.O_CREAT | getattr(os, "O_CLOEXEC", 0), 0o666)
            except OSError as error:
                raise CheckpointWriteError(
                    f"Cannot write the checkpoint {self.path!r}: its lock file {self.file!r} cannot be created "
                    f"({error.strerror or error}). Give a path in a writable directory.", self.path, error,
                ) from error
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                holder = _describe(fd)
                os.close(fd)
                raise CheckpointLockedError(
                    f"The checkpoint path {self.path!r} is in use by another process: {holder} holds its lock "
                    f"file {self.file!r}. Two writers on one path would delete each other's files: give each "
                    "run its own path, or stop the other run first."
                ) from None
            except OSError as error:  # a file system without locks: go on unchecked, and say so
                warnings.warn(f"The file system of {self.file!r} does not support locks ({error.strerror}): "
                              "kfit cannot check that no other process writes the same checkpoint path.",
                              stacklevel=4)
                return fd
            try:  # the holder we waited for may have removed the file: lock the one at the path
                same = os.path.samestat(os.fstat(fd), os.stat(self.file))
            except FileNotFoundError:
                same = False
            if not same:
                os.close(fd)
                continue
            info = {"pid": os.getpid(), "host": socket.gethostname(), "owner": self.owner,
                    "since": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")}
            try:  # who holds it, for the message of another writer (best effort: the disk may be full)
                os.ftruncate(fd, 0)
                os.pwrite(fd, (json.dumps(info) + "\n").encode(), 0)
            except OSError:
                pass
            return fd

    def release(self) -> None:
        """Gives the path up (removes the lock file). Safe to call when not held."""
        with _guard:
            self._release_unguarded()

    def _release_unguarded(self) -> None:
        fd, self._fd = self._fd, None
        if fd is None:
            return
        key = os.path.abspath(self.file)
        if _held.get(key) is self:
            del _held[key]
        try:
            if os.path.samestat(os.fstat(fd), os.stat(self.file)):
                os.remove(self.file)
        except OSError:
            pass
        os.close(fd)  # closing releases the flock

    def __enter__(self) -> PathLock:
        self.acquire()
        return self

    def __exit__(self, *exc: Any) -> None:
        self.release()

    def __del__(self) -> None:
        if self._fd is not None:
            try:
                os.close(self._fd)
            except OSError:
                pass


def _describe(fd: int) -> str:
    try:
        info = json.loads(os.pread(fd, 4096, 0).decode("utf-8", "replace"))
        owner, host, since = (_printable(info[key]) for key in ("owner", "host", "since"))
        return f"{owner} of pid {int(info['pid'])} on host {host!r} (since {since})"
    except (OSError, ValueError, KeyError, TypeError):
        return "a writer that did not say who it is"


def _printable(value: Any) -> str:
    """What another process wrote, safe to print: control characters replaced, at most 200 characters."""
    return "".join(c if c.isprintable() else "?" for c in str(value))[:200]
