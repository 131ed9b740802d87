"""Sources that batch by themselves and cannot seek: ``tf.data``, generators, torch ``DataLoader``\\ s.

``kfit.fit`` trains on them through Keras's own data adapter for the source, wrapped so that kfit's clock
counts the samples of every minibatch: each batch is read one ahead, so the size of a step is known before
the step runs (the per-sample learning rate uses it). Such a source decides its own minibatches and
epochs: a minibatch-size schedule is refused, and an epoch is one pass over the source.

A run resumed on such a source skips ahead: it draws and drops the minibatches the interrupted run had
trained in the epoch it resumes (a generator that is never restarted: every minibatch since the start),
which reproduces the interrupted run when the source yields the same minibatches in the same order. Read on across
epochs (``steps_per_epoch``), Keras's epochs end early where a pass ends: the run's clock follows them
(:attr:`kfit.Clock.epoch_start`), and a ``PyDataset``'s ``on_epoch_begin`` and ``on_epoch_end`` are called for each
epoch the resumed run skips, as Keras's adapter called them (on TensorFlow, whose ``tf.data`` reads a varying number
of batches ahead of those calls, a dataset that changes its rows there cannot resume exactly: ``kfit.fit`` says so;
hooks whose body only returns None are not counted). A ``PyDataset`` with workers that Keras shuffles may not resume
exactly, and says so as it resumes (its queue loses whole epochs' orders, as timing has it). A source of unknown length
that restarts (``tf.data`` of unknown cardinality, Grain, a DataLoader without a length), whose passes' length Keras
learns as the first ends, counting the steps since it made its iterator: the checkpoint holds that length once kfit's
reader has found it, and a resumed run's Keras counts the pass from where the uninterrupted run's stood. Where a pass
ends at an epoch's end (``steps_per_epoch`` divides the pass), Keras finds it ended in the next epoch, which trains no
step: a run resumed from a checkpoint written before that epoch has ``kfit.fit`` play it to the callbacks as it
begins, with the logs ``model.fit`` gave it (see :attr:`SourceAdapter.empty_epoch`).

A ``tf.data`` pipeline read from its start at every epoch also has a state of its own: the
checkpoint holds its iterator's state as the epoch's pass began (its shuffle order and random state, as
``tf.train.Checkpoint`` saves it), and a resumed run opens that same pass before it skips ahead: a pipeline that
reshuffles at every epoch resumes exactly. A pipeline TensorFlow cannot save (a ``py_function``,
``from_generator`` or a stateful random op in it) skips ahead only. A torch ``DataLoader`` (``shuffle=True``, workers)
draws its pass's shuffle order and workers' seeds from torch's random generators when the pass begins: the
checkpoint holds their states as the epoch's pass began, and a resumed run puts them back for the draws of that pass,
then skips ahead: a shuffling DataLoader resumes exactly (read on across epochs, ``steps_per_epoch``, the checkpoint
also holds the sample its pass began at, and only the samples since then are dropped; a dataset that draws random
numbers itself as it is read, say for augmentation, is not reproduced by skipping ahead). So does a ``PyDataset``
that Keras's adapter shuffles (``shuffle=True``, read on across epochs: ``steps_per_epoch``), whose pass draws its
batches' order from Python's random state: the checkpoint holds that state as the pass began.
"""

from __future__ import annotations

import dis
import itertools
import math
import warnings
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import keras
import numpy as np

from kfit import _backend
from kfit._run import StepDriver


def batch_size_of(batch: Any) -> int:
    """The number of samples in a batch as Keras hands it (``x``, ``(x,)``, ``(x, y)``, ``(x, y, w)``): NumPy
    arrays, backend tensors or sparse matrices (SciPy, ``tf.SparseTensor``, JAX ``BCOO``)."""
    x = batch[0] if isinstance(batch, tuple) else batch
    leaves = [leaf for leaf in keras.tree.flatten(x) if leaf is not None]
    if not leaves:
        raise ValueError(f"kfit cannot count the samples of a batch with no input array. Received: {batch!r}")
    shape = getattr(leaves[0], "shape", None)
    return int(shape[0] if shape is not None else np.shape(leaves[0])[0])


class _ReadAhead:
    """Iterates ``source`` one batch ahead, recording the size of every batch it has read; ends after
    ``limit`` batches when one is given. ``hold(index)`` True: the batch of that index (from 0) is not read ahead,
    only when :meth:`release` is called or it is asked for. ``on_read(size)`` is told the size of each batch read,
    ``on_end()`` when the source ends."""

    def __init__(self, source: Iterator[Any], limit: int | None = None,
                 hold: Callable[[int], bool] | None = None, on_read: Callable[[int], None] | None = None,
                 on_end: Callable[[], None] | None = None):
        self._source = source
        self._limit = limit
        self._hold = hold
        self._on_read = on_read
        self._on_end = on_end
        self.sizes: list[int] = []
        self._next: Any = None
        self.done = False
        #: The next batch is held back (see ``hold``).
        self.held = False
        #: True when the source itself ended (not the limit).
        self.exhausted = False
        #: A batch was asked for after the source ended (Keras's loop finding the pass's end by one more call).
        self.asked_past_end = False
        self._advance()

    def _advance(self) -> None:
        if self._limit is not None and len(self.sizes) >= self._limit:
            self.done, self._next = True, None
            return
        if self._hold is not None and self._hold(len(self.sizes)):
            self.held, self._next = True, None
            return
        self._read()

    def release(self) -> None:
        """Reads the batch held back, if one is."""
        if self.held:
            self.held = False
            self._read()

    def _read(self) -> None:
        try:
            batch = next(self._source)
        except StopIteration:
            self.done, self.exhausted, self._next = True, True, None
            if self._on_end is not None:
                self._on_end()
            return
        size = batch_size_of(batch)
        self.sizes.append(size)
        if self._on_read is not None:
            self._on_read(size)
        self._next = batch

    def __iter__(self) -> _ReadAhead:
        return self

    def __next__(self) -> Any:
        if self.held:  # (asked for before the epoch that holds it began)
            self.release()
        if self.done:
            self.asked_past_end = self.asked_past_end or self.exhausted
            raise StopIteration
        batch = self._next
        self._advance()
        return batch


class _Deferred:
    """A pass opened when it is first read."""

    def __init__(self, open_pass: Callable[[], Any]):
        self._open_pass = open_pass
        self._pass: Any = None

    def __iter__(self) -> _Deferred:
        return self

    def __next__(self) -> Any:
        if self._pass is None:
            self._pass = self._open_pass()
        return next(self._pass)


