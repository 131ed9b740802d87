"""One interval type for every "every N" in kfit: samples, minibatches, epochs."""

from __future__ import annotations

import keras
import numpy as np
import pytest
from conftest import BACKEND

import kfit
from kfit.callbacks import Checkpoint, CrossValidation
from kfit.checkpoint import read_checkpoint_info
from kfit.interval import Interval


@pytest.mark.parametrize("spec, expected", [
    ("50000sp", Interval(50000, "sp")), ("100mb", Interval(100, "mb")), (" 2ep ", Interval(2, "ep")),
    (300, Interval(300, "sp")), (np.int64(7), Interval(7, "sp")), (Interval(3, "mb"), Interval(3, "mb")),
])
def test_an_interval_is_read_from_a_string_an_int_or_an_interval(spec, expected):
    assert Interval.parse(spec) == expected


@pytest.mark.parametrize("spec", ["2 epochs", "0ep", "-3sp", "ep", 0, -5, 1.5, True, None, "10s"])
def test_a_bad_interval_names_the_argument_and_the_forms_that_work(spec):
    with pytest.raises(ValueError, match=r"`frequency`: expected a positive number of samples, or a string such as "
                                         r"'50000sp' \(samples\), '100mb' \(minibatches\) or '2ep' \(epochs\)"):
        Interval.parse(spec)


def test_an_interval_is_made_from_its_string_as_the_callbacks_take_it():
    assert Interval("50000sp") == Interval(50000, "sp") and Interval(" 2ep ") == Interval(2, "ep")
    assert kfit.Interval("100mb").unit == "mb"
    with pytest.raises(ValueError, match=r"`value`: expected a positive number of samples.*Received: value='2 epochs'"):
        Interval("2 epochs")


def _steps(interval, sizes, epoch_size=100):
    """The clock readings (samples) after the steps at which ``interval`` is crossed."""
    clock, at = kfit.Clock(epoch_size=epoch_size), []
    for size in sizes:
        clock.minibatch_size = size
        clock.advance(size)
        if clock.crossed(interval):
            at.append(clock.samples)
    return at


def test_the_clock_says_when_a_step_crossed_an_interval_in_each_unit():
    sizes = [32, 32, 32, 4] * 3  # epochs of 100 samples, the last minibatch of each cut short
    assert _steps("64sp", sizes) == [64, 132, 196, 264]  # 128, 192, 256 lie inside those steps
    assert _steps("4mb", sizes) == [100, 200, 300]
    assert _steps("5mb", [32, 32, 32, 4] * 3) == [132, 264]
    assert _steps("2ep", sizes) == [200]
    assert _steps("1ep", [30, 30]) == []  # never an epoch end without reaching one


def test_a_clock_with_epochs_of_several_sizes_counts_them_where_the_loop_ends_them():
    """Keras's epochs on a source read on across its passes end early where a pass ends (32, 16, 32 samples): the
    loop moves ``epoch_start`` as each ends, and the clock's epoch, its samples in and "ep" intervals follow it, not
    the first epoch's size; the state round-trips through ``get_state``."""
    clock, ends = kfit.Clock(epoch_size=32, epoch_start=(0, 0)), []
    for step, size in enumerate([8] * 10, 1):
        clock.minibatch_size = size
        clock.advance(size)
        if step in (4, 6, 10):  # the steps that end an epoch (4 + 2 + 4)
            clock.epoch_start = (clock.epoch_start[0] + 1, clock.samples)
        ends += [clock.samples] if clock.crossed("1ep") else []
        if step == 5:
            assert (clock.epoch, clock.samples_in_epoch, clock.epoch_end()) == (1, 8, None)
    assert ends == [32, 48, 80] and (clock.epoch, clock.samples_in_epoch) == (3, 0)
    restored = kfit.Clock()
    restored.set_state(clock.get_state())
    assert restored == clock
    with pytest.raises(ValueError, match=r"`epoch_start`.*Received: epoch_start=\(1, 90\)"):
        kfit.Clock(samples=80, epoch_start=(1, 90))


@pytest.mark.skipif(BACKEND == "torch", reason="Keras: steps_per_execution must be 1 with the PyTorch backend")
@pytest.mark.parametrize("loop", ["model.fit", "kfit.fit"])
def test_a_multiple_crossed_inside_a_call_of_several_steps_counts(tmp_path, loop):
    """``compile(steps_per_execution=3)``: Keras calls the hooks after each call of 3 steps; a multiple of an interval
    crossed by any of them is seen there (it was missed unless the call's last step crossed it)."""
    x = np.random.default_rng(0).normal(size=(48, 3)).astype("float32")
    y = x.sum(axis=1, keepdims=True)
    model = _model()
    model.compile(optimizer="sgd", loss="mse", steps_per_execution=3)
    checkpoint = Checkpoint(tmp_path / "run.ckpt", frequency="30sp", preserve_all=True, async_write=False)
    every_4_minibatches = CrossValidation((x[:8], y[:8]), frequency="4mb")
    callbacks = [checkpoint, every_4_minibatches]
    if loop == "model.fit":
        model.fit(x, y, batch_size=8, epochs=2, shuffle=False, verbose=0,
                  callbacks=[kfit.callbacks.SampleClock(batch_size=8, num_samples=48), *callbacks])
    else:
        kfit.fit(model, x, y, minibatch_size=8, epochs=2, seed=0, verbose=0, callbacks=callbacks)
    # Calls end at samples 24, 48, 72, 96 (minibatches 3, 6, 9, 12): 30, 60 and 90 lie inside the 2nd, 3rd and 4th
    # calls, minibatches 4 and 8 inside the 2nd and 3rd, 12 at the end of the 4th.
    saved = sorted(read_checkpoint_info(p).samples for p in tmp_path.glob("run.ckpt.*"))
    assert saved == [48, 72, 96]
    assert [r["samples"] for r in every_4_minibatches.results] == [48, 72, 96]


def _model():
    keras.utils.set_random_seed(0)
    model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(1)])
    model.compile(optimizer="sgd", loss="mse")
    return model


def test_cross_validation_and_checkpoints_follow_an_interval_in_any_unit(tmp_path):
    x = np.random.default_rng(0).normal(size=(40, 3)).astype("float32")
    y = x.sum(axis=1, keepdims=True)
    every_3_minibatches = CrossValidation((x[:8], y[:8]), frequency="3mb")
    every_2_epochs = CrossValidation((x[:8], y[:8]), frequency="2ep", name="cv_epochs")
    checkpoint = Checkpoint(tmp_path / "run.ckpt", frequency="2ep", preserve_all=True)
    kfit.fit(_model(), x, y, minibatch_size=10, epochs=5, seed=0, verbose=0,
             callbacks=[every_3_minibatches, every_2_epochs, checkpoint])
    assert [r["samples"] for r in every_3_minibatches.results] == [30, 60, 90, 120, 150, 180]
    assert [r["samples"] for r in every_2_epochs.results] == [80, 160]
    saved = sorted(read_checkpoint_info(p).samples for p in tmp_path.glob("run.ckpt.*"))
    assert saved == [80, 160, 200]  # every second epoch, and the end of the run
    assert checkpoint.epochs == 2 and checkpoint.interval is None
