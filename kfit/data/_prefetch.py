"""Read the next minibatches ahead of the training step, on a background thread.

The minibatch at each clock reading is a pure function of the clock (see ``kfit.training._plan``), so
the reader can walk the plan ahead of the trainer. If the trainer asks for a position the reader did
not predict (a restore, a seek), the queue is dropped and reading restarts there.
"""

from __future__ import annotations

import queue
import sys
import threading
import warnings
from collections.abc import Callable, Iterator
from typing import Any

_STOP = object()

#: Seconds :meth:`Prefetcher.close` waits for a read in progress to return before it leaves the reader thread behind:
#: longer than a slow read takes (a PyDataset's item read from network storage), which must not outlive the run.
CLOSE_WAIT_S = 10.0


class PrefetcherClosed(RuntimeError):
    """Raised by :meth:`Prefetcher.get` waiting for a minibatch when :meth:`Prefetcher.close` (called on another
    thread: the run ended) stopped the reading: the minibatch will not come, and nothing will take it."""


class Prefetcher:
    """Reads ``read(start, size)`` for each ``(start, size)`` of ``plan`` ahead of :meth:`get`.

    Args:
        read: reads the minibatch at ``(start, size)``; returns a host batch.
        plan: an iterator of ``(start, size)`` pairs, the minibatches the trainer will ask for in order.
        depth: how many minibatches to hold ready (0 reads synchronously).
    """

    def __init__(self, read: Callable[[int, int], Any], plan: Iterator[tuple[int, int]], depth: int = 2):
        if not isinstance(depth, int) or depth < 0:
            raise ValueError(f"Invalid value for argument `prefetch`: expected a non-negative integer. Received: prefetch={depth!r}")
        self._read = read
        self._plan = plan
        self._depth = depth
        self._queue: queue.Queue = queue.Queue(maxsize=max(depth, 1))
        self._stop = threading.Event()
        self._reading: tuple[int, int] | None = None  # the (start, size) read last (in progress, if it hangs)
        self._thread: threading.Thread | None = None
        if depth > 0:
            self._thread = threading.Thread(target=self._run, name="kfit-prefetch", daemon=True)
            self._thread.start()

    def _run(self) -> None:
        try:
            for start, size in self._plan:
                if self._stop.is_set():
                    return
                self._reading = (start, size)
                item = (start, size, self._read(start, size))
                while not self._stop.is_set():
                    try:
                        self._queue.put(item, timeout=0.1)
                        break
                    except queue.Full:
                        continue
        except BaseException as error:  # surfaced to the trainer by get()
            self._put_final(error)
            return
        self._put_final(_STOP)

    def _put_final(self, item: Any) -> None:
        while not self._stop.is_set():
            try:
                self._queue.put((None, None, item), timeout=0.1)
                return
            except queue.Full:
                continue

    @property
    def active(self) -> bool:
        """True while the reader thread runs (not closed, not fallen back to reading on the trainer's thread)."""
        return self._thread is not None and not self._stop.is_set()

    def get(self, start: int, size: int) -> Any:
        """The minibatch at ``(start, size)``: from the queue when it was predicted, else read now.

        Raises:
            PrefetcherClosed: :meth:`close` was called on another thread while this waited.
        """
        if self._thread is None:
            return self._read(start, size)
        while True:
            try:
                got_start, got_size, item = self._queue.get(timeout=0.1)
                break
            except queue.Empty:
                # (a tf.data iterator's generator thread waits here; closed, it must end, or the iterator's
                # destructor, in a garbage collection on the trainer's thread, waits for it forever)
                if self._stop.is_set():
                    raise PrefetcherClosed(f"The reader was closed while the minibatch at sample {start} (of "
                                           f"{size}) was awaited.") from None
        if got_start is None:
            if isinstance(item, BaseException):
                raise item
            return self._read(start, size)
        if (got_start, got_size) != (start, size):
            # The plan and the trainer disagree: never train on a batch that was not asked for.
            self.close()
            return self._read(start, size)
        return item

    def close(self) -> None:
        """Stops the reader thread, once a read in progress has ended, and drops what it read ahead.

        A read left running would go on beside the next epoch's reads (in the dataset's code and the stream's state),
        and after ``fit`` returns. A read that has not returned after :data:`CLOSE_WAIT_S` seconds (a dataset's
        ``__getitem__`` that hangs) is left running all the same, with a warning that names the minibatch and where
        the read waits: the thread is a daemon thread (it does not keep Python from exiting) and ends, dropping
        what it read, if the read returns."""
        self._stop.set()
        thread = self._thread  # (a close on another thread may set it to None while this one waits)
        if thread is not None:
            while True:
                try:
                    self._queue.get_nowait()
                except queue.Empty:
                    break
            if thread is not threading.current_thread():
                thread.join(CLOSE_WAIT_S)
                if thread.is_alive():
                    self._warn_left_behind(thread)
            self._thread = None

    def _warn_left_behind(self, thread: threading.Thread) -> None:
        start, size = self._reading or (None, None)
        frame = sys._current_frames().get(thread.ident)
        # Where the read waits: the innermost frame outside Python's standard library (threading's waits, say).
        while frame is not None and frame.f_globals.get("__name__", "").partition(".")[0] in sys.stdlib_module_names:
            frame = frame.f_back
        where = "" if frame is None else (
            f" It waits in {getattr(frame.f_code, 'co_qualname', frame.f_code.co_name)} "
            f"({frame.f_code.co_filename}, line {frame.f_lineno}).")
        warnings.warn(
            f"Closing kfit's reader of the training data: its read of the minibatch of {size} samples at sample {start} "
            f"has not returned after {CLOSE_WAIT_S:g} s.{where} The reader thread is left behind with it (a daemon "
            "thread: it does not keep Python from exiting; it ends, dropping what it read, if the read returns). If the "
            "read hangs, fix the data's __getitem__ (a PyDataset's, an array-like's); if reads can take this long, "
            "they may overlap the next ones.", stacklevel=3)