class SourceAdapter(_backend.DataAdapter):
    """Keras's adapter for a source that batches by itself, counted for kfit's clock.

    Args:
        inner: Keras's data adapter for the source.
        restarts: True when every epoch reads the source from its start (``tf.data``, ``DataLoader``,
            ``PyDataset``); False for a generator, which goes on where it stopped.
        save_passes: keep each tf.data pass's starting state for checkpoints (False: the run has no checkpoint,
            and no state is serialized at each epoch).
    """

    num_samples = None

    def __init__(self, inner: Any, restarts: bool, steps_per_epoch: int | None = None, save_passes: bool = True):
        self.inner = inner
        self.restarts = restarts
        dataset = getattr(inner, "py_dataset", None)  # (Keras's PyDatasetAdapter's; checked on Keras 3.10-3.15)
        self._pydataset = dataset if isinstance(dataset, keras.utils.PyDataset) else None
        self.steps_per_epoch = steps_per_epoch
        self._current: _ReadAhead | None = None
        self._underlying: Iterator[Any] | None = None
        self._steps_at_open = 0
        self._skip = 0
        self._claims_exact = True
        self._first_size: int | None = None  # the rows of the first batch (:meth:`peek`)
        self._limit: int | None = None
        #: The pass being read began where a resumed run skipped to (its epoch is shorter than the source's).
        self._resumed_pass = False
        #: The steps left in the epoch a run resumes in, when known, for Keras (see :meth:`on_epoch_begin`).
        self._steps_left: int | None = None
        #: Read on across epochs from a source of known length read from its start at each pass: the batches of the
        #: pass a run resumed in that Keras has still to count (after the resumed epoch's steps), and which pass that
        #: is (a count of the passes opened), so that Keras ends that pass where it ended (see :meth:`on_epoch_begin`).
        self._pass_rest: int | None = None
        self._rest_pass: int | None = None
        self._passes_opened = 0
        #: The epoch in progress is one a resume cut short (the steps it had left): Keras, told so, warns that the
        #: input "ran out of data", which is kfit's doing, not the source's.
        self.cut_short = False
        self._signature: Any = None
        #: Makes an iterable over one pass of the source, in the form Keras asked for (set by ``get_*``).
        self._passes: Callable[[], Any] = {
            "tensorflow": inner.get_tf_dataset, "jax": inner.get_jax_iterator, "torch": inner.get_torch_dataloader,
        }.get(_backend.BACKEND, inner.get_numpy_iterator)
        if _backend.BACKEND == "tensorflow" and not restarts:
            # A generator on TensorFlow: kfit reads the generator itself, and Keras's own dataset for it converts what
            # kfit's reader hands on (see get_tf_dataset): one pass through tf.data, as in model.fit.
            self._passes = inner.generator
        #: The epoch's pass, opened when the epoch began (see :meth:`on_epoch_begin`), until Keras asks for it.
        self._prepared: _ReadAhead | None = None
        #: Steps counted since training began (kept by the driver).
        self.steps = 0
        #: The clock's minibatches when this ``fit`` call began (a resumed run's), for Keras's epochs (:meth:`position`).
        self.first_step = 0
        #: Read on across epochs, a batch is not read ahead across the end of an epoch where ``model.fit``'s own loop does
        #: not read it before the next epoch's callbacks' ``on_epoch_begin`` (JAX, PyTorch; on TensorFlow Keras's
        #: prefetch reads it): a callback that changes a generator's state as an epoch begins (a curriculum) then sees
        #: the epoch's batches made after it, as in ``model.fit``. The batch is read when Keras begins the epoch.
        self._holds_epoch_ends = self.continues and steps_per_epoch is not None and _backend.BACKEND != "tensorflow"
        #: Where ``model.fit``'s own JAX loop reads batches ahead of its step (Keras 3.10-3.14; 3.15 off CPU), it reads
        #: the next epoch's first ones before that epoch's ``on_epoch_begin``: the batch held back is the one after them.
        self._fit_reads_ahead = _backend.fit_batches_read_ahead(inner) if self._holds_epoch_ends else 0
        self.driver: SourceDriver | None = None
        #: A tf.data pipeline read from its start at every epoch: a checkpoint saves the state its iterator had
        #: when the last pass opened began (not when TensorFlow cannot save the pipeline).
        self._tf_data = type(inner).__name__ == "TFDatasetAdapter"
        restarting_tf_data = self._tf_data and not self.continues
        self._saves_passes = save_passes and restarting_tf_data
        #: A torch DataLoader, or arrays Keras's adapter shuffles from the process's random state as each pass
        #: begins: a checkpoint saves the states of the random generators the last pass opened drew from as it
        #: began (see :meth:`_generators`).
        self._loader = _backend.torch_data_loader(inner)
        self._shuffled_arrays = _backend.shuffled_arrays_draw(inner)
        self._shuffled_batches = _backend.pydataset_shuffle_draw(inner)  # (a PyDataset's, from Python's random state)
        self._saves_draws = save_passes and self._generators() is not None and self.restarts
        #: Samples read from the loader's passes since the run began, and when the pass being read began: read on
        #: across epochs (``steps_per_epoch``), a resumed run opens the pass the checkpoint was saved in and drops only
        #: the samples it had trained of that pass.
        self._samples_read = 0
        self._pass_start = 0
        #: A DataLoader pass is read no further than its length where model.fit's own loop reads no further
        #: (:func:`_backend.fit_reads_past_a_pass`): a batch asked for after the last ends the pass, and its sampler
        #: then draws once more from its generator, which model.fit's next pass would not see.
        self._reads_to_length = (self._loader is not None and not self.continues
                                 and not _backend.fit_reads_past_a_pass(inner))
        #: The loader's generators' states as the epoch's pass ended, before the unread pass Keras's PyTorch loop
        #: makes at an epoch's end drew from them (see :meth:`_draw_unread_loader_pass`).
        self._pass_end_states: list | None = None
        #: The kind of state :meth:`get_state` returns (a checkpoint restores it only into the same kind), and what
        #: it holds, for the resume line.
        self.state_kind, self.saved_state = (
            ("DataLoader", "the states of the random generators its shuffle order and workers' seeds came from")
            if self._loader is not None else
            ("Array", "the random state its shuffle order came from") if self._shuffled_arrays is not None else
            ("PyDataset", "the Python random state its batches' order came from") if self._shuffled_batches is not None
            else
            ("tf.data", "its iterator's state (its shuffle order and random state)"))
        #: Makes the unread tf.data iterator Keras's own loop makes at each epoch's end (see :meth:`on_epoch_end`).
        self._mirrors_epoch_end_pass = restarting_tf_data and _backend.BACKEND == "tensorflow"
        #: The first pass, begun by :meth:`peek`: (its iterator, its first batch, its starting state when saved).
        self._peeked: tuple[Iterator[Any], Any, np.ndarray | None] | None = None
        self._pass_state: Any = None  # a tf.data iterator's state, or a DataLoader's generators' (a list)
        self._restored_pass: Any = None  # a pass's state from a checkpoint (a DataLoader's: {"start", "now"})
        self._reopen: tuple[np.ndarray, bool] | None = None  # (state, the pass after the saved one) for _new_pass
        #: True when :meth:`resume` opens the saved pass again (else it only skips ahead).
        self.reopens = False
        #: Keras's TensorFlow loop finds the end of this source's pass by one more call of the train function, which
        #: TensorFlow runs in part (a pass of unknown length: ``tf.data`` of unknown cardinality, Grain); kfit makes
        #: that call where its reader's pass ends (see :meth:`get_tf_dataset`).
        self._pass_ends_in_a_call = False
        #: The checkpoint resumed from was saved at a pass's end before that call (see :meth:`get_state`).
        self._owes_pass_end_call = False
        #: Read on across epochs from a source of unknown length read from its start at each pass (Keras learns its
        #: passes' length when its first pass ends, see :attr:`_learns_pass_length`): the batches of a pass, once kfit's
        #: reader has found the first pass ended (None before), and the batches read of the pass now open.
        self.pass_batches: int | None = None
        self._in_pass = 0
        #: Resumed mid-epoch on a DataLoader: (the batches of the pass read, torch's default generator's state then).
        self._default_state_at: tuple | None = None
        self._learns: bool | None = None  # (see _learns_pass_length)
        #: The checkpoint resumed from said what it knew of the pass length (``pass_batches``: a file written before
        #: kfit saved it does not).
        self._restored_pass_length = False
        #: For the epoch a run resumes in on such a source: Keras's count of the pass, as the uninterrupted run's
        #: ``EpochIterator`` held it (see :meth:`_resume_count` and :func:`_backend.resume_pass_count`).
        self._keras_count: _backend.PassCount | None = None
        #: The ``steps_per_epoch`` to put back into Keras's ``EpochIterator`` as the epoch after a resumed one begins.
        self._epoch_steps_back: Callable[[], None] | None = None
        #: A run resumed where such a pass ended at an epoch's end, from a checkpoint written before the epoch of no
        #: step that followed (see :meth:`_follow_empty_epoch`): that epoch, which ``kfit.fit`` plays to the callbacks
        #: as the run's first epoch begins; None otherwise.
        self.empty_epoch: int | None = None

    @property
    def num_batches(self) -> int | None:
        return self.inner.num_batches

    @property
    def batch_size(self) -> int | None:
        return self.inner.batch_size

    def steps_into_epoch(self, epoch: int, minibatches: int, samples_in_epoch: int) -> int:
        """The steps that epoch ``epoch`` (a pass) had run when the clock read ``minibatches`` steps, for a source
        read from its start at every epoch: from the passes' steps where the source knows them, else the batches of
        its first batch's size that ``samples_in_epoch`` fill (only a pass's last batch is cut short); 0 where
        neither tells."""
        if self.inner.num_batches:
            return min(max(minibatches - epoch * self.inner.num_batches, 0), self.inner.num_batches)
        size = self.batch_size or self._first_size
        return samples_in_epoch // size if size and samples_in_epoch % size == 0 else 0

    @property
    def has_partial_batch(self) -> bool:
        return self.inner.has_partial_batch

    @property
    def partial_batch_size(self) -> int | None:
        return self.inner.partial_batch_size

    def on_epoch_begin(self) -> None:
        self.inner.on_epoch_begin()
        if self._epoch_steps_back is not None:  # (the epoch after one a run resumed inside)
            self._epoch_steps_back()
            self._epoch_steps_back = None
        current = self._current
        if current is not None:
            current.release()  # (the epoch's first batch, held back at the last one's end: the clock sizes its step)
        if self._resumed_pass and self._rest_pass is None:
            # The epoch a run resumed in was cut short by kfit (the samples dropped, or the steps it had left):
            # Keras must not take its length for the source's.
            _backend.set_epoch_batches(self.inner.num_batches)
            self._resumed_pass = False
        # A pass of a length Keras learns whose last batch ended the last epoch: Keras still holds it, and finds it
        # ended in this epoch, which trains no step (the next epoch opens the next pass).
        held = (current is not None and current.exhausted and self._learns_pass_length
                and _backend.epoch_iterator_reads_on())
        if not self.continues or (self.ended_before(self.steps) and not held):
            # Keras opens a new pass for this epoch (on TensorFlow, lazily, once the first step runs), or, after
            # the steps a resumed epoch had left, reads on in the same pass. (Not before every batch read has been
            # trained: where Keras's JAX loop reads batches ahead, the pass's last one is still to train.)
            self._current = None
            if current is not None and current.exhausted:
                self._underlying = None
        if self._current is None:
            # Opened now, not when Keras first reads it (TensorFlow reads lazily, inside the first step): its first
            # batch is then read before that step begins, so the clock knows the step's size in time.
            self._prepared = self._open(self._passes, beginning=True)
        if self._steps_left is not None:
            # The epoch a run resumes in holds only the steps it had left: Keras is told, so that it does not try
            # one more step on the source that has run dry (on TensorFlow such a try still advances the layers'
            # seed generators: dropout would then differ from the uninterrupted run's).
            _backend.set_epoch_batches(self._steps_left)
            self._steps_left = None
            self.cut_short = True
        elif self._rest_pass is not None and self._passes_opened == self._rest_pass:
            # Read on across epochs in the pass a run resumed in: Keras counts a pass's batches from the iterator it
            # made after the resumed epoch's steps (or as the resumed epoch began). Told the rest of that pass, it
            # opens the next pass where that one ended, as it did.
            if self._pass_rest:
                _backend.set_epoch_batches(self._pass_rest)
                self._pass_rest = None
        elif self._rest_pass is not None:  # that pass has ended: Keras counts the source's own length again
            _backend.set_epoch_batches(self.inner.num_batches)
            self._resumed_pass, self._pass_rest, self._rest_pass = False, None, None
        if self._keras_count is not None:
            # The epoch a run resumes in, on a source whose passes' length Keras learns: its loop counts the pass from
            # where the uninterrupted run's stood, and runs the steps the epoch has left.
            count, self._keras_count = self._keras_count, None
            self._epoch_steps_back = _backend.resume_pass_count(count)

    def on_epoch_end(self) -> None:
        self.inner.on_epoch_end()
        self.cut_short = False
        if self._learns_pass_length and self.driver is not None:
            self.driver.follow_epochs()
        if self._mirrors_epoch_end_pass and _backend.epoch_iterator_opened_next_pass():
            self._draw_unread_pass()

    def _draw_unread_pass(self) -> None:
        # Keras's own loop on TensorFlow makes the next epoch's tf.data iterator as soon as an epoch's last step has
        # run, and never reads it (the next epoch makes another): that draws the pipeline's next shuffle seed. kfit
        # makes it too, so that a reshuffling pipeline trains in model.fit's order.
        iter(self.inner.get_tf_dataset())

    def learn_epoch_size(self, clock: Any, epoch_ended: bool = False) -> None:
        """Tells the clock the samples of an epoch once the first epoch's last step is counted: when Keras ends that
        epoch (``epoch_ended``), or already at that step for a source read from its start at every epoch (its epoch is
        one pass) whose number of batches Keras's adapter knows, or whose pass kfit's reader, one batch ahead, found
        ended, or for a source read on across epochs at its ``steps_per_epoch``-th step, so that a checkpoint written
        there (``max_samples``, a save interval) holds a finished epoch, not one 96 samples in (whose resumed run
        would lack the epoch in its History)."""
        if clock.epoch_size is not None or not clock.samples:
            return
        pass_ended = self.ended_before(self.steps) and self._current.exhausted
        if self.continues and self.steps_per_epoch:
            epoch_done = self.position(clock.minibatches) == (1, 0)  # Keras's first epoch has had its steps
        else:
            epoch_done = not self.continues and (pass_ended or self.inner.num_batches
                                                 and clock.minibatches == self.inner.num_batches)
        if epoch_ended or epoch_done:
            clock.epoch_size = clock.samples

    @property
    def epochs_vary(self) -> bool:
        """True when Keras's epochs are counted in steps, not samples (read on across passes, ``steps_per_epoch``):
        one ends early where a pass ends, and a pass's last batch may be short, so the run's clock follows them
        (:attr:`kfit.Clock.epoch_start`, moved on by the driver) rather than counting epochs of one size."""
        return self.continues and self.steps_per_epoch is not None

    @property
    def continues(self) -> bool:
        """True when Keras reads the source on across epochs (a generator; ``steps_per_epoch`` given)."""
        return not self.restarts or self.steps_per_epoch is not None

    @property
    def epoch_steps(self) -> int | None:
        """The steps of one of Keras's epochs read on across passes: ``steps_per_epoch`` rounded up to whole calls of
        the train function (``compile(steps_per_execution=N)``: Keras's ``EpochIterator`` runs an epoch in whole calls
        of ``N`` steps, so ``steps_per_epoch=4`` with ``N=3`` gives epochs of 6 steps), fewer where a pass ends."""
        if not self.steps_per_epoch:
            return self.steps_per_epoch
        per_call = self.driver.per_call if self.driver is not None else 1
        return -(-self.steps_per_epoch // per_call) * per_call

    def position(self, steps: int) -> tuple[int, int]:
        """Keras's ``(epoch, step in epoch)`` after ``steps`` steps read on across epochs (``steps_per_epoch``
        given): an epoch is :attr:`epoch_steps` steps, cut short where a pass of known length ends (Keras's
        ``EpochIterator`` opens the next pass with the next epoch), or of the length kfit learned (``pass_batches``:
        Keras finds such a pass's end by one more step, which ends the epoch it falls in)."""
        per_epoch, per_pass = self.epoch_steps, self._per_pass
        if not per_epoch:
            raise ValueError("position() needs steps_per_epoch")
        if not per_pass:
            return divmod(steps, per_epoch)
        passes, in_pass = divmod(steps, per_pass)
        epoch, step = divmod(in_pass, per_epoch)
        if self.inner.num_batches:
            return passes * math.ceil(per_pass / per_epoch) + epoch, step
        # A length Keras learns: it finds a pass's end by one more step, in the epoch after a last batch that ends an
        # epoch (an epoch of no step: the next pass begins the epoch after it).
        return passes * (per_pass // per_epoch + 1) + epoch, step

    @property
    def _per_pass(self) -> int | None:
        """The batches of a pass: Keras's adapter's, or the length kfit learned (:attr:`pass_batches`)."""
        return self.inner.num_batches or self.pass_batches

    @property
    def _learns_pass_length(self) -> bool:
        """True for a source of unknown length read from its start at every pass and read on across epochs
        (``steps_per_epoch``): Keras's ``EpochIterator`` learns the passes' length when the first one ends, counting
        the steps since it made its iterator (not an endless one: no pass ends)."""
        if not (self.restarts and self.steps_per_epoch is not None and not self.inner.num_batches):
            return False
        if self._learns is None:
            self._learns = not self._endless
        return self._learns

    def resume(self, samples_in_epoch: int, samples: int, steps_in_epoch: int, epochs_done: Sequence[int] = ()) -> int:
        """Positions the source for a run resumed mid-run; returns the samples it will drop.

        A source read from its start at every epoch drops the epoch's first ``samples_in_epoch`` samples (from
        the pass saved in the checkpoint when it holds one, see :meth:`set_state`); one read on across epochs
        drops the first ``samples`` of the run, and the epoch in progress ends after the
        ``epoch_steps - steps_in_epoch`` steps it has left (or where its pass ends). ``epochs_done``: the epochs of
        the restored History (see :meth:`_follow_empty_epoch`).
        """
        self._skip = samples if self.continues else samples_in_epoch
        restored, self._restored_pass = self._restored_pass, None
        pass_start = restored.get("pass_start") if isinstance(restored, dict) else None
        if restored is not None and self.continues and pass_start is not None and 0 <= pass_start <= samples:
            # A DataLoader read on across epochs: the pass the checkpoint was saved in, from the random states it
            # began from, less the samples trained in it.
            self._skip, self._samples_read = samples - pass_start, pass_start
            self._reopen = (restored, False)
            self.reopens = True
        elif restored is not None and not self.continues:
            # Saved mid-epoch: the pass the epoch reads. Saved at an epoch's end: the pass of the epoch that ended,
            # whose random state the next pass follows.
            self._reopen = (restored, samples_in_epoch == 0)
            self.reopens = True
        if self._counts_pass_on_resume:
            if self.pass_batches is None and not steps_in_epoch and samples:
                self._find_first_pass_end()
            if self._at_a_pass_end_that_ends_an_epoch:
                self._follow_empty_epoch(epochs_done)
            # Keras's loop is put where the uninterrupted run's stood in the pass (see _resume_count): it runs the
            # steps the epoch has left and finds the pass's end itself.
            self._keras_count = self._resume_count(steps_in_epoch)
        elif self.steps_per_epoch is not None and steps_in_epoch:
            self._limit = self.epoch_steps - steps_in_epoch
        caveats = self._inexact_resume()
        for caveat in caveats:
            warnings.warn(caveat, stacklevel=2)
        self._claims_exact = not caveats  # (else batches may differ from the checkpointed run's: see _drop)
        return self._skip

    @property
    def _counts_pass_on_resume(self) -> bool:
        """True when a resumed run puts Keras's count of the pass where the uninterrupted run's stood (see
        :meth:`_resume_count`): on a source whose passes' length Keras learns, from a checkpoint that holds what kfit
        knew of that length, one step per call of the train function (with several, a call that finds a pass's end
        trains the batches it read or not as the backend's loop has it: not followed)."""
        per_call = self.driver.per_call if self.driver is not None else 1
        return self._learns_pass_length and self._restored_pass_length and per_call == 1

    def _find_first_pass_end(self) -> None:
        """A run resumed at an epoch's end in the first pass of a source whose passes' length Keras learns, from a
        checkpoint that did not know whether that pass ended there (on JAX and PyTorch kfit's reader reads no batch
        across an epoch's end before the next epoch begins): the pass is opened and read up to there now, and one batch
        more. Where the pass ended, Keras's uninterrupted loop went on with an epoch of no step (see
        :meth:`_follow_empty_epoch`): the run resumes with the epoch after it, on the next pass."""
        self._prepared = self._open(self._passes, beginning=True)
        if self.pass_batches is None:
            return
        self._move_epochs(1)

    def _move_epochs(self, epochs: int) -> None:
        """Moves the epoch the resumed run begins with, Keras's and the clock's, ``epochs`` later."""
        from kfit.clock import get_clock

        model = self.driver.model
        _backend.set_initial_epoch(model, (_backend.initial_epoch(model) or 0) + epochs)
        clock = get_clock(model)
        if clock is not None and clock.epoch_start is not None:
            clock.epoch_start = (clock.epoch_start[0] + epochs, clock.epoch_start[1])

    @property
    def _at_a_pass_end_that_ends_an_epoch(self) -> bool:
        """The run resumes where a pass of a length Keras learns ended with an epoch (``steps_per_epoch`` divides it),
        on a source whose count of the pass the resumed run follows."""
        length = self.pass_batches
        return bool(self._counts_pass_on_resume and length and length % self.epoch_steps == 0 and self.first_step
                    and self.first_step % length == 0)

    def _follow_empty_epoch(self, epochs_done: Sequence[int]) -> None:
        """A run resumed where a pass whose last batch ended an epoch ended: Keras's uninterrupted loop went on with an
        epoch that trains no step, in which it found the pass ended (its History entry: the logs of that fit call's
        last step, or its metrics reset, as the backend has it; see :func:`_backend.empty_epoch_logs`), and the next
        pass opened with the epoch after it. The run resumes with that epoch (the clock of a checkpoint written at the
        empty epoch's end by a kfit that did not move it on there may still name the empty one: ``epochs_done``, the
        restored History's epochs, says it ended); where the checkpoint was written before the empty epoch (its History
        lacks it), :attr:`empty_epoch` names it, for ``kfit.fit`` to play to the callbacks as the run begins."""
        epoch = _backend.initial_epoch(self.driver.model) or 0
        last = max(epochs_done, default=-1)
        if epoch <= last:
            self._move_epochs(last + 1 - epoch)
            epoch = last + 1
        self.empty_epoch = epoch - 1 if epoch - 1 > last else None

    def _resume_count(self, steps_in_epoch: int) -> _backend.PassCount:
        """Where the uninterrupted run's Keras stood in the pass the run resumes in (on a source whose passes' length
        it learns), from the steps trained since the run began (``first_step``) and the pass length kfit learned
        (``pass_batches``, None in the first pass): the steps Keras had counted since it made the pass's iterator (its
        calls of ``steps_per_execution`` steps each), none where the run resumes as a pass begins; and, once the first
        pass ended, the count it took for the pass length: the steps of the call that found the end included."""
        per_call = self.driver.per_call if self.driver is not None else 1
        length = self.pass_batches
        passes, in_pass = divmod(self.first_step, length) if length else (0, self.first_step)
        return _backend.PassCount(
            steps_left=self.epoch_steps - steps_in_epoch if steps_in_epoch else None,
            steps_seen=-(-in_pass // per_call) * per_call if in_pass else None,
            num_batches=(length // per_call + 1) * per_call if length and passes else None)

    def _inexact_resume(self) -> list[str]:
        """What keeps a resume on this source from reproducing the uninterrupted run, said once as it resumes."""
        caveats = []
        if not self.epochs_vary:
            return caveats
        if (self._pydataset is not None and self.inner.num_batches and getattr(self.inner, "shuffle", False)
                and getattr(self.inner, "enqueuer", None) is not None):
            caveats.append(PYDATASET_WORKERS_SHUFFLE_RESUME)
        if self._learns_pass_length and not self._restored_pass_length:
            caveats.append(UNKNOWN_LENGTH_RESUME)
        elif self._learns_pass_length and not self._counts_pass_on_resume:
            caveats.append(UNKNOWN_LENGTH_MULTI_STEP_RESUME)
        return caveats

    @property
    def _endless(self) -> bool:
        """True for a source Keras reads as endless: a ``PyDataset`` of no length (read by index without end), a
        ``tf.data`` pipeline of infinite cardinality (``TFDatasetAdapter.get_tf_dataset`` gives it as it is: Keras
        3.10-3.15)."""
        if self._pydataset is not None:
            return not self.inner.num_batches
        if self._tf_data:
            import tensorflow as tf

            return int(self.inner.get_tf_dataset().cardinality()) == tf.data.INFINITE_CARDINALITY
        return False

    def replay_epoch_hooks(self, epochs: int) -> None:
        """Calls a ``PyDataset``'s ``on_epoch_begin`` and ``on_epoch_end`` once for each of the ``epochs`` epochs a
        resumed run skips, as ``model.fit`` called them (Keras's adapter calls them as every epoch begins and ends, also
        where an epoch ends inside a pass): a dataset that reorders its rows there from its own seeded random state
        serves the resumed epochs the uninterrupted run's rows."""
        for _ in range(epochs if self._pydataset is not None else 0):
            self._pydataset.on_epoch_begin()
            self._pydataset.on_epoch_end()

    @property
    def has_epoch_hooks(self) -> bool:
        """True for a ``PyDataset`` with an ``on_epoch_begin`` or ``on_epoch_end`` of its own (it may change its rows
        there) that does something: one whose body only returns None (``pass``, a docstring) changes nothing."""
        return self._pydataset is not None and not all(
            _does_nothing(getattr(self._pydataset, hook)) for hook in ("on_epoch_begin", "on_epoch_end"))

    def size_of_step(self, steps: int) -> int | None:
        """The size of the ``steps``-th step since training began, if its batch has been read."""
        if self._current is None:
            return None
        index = steps - self._steps_at_open
        sizes = self._current.sizes
        return sizes[index] if 0 <= index < len(sizes) else None

    def ended_before(self, steps: int) -> bool:
        """True when the pass in progress ended before the ``steps``-th step's batch."""
        current = self._current
        return current is not None and current.done and steps - self._steps_at_open >= len(current.sizes)

    def _new_pass(self) -> None:
        self._passes_opened += 1
        self._in_pass = 0
        reopen, self._reopen = self._reopen, None
        peeked, self._peeked = self._peeked, None
        if reopen is None and peeked is not None:  # the pass peek() began: read from its start
            iterator, _, state = peeked
            if self._saves_passes:
                self._pass_state = state
                self._saves_passes = state is not None
        elif self._saves_draws:
            self._underlying = self._new_loader_pass(reopen)
            return
        elif not self._saves_passes:
            self._underlying = iter(self._passes())
            return
        else:
            # kfit makes the pass's tf.data iterator itself (to save its state, or to put a saved one in) and reads it
            # through Keras's own conversions for this backend.
            dataset = self.inner.get_tf_dataset()
            if reopen is not None and reopen[1]:  # the saved pass's random state, then the pass that followed it
                _backend.set_tf_iterator_state(iter(dataset), reopen[0])
                if self._mirrors_epoch_end_pass:
                    self._draw_unread_pass()  # made at the end of the saved pass's epoch, as Keras's loop does
            iterator = iter(dataset)
            if reopen is not None and not reopen[1]:
                _backend.set_tf_iterator_state(iterator, reopen[0])
            self._pass_state = _backend.tf_iterator_state(iterator)
            self._saves_passes = self._pass_state is not None  # TensorFlow cannot save this pipeline: not tried again
        self._underlying = self._read_as(iterator, self._passes.__name__)

    def _generators(self) -> list | None:
        """The random generators a new pass draws from (see :func:`_loader_generators`); None for a source whose
        passes draw from none that kfit can save."""
        if self._loader is not None:
            return _loader_generators(self._loader)
        drawn = self._shuffled_arrays or self._shuffled_batches
        return [drawn, None, None] if drawn is not None else None

    def _torch_loader(self) -> Any:
        """On PyTorch, the DataLoader Keras's loop iterates for a pass of a DataLoader or of arrays (making an
        iterator draws its workers' base seed from torch's default generator); None otherwise."""
        if _backend.BACKEND != "torch":
            return None
        if self._loader is not None:
            return self._loader
        return self.inner.get_torch_dataloader() if type(self.inner).__name__ == "ArrayDataAdapter" else None

    def _new_loader_pass(self, reopen: tuple | None) -> Iterator[Any]:
        """A new pass over the torch DataLoader, keeping the states of the generators it draws from as it begins.

        Resuming (``reopen``: a checkpoint's states, and whether it was saved at an epoch's end): saved at an epoch's
        end, the generators are put where they were then (a sampler with a generator of its own draws once more as its
        pass ends), and the next pass draws from there. Saved mid-epoch, the states the epoch's pass began from are
        put back for the pass's own draws, made as it yields its first batch; torch's default generator then goes back
        to the checkpoint's state once the pass is read as far as it was then (on PyTorch the process's, which dropout
        draws from; on JAX the one saved with the pass: an evaluation of a DataLoader inside the epoch drew from it; see
        :meth:`_put_default_generator_back`), as Python's does at once (a PyDataset's order), and the loader's own
        generators go on from those draws, as in the uninterrupted run."""
        generators = self._generators()
        self._pass_end_states = None
        self._pass_start = self._samples_read
        if reopen is not None:
            saved, ended = reopen
            if ended:
                _set_generator_states(generators, saved["now"])
                if self._torch_loader() is not None and self.inner.num_batches:
                    # Made by Keras's loop at the end of the saved pass's epoch, as its last step had run.
                    iter(self._torch_loader())
            else:
                restored = (generators[0].get_state() if _backend.BACKEND == "torch"
                            or isinstance(generators[0], _backend.PythonGlobalRandom) else None)
                _set_generator_states(generators, saved["start"])
                iterator = iter(self._passes())
                first = next(iterator, _END)
                if self._loader is not None and saved.get("read") and _backend.BACKEND != "tensorflow":
                    # once the pass is read as far as when the checkpoint was written (a sampler may draw as it is
                    # read); not on TensorFlow, whose loop reads the pass on a tf.data thread: the generator's state as
                    # a checkpoint is written is not tied to the batches read there, and it goes on from the pass's draws
                    self._default_state_at = (saved["read"], saved["now"][0] if restored is None else restored)
                elif restored is not None:
                    generators[0].set_state(restored)
                self._pass_state = saved["start"]
                return iterator if first is _END else itertools.chain([first], iterator)
        self._pass_state = _generator_states(generators)
        return iter(self._passes())

    def _read_one(self, size: int) -> None:
        """Counts a batch kfit's reader read from the pass now open."""
        self._in_pass += 1
        self._put_default_generator_back()
        if self.continues and self._saves_draws:
            self._count_read(size)

    def _put_default_generator_back(self) -> None:
        """Resumed mid-epoch on a DataLoader: puts torch's default generator where the checkpoint found it once the
        pass reopened is read as far as it was then (what drew from it after the pass's own draws, say an evaluation
        of a DataLoader inside the epoch, is then drawn; on PyTorch dropout draws from it too)."""
        if self._default_state_at is not None and self._in_pass >= self._default_state_at[0]:
            state, self._default_state_at = self._default_state_at[1], None
            _set_generator_states(self._generators()[:1], [state])

    def _pass_ended(self) -> None:
        """The pass now open ended: the first such pass of a source whose passes' length Keras learns gives it."""
        if self.pass_batches is None and self._in_pass and self._learns_pass_length:
            self.pass_batches = self._in_pass

    def _count_read(self, size: int) -> None:
        """Counts a batch read from the source (a pass read on across epochs begins where the samples read before
        it end: nothing read is left untrained there)."""
        self._samples_read += size

    def _draw_unread_loader_pass(self) -> None:
        # Keras's PyTorch loop makes the next epoch's DataLoader iterator as soon as an epoch's last step has run, and
        # never reads it (the next epoch makes another): that draws the workers' base seed from the loader's generator.
        # kfit makes it too, so that a shuffling loader trains in model.fit's order; a checkpoint keeps the states from
        # before it (the pass's end), and a run resumed at that epoch's end makes it again (:meth:`_new_loader_pass`).
        generators = self._generators()
        self._pass_end_states = None if generators is None else _generator_states(generators)
        iter(self._torch_loader())

    def _read_as(self, iterator: Iterator[Any], method: str) -> Iterator[Any]:
        """``iterator``, over the tf.data pipeline, read in the form Keras's ``inner.<method>()`` gives (its own
        conversions for the backend's loop, sparse ones included)."""
        if method == "get_tf_dataset":
            return iterator
        return iter(_backend.keras_pass(self.inner, iterator, method))

    def get_state(self) -> dict[str, Any] | None:
        """What a checkpoint saves of the source: the state of a ``tf.data`` iterator as the last pass opened began
        (a DataLoader's: of its random generators), and ``pass_end_call`` True when the run stands at a pass's end
        that Keras's TensorFlow loop has not yet found by its one more call (see :meth:`_pass_end_call_due`), and for a
        source whose passes' length Keras learns (:attr:`_learns_pass_length`) ``pass_batches``, that length once kfit
        has found the first pass ended (None before); None for a source with none of these (it skips ahead)."""
        state: dict[str, Any] | None = None
        if self._pass_state is not None and self._saves_draws:
            now = self._pass_end_states
            state = {"kind": self.state_kind, "generators": list(self._pass_state),
                     "now": now if now is not None else _generator_states(self._generators()), "read": self._in_pass}
            if self.continues:
                state["pass_start"] = self._pass_start
        elif self._pass_state is not None and self._saves_passes:
            state = {"kind": "tf.data", "iterator": self._pass_state}
        if self._pass_end_call_due():
            state = {"kind": self.state_kind, **(state or {}), "pass_end_call": True}
        if self._learns_pass_length:
            state = {"kind": self.state_kind, **(state or {}), "pass_batches": self.pass_batches}
        return state

    def _pass_end_call_due(self) -> bool:
        """True when every batch of a pass of unknown length has been trained on and Keras's TensorFlow loop has not
        yet made the call that finds the pass ended: a run stopped there (``max_samples``, a callback) or saved there
        (a save interval) and resumed makes that call as it resumes (:meth:`make_owed_pass_end_call`), as the
        uninterrupted run made it."""
        current = self._current
        return (self._pass_ends_in_a_call and current is not None and current.exhausted
                and not current.asked_past_end and self.ended_before(self.steps))

    def make_owed_pass_end_call(self) -> bool:
        """Makes the call of the train function past a pass's end that the uninterrupted run made after the step its
        checkpoint was saved at (TensorFlow runs it in part: it counts an optimizer iteration, as Adam's bias
        correction reads, and advances the seed generators). True when one was owed and made."""
        owed, self._owes_pass_end_call = self._owes_pass_end_call, False
        if self._keras_count is not None and self._keras_count.steps_seen is not None:
            return False  # Keras's loop holds the pass as the run resumes: it makes that call as it finds the end
        if not owed or _backend.BACKEND != "tensorflow" or self._signature is None or self.driver is None:
            return False
        self._call_past_the_pass_end()
        return True

    def set_state(self, state: dict[str, Any] | None) -> None:
        """Keeps a state from :meth:`get_state` for :meth:`resume`."""
        self._owes_pass_end_call = bool(state and state.get("pass_end_call"))
        self._restored_pass_length = bool(state) and "pass_batches" in state
        if self._restored_pass_length:
            self.pass_batches = None if state["pass_batches"] is None else int(state["pass_batches"])
        if state is None or set(state) <= {"kind", "pass_end_call", "pass_batches"}:
            self._restored_pass = None
            return
        generators = self._generators()
        if generators is not None:
            saved = {"start": state.get("generators"), "now": state.get("now")}
            if state.get("kind") != self.state_kind or any(
                    not isinstance(states, list) or [s is None for s in states] != [g is None for g in generators]
                    for states in saved.values()):
                raise ValueError(f"The saved source state is not this {self.state_kind} source's random states: "
                                 f"kind {state.get('kind')!r}, keys {sorted(state)}.")
            self._restored_pass = {part: [None if s is None else np.asarray(s, dtype=np.uint8) for s in states]
                                   for part, states in saved.items()}
            for key in ("pass_start", "read"):  # ("read": not in the files of kfit before it)
                if state.get(key) is not None:
                    self._restored_pass[key] = int(state[key])
            return
        if state.get("kind") != "tf.data" or "iterator" not in state:
            raise ValueError(f"The saved source state is not a tf.data iterator's: keys {sorted(state)}.")
        self._restored_pass = np.asarray(state["iterator"], dtype=np.uint8)

    def _drop(self, samples: int) -> int:
        """Draws and drops ``samples`` samples; returns how many batches of the pass now open it dropped."""
        dropped, empty_passes, batches = 0, 0, 0
        while dropped < samples:
            try:
                size = batch_size_of(next(self._underlying))
                dropped += size
                self._count_read(size)
                self._in_pass += 1
                self._put_default_generator_back()
                empty_passes, batches = 0, batches + 1
            except StopIteration:
                self._pass_ended()
                empty_passes += 1
                if not self.restarts or empty_passes > 1:
                    raise ValueError(f"The data source ran out after {dropped} samples while kfit skipped the "
                                     f"{samples} samples the interrupted run had trained on. Resume with the same "
                                     "data.") from None
                self._new_pass()  # a source that restarts goes on with its next pass
                batches = 0
        if dropped > samples and self._claims_exact:  # (it would train fewer samples than its clock counts)
            raise ValueError(f"The checkpoint was written {samples} samples into the pass this run resumes in, and "
                             f"the source's batches do not end there: they add up to {dropped - size}, then "
                             f"{dropped} samples. Resume with the data the checkpoint was written on, or from a "
                             "checkpoint written at an epoch's end.")
        return batches

    def _open(self, passes: Callable[[], Any], now: bool = False, beginning: bool = False) -> _ReadAhead | _Deferred:
        # Keras asks for an iterator at each epoch (or, reading on across epochs, when the last one ended).
        # Batches come from Keras's own adapter in the form this backend's loop reads (its tensors, sparse
        # ones included), so kfit converts nothing.
        prepared, self._prepared = self._prepared, None
        if prepared is not None and passes == self._passes:  # (bound methods: equal, never identical)
            return prepared
        current = self._current
        if not now and not self.continues and current is not None and current.done:
            # Keras asks for the next epoch's pass as soon as an epoch's last step has run, and again when that epoch
            # begins (JAX, PyTorch): opened only if read, as Keras's own adapter makes its dataset's iterator only
            # when it is read (a new tf.data iterator draws the pipeline's next shuffle seed).
            if self._torch_loader() is not None:
                self._draw_unread_loader_pass()
            return _Deferred(lambda: self._open(passes, now=True))
        if passes != self._passes:
            self._passes, self._underlying = passes, None
        exhausted = self._current is not None and self._current.exhausted or self._pass_rest == 0
        if self._underlying is None or not self.continues or exhausted:
            self._new_pass()
            self._pass_rest = None if self._pass_rest == 0 else self._pass_rest
        skipped = self._skip
        dropped_batches = 0
        if skipped:
            self._skip = 0
            dropped_batches = self._drop(skipped)
        limit, self._limit = self._limit, None
        if limit is not None:
            self._steps_left = limit
        elif skipped and not self.continues and self.inner.num_batches:
            self._steps_left = self.inner.num_batches - dropped_batches
        if skipped and self.continues and self.restarts and self.inner.num_batches:
            self._pass_rest = max(self.inner.num_batches - dropped_batches - (limit or 0), 0)
            self._rest_pass = self._passes_opened
        self._resumed_pass = (self._resumed_pass or bool(skipped and not self.continues) or limit is not None
                              or self._rest_pass is not None)
        # A step planned from the previous pass and not yet counted (Keras opens the next epoch's pass as soon
        # as the last step of an epoch has run) is not this pass's first step.
        driver = self.driver
        self._steps_at_open = self.steps + int(driver is not None and driver.pending is not None and driver.pending_known)
        length = self.inner.num_batches if self._reads_to_length else None
        hold = (lambda index: self._epoch_begins_at(index, beginning)) if self._holds_epoch_ends else None
        counts, ended = self._read_one, self._pass_ended
        self._current = _ReadAhead(self._underlying, limit if length is None else length - dropped_batches, hold, counts,
                                   ended)
        if skipped and self.restarts and (self._current.exhausted or length == dropped_batches) \
                and not self._current.sizes and not (self._keras_count and self._keras_count.steps_seen is not None):
            # The samples dropped ended a pass: the resumed epoch begins with the next pass, as it did. (Not where
            # Keras still holds that pass as the run resumes, its end still to find: it finds it, as it did.)
            self._new_pass()
            self._current = _ReadAhead(self._underlying, limit if length is None else length, hold, counts, ended)
        return self._current

    def _epoch_begins_at(self, index: int, beginning: bool) -> bool:
        """True when the batch ``index`` of the pass now open (its first: 0) is the first step of one of Keras's
        epochs that has not begun (Keras opens a pass as an epoch begins, ``beginning``, or as soon as the last step
        of the epoch before has run); where Keras's own loop reads ``k`` batches ahead (``_fit_reads_ahead``), the
        batch ``k`` after that first step instead (model.fit has read the ones before it when the epoch begins)."""
        ahead = self._fit_reads_ahead
        if index < ahead or (index == ahead and beginning):
            return False
        step = self.first_step + self._steps_at_open + index - ahead
        if index > ahead and self._per_pass and step % self._per_pass == 0:
            return False  # past the pass's end: reading finds it ended (Keras opens the next pass as the epoch ends)
        return self.position(step)[1] == 0

    def peek(self, draws: bool) -> Any:
        """The source's first batch as NumPy arrays (for kfit to build the model and size the first step).

        Args:
            draws: read it from an iterator of its own, as Keras's own ``fit`` does before its first epoch while the
                model is not built (``_backend.fit_reads_a_first_batch``), with the batches its JAX loop's iterator
                reads ahead of the one it hands on (``_backend.fit_batches_read_ahead``: a shuffle="batch" pass draws
                an order for each). Otherwise a ``tf.data`` pipeline's first
                pass begins here and the first epoch reads it from its start: kfit makes no iterator over the
                pipeline (drawing its next shuffle seed) that ``model.fit`` would not make.
        """
        if draws or not self._tf_data:
            generators = None if draws or self._loader is None else _loader_generators(self._loader)
            states = None if generators is None else _generator_states(generators)
            # (not from a PyDataset's queue of workers, one stream: model.fit would train on the batch taken)
            first = None if draws else _backend.pydataset_queue_first_batch(self.inner)
            shuffled_arrays = _backend.shuffles_from_process_random_state(self.inner)
            if first is None and draws and shuffled_arrays and _backend.BACKEND == "torch":
                # Keras's PyTorch loop reads it from the adapter's DataLoader, whose sampler draws from torch's
                # default generator (its NumPy iterator would draw from NumPy's, which model.fit does not touch).
                batch = next(iter(self.inner.get_torch_dataloader()))
                # (None is a leaf, handed to the function: Keras 3.10 has no none_is_leaf argument)
                first = keras.tree.map_structure(lambda t: None if t is None else keras.ops.convert_to_numpy(t), batch)
            elif first is None:
                numpy_state = np.random.get_state() if shuffled_arrays and not draws else None
                batch_order = self._shuffled_batches
                python_state = batch_order.get_state() if batch_order is not None and not draws else None
                iterator = iter(_backend.numpy_batches(self.inner))
                first = next(iterator)
                if draws:  # model.fit's look reads through its JAX loop's iterator, which reads batches ahead
                    for _ in range(_backend.fit_batches_read_ahead(self.inner)):
                        next(iterator, None)
                if numpy_state is not None:  # (model.fit reads no batch here: its first pass draws the order)
                    np.random.set_state(numpy_state)
                if python_state is not None:  # (as for a PyDataset's batch order)
                    batch_order.set_state(python_state)
            if states is not None:
                # model.fit reads no batch before its first epoch here: the pass this read began leaves the loader's
                # random generators where they were (its base seed and shuffle order were drawn from them).
                _set_generator_states(generators, states)
        else:
            iterator = iter(self.inner.get_tf_dataset())
            state = _backend.tf_iterator_state(iterator) if self._saves_passes else None
            drawn = next(iterator)
            self._peeked = (itertools.chain([drawn], iterator), drawn, state)
            first = next(self._read_as(iter([drawn]), "get_numpy_iterator"))
        self._first_size = batch_size_of(first)
        return first

    def first_batch(self) -> Any:
        """The source's first batch as this backend's loop reads it (Keras's conversion: sparse inputs become
        the backend's sparse tensors). For sources read from their start (arrays, ``tf.data``), not generators."""
        if self._peeked is None:
            return next(iter(self._passes()))
        # The batch peek() read: no other iterator over the pipeline is made.
        return next(self._read_as(iter([self._peeked[1]]), self._passes.__name__))

    def get_numpy_iterator(self) -> Iterator[Any]:
        return self._open(self.inner.get_numpy_iterator)

    def get_jax_iterator(self) -> Iterator[Any]:
        return self._open(self.inner.get_jax_iterator)

    def get_torch_dataloader(self) -> Any:
        adapter = self

        class _Passes:
            def __iter__(self) -> Iterator[Any]:
                return adapter._open(adapter.inner.get_torch_dataloader)

        return _Passes()

    def get_tf_dataset(self) -> Any:
        import tensorflow as tf

        if not self.restarts:
            # A generator: read by kfit one batch ahead (_ReadAhead), converted by Keras's own dataset for it, with
            # no prefetch (see _backend.generator_tf_dataset).
            return _backend.generator_tf_dataset(self.inner, lambda: self._open(self.inner.generator))
        if self._signature is None:
            # Keras's own dataset for the source says what a batch holds (sparse and nested parts included), and
            # how tf.data may read it (a PyDataset's workers want no tf.data prefetching past an epoch's end).
            own = self.inner.get_tf_dataset()
            endless = int(own.cardinality()) == tf.data.INFINITE_CARDINALITY
            self._signature = (own.element_spec, own.options(), endless)
        spec, options, endless = self._signature
        # Keras's loop finds the end of a pass of unknown length by one more call of the train function, which
        # TensorFlow runs in part (it counts an optimizer iteration and advances the seed generators): kfit makes
        # that call where Keras's loop asks for the batch past the pass's end (see _backend.python_steps_dataset).
        self._pass_ends_in_a_call = not self.inner.num_batches and not endless
        at_end = self._call_past_the_pass_end if self._pass_ends_in_a_call else None
        # Handed to the train step from Python as kfit's reader reads them, with no tf.data pipeline between the two.
        per_call = _backend.steps_per_execution(self.driver.model) if self.driver is not None else 1
        direct = _backend.python_steps_dataset(lambda: self._open(self.inner.get_tf_dataset), spec, per_call, at_end)
        if direct is not None:
            return direct
        dataset = tf.data.Dataset.from_generator(lambda: self._open(self.inner.get_tf_dataset),
                                                 output_signature=spec).with_options(options)
        if self._pass_ends_in_a_call:
            # Read by the train step only (no prefetch injected, kfit's reader reads one batch ahead): the batch
            # asked for past the pass's end is then asked for by the call that finds the end (see get_state).
            no_prefetch = tf.data.Options()
            no_prefetch.experimental_optimization.inject_prefetch = False
            dataset = dataset.with_options(no_prefetch)
        return dataset

    def _call_past_the_pass_end(self) -> None:
        spec, options, _ = self._signature
        _backend.call_train_function_past_a_pass_end(self.driver.model, spec, options)


_END = object()

PYDATASET_WORKERS_SHUFFLE_RESUME = (
    "This resume is not exact: with steps_per_epoch other than its length, a PyDataset with workers and shuffle=True "
    "is read by Keras's own adapter, whose queue of workers draws a new order of the batches as every epoch begins "
    "and keeps the batches of the orders it drew for the epochs after; whether an epoch's order reaches the queue "
    "depends on how soon its worker thread starts, so the batches trained differ from run to run (under model.fit "
    "too), and a resumed run cannot find the ones the interrupted run would have trained. For an exact resume give "
    "steps_per_epoch equal to the dataset's length or leave it out (kfit's own stream reads the dataset), or "
    "shuffle=False, or no workers."
)

UNKNOWN_LENGTH_RESUME = (
    "This resume may not be exact: the checkpoint was written by a kfit that did not save how long the passes are of "
    "this source whose length Keras does not know (a tf.data pipeline of unknown cardinality, a Grain dataset, a "
    "DataLoader without a length), read on across epochs (steps_per_epoch). Keras learns where a pass ends when its "
    "first pass ends, counting the steps since it began reading: a resumed run's Keras counts them from the resume, "
    "so once a pass ends its epochs (the History) and the steps it trains may differ from the uninterrupted run's. "
    "Checkpoints written from now on resume exactly."
)

UNKNOWN_LENGTH_MULTI_STEP_RESUME = (
    "This resume may not be exact: with compile(steps_per_execution=N) for N > 1, a source whose length Keras does not "
    "know (a tf.data pipeline of unknown cardinality, a Grain dataset, a DataLoader without a length), read on across "
    "epochs (steps_per_epoch), is read in calls of N steps, and the call that finds a pass's end trains the batches "
    "it read before it or not as the backend's loop has it: kfit does not put a resumed run's Keras where the "
    "uninterrupted run's stood in the pass, so once a pass ends its epochs (the History) and the steps it trains may "
    "differ from the uninterrupted run's. For an exact resume use steps_per_execution=1, give the source its length "
    "(tf.data: dataset.apply(tf.data.experimental.assert_cardinality(batches))) or make it endless (repeat())."
)


def _does_nothing(method: Any) -> bool:
    """True for a Python function (or method) whose body only returns None: ``pass``, ``...``, a docstring,
    ``return None`` (the same instructions for all four: checked on CPython 3.10-3.13). Anything else, a call of
    ``super()``'s included, may do something."""
    code = getattr(getattr(method, "__func__", method), "__code__", None)
    if code is None:
        return False
    steps = [(i.opname, i.argval) for i in dis.get_instructions(code) if i.opname not in ("RESUME", "NOP", "CACHE")]
    return steps in ([("LOAD_CONST", None), ("RETURN_VALUE", None)], [("RETURN_CONST", None)])


def _loader_generators(loader: Any) -> list:
    """The torch generators a new pass over ``loader`` draws from: torch's default generator (the workers' base seed,
    and the shuffle order of a sampler without a generator of its own), the loader's and its sampler's (None where
    there is none, or the same as an earlier one)."""
    import torch

    generators: list = [torch.default_generator]
    for generator in (loader.generator, getattr(loader.sampler, "generator", None)):
        generators.append(None if generator is None or any(generator is g for g in generators) else generator)
    return generators


def _generator_states(generators: list) -> list:
    return [None if g is None else np.array(g.get_state(), dtype=np.uint8) for g in generators]


def _set_generator_states(generators: list, states: list) -> None:
    for generator, state in zip(generators, states):
        if generator is None:
            continue
        if isinstance(generator, (_backend.NumpyGlobalRandom, _backend.PythonGlobalRandom)):
            generator.set_state(state)
        else:
            import torch

            generator.set_state(torch.from_numpy(np.ascontiguousarray(state, dtype=np.uint8)))


class SourceDriver(StepDriver):
    """The clock on a :class:`SourceAdapter`: a step's size is the size of the batch it trains."""

    def __init__(self, model: Any, adapter: SourceAdapter):
        super().__init__(model)
        self.adapter = adapter
        #: The steps one call of the train function runs (``steps_per_execution``; fewer where a pass ends).
        self.per_call = _backend.steps_per_execution(model)
        #: The pending step's size was read from its batch (not assumed).
        self.pending_known = False
        #: Keras's epoch after the last step counted (read on across epochs, see :meth:`count`).
        self._epoch: int | None = None
        adapter.driver = self

    def sizes(self, clock: Any, batch: int) -> list[int] | None:
        size = self.adapter.size_of_step(self.adapter.steps)
        if size is None and self.adapter.ended_before(self.adapter.steps):
            _backend.before_empty_step(self.model)
            return None  # the pass ended: Keras finds no step to run
        self.pending_known = size is not None
        if size is None:  # not read yet (tf.data reads on its own thread): the source's batch size
            size = self.adapter.batch_size or clock.minibatch_size
        return [] if size is None else [size]

    def count(self, clock: Any, sizes: list[int]) -> None:
        adapter = self.adapter
        before = (clock.samples, clock.minibatches)
        actual = adapter.size_of_step(adapter.steps)
        if actual is None and adapter.ended_before(adapter.steps):
            return  # Keras asked for a step, and the pass had ended: nothing was trained
        if self.per_call == 1:
            clock.advance(actual or sizes[0])
            adapter.steps += 1
        else:  # the steps of the call, up to where the pass ended
            ran = [actual or sizes[0]]
            while len(ran) < self.per_call and (size := adapter.size_of_step(adapter.steps + len(ran))) is not None:
                ran.append(size)
            super().count(clock, ran)
            adapter.steps += len(ran)
        if clock.epoch_size is None:  # (the first epoch only: this runs at every step)
            self.adapter.learn_epoch_size(clock)
        if clock.epoch_start is not None:
            # (Keras's epoch after the last count, as found then: a pass length learned since moves the epochs after)
            was = self._epoch if self._epoch is not None else adapter.position(before[1])[0]
            epoch, step = adapter.position(clock.minibatches)
            self._epoch = epoch
            if epoch > was:
                # The steps ended one of Keras's epochs (step 0 of the next), or began one after an epoch of no step
                # (where Keras found the end of a pass whose last batch had ended an epoch).
                clock.epoch_start = (clock.epoch_start[0] + epoch - was, clock.samples if step == 0 else before[0])

    def follow_epochs(self) -> None:
        """As one of Keras's epochs ends on a source whose passes' length Keras learns: where kfit's reader found the
        first pass's length only in that epoch, which trained no step (the pass's last batch ended the epoch before it,
        and kfit's reader held the batch after it), the clock moves on to the epoch after it, where :meth:`count`, which
        found its epoch before that length was known, left it in the empty one (a checkpoint written at the empty
        epoch's end would resume it again)."""
        from kfit.clock import get_clock

        clock = get_clock(self.model)
        if clock is None or clock.epoch_start is None or self._epoch is None:
            return
        epoch, step = self.adapter.position(clock.minibatches)
        if epoch > self._epoch and step == 0:
            clock.epoch_start = (clock.epoch_start[0] + epoch - self._epoch, clock.samples)
            self._epoch = epoch
