"""A ``keras.utils.PyDataset`` read as a seekable stream of samples.

A PyDataset serves whole batches. The stream lays its batches end to end, sweep after sweep; each sweep
visits the batches in an order shuffled by ``(seed, sweep)`` (samples inside a batch keep their order).
A minibatch of any size is cut from that sequence, so minibatch-size schedules work, and the position is
a function of the clock alone: seeking reads only the batches the next minibatch needs.

The dataset's own ``on_epoch_begin`` and ``on_epoch_end`` run as under ``model.fit`` (which calls ``on_epoch_end``
once before the first epoch, then both around each): before the first read of each sweep, the stream calls
``on_epoch_begin`` (and ``on_epoch_end`` first, unless :meth:`PyDatasetStream.end_sweep` called it when the sweep
before ended), as many times as ``model.fit`` would have by then, so a dataset that reshuffles itself there (from
its own seeded random state) serves the same batches, and a resumed run replays the calls up to its sweep.
``kfit.fit`` ends each sweep when Keras ends the epoch that ends it (after its last step, before validation, as
``model.fit`` does) and reads no sweep ahead of the epoch that reads it, so a callback that changes the dataset in
its ``on_epoch_begin`` (a curriculum) changes the batches of that epoch.

A dataset's ``workers`` and ``use_multiprocessing`` work as under ``model.fit``: told each epoch's plan
(:meth:`PyDatasetStream.read_ahead`), the stream fetches the items it reads next on a pool of threads or processes,
at most ``max_queue_size`` ahead, within the epoch (:mod:`kfit.data._items_ahead`).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from kfit.data._items_ahead import ItemsAhead
from kfit.data._stream import check_global_minibatch, flatten, pack, read_share


def _as_triple(item: Any) -> tuple:
    if isinstance(item, tuple):
        if len(item) == 1:
            return item[0], None, None
        if len(item) == 2:
            return item[0], item[1], None
        if len(item) == 3:
            return item
        raise ValueError(f"A PyDataset batch must be x, (x,), (x, y) or (x, y, sample_weight). Received a tuple of {len(item)}.")
    return item, None, None


class PyDatasetStream:
    """An endless, seekable sample stream over a ``keras.utils.PyDataset``.

    Args:
        dataset: the PyDataset; every batch but the last must hold the same number of samples.
        shuffle: shuffle the order of the batches in each sweep.
        seed: the stream's seed.
        rank, num_workers: this worker's share of every global minibatch.

    Raises:
        ValueError: an empty dataset, or batches of unequal sizes before the last.
    """

    def __init__(self, dataset: Any, *, shuffle: bool = True, seed: int = 0, rank: int = 0, num_workers: int = 1):
        self.dataset = dataset
        num_batches = dataset.num_batches if hasattr(dataset, "num_batches") else len(dataset)
        if num_batches is None:
            raise ValueError("Invalid value for argument `x`: an infinite PyDataset (num_batches=None) has no sweeps to seek in. Give it a length.")
        if num_batches < 1:
            raise ValueError("Invalid value for argument `x`: the PyDataset is empty (0 batches).")
        self.num_batches = int(num_batches)
        first = _as_triple(dataset[0])
        self.structure = first
        self.batch_size = self._length(first)
        last = first if self.num_batches == 1 else _as_triple(dataset[self.num_batches - 1])
        self.last_size = self._length(last)
        self.sizes = np.full(self.num_batches, self.batch_size, dtype=np.int64)
        self.sizes[-1] = self.last_size
        self.num_samples = int(self.sizes.sum())
        self.shuffle = bool(shuffle)
        self.seed = int(seed)
        self.rank = rank
        self.num_workers = num_workers
        self.pads_empty_shares = False  # see SampleStream.pads_empty_shares
        self.position = 0
        self.has_h5py = False
        self._sweep_cache: tuple[int, np.ndarray, np.ndarray] | None = None
        self._batch_cache: dict[int, list] = {}
        self._items = ItemsAhead(dataset)
        self._passes = 0  # the sweeps the dataset was told of (its on_epoch_end and on_epoch_begin called)
        self._ended = False  # the last sweep told of has ended (its on_epoch_end called)
        #: Whether reads tell the dataset of their sweep. ``kfit.fit`` turns it off until its first epoch begins: what
        #: it reads before (to build the model) reads the dataset as it is, as ``model.fit``'s first look does.
        self.telling = True

    @staticmethod
    def _length(triple: tuple) -> int:
        leaves = [leaf for leaf in flatten(triple) if leaf is not None]
        if not leaves:
            raise ValueError("Invalid value for argument `x`: the PyDataset's batches hold no arrays.")
        return len(leaves[0])

    def _sweep(self, sweep: int) -> tuple[np.ndarray, np.ndarray]:
        """Batch order of ``sweep`` and the stream offset where each of those batches starts."""
        if self._sweep_cache is None or self._sweep_cache[0] != sweep:
            order = np.arange(self.num_batches)
            if self.shuffle:
                order = np.random.default_rng([self.seed, sweep]).permutation(self.num_batches)
            starts = np.concatenate([[0], np.cumsum(self.sizes[order])[:-1]])
            self._sweep_cache = (sweep, order, starts)
        return self._sweep_cache[1], self._sweep_cache[2]

    def _batch(self, sweep: int, index: int) -> list:
        if index not in self._batch_cache:
            if len(self._batch_cache) > 4:
                self._batch_cache.clear()
            triple = _as_triple(self._items.get(sweep, index))
            self._batch_cache[index] = [None if leaf is None else np.asarray(leaf) for leaf in flatten(triple)]
        return self._batch_cache[index]

    def _begin_sweep(self, sweep: int) -> None:
        """Tells the dataset of every sweep up to ``sweep`` not told yet, as ``model.fit`` tells it of its epochs."""
        while self._passes <= sweep:
            if not self._ended:
                self.dataset.on_epoch_end()
            self.dataset.on_epoch_begin()
            self._passes += 1
            self._ended = False
            self._batch_cache.clear()  # the dataset may serve other rows now
            self._items.dataset_changed()

    def end_sweep(self, position: int) -> None:
        """Calls the dataset's ``on_epoch_end`` now if the global stream ``position`` ends the sweep last begun (an
        epoch ended there, as ``model.fit`` calls it when an epoch's data runs out; 0: before the first sweep, as
        ``model.fit`` calls it before its first epoch); else leaves it for the next sweep's first read."""
        if position % self.num_samples == 0 and position // self.num_samples == self._passes and not self._ended:
            self.dataset.on_epoch_end()
            self._ended = True

    def epoch_begins(self) -> None:
        """An epoch begins (after every callback's ``on_epoch_begin``, which may have changed the dataset): reads tell
        the dataset of their sweep from now on, and the batches kept from earlier reads are read again."""
        self.telling = True
        self._batch_cache.clear()
        self._items.dataset_changed()

    def read_ahead(self, plan: list[tuple[int, int]]) -> None:
        """The ``(start, size)`` global minibatches of the epoch beginning now: with the dataset's ``workers`` (or
        ``use_multiprocessing``), the items they read are fetched ahead, concurrently, in order, as model.fit does."""
        if self._items.parallel:
            self._items.expect(self._keys(plan))

    def stop_reading_ahead(self) -> None:
        """Drops what was fetched ahead and ends the threads or processes fetching it."""
        self._items.close()

    def _keys(self, plan: list[tuple[int, int]]):
        """The ``(sweep, index)`` of each batch that reading ``plan`` reads, in order, each where it is first read."""
        last = None
        for start, size in plan:
            for sweep, index, _row, _take in self._pieces(*read_share(start, size, self.rank, self.num_workers)):
                if (sweep, index) != last:
                    last = (sweep, index)
                    yield last

    def _pieces(self, lo: int, hi: int):
        """``(sweep, batch index, first row, rows)`` of each batch piece that stream positions ``[lo, hi)`` hold."""
        position = lo
        while position < hi:
            sweep, offset = divmod(position, self.num_samples)
            order, starts = self._sweep(sweep)
            k = int(np.searchsorted(starts, offset, side="right") - 1)
            row = offset - int(starts[k])
            take = min(hi - position, int(self.sizes[order[k]]) - row)
            yield sweep, int(order[k]), row, take
            position += take

    def _rows(self, lo: int, hi: int) -> list:
        pieces: list[list] = []
        for sweep, index, row, take in self._pieces(lo, hi):
            if self.telling:
                self._begin_sweep(sweep)
            batch = self._batch(sweep, index)
            pieces.append([None if leaf is None else leaf[row : row + take] for leaf in batch])
        return [None if parts[0] is None else np.concatenate(parts) for parts in zip(*pieces)]

    def check_minibatch_size(self, size: int) -> None:
        check_global_minibatch(size, self.num_workers, self.pads_empty_shares)

    def read(self, start: int, size: int) -> tuple:
        """This worker's share of the global minibatch at stream positions ``[start, start + size)``."""
        self.check_minibatch_size(size)
        lo, hi = read_share(start, size, self.rank, self.num_workers)
        return pack(self.structure, self._rows(lo, hi))

    def get_state(self) -> dict[str, Any]:
        return {"position": int(self.position), "seed": self.seed, "shuffle": self.shuffle, "num_samples": self.num_samples}

    def set_state(self, state: dict[str, Any]) -> None:
        if int(state.get("num_samples", self.num_samples)) != self.num_samples:
            raise ValueError(f"The saved stream state is for {state['num_samples']} samples, but the PyDataset holds {self.num_samples}. Resume with the same data.")
        self.seed = int(state.get("seed", self.seed))
        self.shuffle = bool(state.get("shuffle", self.shuffle))
        self.position = int(state["position"])
        self._sweep_cache = None
