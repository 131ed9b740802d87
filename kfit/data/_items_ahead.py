"""Fetches a ``keras.utils.PyDataset``'s items ahead, concurrently, as ``model.fit`` does with its ``workers``.

Under ``model.fit``, Keras's ``OrderedEnqueuer`` fetches the items of a PyDataset with ``workers > 1`` (or
``use_multiprocessing`` and ``workers > 0``) on a pool of that many threads (processes with
``use_multiprocessing``), at most ``max_queue_size`` ahead, in the order it uses them, and makes its pool again for
each epoch. kfit's stream reads items in its own order (its seeded shuffle, minibatches of any size): it tells
:class:`ItemsAhead` the items an epoch will read, in order, and this fetches them on the same kind of pool, at most
``max_queue_size`` ahead, never one of a sweep the dataset has not been told of yet (its ``on_epoch_begin`` may
change what it serves). The pool is made again each time the dataset may have changed (a sweep told, an epoch
begun), so worker processes see the dataset as it is then; nothing is fetched past the epoch's plan.

A worker process that dies (the kernel's out-of-memory killer, ``os._exit`` or a crash in native code in
``__getitem__``) loses the item it was fetching: ``multiprocessing.Pool`` starts another process, but that item's
result never comes, and Keras's ``OrderedEnqueuer`` waits for it forever (``model.fit`` hangs; Keras 3.15). Here the
read waiting for an item finds the dead process, ends the pool and raises a ``RuntimeError`` that says so. (Not where
``Pool.terminate`` itself waits forever, CPython's bpo-22393: a process killed while it held one of the pool's queue
locks, waiting for a task or sending a result.)

A worker process starts with SIGTERM and SIGINT blocked, until it has put its own handlers in place: forked, it would
otherwise begin with the training process's (a ``Checkpoint``'s, which defers SIGTERM to save the run), and a
``Pool.terminate`` in the first milliseconds of its life (an epoch cut short just after its pool was made) was then
deferred by a process that never saves: the worker lived on, and ``terminate`` waited for it forever.
"""

from __future__ import annotations

import collections
import multiprocessing
import multiprocessing.pool
import signal
import threading
from collections.abc import Iterator
from typing import Any

_DATASET: Any = None  # a worker process's PyDataset
#: The signals a worker process handles its own way (:func:`_init_worker`), blocked until it does.
_WORKER_SIGNALS = {signal.SIGTERM, signal.SIGINT}
_MASKS = hasattr(signal, "pthread_sigmask")  # (not on Windows, which has no fork either)


def _init_worker(dataset: Any) -> None:
    global _DATASET
    _DATASET = dataset
    # The handlers of the training process (a Checkpoint's, which lets SIGTERM save the run) are not a worker's: the
    # pool ends its workers with SIGTERM, and Ctrl-C is the training process's to handle.
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    if _MASKS:  # a SIGTERM sent before now (Pool.terminate) was held: it ends the process here
        signal.pthread_sigmask(signal.SIG_UNBLOCK, _WORKER_SIGNALS)


def _item(index: int) -> Any:
    return _DATASET[index]


def _death(dataset: Any, exitcode: int) -> RuntimeError:
    """The error of a worker process that died with ``exitcode`` (a process's: ``-N`` for signal ``N``)."""
    if exitcode < 0:
        try:
            how = f"was killed by signal {signal.Signals(-exitcode).name}"
        except ValueError:
            how = f"was killed by signal {-exitcode}"
    else:
        how = f"exited with code {exitcode}"
    return RuntimeError(
        f"A worker process fetching the items of the PyDataset {type(dataset).__name__} (workers="
        f"{getattr(dataset, 'workers', None)}, use_multiprocessing=True) {how} while items were being fetched: the "
        "item it was fetching is lost. If memory ran out (the kernel's out-of-memory killer sends SIGKILL), lower the "
        "dataset's `workers` or `max_queue_size`, or the memory one item takes; else `__getitem__` ended the process "
        "(os._exit, sys.exit) or crashed in native code: read the dataset's items with use_multiprocessing=False to "
        "see where.")


