"""kfit's stream as a Keras data adapter: ``model.fit`` itself trains on kfit's minibatches.

``kfit.fit`` hands :class:`StreamAdapter` to ``model.fit`` as its ``x``. Keras then runs its own loop
(its callbacks, ``train_step``, EMA, ``steps_per_execution``, validation, progress bar) and draws, for
each of its epochs, the minibatches of one kfit epoch: the plan (``kfit.training._plan``) read from the
clock when the epoch begins, read ahead on a background thread. Batches reach ``train_step`` as Keras
packs them: ``x``, ``(x, y)`` or ``(x, y, sample_weight)``.

An epoch may hold fewer minibatches than the adapter declares (the epoch a run resumes in, the last one
before ``max_samples``, a minibatch-size schedule): its iterator ends early, which Keras handles as the
end of the epoch.

On TensorFlow the ``tf.data`` pipeline declares the batch dimension as Keras's own array adapter does: static (the
minibatch size) when every minibatch the step is handed until the end of the ``fit`` call has the same rows (a
fixed minibatch size that no epoch end, nor the end of the call, cuts short; or ``pad`` padding every one to it),
unknown otherwise (a minibatch-size schedule, a remainder). TensorFlow traces another graph for each, whose float
rounding can differ (a ``SimpleRNN`` under oneDNN): ``kfit.fit`` on the same minibatches as ``model.fit`` then
trains to the same bits.
"""

from __future__ import annotations

import math
import os
from collections.abc import Callable, Iterator
from typing import Any

import keras
import numpy as np

from kfit import _backend
from kfit.data import _epochs_ahead
from kfit.data._prefetch import Prefetcher, PrefetcherClosed

#: ``0`` turns reading ahead across epochs off (``kfit.data._epochs_ahead``): each epoch starts its own reader.
READ_AHEAD_VARIABLE = "KFIT_READ_AHEAD"
#: The most minibatches walked to find the longest epoch of a minibatch-size schedule.
_PLAN_WALK_LIMIT = 200_000


def pack_batch(x: Any, y: Any, sample_weight: Any) -> Any:
    """``x``, ``(x, y)`` or ``(x, y, sample_weight)``: the form ``model.fit`` hands ``train_step``."""
    if y is None and sample_weight is None:
        return x
    if sample_weight is None:
        return (x, y)
    return (x, y, sample_weight)


