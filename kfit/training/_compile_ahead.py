"""Compile the train step for the minibatch sizes that come next, on a background thread (JAX; TensorFlow with XLA).

A minibatch-size schedule hands the compiled step new shapes as training goes (256 → 4096, and the shorter
minibatch that ends an epoch); under JAX each new shape compiles when its first step runs, and training waits.
kfit's plan is a function of the clock, so the sizes of the next epoch are known while this one trains:
:class:`CompileAhead` lowers and compiles Keras's own jitted step for them (``jit(train_step).lower(...).compile()``)
while the current sizes train. When training reaches a new size its step is already compiled.

TensorFlow needs no more than one trace: where the sizes differ (a schedule, a remainder), kfit's ``tf.data``
pipeline leaves the batch dimension unknown (static where every minibatch has one size, as Keras's own adapter
declares it), so the step traced by the first step serves every size. With ``jit_compile=True`` XLA still compiles
that trace for each new shape on its first step: the thread, once training's first step has traced the step, runs
it once for each coming size on a minibatch of zeros and on copies of its variables
(:func:`kfit._backend.xla_step_warmer`), which leaves XLA's compiled shape in its cache and the model untouched.
PyTorch's step is not compiled (``jit_compile=True`` there compiles lazily, per shape): nothing is compiled ahead.

Only one thread traces the step at a time. Keras's JAX train step writes to the model while it is traced (the forward
pass's losses, ``_losses_override``): two traces at once, of a model with a regularizer, leak each other's tracers. A
step of a size that no trace serves yet traces on the trainer's thread: :meth:`CompileAhead.before_step` then holds the
thread's next trace back until the step after it; the thread's traces hold the trainer's new sizes back in turn. Only
the trace is held, not XLA's compile, which takes most of the time. Nothing is compiled ahead under data-parallel training,
with ``steps_per_execution`` > 1, or with ``KFIT_COMPILE_AHEAD=0``.

Example:
    >>> from kfit.training._compile_ahead import CompileAhead
    >>> ahead = CompileAhead(model=None, sample_batch=None)  # no jitted step: an inactive helper
    >>> ahead.request([64, 128]); ahead.close(); sorted(ahead.compiled)
    []
"""

from __future__ import annotations

import os
import queue
import threading
from collections.abc import Iterable
from typing import Any

from kfit import _backend

_STOP = None