class ItemsAhead:
    """Fetches ``dataset[index]`` for each ``(sweep, index)`` an epoch will read, ahead of :meth:`get`.

    Args:
        dataset: the PyDataset; its ``workers``, ``use_multiprocessing`` and ``max_queue_size`` say how, as in
            ``model.fit``. With neither more than one worker nor ``use_multiprocessing``, every item is read when asked.
    """

    def __init__(self, dataset: Any):
        workers = int(getattr(dataset, "workers", 1) or 0)
        self._processes = bool(getattr(dataset, "use_multiprocessing", False))
        #: Whether items are fetched ahead (Keras's PyDatasetAdapter's test for starting its enqueuer).
        self.parallel = workers > 1 or (workers > 0 and self._processes)
        self._workers = max(workers, 1)
        self._depth = max(int(getattr(dataset, "max_queue_size", 10) or 1), 1)
        self._dataset = dataset
        self._pool: multiprocessing.pool.Pool | None = None
        self._pool_processes: list = []  # the worker processes the pool started with (processes only)
        self._pending: collections.deque = collections.deque()  # ((sweep, index), AsyncResult), in reading order
        self._keys: Iterator[tuple[int, int]] | None = None
        self._next: tuple[int, int] | None = None
        self._lock = threading.RLock()  # the reader thread reads; the trainer's thread closes

    def expect(self, keys: Iterator[tuple[int, int]]) -> None:
        """The ``(sweep, index)`` items the epoch beginning now reads, in order (each once, where it is first read)."""
        with self._lock:
            self.close()
            if self.parallel:
                self._keys = keys
                self._next = next(keys, None)

    def dataset_changed(self) -> None:
        """The dataset was told of a sweep, or may have been changed: what is fetched from now on, a new pool fetches."""
        self._drop_pool()

    def get(self, sweep: int, index: int) -> Any:
        """``dataset[index]``, read while sweep ``sweep`` is told: fetched ahead if expected, else read now."""
        with self._lock:
            ahead = self._keys is not None
            if ahead:
                self._fill(sweep)
                ahead = bool(self._pending) and self._pending[0][0] == (sweep, index)
                if not ahead:
                    self.close()  # a read the epoch's plan did not foresee: the rest of it is read as asked
                else:
                    pool, result, processes = self._pool, self._pending.popleft()[1], self._pool_processes
        if not ahead:  # (outside the lock: a read that hangs must not hold up close(), on the trainer's thread)
            return self._dataset[index]
        while not result.ready():
            if self._closed(pool, processes):  # closed meanwhile (by the trainer's thread): its result never comes
                return self._dataset[index]
            result.wait(0.05)
        return result.get()  # raises what __getitem__ raised, as model.fit's enqueuer does

    def _closed(self, pool: multiprocessing.pool.Pool, processes: list) -> bool:
        """Whether ``pool`` was closed; raises if one of its worker ``processes`` died (and closes it)."""
        with self._lock:  # (the trainer's thread closes a pool under it: its processes end then, and died of nothing)
            if self._pool is not pool:
                return True
            # A worker never exits on its own (no maxtasksperchild): it died, and the item it was fetching with it.
            # Those the pool started with are enough to look at: the pool replaces only those that died.
            dead = next((process.exitcode for process in processes if process.exitcode is not None), None)
            if dead is not None:
                self.close()
                raise _death(self._dataset, dead)
            return False

    def _fill(self, sweep: int) -> None:
        while self._next is not None and self._next[0] <= sweep and len(self._pending) < self._depth:
            if self._pool is None:
                self._pool = self._new_pool()
            if self._processes:
                result = self._pool.apply_async(_item, (self._next[1],))
            else:
                result = self._pool.apply_async(self._dataset.__getitem__, (self._next[1],))
            self._pending.append((self._next, result))
            self._next = next(self._keys, None)

    def _new_pool(self) -> multiprocessing.pool.Pool:
        if self._processes:  # as Keras's OrderedEnqueuer: the default context, the dataset handed to each process
            # Workers inherit this thread's signal mask (and the pool's threads, which start replacement workers, do
            # too): blocked until _init_worker. The training process's signals go to its other threads meanwhile.
            mask = signal.pthread_sigmask(signal.SIG_BLOCK, _WORKER_SIGNALS) if _MASKS else None
            try:
                pool = multiprocessing.Pool(self._workers, initializer=_init_worker, initargs=(self._dataset,))
            finally:
                if mask is not None:
                    signal.pthread_sigmask(signal.SIG_SETMASK, mask)
            # Pool's list of its processes (``_pool``: a CPython internal, there since Python 2.6), as started.
            self._pool_processes = list(pool._pool)
            return pool
        return multiprocessing.pool.ThreadPool(self._workers)

    def _drop_pool(self) -> None:
        with self._lock:
            self._pending.clear()
            pool, self._pool, self._pool_processes = self._pool, None, []
            if pool is not None:
                pool.terminate()
                pool.join()

    def close(self) -> None:
        """Stops fetching ahead and ends the pool's threads or processes."""
        with self._lock:
            self._keys, self._next = None, None
            self._drop_pool()