class StreamAdapter(_backend.DataAdapter):
    """Feeds ``model.fit`` the minibatches of kfit's plan, one kfit epoch per Keras epoch.

    Args:
        read: ``read(start, size)`` returns the host batch ``(x, y, sample_weight)`` at those global
            positions (this worker's share).
        epoch_plan: returns the ``(start, size)`` list of the epoch beginning at the clock's reading.
        declared_batches: the number of minibatches Keras is told an epoch holds (an upper bound).
        batch_size: the fixed minibatch size (per worker), or None for a schedule.
        prefetch: minibatches read ahead on a background thread.
        rows: for data in memory, ``(data, rows)``: the whole ``(x, y, sample_weight)`` and ``rows(start, size)``,
            the indices ``read(start, size)`` gathers. On TensorFlow the batches are then gathered by
            ``tf.data`` itself, as Keras's own array adapter does, instead of passing through Python.
        ahead: ``(reading, plan_at)``: the clock's reading ``(samples, minibatches)`` and the pure
            ``plan_at(samples, minibatches)`` that ``epoch_plan`` uses. One reader then serves the whole
            ``fit`` call, reading each next epoch's plan and first minibatches ahead (``kfit.data._epochs_ahead``):
            with ``rows`` on TensorFlow one ``tf.data`` iterator, else (``prefetch`` > 0) one reader thread.
            ``KFIT_READ_AHEAD=0`` in the environment turns that off.
        source: the stream read, if it has epoch hooks of its own (:class:`kfit.data.PyDatasetStream`): it reads no
            epoch ahead of the epoch that reads it (the dataset's user code may depend on what a callback's
            ``on_epoch_begin`` changed), is told when each epoch begins (``source.epoch_begins()``), and ends its
            sweep when Keras ends the epoch that ends it (``source.end_sweep(position)``).
        pad: for a step compiled per shape (JAX; TensorFlow with ``jit_compile=True``), what pads each minibatch to
            the rows the step is handed it with (``kfit.training._padding.Padding``: ``pad.rows(plan, minibatches)``
            for the minibatches of an epoch's plan, ``pad.batch(batch, rows)``). The batches then carry sample
            weights and a row mask; on TensorFlow over data in memory ``tf.data`` pads them itself.

    On TensorFlow the batch dimension of the ``tf.data`` elements is static when :meth:`_static_rows` finds every
    minibatch from the dataset's first to the end of the call of one size (with ``batch_size`` given, through
    ``plan_at``); Keras's own dataset (:meth:`get_tf_dataset`, made before a checkpoint restore moves the clock) is
    checked again when an epoch begins elsewhere than it planned for, and replaced if its batch dimension no longer
    holds.
    """

    def __init__(self, read: Callable[[int, int], tuple], epoch_plan: Callable[[], list],
                 declared_batches: int | None, batch_size: int | None, prefetch: int = 2,
                 rows: tuple[tuple, Callable[[int, int], np.ndarray]] | None = None,
                 ahead: tuple[Callable[[], tuple[int, int]], _epochs_ahead.PlanAt] | None = None,
                 pad: Any = None, whole_epoch_at: _epochs_ahead.PlanAt | None = None, source: Any = None):
        self._rows = rows
        self._source = source
        self._epoch_open = False  # between Keras's on_epoch_begin and on_epoch_end
        self._whole_epoch_at = whole_epoch_at  # the plan of the whole epoch a clock reading is in, max_samples aside
        self._reading = ahead[0] if ahead is not None else None  # the clock reading (samples, minibatches)
        self._plan_at = ahead[1] if ahead is not None else None
        self._ahead = ahead if os.environ.get(READ_AHEAD_VARIABLE, "1") != "0" and source is None else None
        self._tensors: Any = None
        # Reading ahead across epochs: the epochs' chain, the TensorFlow epoch loop its tf.data iterator serves (or
        # None), and its reader thread (None for tf.data's gather from memory).
        self._chain: _epochs_ahead.EpochChain | None = None
        self._chain_owner: Any = None
        self._reader: Prefetcher | None = None
        self._begin_reading: tuple[int, int] | None = None  # the clock when this epoch began
        self._read = read
        self._epoch_plan = epoch_plan
        self._declared = declared_batches
        self._batch_size = batch_size
        self._prefetch = prefetch
        self._plan: list[tuple[int, int]] | None = None
        self._plan_minibatches = 0  # the clock's minibatch count when the epoch of _plan began
        self._prefetchers: list[Prefetcher] = []
        self._signature: Any = None
        self._pad = pad
        # TensorFlow, Keras's own dataset (get_tf_dataset): made (or not), the static rows its elements declare (None:
        # unknown), the clock reading where the next epoch begins if the clock follows the plans it was checked on.
        self._keras_dataset_made = False
        self._keras_rows: int | None = None
        self._keras_checked: tuple[int, int] | None = None
        self._worker_rows_of: dict[int, int] = {}  # a global minibatch size: this worker's rows of it
        #: PyTorch: the next pass Keras opens makes no draw from torch's default generator (set by a mid-epoch restore).
        self.skip_pass_draw = False

    # -- what Keras asks -------------------------------------------------------------------------
    @property
    def num_batches(self) -> int | None:
        return self._declared

    @property
    def batch_size(self) -> int | None:
        return self._batch_size

    @property
    def has_partial_batch(self) -> bool:
        return False

    @property
    def partial_batch_size(self) -> int | None:
        return None

    def on_epoch_begin(self) -> None:
        self.close(keep_reader=True)
        if self._source is not None:
            self._source.epoch_begins()
        self._epoch_open = True
        self._new_plan()
        if self._source is not None:
            self._source.read_ahead(self._plan)
        _backend.declare_epoch_steps(len(self._plan))
        if self._ahead is None:
            self._check_keras_dataset()
            return
        self._begin_reading = now = self._ahead[0]()
        owner = None  # TensorFlow: the epoch loop that one tf.data iterator can serve, if any
        if _backend.BACKEND == "tensorflow" and (self._rows is not None or self._prefetch > 0):
            owner = _backend.one_iterator_epoch_loop()
        if owner is None:
            self._check_keras_dataset()  # Keras's own dataset is read this epoch
        if (self._chain is not None and self._chain_owner is owner and (self._reader is None or self._reader.active)
                and self._chain.continues(now, self._plan)):
            return  # the reader read this epoch's plan ahead: it goes on
        self.close()  # a new reader starts at this epoch's first minibatch (elsewhere than tf.data: when first read)
        if owner is not None:
            chain = self._start_chain(owner)
            rows = self._static_rows(now, self._plan)  # every minibatch of the chain's epochs: to the end of the call
            if self._rows is not None:
                dataset = _epochs_ahead.gathered_dataset(
                    self._data_tensors(), self._rows[1], chain.produce,
                    None if self._pad is None else lambda index, plan: self._pad.rows(plan, chain.reading(index)[1]),
                    static_rows=rows)
            else:
                dataset = self._tf_generator_dataset(lambda: self._chained_batches(chain, keras.tree.lists_to_tuples),
                                                     rows)
            _backend.iterate_once(owner, dataset)

    def _static_rows(self, reading: tuple[int, int] | None, plan: list[tuple[int, int]] | None = None) -> int | None:
        """The rows of every minibatch the step is handed from the clock ``reading`` (``plan``: the plan of the epoch
        beginning there; None: planned now) to the end of the ``fit`` call, when they are one number, else None.

        One number only with a fixed minibatch size (``batch_size``), when no epoch end, nor the end of the call,
        cuts a minibatch short (``_epochs_ahead.constant_size``), or when ``pad`` pads every one to that size; the
        rows of this worker's share of it (read from the data: shares of a global size may differ by one between
        workers)."""
        if self._batch_size is None or self._plan_at is None or reading is None:
            return None
        reading = (int(reading[0]), int(reading[1]))
        plan = self._plan_at(*reading) if plan is None else plan
        if not plan:
            return None
        if self._pad is not None:
            return self._pad.rows(plan[:1], reading[1])[0]  # the scheduled size, fixed: every minibatch is padded to it
        size = _epochs_ahead.constant_size(self._plan_at, reading, plan)
        if size is not None and self._whole_epoch_at is not None and any(
                s != size for _, s in self._whole_epoch_at(*reading)):
            # A call that begins or ends inside an epoch (a resume, max_samples) declares what a call training the
            # whole epoch does: Keras's per-output loss means (CompileLoss) weight each step by the static batch
            # dimension (1 when unknown), and an epoch whose steps several calls train must weight them alike.
            return None
        return None if size is None else self._worker_rows(plan[0][0], size)

    def _worker_rows(self, start: int, size: int) -> int:
        """The rows of this worker's share of the global minibatch ``(start, size)`` (the same for every ``start``)."""
        if size not in self._worker_rows_of:
            if self._rows is not None:
                rows = len(self._rows[1](start, size))
            else:
                # Read on the calling thread (TensorFlow; once a call, for its fixed size). A PyDataset's stream, whose
                # reads change its state (its sweeps told, its batches kept) and run user code, is never read here
                # while a reader reads it: Keras makes its dataset (get_tf_dataset) before any reader starts, and an
                # epoch begins (_check_keras_dataset) once the last epoch's readers and item pool are ended (close,
                # which waits up to 5 s for a read in progress): such a stream is read ahead within its epoch only (no
                # `ahead`). The reader that runs on across epochs reads a SampleStream (h5py, array-likes), whose reads
                # share no state (h5py serializes its calls). Generators and tf.data never come here (SourceAdapter).
                leaves = [a for a in keras.tree.flatten(pack_batch(*self._read(start, size))) if a is not None]
                rows = int(np.shape(leaves[0])[0]) if leaves else size
            self._worker_rows_of[size] = rows
        return self._worker_rows_of[size]

    def _check_keras_dataset(self) -> None:
        """Keeps the batch dimension that Keras's own dataset declares true for the epoch beginning now (TensorFlow).

        It was declared for the clock when ``model.fit`` began, before a checkpoint's restore (or a callback) may have
        moved it: when the epoch begins elsewhere than the plans it was checked on lead, it is checked from here, and
        the dataset replaced if its rows no longer hold (from the next ``iter()`` on, which Keras's loop makes now)."""
        if not self._keras_dataset_made or self._reading is None:
            return
        reading = tuple(self._reading())
        if reading != self._keras_checked:
            rows = self._static_rows(reading, self._plan)
            if rows != self._keras_rows and _backend.replace_epoch_dataset(self._keras_dataset(rows)):
                self._keras_rows = rows
        plan = self._plan
        self._keras_checked = (plan[-1][0] + plan[-1][1], reading[1] + len(plan)) if plan else reading

    def _start_chain(self, owner: Any = None) -> _epochs_ahead.EpochChain:
        """A chain of epochs from this one, read by one reader (``owner``: the epoch loop its tf.data iterator serves)."""
        self._chain = _epochs_ahead.EpochChain(self._ahead[1])
        self._chain.start(self._begin_reading, self.plan)
        self._chain_owner = owner
        return self._chain

    def _start_reader(self, chain: _epochs_ahead.EpochChain, convert: Callable[[Any], Any]) -> Prefetcher:
        """The reader thread of ``chain``'s epochs: every minibatch, read ahead, through ``convert``."""
        self._reader = Prefetcher(self._packed(convert), chain.positions(), depth=self._prefetch)
        return self._reader

    def _packed(self, convert: Callable[[Any], Any]) -> Callable[[int, int], Any]:
        """``read(start, size)`` of a reader: the minibatch packed as Keras hands it, through ``convert``."""
        return lambda start, size: convert(pack_batch(*self._read(start, size)))

    def _chained_batches(self, chain: _epochs_ahead.EpochChain, convert: Callable[[Any], Any]) -> Iterator[Any]:
        """Every minibatch of ``chain``'s epochs, for one tf.data iterator (its reader starts with it)."""
        reader = self._start_reader(chain, convert)
        try:
            for reading, plan in chain.read_epochs():
                if self._pad is None:
                    for start, size in plan:
                        yield reader.get(start, size)
                else:
                    yield from self._padded(plan, (reader.get(start, size) for start, size in plan), reading[1])
        except PrefetcherClosed:  # the run ended while the iterator waited: it ends too
            return

    def on_epoch_end(self) -> None:
        # An epoch that did not run to its end leaves its reader short of where the next one begins.
        self.close(keep_reader=_backend.epoch_iterator_opened_next_pass())
        if self._source is not None:
            if not self._epoch_open:  # Keras's call before the first epoch (its data's reset): the dataset's first
                self._source.end_sweep(0)
            elif self._plan:
                start, size = self._plan[-1]
                self._source.end_sweep(start + size)
        self._epoch_open = False

    @property
    def plan(self) -> list[tuple[int, int]]:
        """The ``(start, size)`` minibatches of the epoch being trained."""
        return self._new_plan() if self._plan is None else self._plan

    @property
    def planned(self) -> list[tuple[int, int]] | None:
        """The epoch's plan if it has been made (None before the epoch's first step: reading :attr:`plan` makes it)."""
        return self._plan

    def _new_plan(self) -> list[tuple[int, int]]:
        """Plans the epoch beginning at the clock's reading."""
        self._plan_minibatches = self._reading()[1] if self._reading is not None else 0
        self._plan = self._epoch_plan()
        return self._plan

    def _padded(self, plan: list[tuple[int, int]], batches: Iterator[Any], minibatches: int) -> Iterator[Any]:
        """``batches``, the minibatches of ``plan`` (an epoch beginning at the clock's minibatch count
        ``minibatches``), padded as the step is handed them (with ``pad``)."""
        for batch, rows in zip(batches, self._pad.rows(plan, minibatches)):
            yield self._pad.batch(batch, rows)

    def _batches(self, convert: Callable[[Any], Any]) -> Iterator[Any]:
        plan = list(self.plan)
        if self._ahead is not None and self._prefetch > 0 and self._begin_reading is not None:
            # One reader for the whole fit call: it reads the next epoch's plan, then its first minibatches, ahead.
            if self._reader is None:
                self._start_reader(self._start_chain(), convert)
            reader, own = self._reader, False
        else:
            reader, own = Prefetcher(self._packed(convert), iter(plan), depth=self._prefetch), True
            self._prefetchers.append(reader)
        try:
            for start, size in plan:
                yield reader.get(start, size)
        except PrefetcherClosed:  # the run ended while the iterator waited: it ends too
            return
        finally:
            if own:
                reader.close()

    def get_numpy_iterator(self) -> Iterator[Any]:
        return self._batches(lambda batch: batch)

    def get_jax_iterator(self) -> Iterator[Any]:
        # NumPy batches, as Keras's own array adapter hands JAX: the compiled step takes them in its fast path.
        # (JAX arrays made on the reader thread cost ~300 us more per step on a CPU: benchmarks/overhead.py.)
        return self._epoch_batches(lambda batch: batch)

    def get_torch_dataloader(self) -> Any:
        return _Iterable(lambda: self._batches(_backend.to_tensors), self._loader_pass_begins)

    def _loader_pass_begins(self) -> None:
        """Keras's PyTorch loop opens a pass: draw what a pass over its own ``DataLoader`` draws from torch's default
        generator (``_backend.draw_as_a_data_loader_pass``), but for the pass of an epoch resumed in its middle, whose
        draw the restored random state holds already (``skip_pass_draw``)."""
        if self.skip_pass_draw:
            self.skip_pass_draw = False
        else:
            _backend.draw_as_a_data_loader_pass()

    def get_tf_dataset(self) -> Any:
        # Its batch dimension: static when every minibatch from the clock's reading now to the end of the call has
        # the same rows (checked again when an epoch begins elsewhere: _check_keras_dataset).
        self._keras_checked = tuple(self._reading()) if self._reading is not None else None
        self._keras_rows = self._static_rows(self._keras_checked)
        self._keras_dataset_made = True
        return self._keras_dataset(self._keras_rows)

    def _keras_dataset(self, rows: int | None) -> Any:
        """Keras's own dataset: the minibatches of the epoch each of its iterators begins in, ``rows`` in each if
        not None."""
        # tf.data takes tuples, not lists, as nested structure (as Keras's own array adapter, lists become tuples).
        if self._rows is not None:
            return self._tf_gathered_dataset(rows)
        return self._tf_generator_dataset(lambda: self._epoch_batches(keras.tree.lists_to_tuples), rows)

    def _epoch_batches(self, convert: Callable[[Any], Any]) -> Iterator[Any]:
        """The epoch's minibatches through ``convert``, as the step is handed them: padded, with ``pad`` (no
        generator in between without: this is the per-step path)."""
        return self._batches(convert) if self._pad is None else self._padded_epoch(convert)

    def _padded_epoch(self, convert: Callable[[Any], Any]) -> Iterator[Any]:
        batches = self._batches(convert)  # the plan is read when the first minibatch is
        yield from self._padded(self.plan, batches, self._plan_minibatches)

    def _tf_generator_dataset(self, batches: Callable[[], Iterator[Any]], rows: int | None = None) -> Any:
        """A ``tf.data`` dataset of the minibatches ``batches()`` yields (as tuples: ``tf.data``'s structure), of
        ``rows`` rows each if not None (the static batch dimension; ``tf.data`` refuses a minibatch of another size)."""
        import tensorflow as tf

        if self._signature is None:
            start, size = self.plan[0] if self.plan else (0, 1)
            sample = keras.tree.lists_to_tuples(pack_batch(*self._read(start, size)))
            if self._pad is not None:
                sample = self._pad.batch(sample, size)
            # A None leaf: an empty Optional, as Keras's own generator adapter hands tf.data one.
            self._signature = tf.nest.map_structure(lambda a: tf.OptionalSpec(None) if a is None else tf.TensorSpec(
                (None, *np.shape(a)[1:]), tf.as_dtype(np.asarray(a).dtype)), sample)
        signature = self._signature
        if rows is not None:
            signature = tf.nest.map_structure(
                lambda spec: tf.TensorSpec((rows, *spec.shape[1:]), spec.dtype)
                if isinstance(spec, tf.TensorSpec) else spec, signature)
        if any(isinstance(spec, tf.OptionalSpec) for spec in tf.nest.flatten(signature)):
            inner = batches
            batches = lambda: (tf.nest.map_structure(  # noqa: E731
                lambda a: tf.experimental.Optional.empty(None) if a is None else a, batch) for batch in inner())
        return tf.data.Dataset.from_generator(batches, output_signature=signature)

    def _tf_gathered_dataset(self, rows: int | None = None) -> Any:
        """One epoch's minibatches gathered by ``tf.data`` from the data in memory: the plan's row indices are read
        once (one Python call, when the iterator starts), the rows of every minibatch by ``tf.gather`` (``rows``
        each, the static batch dimension, if not None)."""
        return _epochs_ahead.gathered_dataset(
            self._data_tensors(), self._rows[1], lambda index: self.plan if index == 0 else [],
            None if self._pad is None else lambda index, plan: self._pad.rows(plan, self._plan_minibatches),
            static_rows=rows)

    def _data_tensors(self) -> Any:
        """The training data in memory as tensors, converted once."""
        if self._tensors is None:
            import tensorflow as tf

            # A None leaf (no target for an output without a loss, as in model.fit(x, [y, None])) stays None, as in
            # Keras's own array adapter: tf.data carries it through (NoneTensorSpec).
            self._tensors = tf.nest.map_structure(lambda a: None if a is None else tf.convert_to_tensor(a),
                                                  keras.tree.lists_to_tuples(pack_batch(*self._rows[0])))
        return self._tensors

    def close(self, keep_reader: bool = False) -> None:
        """Stops the readers of abandoned epochs, and the reader that runs on from epoch to epoch unless
        ``keep_reader``."""
        for prefetcher in self._prefetchers:
            prefetcher.close()
        self._prefetchers = []
        if self._source is not None:
            self._source.stop_reading_ahead()
        if not keep_reader:
            if self._reader is not None:
                self._reader.close()
            self._chain, self._chain_owner, self._reader = None, None, None


