"""A test evaluation when training ends (CNTK's TestConfig)."""

from __future__ import annotations

from typing import Any

from kfit.callbacks._base import KfitCallback
from kfit.callbacks._cross_validation import (
    EvaluationData,
    check_metric,
    cntk_data,
    cntk_keywords,
    evaluation_logs,
    is_accuracy,
)


class Test(KfitCallback):
    """Evaluates the model on ``data`` once, when training ends, and reports the result.

    The results go

    * into the run's ``History`` (``kfit.fit``'s return value) as ``test_<name>`` lists of one value, with
      ``test_average_error``, ``test_samples`` and ``test_minibatches``;
    * to every kfit callback of the run through ``on_final_test_end(logs)`` (progress printers, CSV writers);
    * into :attr:`results` (None until the test has run);
    * to stdout, as CNTK prints them, with the metric named: ``Finished Test: Minibatch[1-12]: 1 - accuracy =
      3.06% * 360;`` (the error ``1 - accuracy`` in percent for an accuracy, else the value), unless the run has a
      :class:`kfit.callbacks.ProgressPrinter`, which prints that line itself, or ``verbose=0``.

    Under ``kfit.fit`` it runs after the controllers (``order = 50``): a model whose best weights an
    :class:`EarlyStopping` restores is tested with them. Under plain ``model.fit``, put it after them in
    the callback list. It does not need the sample clock.

    Under data-parallel training each worker tests only its contiguous share of ``data`` and the metrics'
    states are summed over the workers: every worker gets the single-process results
    (:attr:`evaluated_samples`: the share's size). Every worker must be given the same ``data``. See
    :class:`CrossValidation` for what is evaluated whole instead.

    Args:
        data: ``(x, y)`` or ``(x, y, sample_weight)`` (see :class:`CrossValidation`).
        minibatch_size: the evaluation's minibatch size: a positive int or a minibatch-size schedule (read
            at the clock's final value); None: 32.
        metric: the result that gives ``test_average_error`` and the printed metric (default: the first
            compiled metric, else the loss).
        verbose: 0 prints nothing.
        name: the key of this callback's state in checkpoints.
        minibatch_source, source: CNTK's names of ``data`` (``source`` deprecated there), taken for it; give
            one of the three.
        mb_size: CNTK's deprecated name of ``minibatch_size``, taken for it (refused when both are given and
            differ).
        criterion, model_inputs_to_streams: CNTK's ``TestConfig`` arguments with no counterpart in Keras
            (see :class:`CrossValidation`): accepted as None only; anything else is refused, saying what to
            write instead.

    Raises:
        TypeError: ``data`` not in one of the accepted forms or given not exactly once.
        ValueError: a bad ``minibatch_size`` or ``metric``, a ``criterion`` or ``model_inputs_to_streams``;
            at the start of training, ``data`` whose inputs do not fit the model.

    Example:
        >>> import numpy as np, kfit
        >>> x, y = np.zeros((360, 64), "float32"), np.zeros((360,), "int64")
        >>> test = kfit.callbacks.Test((x, y), minibatch_size=32)
        >>> test.data.num_samples, test.results
        (360, None)
    """

    __test__ = False  # not a pytest test class
    default_name = "test"
    order = 50

    def __init__(
        self,
        data: Any = None,
        minibatch_size: Any = None,
        metric: str | None = None,
        verbose: int = 1,
        name: str | None = None,
        *,
        minibatch_source: Any = None,
        source: Any = None,
        mb_size: Any = None,
        criterion: Any = None,
        model_inputs_to_streams: Any = None,
    ):
        super().__init__(name=name)
        data = cntk_data("Test", data, minibatch_source, source)
        self.minibatch_size = cntk_keywords("Test", minibatch_size, mb_size, criterion, model_inputs_to_streams)
        self.data = EvaluationData(data, "Test", reusable=False)
        self.metric = check_metric(metric)
        if verbose not in (0, 1, True, False):
            raise ValueError(f"Invalid value for argument `verbose`: expected 0 or 1. Received: verbose={verbose!r}")
        self.verbose = int(verbose)
        #: The test's logs (``test_*``), once it has run.
        self.results: dict[str, Any] | None = None
        #: The samples this worker evaluated (its share when sharded; 0 before the test).
        self.evaluated_samples = 0

    # The test needs no clock: the per-step hooks do nothing.
    def on_train_batch_begin(self, batch: int, logs: dict | None = None) -> None:
        pass

    def on_train_batch_end(self, batch: int, logs: dict | None = None) -> None:
        pass

    def on_train_begin(self, logs: dict | None = None) -> None:
        self.data.check_same_on_workers()
        self.data.check_model(self.training_model)
        self.results = None  # an earlier run's (a restored run gets its own back from the checkpoint)

    def on_train_end(self, logs: dict | None = None) -> None:
        self.run()

    def run(self) -> dict[str, Any]:
        """Evaluates now and reports the results (see the class); returns the ``test_*`` logs."""
        logs, key, value = evaluation_logs(self, "test", "Test")
        self.results = logs
        history = self.training_run.history
        history = history if history is not None else getattr(self.training_model, "history", None)
        if history is not None:
            for k, v in logs.items():
                history.history[k] = [v]
        self.publish("on_final_test_end", dict(logs))
        if self.verbose and not any(type(p).__name__ == "ProgressPrinter" for p in self.peers()):
            from kfit import distributed

            if distributed.is_chief():
                print(self._line(key, value, logs), flush=True)
        return logs

    @staticmethod
    def _line(key: str, value: float, logs: dict[str, Any]) -> str:
        if is_accuracy(key):
            metric = f"1 - {key.removeprefix('test_')} = {(1.0 - value) * 100.0:.2f}%"
        else:
            metric = f"{key.removeprefix('test_')} = {value:.6f}"
        return f"Finished Test: Minibatch[1-{logs['test_minibatches']}]: {metric} * {logs['test_samples']};"

    def get_state(self) -> dict[str, Any]:
        return {"results": None if self.results is None else dict(self.results)}

    def set_state(self, state: dict[str, Any]) -> None:
        results = state.get("results")
        self.results = None if results is None else dict(results)
