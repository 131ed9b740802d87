"""The clock under ``kfit.fit``: each Keras step is a minibatch of kfit's plan.

``kfit.fit`` runs ``model.fit`` on a :class:`kfit.data.StreamAdapter`; Keras numbers the steps of each
epoch from 0, and step ``k`` trains the ``k``-th minibatch of the epoch's plan. So the driver knows the
size of every step before it runs, and counts it once it has run, whichever kfit callback reaches the
hook first (as :class:`kfit.callbacks.SampleClock` does under plain ``model.fit``).
"""

from __future__ import annotations

from typing import Any

from kfit import _backend
from kfit.callbacks._sample_clock import apply_minibatch_size
from kfit.clock import Clock


class PlanDriver:
    """Sets the clock before each of ``model.fit``'s steps from the epoch's plan, and counts the step after.

    Args:
        model: the model being trained.
        adapter: the :class:`kfit.data.StreamAdapter` that feeds ``model.fit``; its ``plan`` is the epoch's.
    """

    #: Minibatch sizes come from kfit's plan (a minibatch-size schedule works).
    plans_sizes = True

    def __init__(self, model: Any, adapter: Any):
        self.model = model
        self.adapter = adapter
        self.pending: list[int] | None = None
        self.pending_batch: int | None = None
        self.applied: int | None = None

    def _steps_per_execution(self) -> int:
        return max(int(getattr(self.model, "steps_per_execution", 1) or 1), 1)

    def batch_begin(self, clock: Clock, batch: int) -> bool:
        """Plans step ``batch`` of the epoch; False when the epoch's plan has no such step (Keras asks
        for one more step before it finds that the epoch's data has ended)."""
        if self.pending is not None:
            if self.pending_batch == batch:
                return True
            self.flush(clock)
        plan = self.adapter.plan
        steps = plan[batch:batch + self._steps_per_execution()]
        if not steps:
            _backend.before_empty_step(self.model)
            return False
        if steps[0][0] != clock.samples:
            raise RuntimeError(
                f"kfit's clock ({clock.samples} samples) and the minibatch model.fit is about to train "
                f"(at sample {steps[0][0]}) disagree. This is a bug in kfit: please report it."
            )
        size = steps[0][1]
        clock.minibatch_size = size
        apply_minibatch_size(self.model, size, self.applied)
        self.applied = size
        self.pending = [s for _, s in steps]
        self.pending_batch = batch
        return True

    def batch_end(self, clock: Clock) -> None:
        self.flush(clock)

    def flush(self, clock: Clock) -> None:
        """Counts the step in progress, once."""
        if self.pending is None:
            return
        for size in self.pending:
            clock.advance(size)
        self.pending = None
        self.pending_batch = None