class _Iterable:
    """An iterable that starts a new pass at every ``iter()`` (what Keras's torch loop expects), calling
    ``begins`` first if given."""

    def __init__(self, make: Callable[[], Iterator[Any]], begins: Callable[[], None] | None = None):
        self._make = make
        self._begins = begins

    def __iter__(self) -> Iterator[Any]:
        if self._begins is not None:
            self._begins()
        return self._make()


def declared_batches(size_at: Callable[[int, int], int], fixed_size: int | None, samples: int, minibatches: int,
                     epoch_size: int, stop_at: int, plan: Callable[..., Iterator[tuple[int, int]]]) -> int:
    """How many minibatches to tell Keras an epoch holds: exact for a fixed size, else the longest epoch (with
    nothing to train, ``epochs=0``: an epoch's, as ``model.fit`` tells its callbacks)."""
    if fixed_size is not None:
        return max(1, math.ceil((min(epoch_size, stop_at) if stop_at else epoch_size) / fixed_size))
    longest, current, epoch = 0, 0, None
    for walked, (start, _size) in enumerate(plan(samples, minibatches, size_at, epoch_size, stop_at)):
        if walked >= _PLAN_WALK_LIMIT:
            return max(longest, current, epoch_size)
        if start // epoch_size != epoch:
            longest, current, epoch = max(longest, current), 0, start // epoch_size
        current += 1
    return max(1, longest, current)
