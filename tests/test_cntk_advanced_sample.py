"""CNTK's advanced training sample (reference 001, section 6-3), ported to kfit and scaled to digits.

The sample's cross-validation callback halves the learning rate whenever the cross-validation error
improved by less than 5% (relative), and stops training after the sixth cut; a final test follows.
Here it runs as written, on scikit-learn's 8x8 digits instead of MNIST: 1024 training samples (one
epoch), the schedules of the sample with minibatch sizes divided by 8, and a rate per sample of 0.01.
"""

from __future__ import annotations

import math
import re

import keras
import numpy as np
import pytest

import kfit
from kfit import cntk
from kfit.callbacks import KfitCallback


def load_digits_splits():
    from sklearn.datasets import load_digits

    digits = load_digits()
    order = np.random.default_rng(0).permutation(len(digits.target))
    x = (digits.data[order] / 16.0).astype("float32")
    y = digits.target[order].astype("int64")
    return (x[:1024], y[:1024]), (x[1024:1400], y[1024:1400]), (x[1400:], y[1400:])


class StepRecorder(KfitCallback):
    """After every step: where it started, its minibatch size, and the rate and momentum it used."""

    default_name = "step_recorder"

    def __init__(self):
        super().__init__()
        self.steps: list[tuple[int, int, float, float]] = []

    def on_step_end(self, clock, logs):
        optimizer = self.training_model.optimizer

        def read(name):
            variable = kfit.optimizers.hyperparameter_variable(optimizer, name)
            return float(kfit._backend.read_variable(self.training_model, variable))

        size = clock.minibatch_size
        self.steps.append((clock.samples - size, size, read("learning_rate"), read("momentum")))


def test_section_6_3_sample_halves_the_rate_six_times_then_stops_and_tests(capsys):
    (X_train, Y_train), (X_cv, Y_cv), (X_test, Y_test) = load_digits_splits()
    keras.utils.set_random_seed(1)
    model_mn = keras.Sequential([keras.Input((64,)), keras.layers.Dense(32, activation="relu"), keras.layers.Dense(10)])
    model_mn.compile(
        optimizer=kfit.optimizers.MomentumSGD(),
        loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
        metrics=["accuracy"],  # average_error = 1 - accuracy: CNTK's classification_error
    )

    # The sample's schedules (section 5), with N = len(X_train).
    N = len(X_train)
    lrs = cntk.learning_rate_schedule(
        [0.01] * 12 + [0.005] * 6 + [0.0025] * 6 + [0.00125] * 3 + [0.000625] * 3 + [0.0003125],
        cntk.UnitType.sample, epoch_size=N,
    )
    momentums = cntk.momentum_as_time_constant_schedule([0] * 5 + [1024], epoch_size=N)
    minibatch_sizes = cntk.minibatch_size_schedule([32] * 6 + [64] * 9 + [128] * 7 + [256] * 8 + [512], epoch_size=N)
    learner = kfit.callbacks.LearningRateSchedule(lrs)  # plays the role of CNTK's learner
    momentum = kfit.callbacks.MomentumSchedule(momentums)

    # The sample's callback, as written (CNTK's learner -> the LearningRateSchedule callback).
    epoch_size = len(X_train)
    prev_metric = 1  # metric from previous call to the callback. Error=100% at start.
    calls = []

    def adjust_lr_callback(index, average_error, cv_num_samples, cv_num_minibatches):
        nonlocal prev_metric
        calls.append((index, average_error, prev_metric, kfit.get_clock(model_mn).samples))
        if (prev_metric - average_error) / prev_metric < 0.05:  # did metric improve by at least 5% rel?
            learner.reset_learning_rate(cntk.learning_rate_schedule(learner.learning_rate() / 2, cntk.UnitType.sample))
            if learner.learning_rate() < lrs[0] / (2**7 - 0.1):  # we are done after the 6-th LR cut
                print("Learning rate {} too small. Training complete.".format(learner.learning_rate()))  # noqa: UP032
                return False  # means we are done
            print("Improvement of metric from {:.3f} to {:.3f} insufficient. Halving learning rate to {}.".format(  # noqa: UP032
                prev_metric, average_error, learner.learning_rate()))
        prev_metric = average_error
        return True  # means continue

    cv_callback_config = kfit.callbacks.CrossValidation((X_cv, Y_cv), 3 * epoch_size, minibatch_size=256,
                                                        callback=adjust_lr_callback)
    test_callback_config = kfit.callbacks.Test((X_test, Y_test))
    recorder = StepRecorder()
    callbacks = [learner, momentum, cv_callback_config, test_callback_config, recorder]
    progress = kfit.fit(model_mn, X_train, Y_train, minibatch_size=minibatch_sizes, epoch_size=N, epochs=50,
                        callbacks=callbacks, verbose=0)
    losses = [summ.loss for summ in progress.epoch_summaries]
    out = capsys.readouterr().out

    # Which evaluations improved by less than 5%: the sample's rule, replayed on what the callback saw.
    insufficient = [(i, s) for i, error, prev, s in calls if (prev - error) / prev < 0.05]
    assert len(insufficient) == 7, calls
    halvings = [float(m) for m in re.findall(r"insufficient\. Halving learning rate to (\S+)\.\n", out)]
    assert halvings == pytest.approx([0.01 / 2**k for k in range(1, 7)], rel=1e-12)
    assert re.search(r"Learning rate (\S+) too small\. Training complete\.", out).group(1) == str(0.01 / 2**7)

    # Training stopped right after the seventh insufficient evaluation, at that evaluation's sample count.
    last_index, last_samples = insufficient[-1]
    assert calls[-1][0] == last_index and last_samples == (last_index + 1) * 3 * epoch_size
    assert kfit.get_clock(model_mn).samples == last_samples
    assert len(cv_callback_config.results) == last_index + 1
    assert len(losses) == last_samples // N and all(math.isfinite(loss) for loss in losses)

    # The rate the optimizer actually used at every step: the schedule until the first cut, then
    # halved at each cut (per sample; the optimizer gets rate * minibatch size), and the momentum.
    cuts = [s for _, s in insufficient[:-1]]
    for start, size, lr, mom in recorder.steps:
        halved = sum(start >= s for s in cuts)
        per_sample = lrs[start] if halved == 0 else 0.01 / 2**halved
        assert lr == pytest.approx(per_sample * size, rel=1e-6), (start, size, halved)
        expected_momentum = 0.0 if start < 5 * N else math.exp(-size / 1024)
        assert mom == pytest.approx(expected_momentum, rel=1e-6, abs=1e-12)
    assert cuts[0] < 12 * N, "the first cut must halve the sample's first rate"
    assert {size for _, size, _, _ in recorder.steps} >= {32, 64}

    # The final test ran once, on the final model, and is in the returned history and printed.
    expected = model_mn.evaluate(X_test, Y_test, batch_size=32, verbose=0, return_dict=True)
    assert progress.history["test_average_error"] == [pytest.approx(1.0 - expected["accuracy"], abs=1e-6)]
    assert progress.history["test_samples"] == [len(X_test)]
    assert test_callback_config.results["test_minibatches"] == math.ceil(len(X_test) / 32)
    assert out.count("Finished Test: Minibatch[1-13]: 1 - accuracy = ") == 1
    assert 0.0 < progress.history["test_average_error"][0] < 0.2
