"""The clock under ``kfit.fit``: each Keras step is a minibatch of kfit's plan.

``kfit.fit`` runs ``model.fit`` on a :class:`kfit.data.StreamAdapter`; Keras numbers the steps of each
epoch from 0 (kfit's callback list adds the steps a resumed epoch had run before: ``Run.batch_offset``), and
step ``k`` of the call trains the ``k``-th minibatch of the epoch's plan. So the driver knows the
size of every step before it runs, and counts it once it has run, whichever kfit callback reaches the
hook first (as :class:`kfit.callbacks.SampleClock` does under plain ``model.fit``).
"""

from __future__ import annotations

from typing import Any

from kfit import _backend
from kfit._run import Run, StepDriver
from kfit.clock import Clock


class PlanDriver(StepDriver):
    """Sets the clock before each of ``model.fit``'s steps from the epoch's plan, and counts the step after.

    Args:
        model: the model being trained.
        adapter: the :class:`kfit.data.StreamAdapter` that feeds ``model.fit``; its ``plan`` is the epoch's.
        run: the run (its ``batch_offset``: the batch number of the plan's first minibatch).
    """

    plans_sizes = True

    def __init__(self, model: Any, adapter: Any, run: Run):
        super().__init__(model)
        self.adapter = adapter
        self.run = run

    def sizes(self, clock: Clock, batch: int) -> list[int] | None:
        step = batch - self.run.batch_offset
        steps = self.adapter.plan[step:step + _backend.steps_per_execution(self.model)]
        if not steps:
            _backend.before_empty_step(self.model)
            return None
        if steps[0][0] != clock.samples:
            raise RuntimeError(
                f"kfit's clock ({clock.samples} samples) and the minibatch model.fit is about to train "
                f"(at sample {steps[0][0]}) disagree. This is a bug in kfit: please report it."
            )
        return [size for _, size in steps]

    def inside_epoch(self, clock: Clock) -> bool:
        """True between two steps of one epoch: one of its steps has run and another is planned."""
        plan = self.adapter.planned
        return bool(plan) and plan[0][0] < clock.samples < plan[-1][0] + plan[-1][1]