class CompileAhead:
    """Compiles Keras's jitted train step for per-worker minibatch sizes, one at a time, on a daemon thread.

    Args:
        model: the model being trained (its ``train_function`` made; None: inactive).
        sample_batch: a host batch as the step receives it (NumPy leaves): its structure, dtypes and trailing
            shapes; the leading dimension is replaced by each requested size.

    Attributes:
        compiled: the sizes compiled ahead so far.
        errors: what failed to compile ahead (the step then compiles on its first call, as without this helper).
    """

    def __init__(self, model: Any, sample_batch: Any):
        enabled = os.environ.get("KFIT_COMPILE_AHEAD", "1") != "0"
        self._step = _backend.jitted_train_step(model) if enabled and model is not None else None
        #: TensorFlow with XLA: runs the traced step for a size on copies of its variables (see the module's text).
        self._warm = _backend.xla_step_warmer(model) if enabled and model is not None else None
        #: Training's first step has run (TensorFlow: the step the thread runs is traced then).
        self._stepped = threading.Event()
        self._steps_begun = False
        self._closing = False
        if self._step is not None:  # (made after fit ended: the step, traced on the thread, reads them)
            _backend.record_state_sharding(model)
        # The states the step takes, read now: Keras's JAX fit empties the variables while it trains.
        self._states = _backend.train_state_specs(model) if self._step is not None else None
        self._sample = sample_batch
        self._requested: set[int] = set()
        self._traced: set[int] = set()  # sizes whose step is traced, by the thread or by training
        self._tracing = threading.Lock()  # held by whichever thread traces the step
        self._held = False  # the trainer's thread holds _tracing for the step it runs
        self.compiled: set[int] = set()
        self.errors: list[str] = []
        self._queue: queue.Queue = queue.Queue()
        self._thread: threading.Thread | None = None

    @property
    def active(self) -> bool:
        """Whether shapes are compiled ahead (JAX, a jitted step found; TensorFlow with ``jit_compile=True``)."""
        return self._step is not None or self._warm is not None

    def seen(self, sizes: Iterable[int]) -> None:
        """Marks sizes whose step is compiled by training itself (the first one): not compiled again."""
        self._requested.update(int(s) for s in sizes)

    def before_step(self, size: int) -> None:
        """Training is about to run a step of ``size`` rows. If no trace serves that size yet, the step traces it:
        the thread's next trace waits until the next step (or :meth:`after_steps`)."""
        self.after_steps()
        self._steps_begun = True
        if self._step is None or size in self._traced:
            return
        self._tracing.acquire()
        self._held = True
        self._traced.add(size)

    def after_steps(self) -> None:
        """Lets the thread trace again (the steps of the epoch have run)."""
        if self._steps_begun and not self._stepped.is_set():  # (a read at most steps, not the Event's lock)
            self._stepped.set()
        if self._held:
            self._held = False
            self._tracing.release()

    def request(self, sizes: Iterable[int]) -> None:
        """Compiles the step for each size not requested before, in the order given."""
        if not self.active:
            return
        for size in sizes:
            size = int(size)
            if size in self._requested:
                continue
            self._requested.add(size)
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, args=(_backend.thread_state(),),
                                                name="kfit-compile-ahead", daemon=True)
                self._thread.start()
            self._queue.put(size)

    def _run(self, adopt_thread_state: Any) -> None:
        if self._step is not None:
            import jax
            import numpy as np

        adopt_thread_state()
        while True:
            size = self._queue.get()
            if size is _STOP:
                self._queue.task_done()
                return
            try:
                if self._warm is not None:
                    self._stepped.wait()
                    if not self._closing:
                        self._warm(size)
                        self.compiled.add(size)
                    continue
                data = jax.tree_util.tree_map(
                    lambda a, rows=size: jax.ShapeDtypeStruct((rows, *np.shape(a)[1:]),
                                                              jax.dtypes.canonicalize_dtype(np.asarray(a).dtype)),
                    self._sample)
                with self._tracing:
                    lowered = [self._step.lower(state, data) for state in self._states]
                    self._traced.add(size)
                for each in lowered:
                    each.compile()
                self.compiled.add(size)
            except Exception as error:  # the step compiles on its first call instead
                self.errors.append(f"minibatch size {size}: {type(error).__name__}: {error}")
            finally:
                self._queue.task_done()

    def wait(self) -> None:
        """Waits until every size requested so far is compiled (or has failed). On TensorFlow the step must be
        traced (by a step of training) before: the thread does not wait for a step any longer."""
        self.after_steps()  # (the thread may wait for the trace training holds)
        self._stepped.set()
        if self._thread is not None:
            self._queue.join()

    def close(self) -> None:
        """Drops the sizes not compiled yet, waits for the compile in progress (at most one) and lets go of the
        step: a jitted step kept alive keeps its traces in JAX's caches, where a later ``jit`` of the same
        ``train_step`` (after ``model.compile`` again, with other metrics) would find them."""
        self.after_steps()
        self._closing = True
        self._stepped.set()  # (a thread waiting for training's first step: there is none to come)
        if self._thread is not None:
            self._drain()
        self._step = self._states = self._sample = self._warm = None

    def _drain(self) -> None:
        while True:
            try:
                self._queue.get_nowait()
            except queue.Empty:
                break
            self._queue.task_done()
        self._queue.put(_STOP)
        self._thread.join()
        self._thread = None
