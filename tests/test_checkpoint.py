"""Full-state checkpoints: exact resume, damaged and mismatched files, file naming, model.fit, the CLI.

The kill-and-resume test with real processes is in test_checkpoint_resume.py.
"""

from __future__ import annotations

import json
import os
import random
import re
import shutil
import tempfile
import warnings

import h5py
import keras
import numpy as np
import pytest
from checkpoint_files import edit, edit_meta, flip_byte, seal, write_format_1

import kfit
from kfit.checkpoint import (
    CheckpointCorruptError,
    CheckpointError,
    CheckpointMismatchError,
    CheckpointNotFoundError,
    _format,
    list_checkpoints,
    read_checkpoint_info,
)
from kfit.cli import main as cli

FIT = dict(minibatch_size=[8, 8, 8, 16], epoch_size=60, seed=5, verbose=0)


def make_model(hidden: int = 8, optimizer: str = "momentum", dropout: bool = True, extra_layer: bool = False):
    keras.utils.set_random_seed(1)
    layers = [keras.Input((4,)), keras.layers.Dense(hidden, activation="tanh")]
    if dropout:
        layers.append(keras.layers.Dropout(0.3, seed=3))
    if extra_layer:
        layers.append(keras.layers.Dense(hidden, activation="tanh"))
    layers.append(keras.layers.Dense(1))
    model = keras.Sequential(layers)
    if optimizer == "momentum":
        opt = kfit.optimizers.MomentumSGD(learning_rate=0.01, momentum=0.9)
    else:
        opt = keras.optimizers.Adam(learning_rate=0.01)
    model.compile(optimizer=opt, loss="mse", metrics=["mae"])
    return model


def data(n: int = 100):
    rng = np.random.default_rng(0)
    return rng.normal(size=(n, 4)).astype("float32"), rng.normal(size=(n, 1)).astype("float32")


def state(model) -> list[np.ndarray]:
    return [keras.ops.convert_to_numpy(v.value) for v in model.variables + model.optimizer.variables]


def assert_same_state(a, b) -> None:
    sa, sb = state(a), state(b)
    assert len(sa) == len(sb)
    for i, (x, y) in enumerate(zip(sa, sb, strict=True)):
        assert np.array_equal(x, y), (a.variables + a.optimizer.variables)[i].path


def built(model, x):
    model(x[:2])
    model.optimizer.build(model.trainable_variables)
    return model


@pytest.fixture(scope="module")
def reference():
    """An uninterrupted run of 5 epochs: (state, history, epoch)."""
    keras.backend.clear_session()
    x, y = data()
    model = make_model()
    history = kfit.fit(model, x, y, epochs=5, **FIT)
    return state(model), history.history, history.epoch


def interrupted_run(path, **checkpoint):
    """The first 152 samples (2.5 epochs) of the reference run, with checkpoints. (The reference run passes
    through sample 152; a stop elsewhere would cut a minibatch short, which the reference never does.)"""
    x, y = data()
    options = dict(frequency=70, keep=2) | checkpoint
    callback = kfit.callbacks.Checkpoint(path, **options)
    kfit.fit(make_model(), x, y, epochs=5, max_samples=152, callbacks=[callback], **FIT)
    return callback


def resume(path, **checkpoint):
    x, y = data()
    model = make_model()
    callback = kfit.callbacks.Checkpoint(path, frequency=70, keep=2, **checkpoint)
    history = kfit.fit(model, x, y, epochs=5, callbacks=[callback], **FIT)
    return model, history, callback


def assert_matches_reference(model, history, reference) -> None:
    expected_state, expected_history, expected_epoch = reference
    got = state(model)
    for i, (x, y) in enumerate(zip(expected_state, got, strict=True)):
        assert np.array_equal(x, y), (model.variables + model.optimizer.variables)[i].path
    assert history.history == expected_history
    assert history.epoch == expected_epoch


# -- exact resume ------------------------------------------------------------------------------------
@pytest.mark.parametrize("async_write", [True, False])
def test_resume_mid_epoch_is_bit_identical(tmp_path, reference, async_write):
    path = tmp_path / "run.ckpt"
    first = interrupted_run(path, async_write=async_write)
    # crossing 70 samples (at 76), the final one at the mid-epoch stop at 152, and that state again when the partial
    # epoch ends, with its history entry
    assert first.saves == 3
    assert read_checkpoint_info(path).samples_in_epoch == 32
    model, history, callback = resume(path, async_write=async_write)
    assert callback.restored_from.samples == 152 and callback.restored_from.checksum_ok
    assert_matches_reference(model, history, reference)


def test_restore_falls_back_to_the_previous_intact_checkpoint(tmp_path, reference):
    path = tmp_path / "run.ckpt"
    interrupted_run(path)
    assert [s for s, _ in list_checkpoints(path)] == [152, 152, 76]
    os.remove(f"{path}.152")
    with open(path, "r+b") as f:  # damage the newest file
        f.truncate(os.path.getsize(path) // 2)
    with pytest.warns(UserWarning, match="truncated or damaged.*Falling back to the previous intact checkpoint: resumed from .*run.ckpt.76"):
        model, history, callback = resume(path)
    assert callback.restored_from.samples == 76 and callback.restored_from.path == f"{path}.76"
    assert_matches_reference(model, history, reference)


def test_a_resume_given_another_seed_or_shuffle_says_it_keeps_the_checkpoints(tmp_path, reference):
    """The run resumed with seed=6 or shuffle=False read the data in the checkpoint's order (seed 5, shuffled), as an
    exact resume must, without a word: the user's change was dropped silently."""
    interrupted_run(tmp_path / "saved" / "run.ckpt")
    x, y = data()
    for changed, said in ((dict(seed=6), r"seed=5 \(this run asked for seed=6\)"),
                          (dict(shuffle=False), r"shuffle=True \(this run asked for shuffle=False\)")):
        directory = tmp_path / str(changed)
        shutil.copytree(tmp_path / "saved", directory)
        model = make_model()
        with pytest.warns(UserWarning, match=said + ": the checkpoint's order is kept"):
            history = kfit.fit(model, x, y, epochs=5, callbacks=[
                kfit.callbacks.Checkpoint(directory / "run.ckpt", frequency=70)], **(FIT | changed))
        assert_matches_reference(model, history, reference)


def test_a_resume_under_another_learning_rate_in_code_says_the_checkpoints_is_restored(tmp_path, reference):
    """The code now compiles the optimizer with learning_rate=0.05 (it was 0.01): the checkpoint's 0.01 overwrote it
    without a word. The restore keeps it (an exact resume, as for another seed) and says so, naming both values; an
    unchanged resume says nothing of the optimizer."""
    interrupted_run(tmp_path / "saved" / "run.ckpt")
    x, y = data()
    for rate in (0.05, 0.01):
        directory = tmp_path / str(rate)
        shutil.copytree(tmp_path / "saved", directory)
        model = make_model()
        model.optimizer.learning_rate.assign(rate)
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            history = kfit.fit(model, x, y, epochs=5, callbacks=[
                kfit.callbacks.Checkpoint(directory / "run.ckpt", frequency=70)], **FIT)
        said = [str(w.message) for w in caught if "optimizer's" in str(w.message)]
        if rate == 0.01:
            assert said == []
        else:
            assert len(said) == 1 and "This code sets the optimizer's learning_rate=0.05; the run that wrote the " \
                "checkpoint" in said[0] and "set learning_rate=0.01, and the checkpoint's learning_rate=0.01 is " \
                "restored" in said[0] and "assign(0.05)" in said[0], said
        assert_matches_reference(model, history, reference)


class _CrashAtEpoch(keras.callbacks.Callback):
    def __init__(self, epoch, step=0):
        super().__init__()
        self.epoch, self.step = epoch, step

    def on_epoch_begin(self, epoch, logs=None):
        self.now = epoch

    def on_train_batch_end(self, batch, logs=None):
        if self.now == self.epoch and batch == self.step:
            raise RuntimeError("crash")


@pytest.mark.parametrize("loop", ["kfit.fit", "model.fit"])
def test_a_second_run_on_the_same_model_records_the_learning_rate_in_code_as_a_first_run(tmp_path, loop):
    """The first run's schedule left the optimizer's learning rate (and the clock its minibatch_size) moved; the second
    run on the same model recorded those as set in code, and its resume in a model built anew (a new process, the same
    code) said the code had changed them. A value the last run left is now the one that run had in code; a value the
    user assigned since still is the code's (and is named). A rerun of the same model after a crash resumes without a
    note and records the same: under model.fit too, where Keras tells no callback of a fit that raised (the rerun took
    the record of the run before the crashed one, and its checkpoints said the code set learning_rate=0.01 where the
    user had assigned 0.02: the last resume said nothing). The last resume has no schedule: one that sets the rate
    before every step is told nothing of the rate in code (it plays no part)."""
    x, y = data(96)
    schedule = kfit.schedules.learning_rate_per_sample([0.001, 0.0005], epoch_size=96)

    def fit(model, *callbacks, scheduled=True):
        lr = [kfit.callbacks.LearningRateSchedule(schedule)] * scheduled
        if loop == "kfit.fit":
            return kfit.fit(model, x, y, minibatch_size=16, epochs=3, seed=0, verbose=0, callbacks=[*lr, *callbacks])
        clock = kfit.callbacks.SampleClock(batch_size=16, num_samples=96)
        return model.fit(x, y, batch_size=16, epochs=3, shuffle=False, verbose=0, callbacks=[clock, *lr, *callbacks])

    def notes(model, path, *crash, scheduled=True):
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            try:
                fit(model, kfit.callbacks.Checkpoint(path, async_write=False), *crash, scheduled=scheduled)
            except RuntimeError as error:
                assert crash and str(error) == "crash"
        return [str(w.message) for w in caught if "optimizer's" in str(w.message)]

    for assigned in (None, 0.02):
        path = tmp_path / str(assigned) / "run.ckpt"
        model = make_model()
        fit(model)
        if assigned is not None:
            model.optimizer.learning_rate.assign(assigned)
        notes(model, path, _CrashAtEpoch(1, step=2))  # (the learning rate moves past the checkpoint's)
        assert notes(model, path, _CrashAtEpoch(2, step=2)) == []  # the same model, rerun
        said = notes(make_model(), path, scheduled=False)
        if assigned is None:
            assert said == []
        else:
            assert len(said) == 1 and "This code sets the optimizer's learning_rate=0.01; the run that wrote the " \
                "checkpoint" in said[0] and "set learning_rate=0.02, and the checkpoint's learning_rate=" in said[0], said


def test_a_rerun_after_a_model_fit_that_raised_records_the_value_in_code_its_restore_had_replaced(tmp_path):
    """Code changed to learning_rate=0.05 resumed (under model.fit) a checkpoint of 0.01, with the note, and raised;
    its rerun on the same model, the same code, recorded the restored 0.01 as set in code (Keras tells no callback of
    a fit that raised, so nothing said what that run had in code), and a later resume of the same code said "This
    code sets the optimizer's learning_rate=0.05; the run that wrote the checkpoint set learning_rate=0.01". The
    restore step records what a run starts from: the rerun records 0.05, and a value the user assigned after the
    crash is still the code's, and named."""
    x, y = data(96)

    def notes(model, path, crash_epoch=None):
        crash = [_CrashAtEpoch(crash_epoch, step=2)] if crash_epoch is not None else []
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            try:
                model.fit(x, y, batch_size=16, epochs=4, shuffle=False, verbose=0, callbacks=[
                    kfit.callbacks.SampleClock(batch_size=16, num_samples=96),
                    kfit.callbacks.Checkpoint(path, async_write=False), *crash])
            except RuntimeError as error:
                assert crash and str(error) == "crash"
        return [str(w.message) for w in caught if "optimizer's" in str(w.message)]

    def in_code(rate):
        model = make_model()
        model.optimizer.learning_rate.assign(rate)
        return model

    for assigned in (None, 0.02):
        path = tmp_path / str(assigned) / "run.ckpt"
        notes(in_code(0.01), path, crash_epoch=1)
        model = in_code(0.05)
        assert len(notes(model, path, crash_epoch=2)) == 1  # (0.05 in code, 0.01 restored)
        if assigned is not None:
            model.optimizer.learning_rate.assign(assigned)
        said = notes(model, path, crash_epoch=3)  # the same model, rerun
        if assigned is None:
            assert said == []
        else:
            assert len(said) == 1 and "This code sets the optimizer's learning_rate=0.02; the run that wrote the " \
                "checkpoint" in said[0] and "set learning_rate=0.05, and the checkpoint's learning_rate=0.01" in said[0], said
        assert notes(in_code(assigned or 0.05), path) == []


@pytest.mark.parametrize("mover", ["ReduceLROnPlateau after", "LearningRateScheduler before",
                                   "LearningRateScheduler after"])
def test_a_rerun_after_a_model_fit_that_raised_reads_a_rate_keras_moved_as_the_crashed_runs(tmp_path, mover):
    """Under plain model.fit, Keras's ReduceLROnPlateau or LearningRateScheduler moved the learning rate (0.01 in code)
    and the fit raised (Keras tells no callback): the rerun of the same model read the moved rate as assigned in code,
    said "This code sets the optimizer's learning_rate=0.005 (or 0.0025)" at its resume, and its checkpoints recorded
    it, so that a resume of the unchanged code in a model built anew said "This code sets the optimizer's
    learning_rate=0.01; the run that wrote the checkpoint set learning_rate=0.005". Both say nothing now, whether
    Keras's callback is listed before or after kfit's."""
    x, y = data(96)
    kind, where = mover.split()

    def notes(model, crash_epoch=None):
        moves = (keras.callbacks.ReduceLROnPlateau(monitor="loss", factor=0.5, patience=0, min_delta=10.0)
                 if kind == "ReduceLROnPlateau" else keras.callbacks.LearningRateScheduler(lambda e, lr: 0.01 * 0.5**e))
        ours = [kfit.callbacks.SampleClock(batch_size=16, num_samples=96),
                kfit.callbacks.Checkpoint(tmp_path / "run.ckpt", async_write=False)]
        crash = [_CrashAtEpoch(crash_epoch, step=2)] if crash_epoch is not None else []
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            try:
                model.fit(x, y, batch_size=16, epochs=5, shuffle=False, verbose=0,
                          callbacks=(ours + [moves] if where == "after" else [moves] + ours) + crash)
            except RuntimeError as error:
                assert crash and str(error) == "crash"
        return [str(w.message) for w in caught if "optimizer's" in str(w.message)]

    model = make_model()
    assert notes(model, crash_epoch=2) == []
    assert float(model.optimizer.learning_rate) < 0.009  # (Keras's callback moved it)
    assert notes(model, crash_epoch=3) == []  # the same model, rerun
    assert notes(make_model()) == []  # the same code, in a new process


@pytest.mark.parametrize("loop", ["kfit.fit", "model.fit"])
def test_a_resume_says_nothing_of_a_value_in_code_that_its_schedules_set_before_every_step(tmp_path, loop):
    """The resume, with the same LearningRateSchedule and MomentumSchedule, of code that compiles other values of the
    learning rate, momentum and minibatch_size (which the schedules and the clock set before every step) said "This
    code sets the optimizer's learning_rate=0.05, momentum=0.5, minibatch_size=32 ... assign it once the run has
    resumed": a false warning (they play no part: it trains as the unchanged code does, and an assignment would be
    overwritten at the next step). It says nothing now; a learning rate changed in code that no schedule of the
    resumed run sets is still named, alone."""
    x, y = data(96)
    rate = kfit.schedules.learning_rate_per_sample([0.001, 0.0005], epoch_size=96)
    tau = kfit.schedules.momentum_as_time_constant([0, 64], epoch_size=96)

    def fit(path, changed=(), schedules=("lr", "momentum"), *crash):
        model = make_model()
        for name in changed:
            getattr(model.optimizer, name).assign({"learning_rate": 0.05, "momentum": 0.5, "minibatch_size": 32}[name])
        callbacks = [*[kfit.callbacks.LearningRateSchedule(rate)] * ("lr" in schedules),
                     *[kfit.callbacks.MomentumSchedule(tau)] * ("momentum" in schedules),
                     kfit.callbacks.Checkpoint(path, async_write=False), *crash]
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            try:
                if loop == "kfit.fit":
                    kfit.fit(model, x, y, minibatch_size=16, epochs=3, seed=0, verbose=0, callbacks=callbacks)
                else:
                    model.fit(x, y, batch_size=16, epochs=3, shuffle=False, verbose=0,
                              callbacks=[kfit.callbacks.SampleClock(batch_size=16, num_samples=96), *callbacks])
            except RuntimeError as error:
                assert crash and str(error) == "crash"
        return state(model), [str(w.message) for w in caught if "optimizer's" in str(w.message)]

    fit(tmp_path / "saved" / "run.ckpt", (), ("lr", "momentum"), _CrashAtEpoch(1, step=2))

    def resume(changed, schedules):
        directory = tmp_path / f"{changed}{schedules}"
        shutil.copytree(tmp_path / "saved", directory)
        return fit(directory / "run.ckpt", changed, schedules)

    everything = ("learning_rate", "momentum", "minibatch_size")
    unchanged, said = resume((), ("lr", "momentum"))
    assert said == []
    trained, said = resume(everything, ("lr", "momentum"))
    assert said == [], said
    for got, expected in zip(trained, unchanged):
        np.testing.assert_array_equal(got, expected)
    _, said = resume(everything, ("momentum",))
    assert len(said) == 1 and "This code sets the optimizer's learning_rate=0.05; the run that wrote the checkpoint" \
        in said[0] and "set learning_rate=0.01, and the checkpoint's learning_rate=" in said[0], said


def test_a_checkpoint_of_another_keras_version_is_restored_with_a_warning_naming_both(tmp_path):
    """The file records the Keras version that wrote it; a restore under another one said nothing."""
    x, y = data()
    path = tmp_path / "run.ckpt"
    kfit.save_checkpoint(path, built(make_model(), x))
    edit_meta(path, lambda meta: meta.__setitem__("keras_version", "3.10.0"))
    assert read_checkpoint_info(path).keras_version == "3.10.0"
    with pytest.warns(UserWarning, match=rf"written under Keras 3\.10\.0 and is restored under Keras "
                      rf"{keras.__version__}: the run goes on from the same weights, but not bit-identically"):
        kfit.load_checkpoint(path, built(make_model(), x))


def test_restore_after_a_change_of_minibatch_size_schedule(tmp_path):
    """Resumed with another schedule, the run goes on from the saved sample with the new sizes: exactly as a
    run whose schedule switches at that sample (the minibatch-size variable follows)."""
    x, y = data()
    first, second = [8, 8, 8, 16], kfit.schedules.minibatch_size([12, 20], epoch_size=60)
    options = dict(epoch_size=60, seed=5, verbose=0)
    path = tmp_path / "run.ckpt"
    kfit.fit(make_model(), x, y, epochs=3, max_samples=92, minibatch_size=first,
             callbacks=[kfit.callbacks.Checkpoint(path, frequency=50)], **options)
    resumed = make_model()
    callback = kfit.callbacks.Checkpoint(path, frequency=50)
    history = kfit.fit(resumed, x, y, epochs=3, minibatch_size=second, callbacks=[callback], **options)
    assert callback.restored_from.samples == 92

    switch = kfit.schedules.minibatch_size(lambda samples: 8 if samples < 24 else 16 if samples < 92 else second.value(samples))
    expected = make_model()
    expected_history = kfit.fit(expected, x, y, epochs=3, minibatch_size=switch, **options)
    assert_same_state(expected, resumed)
    assert history.history == expected_history.history
    size = kfit.optimizers.minibatch_size_variable(resumed.optimizer)
    assert float(keras.ops.convert_to_numpy(size)) == 20.0  # the new schedule's size (20 from sample 60 on)


def test_save_and_load_restore_everything(tmp_path):
    x, y = data()
    model = built(make_model(), x)
    clock = kfit.Clock(samples=130, minibatches=9, epoch_size=60, minibatch_size=16)
    stream = kfit.data.SampleStream(x, y, seed=3)
    stream.position = 130

    class Stateful(kfit.callbacks.KfitCallback):
        def __init__(self, value):
            super().__init__(name="stateful")
            self.value = value

        def get_state(self):
            return self.value

        def set_state(self, state):
            self.value = state

    value = {"best": 0.5, "weights": [np.arange(6.0).reshape(2, 3), np.ones(2, "int32")],
             "by_index": {3: "three", 4: None}, "pair": (1, 2), "nan": float("nan")}
    history = keras.callbacks.History()
    history.history, history.epoch = {"loss": [1.5, 0.75]}, [0, 1]
    np.random.seed(7)
    random.seed(7)
    saved = state(model)
    kfit.save_checkpoint(tmp_path / "c.ckpt", model, clock=clock, stream=stream, callbacks=[Stateful(value)], history=history)
    expected_draws = (np.random.random(3), random.random())

    for v in model.variables + model.optimizer.variables:
        v.assign(keras.ops.zeros(v.shape, v.dtype))
    other_clock, other_stream = kfit.Clock(epoch_size=60), kfit.data.SampleStream(x, y, seed=0)
    callback, other_history = Stateful(None), keras.callbacks.History()
    before = np.random.get_state()
    kfit.load_checkpoint(tmp_path / "c.ckpt", model, clock=other_clock, stream=other_stream)
    after = np.random.get_state()
    assert before[0] == after[0] and np.array_equal(before[1], after[1])  # the process's RNG left alone by default
    info = kfit.load_checkpoint(tmp_path / "c.ckpt", model, clock=other_clock, stream=other_stream,
                                callbacks=[callback], history=other_history, random_state=True)
    assert info.samples == 130 and info.checksum_ok and info.optimizer == "MomentumSGD"
    for a, b in zip(saved, state(model), strict=True):
        assert np.array_equal(a, b)
    assert other_clock.get_state() == clock.get_state()
    assert other_stream.get_state() == stream.get_state()
    assert other_history.history == history.history and other_history.epoch == [0, 1]
    got = callback.value
    assert got["best"] == 0.5 and got["by_index"] == {3: "three", 4: None} and got["pair"] == [1, 2]
    assert np.isnan(got["nan"])
    assert np.array_equal(got["weights"][0], value["weights"][0]) and got["weights"][1].dtype == np.int32
    assert np.array_equal(np.random.random(3), expected_draws[0]) and random.random() == expected_draws[1]
    if keras.backend.backend() == "torch":
        import torch

        torch.manual_seed(3)
        kfit.save_checkpoint(tmp_path / "t.ckpt", model)
        draw = torch.rand(3)
        kfit.load_checkpoint(tmp_path / "t.ckpt", model, random_state=True)
        assert torch.equal(torch.rand(3), draw)


class _Largest(keras.metrics.Metric):
    """A metric whose state is not a sum over samples: the largest target seen."""

    def __init__(self, name="largest", **kwargs):
        super().__init__(name=name, **kwargs)
        self.largest = self.add_variable(shape=(), initializer="zeros", name="largest")

    def update_state(self, y_true, y_pred, sample_weight=None):
        self.largest.assign(keras.ops.maximum(self.largest.value, keras.ops.cast(keras.ops.max(y_true), "float32")))

    def result(self):
        return keras.ops.convert_to_tensor(self.largest)


def _two_workers_checkpoint(tmp_path, shares):
    """A checkpoint as two workers write it (rank 0's metric variables in the "metrics" group, rank 1's as
    worker_metrics/1/<i>), from one process: each worker's metric state is that of evaluating its share."""
    x, y = data()
    model = built(make_model(), x)
    model.compile(optimizer=model.optimizer, loss="mse", metrics=["mae", _Largest()])
    states = []
    for lo, hi in shares:
        model.evaluate(x[lo:hi], y[lo:hi], batch_size=7, verbose=0)
        states.append([keras.ops.convert_to_numpy(v.value) for v in model.metrics_variables])
    path = tmp_path / "two.ckpt"
    kfit.save_checkpoint(path, model, clock=kfit.Clock(samples=40, minibatches=4, epoch_size=100))

    def add_rank_one(f):
        meta = json.loads(f.attrs["meta"])
        for i, value in enumerate(states[1]):
            f.create_dataset(f"worker_metrics/1/{i}", data=value)
            meta["arrays"].append({"name": f"worker_metrics/1/{i}", "shape": list(value.shape), "dtype": value.dtype.name})
        meta["workers"] = {"count": 2, "metric_states": 2}
        f.attrs["meta"] = json.dumps(meta)
    assert read_checkpoint_info(path).samples == 40
    edit(path, add_rank_one)  # (the file holds rank 0's state: the last one evaluated is rank 1's)
    edit(path, lambda f: [f[f"metrics/{i}"].write_direct(np.asarray(v)) for i, v in enumerate(states[0])])
    return path, model, states


def test_two_workers_metric_states_load_on_one_worker_as_their_sums(tmp_path):
    """A checkpoint of two workers resumed on one: the training metrics whose state is a sum over samples (the loss,
    mae) go on from the sum of both workers' states, i.e. as if one worker had trained both shares; a metric with
    another kind of state goes on from worker 0's, and a warning names it."""
    x, y = data()
    path, model, states = _two_workers_checkpoint(tmp_path, [(0, 20), (20, 50)])
    for v in model.metrics_variables:
        v.assign(keras.ops.ones(v.shape, v.dtype))
    with pytest.warns(UserWarning, match=r"resumed on 1: the metric variables \['largest/largest'\] do not hold sums"):
        kfit.load_checkpoint(path, model)
    restored = [keras.ops.convert_to_numpy(v.value) for v in model.metrics_variables]
    paths = [v.path for v in model.metrics_variables]
    for name, value, first, second in zip(paths, restored, *states, strict=True):
        expected = first if name == "largest/largest" else first + second
        np.testing.assert_array_equal(value, expected, err_msg=name)
    whole = model.evaluate(x[:50], y[:50], batch_size=50, verbose=0, return_dict=True)  # resets the metrics first
    model.evaluate(x[:50], y[:50], batch_size=50, verbose=0)
    for v, value in zip(model.metrics_variables, restored, strict=True):  # the sums are the whole set's state
        v.assign(value)
    results = model.get_metrics_result()
    for key in ("loss", "mae"):
        assert float(results[key]) == pytest.approx(whole[key], rel=1e-6)


def test_a_worker_metric_state_the_file_lacks_is_refused_as_damaged(tmp_path):
    path, model, _ = _two_workers_checkpoint(tmp_path, [(0, 20), (20, 50)])
    edit_meta(path, lambda meta: meta["workers"].__setitem__("count", 3))  # 3 workers' states claimed, 2 stored
    with pytest.raises(CheckpointCorruptError, match=r"meta.workers.metric_states should be 1 or meta.workers.count"):
        kfit.load_checkpoint(path, model)
    edit_meta(path, lambda meta: meta.__setitem__("workers", {"count": 3, "metric_states": 3}))
    with pytest.raises(CheckpointCorruptError, match=r"should hold worker_metrics/2/0 of the shape of metrics/0"):
        kfit.load_checkpoint(path, model)
    assert cli(["inspect", str(path)]) == 1


def test_a_model_built_twice_in_one_process_loads_by_position(tmp_path):
    x, _ = data()
    first = built(make_model(), x)
    kfit.save_checkpoint(tmp_path / "c.ckpt", first)
    second = built(make_model(), x)  # sequential_1/dense_2/...: Keras numbered the names
    for v in second.trainable_variables:
        v.assign(keras.ops.zeros(v.shape, v.dtype))
    kfit.load_checkpoint(tmp_path / "c.ckpt", second)
    assert_same_state(first, second)


def two_outputs():
    """A functional model with two outputs named by Keras (``dense_4``, ``dense_5``): its logs are per output."""
    keras.utils.set_random_seed(1)
    inputs = keras.Input((4,))
    hidden = keras.layers.Dense(8, activation="tanh")(inputs)
    model = keras.Model(inputs, [keras.layers.Dense(1)(hidden), keras.layers.Dense(1)(hidden)])
    model.compile(optimizer=kfit.optimizers.MomentumSGD(learning_rate=0.01, momentum=0.9), loss=["mse", "mse"],
                  metrics=[["mae"], ["mae"]])
    return model


def test_a_multi_output_model_built_again_in_one_process_resumes_its_history_under_its_new_names(tmp_path):
    """The same model built again in one process (a notebook cell run again) gets new output names from Keras, and
    the run resumed in it kept the checkpoint's per-output lists (dense_4_loss, 3 values) beside its own (dense_7_loss,
    2): lists of different lengths, under names no run of this model logs. The restored lists now go on under this
    run's names: the history is the uninterrupted run's, per output."""
    x, y = data()
    z = -y
    options = dict(minibatch_size=8, epoch_size=60, seed=5, verbose=0, validation_data=(x[:20], [y[:20], z[:20]]))
    reference = two_outputs()
    expected = kfit.fit(reference, x, [y, z], epochs=4, **options)
    path = tmp_path / "run.ckpt"
    kfit.fit(two_outputs(), x, [y, z], epochs=4, max_samples=144, callbacks=[kfit.callbacks.Checkpoint(path)],
             **options)  # stopped inside the third epoch
    model = two_outputs()
    history = kfit.fit(model, x, [y, z], epochs=4, callbacks=[kfit.callbacks.Checkpoint(path)], **options)

    def by_position(model, history):  # the keys with each output named by its place: output_0_loss, val_output_1_mae
        names = dict(zip(model.output_names, ("output_0", "output_1"), strict=True))
        pattern = "|".join(sorted(names, key=len, reverse=True))
        return {re.sub(f"({pattern})(?=_)", lambda match: names[match.group()], key): values
                for key, values in history.history.items()}

    assert set(model.output_names).isdisjoint(reference.output_names)
    assert "val_" + model.output_names[1] + "_mae" in history.history
    assert by_position(model, history) == by_position(reference, expected)
    assert {len(values) for values in history.history.values()} == {4}
    assert_same_state(reference, model)


def test_loading_into_a_model_compiled_anew_says_nothing_of_a_misfit(tmp_path):
    """A trained model's checkpoint (its compiled metrics built) loaded into the same model compiled anew, whose
    compiled metrics Keras builds only at its first step: that warned that the checkpoint 'does not fit this model'
    and to restore 'into a model built like the one that saved it' (which it was)."""
    x, y = data()
    trained = built(make_model(), x)
    trained.evaluate(x, y, verbose=0)  # builds the compiled metrics ("mae")
    at_epoch_end, mid_epoch = tmp_path / "end.ckpt", tmp_path / "mid.ckpt"
    kfit.save_checkpoint(at_epoch_end, trained, clock=kfit.Clock(samples=120, minibatches=15, epoch_size=60))
    kfit.save_checkpoint(mid_epoch, trained, clock=kfit.Clock(samples=130, minibatches=16, epoch_size=60))
    keras.backend.clear_session()
    fresh = built(make_model(), x)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # at an epoch's end the metric state is reset before it counts again
        kfit.load_checkpoint(at_epoch_end, fresh)
    assert [np.array_equal(a, b) for a, b in zip(state(trained), state(fresh), strict=True)] == [True] * len(state(fresh))
    with pytest.warns(UserWarning, match="compiled metrics are not built yet") as caught:
        kfit.load_checkpoint(mid_epoch, fresh)
    assert not any("does not fit" in str(w.message) for w in caught)


# -- damaged, missing and mismatched files --------------------------------------------------------------
def saved_model(tmp_path):
    x, _ = data()
    model = built(make_model(), x)
    path = tmp_path / "c.ckpt"
    kfit.save_checkpoint(path, model)
    for v in model.trainable_variables:  # something a failed restore must not overwrite
        v.assign(keras.ops.ones(v.shape, v.dtype))
    return model, path


def test_truncated_file_is_refused_and_changes_nothing(tmp_path):
    model, path = saved_model(tmp_path)
    before = state(model)
    with open(path, "r+b") as f:
        f.truncate(os.path.getsize(path) - 100)
    with pytest.raises(CheckpointCorruptError, match="truncated or damaged"):
        kfit.load_checkpoint(path, model)
    for a, b in zip(before, state(model), strict=True):
        assert np.array_equal(a, b)


def test_flipped_byte_in_an_array_is_refused_and_changes_nothing(tmp_path):
    model, path = saved_model(tmp_path)
    before = state(model)
    content = open(path, "rb").read()
    _, arrays = _format.read_file(path)
    flip_byte(path, content.index(arrays["model/0"].tobytes()) + 5)
    with pytest.raises(CheckpointCorruptError, match=r"is damaged: the checksum of the file \(SHA-256\) does not hold"):
        kfit.load_checkpoint(path, model)
    with pytest.raises(CheckpointCorruptError, match="c.ckpt' is damaged"):
        read_checkpoint_info(path)
    for a, b in zip(before, state(model), strict=True):
        assert np.array_equal(a, b)


def test_flipped_byte_in_the_metadata_is_refused(tmp_path):
    _, path = saved_model(tmp_path)
    content = open(path, "rb").read()
    flip_byte(path, content.index(b'"kfit_version"') + 3)
    with pytest.raises(CheckpointCorruptError, match="checksum of the file"):
        read_checkpoint_info(path)


def test_format_1_files_are_still_read(tmp_path):
    model, path = saved_model(tmp_path)
    meta, arrays = _format.read_file(path)
    old = tmp_path / "old.ckpt"
    write_format_1(old, meta, arrays)
    info = kfit.load_checkpoint(old, model)
    assert info.format_version == 1 and info.checksum_ok
    assert np.array_equal(state(model)[0], arrays["model/0"])
    with h5py.File(old, "r") as f:
        offset = f["model/0"].id.get_offset()
    flip_byte(old, offset + 2)
    info = read_checkpoint_info(old)
    assert info.checksum_ok is False and "checksum of variable" in info.problem and "(model/0)" in info.problem


def _format_1_heap_object(data: bytes, starts: bytes) -> int:
    """The offset of the size field of the object of the file's global heap (HDF5's GCOL) whose data starts with
    ``starts``."""
    import struct

    heap = data.index(b"GCOL")
    offset, end = heap + 16, heap + struct.unpack_from("<Q", data, heap + 8)[0]
    while offset < end:
        index, _, _, size = struct.unpack_from("<HHIQ", data, offset)
        if data[offset + 16:].startswith(starts):
            return offset + 8
        assert index != 0
        offset += 16 + (size + 7) // 8 * 8
    raise AssertionError(starts)


def test_a_damaged_format_1_file_on_which_hdf5_never_returns_is_refused(tmp_path, monkeypatch, capsys):
    """A format-1 file (no whole-file checksum: HDF5 parses it) whose metadata checksum string is declared 16 bytes
    longer: reading it looped forever inside HDF5 (load_checkpoint, restore=True, kfit inspect, kfit runs)."""
    model, path = saved_model(tmp_path)
    meta, arrays = _format.read_file(path)
    old = tmp_path / "old.ckpt"
    write_format_1(old, meta, arrays)
    flip_byte(old, _format_1_heap_object(old.read_bytes(), b"crc32:"), 0x10)
    monkeypatch.setattr(_format, "FORMAT_1_TIMEOUT_S", 3.0)
    before = state(model)
    with pytest.raises(CheckpointCorruptError, match="first format .*HDF5 did not finish reading it in 3 s"):
        kfit.load_checkpoint(old, model)
    assert all(np.array_equal(a, b) for a, b in zip(before, state(model), strict=True))
    os.remove(path)
    assert cli(["runs", str(tmp_path)]) == 1
    assert "DAMAGED" in capsys.readouterr().out


def test_wrong_model_is_refused_naming_the_first_variable_that_differs(tmp_path):
    _, path = saved_model(tmp_path)
    x, _ = data()
    keras.backend.clear_session()  # the same layer names as the saved model: variables are matched by path
    wider = built(make_model(hidden=16), x)
    before = state(wider)
    with pytest.raises(CheckpointMismatchError, match=r"model variable 'sequential/dense/kernel' has shape \(4, 16\) in the model and \(4, 8\)"):
        kfit.load_checkpoint(path, wider)
    # Other names (Keras numbered them): matched by position; the first variable that differs is named.
    deeper = built(make_model(extra_layer=True), x)
    with pytest.raises(CheckpointMismatchError, match=r"model variable 'sequential_\d+/dense_\d+/kernel' \(shape \(8, 8\), float32\) differs from the checkpoint's 'sequential/dense_1/kernel' \(shape \(8, 1\), float32\)"):
        kfit.load_checkpoint(path, deeper)
    for a, b in zip(before, state(wider), strict=True):
        assert np.array_equal(a, b)


def test_wrong_optimizer_is_refused(tmp_path):
    _, path = saved_model(tmp_path)
    x, _ = data()
    model = built(make_model(optimizer="adam"), x)
    before = state(model)
    with pytest.raises(CheckpointMismatchError, match="saved with a MomentumSGD optimizer.*this model's optimizer is an Adam"):
        kfit.load_checkpoint(path, model)
    for a, b in zip(before, state(model), strict=True):
        assert np.array_equal(a, b)


class _TwoDense(keras.Model):
    """A subclassed model; with ``own_build`` its build() creates nothing (its layers are built when called)."""

    def __init__(self, own_build: bool = False):
        super().__init__()
        self.hidden, self.out = keras.layers.Dense(8), keras.layers.Dense(1)
        self.own_build = own_build

    def build(self, input_shape):
        if not self.own_build:
            super().build(input_shape)

    def call(self, x):
        return self.out(self.hidden(x))


def test_a_subclassed_model_without_variables_is_refused_saying_how_to_build_it(tmp_path):
    """A model whose own build() creates no variable was told it 'is not built' and to call model.build(), which
    the user had done."""
    x, _ = data()
    saved = _TwoDense()
    saved.compile(optimizer="sgd", loss="mse")
    saved(x[:2])
    kfit.save_checkpoint(tmp_path / "c.ckpt", saved)
    unbuilt = _TwoDense()
    unbuilt.compile(optimizer="sgd", loss="mse")
    with pytest.raises(CheckpointMismatchError, match=r"The model is not built.*model.build\(input_shape\)"):
        kfit.load_checkpoint(tmp_path / "c.ckpt", unbuilt)
    own = _TwoDense(own_build=True)
    own.compile(optimizer="sgd", loss="mse")
    own.build((None, 4))
    with pytest.raises(CheckpointMismatchError, match=r"it is built, but its build\(\) created none.*Call it on a "
                       "batch first"):
        kfit.load_checkpoint(tmp_path / "c.ckpt", own)
    own(x[:2])
    kfit.load_checkpoint(tmp_path / "c.ckpt", own)
    assert all(np.array_equal(a, b) for a, b in zip(state(saved), state(own), strict=True))


_SAVE_ON_ANOTHER_BACKEND = """
import sys, numpy as np, keras, kfit
sys.path.insert(0, sys.argv[3])
from test_checkpoint import FIT, data, make_model
x, y = data()
model = make_model()
kfit.fit(model, x, y, epochs=5, max_samples=152, callbacks=[kfit.callbacks.Checkpoint(sys.argv[1], frequency=70)], **FIT)
np.savez(sys.argv[2], *[keras.ops.convert_to_numpy(v.value) for v in model.variables + model.optimizer.variables])
"""


def test_a_checkpoint_written_on_another_backend_resumes_from_its_weights(tmp_path):
    """Written mid-epoch on another backend: the weights, optimizer slots, clock and data position are restored,
    with a warning that the run goes on from them but not bit-identically (the README says so)."""
    import subprocess
    import sys

    other = {"tensorflow": "jax", "jax": "torch", "torch": "tensorflow"}[keras.backend.backend()]
    path, saved = tmp_path / "run.ckpt", tmp_path / "saved.npz"
    env = dict(os.environ, KERAS_BACKEND=other)
    done = subprocess.run([sys.executable, "-c", _SAVE_ON_ANOTHER_BACKEND, str(path), str(saved),
                           os.path.dirname(__file__)], env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    assert read_checkpoint_info(path).backend == other
    x, y = data()
    model = built(make_model(), x)
    with pytest.warns(UserWarning, match=f"written on the {other} backend and is restored on "
                      f"{keras.backend.backend()}: the run goes on from the same weights, but not bit-identically"):
        kfit.load_checkpoint(path, model)
    expected = np.load(saved)
    got = state(model)
    assert all(np.array_equal(expected[f"arr_{i}"], value) for i, value in enumerate(got)) and len(expected) == len(got)
    callback = kfit.callbacks.Checkpoint(path, frequency=70)
    with pytest.warns(UserWarning, match=f"written on the {other} backend"):
        history = kfit.fit(make_model(), x, y, epochs=5, callbacks=[callback], **FIT)
    assert callback.restored_from.samples == 152 and history.epoch == [0, 1, 2, 3, 4]
    assert list_checkpoints(path)[0][0] == 300


def test_a_checkpoint_of_another_dtype_policy_is_refused_naming_the_policy(tmp_path):
    """A float32 run's checkpoint loaded into the model built under mixed_float16 (whose optimizer Keras wraps in a
    LossScaleOptimizer): the error named only two optimizer classes, not the policy the user changed."""
    _, path = saved_model(tmp_path)
    x, _ = data()
    keras.config.set_dtype_policy("mixed_float16")
    try:
        model = built(make_model(), x)
    finally:
        keras.config.set_dtype_policy("float32")
    with pytest.raises(CheckpointMismatchError, match="saved with a MomentumSGD optimizer, and this model's optimizer "
                       "is a LossScaleOptimizer.*under the dtype policy.*this model's policy is 'mixed_float16'"):
        kfit.load_checkpoint(path, model)



@pytest.mark.parametrize("name", [None, "opt"])
def test_a_loss_scale_optimizer_wrapping_another_optimizer_is_refused_naming_both(tmp_path, name):
    """A run of LossScaleOptimizer(Adam) resumed as LossScaleOptimizer(AdamW): only the outer classes were compared, so
    with the same optimizer name (the same variable paths) the resume went on silently with AdamW (its weight_decay not
    named either: the options of inner optimizers of two classes are not compared); with Keras's names it was refused
    naming two variables. Refused naming both inner optimizers, as Adam -> AdamW without the wrapper is."""
    x, y = data()
    path = tmp_path / "run.ckpt"

    def fit(inner):
        model = make_model(dropout=False)
        model.compile(optimizer=keras.optimizers.LossScaleOptimizer(inner(0.01, name=name)), loss="mse")
        kfit.fit(model, x, y, epochs=1, callbacks=[kfit.callbacks.Checkpoint(path, async_write=False)], **FIT)

    fit(keras.optimizers.Adam)
    with pytest.raises(CheckpointMismatchError, match="saved with a LossScaleOptimizer wrapping an Adam optimizer, and "
                       "this model's LossScaleOptimizer wraps an AdamW. Compile the model with the optimizer it was "
                       "trained with"):
        fit(keras.optimizers.AdamW)


@pytest.mark.parametrize("saved, resumed, option, has", [
    (dict(gradient_accumulation_steps=2), {}, "gradient_accumulation_steps", "the checkpoint's"),
    ({}, dict(use_ema=True), "use_ema", "this model's"),
    (dict(amsgrad=True), {}, "amsgrad", "the checkpoint's"),
])
def test_a_run_resumed_with_other_optimizer_options_is_refused_naming_the_option(saved, resumed, option, has, tmp_path):
    """An option that adds optimizer variables (Keras's gradient accumulators, moving averages, AMSGrad's maxima),
    given in one run and not in the other: the refusal named only the two variables met in one place."""
    x, y = data()
    path = tmp_path / "run.ckpt"

    def fit(options):
        model = make_model(dropout=False)
        model.compile(optimizer=keras.optimizers.Adam(0.01, **options), loss="mse")
        kfit.fit(model, x, y, epochs=1, callbacks=[kfit.callbacks.Checkpoint(path, async_write=False)], **FIT)

    fit(saved)
    with pytest.raises(CheckpointMismatchError, match=rf"optimizer option `{option}`: {has} optimizer has it.*compile "
                                                      "with the optimizer options of the run that saved it"):
        fit(resumed)


@pytest.mark.parametrize("loss_scaled", [False, True])
def test_a_run_resumed_with_other_optimizer_options_that_add_no_variable_says_which(tmp_path, loss_scaled):
    """Options whose change adds no optimizer variable (gradient_accumulation_steps 2 -> 3, clipnorm, Keras SGD's
    momentum and nesterov; a LossScaleOptimizer's inner optimizer's too): the resume went on without a word, as if
    it were the same run. It still goes on (following the code), with one note naming each changed option and both
    its values; an unchanged resume says nothing of them."""
    x, y = data()
    path = tmp_path / "run.ckpt"

    def fit(epochs, **options):
        model = make_model(dropout=False)
        optimizer = keras.optimizers.SGD(0.01, **options)
        model.compile(optimizer=keras.optimizers.LossScaleOptimizer(optimizer) if loss_scaled else optimizer, loss="mse")
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            kfit.fit(model, x, y, epochs=epochs, callbacks=[kfit.callbacks.Checkpoint(path, async_write=False)], **FIT)
        return [str(w.message) for w in caught if "optimizer's" in str(w.message)]

    saved = dict(gradient_accumulation_steps=2, clipnorm=1.0, momentum=0.9, nesterov=False)
    assert fit(1, **saved) == []
    assert fit(2, **saved) == []
    said = fit(3, gradient_accumulation_steps=3, momentum=0.9, nesterov=True)
    assert len(said) == 1, said
    assert (f"The run that wrote the checkpoint {str(path)!r} used the optimizer's clipnorm=1.0, "
            "gradient_accumulation_steps=2, nesterov=False; this code uses clipnorm=None, gradient_accumulation_steps=3, "
            "nesterov=True: the resumed run follows the code.") in said[0], said
    assert read_checkpoint_info(path).samples == 180  # (it went on to the end)

    def older(meta):  # a file of an older kfit records no options: nothing to compare, and it loads
        for level in (meta["optimizer"], meta["optimizer"].get("inner", {})):
            level.pop("options", None)
    edit_meta(path, older)
    assert fit(4, **saved) == []


def test_loading_a_runs_checkpoint_into_a_model_outside_a_run_says_nothing_of_its_callbacks(tmp_path):
    """``kfit.load_checkpoint(path, model)`` of a kfit.fit run's file, the way to get the trained model back: it warned
    that the file 'holds the state of callbacks [...], which this run does not have' (there is no run; kfit's own
    epoch summaries, and any callback of the run, are not asked for). Inside a run the note stays."""
    x, y = data()
    path = tmp_path / "run.ckpt"
    model = make_model()
    kfit.fit(model, x, y, epochs=2, callbacks=[kfit.callbacks.Checkpoint(path, async_write=False),
                                                kfit.callbacks.EarlyStopping("loss", patience=5)], **FIT)
    fresh = built(make_model(), x)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        kfit.load_checkpoint(path, fresh)
    for a, b in zip(model.weights, fresh.weights):
        np.testing.assert_array_equal(keras.ops.convert_to_numpy(a), keras.ops.convert_to_numpy(b))
    with pytest.warns(UserWarning, match=r"holds the state of callbacks \['early_stopping'\], which this run does not"):
        kfit.fit(make_model(), x, y, epochs=3, callbacks=[kfit.callbacks.Checkpoint(path, async_write=False)], **FIT)

def test_missing_file(tmp_path):
    x, y = data()
    model = built(make_model(), x)
    with pytest.raises(CheckpointNotFoundError, match="does not exist") as error:
        kfit.load_checkpoint(tmp_path / "nothing.ckpt", model)
    assert isinstance(error.value, FileNotFoundError)
    callback = kfit.callbacks.Checkpoint(tmp_path / "nothing.ckpt")  # restore=True starts afresh
    kfit.fit(model, x, y, epochs=1, callbacks=[callback], **FIT)
    assert callback.restored_from is None and os.path.isfile(tmp_path / "nothing.ckpt")


def test_every_checkpoint_damaged_is_an_error(tmp_path):
    _, path = saved_model(tmp_path)
    with open(path, "r+b") as f:
        f.truncate(100)
    x, y = data()
    with pytest.raises(CheckpointError, match="None of the checkpoints.*truncated or damaged"):
        kfit.fit(make_model(), x, y, epochs=1, callbacks=[kfit.callbacks.Checkpoint(path)], **FIT)


def test_files_that_are_not_kfit_checkpoints(tmp_path):
    plain = tmp_path / "plain.h5"
    with h5py.File(plain, "w") as f:
        f["x"] = np.arange(3)
    with pytest.raises(CheckpointCorruptError, match="not a kfit checkpoint"):
        read_checkpoint_info(plain)
    _, path = saved_model(tmp_path)
    edit(path, lambda f: f.attrs.modify("format_version", _format.FORMAT_VERSION + 1))
    with pytest.raises(CheckpointError, match="Upgrade kfit"):
        read_checkpoint_info(path)
    # A newer header (sealed as kfit would seal it) is refused the same way.
    _, path = saved_model(tmp_path)
    seal(path, open(path, "rb").read()[_format.HEADER_SIZE:], version=_format.FORMAT_VERSION + 1)
    with pytest.raises(CheckpointError, match="format version 3.*Upgrade kfit"):
        read_checkpoint_info(path)
    # A dataset of Python objects is refused, never unpickled.
    _, path = saved_model(tmp_path)

    def pickle_like(f):
        meta = json.loads(f.attrs["meta"])
        del f["model/0"]
        f.create_dataset("model/0", data=np.array([b"cos\nsystem\n"], dtype=object), dtype=h5py.string_dtype())
        meta["arrays"][0]["shape"] = [1]
        f.attrs["meta"] = json.dumps(meta, sort_keys=True, separators=(",", ":"))

    edit(path, pickle_like)
    with pytest.raises(CheckpointCorruptError, match="non-numeric"):
        _format.read_file(path)
    # An array that declares 4 TB (more bytes than the file holds) is refused before it is read.
    _, path = saved_model(tmp_path)
    edit_meta(path, lambda meta: None)  # sealed again, unchanged: still loads
    _format.read_file(path)

    def huge(f):
        meta = json.loads(f.attrs["meta"])
        del f["model/0"]
        f.create_dataset("model/0", shape=(10**12,), dtype="float32")  # no data written: HDF5 allocates late
        meta["arrays"][0]["shape"] = [10**12]
        f.attrs["meta"] = json.dumps(meta, sort_keys=True, separators=(",", ":"))

    edit(path, huge)
    assert read_checkpoint_info(path).variables[0].shape == (10**12,)  # metadata only: no array is read
    with pytest.raises(CheckpointCorruptError, match=r"declares 4000000000000 bytes \(shape \(1000000000000,\)\)"):
        _format.read_file(path)


def _unprivileged(function):
    """Runs ``function`` without root's power to write anywhere: in-process for a normal user, else in a
    forked child that drops to the 'nobody' user. Returns (exception type name, message) or None."""
    if os.geteuid() != 0:
        try:
            function()
        except Exception as error:
            return type(error).__name__, str(error)
        return None
    read, write = os.pipe()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # JAX warns about fork in a threaded process; the child only writes a file
        pid = os.fork()
    if pid == 0:  # the child: no backend calls, only NumPy, h5py and the file system
        code = 0
        try:
            os.setgid(65534)
            os.setuid(65534)
            function()
        except Exception as error:
            os.write(write, json.dumps([type(error).__name__, str(error)]).encode())
            code = 3
        finally:
            os._exit(code)
    os.close(write)
    with os.fdopen(read) as f:
        reported = f.read()
    os.waitpid(pid, 0)
    return tuple(json.loads(reported)) if reported else None


def test_read_only_directory_refuses_and_leaves_the_previous_checkpoint(tmp_path):
    x, _ = data()
    model = built(make_model(), x)
    arrays, meta = kfit.checkpoint._state.collect(kfit.checkpoint._state.training_parts(model))
    base = tempfile.mkdtemp()  # under /tmp: every directory above is open to the unprivileged user
    try:
        directory = os.path.join(base, "ro")
        os.mkdir(directory)
        target = os.path.join(directory, "c.ckpt")
        _format.write_checkpoint(target, arrays, meta, 10)
        before = open(target, "rb").read()
        os.chmod(base, 0o755)
        os.chmod(directory, 0o555)
        failure = _unprivileged(lambda: _format.write_checkpoint(target, arrays, meta, 20))
        assert failure is not None and failure[0] == "CheckpointWriteError", failure
        assert f"Cannot write the checkpoint {target!r}" in failure[1] and "Permission denied" in failure[1]
        assert open(target, "rb").read() == before
        assert os.listdir(directory) == ["c.ckpt"]
    finally:
        os.chmod(base, 0o700)
        if os.path.isdir(os.path.join(base, "ro")):
            os.chmod(os.path.join(base, "ro"), 0o755)
        shutil.rmtree(base)


def test_a_path_inside_a_file_fails_before_training(tmp_path):
    blocker = tmp_path / "not_a_directory"
    blocker.write_text("")
    x, y = data()
    model = make_model()
    with pytest.raises(CheckpointError, match="cannot be created"):
        kfit.save_checkpoint(blocker / "c.ckpt", built(make_model(), x))
    with pytest.raises(CheckpointError, match=r"not_a_directory/c.ckpt"):
        kfit.fit(model, x, y, epochs=1, callbacks=[kfit.callbacks.Checkpoint(blocker / "c.ckpt")], **FIT)
    assert int(keras.ops.convert_to_numpy(model.optimizer.iterations)) == 0


# -- files kept ----------------------------------------------------------------------------------------
def test_preserve_all_keeps_every_checkpoint_named_by_samples(tmp_path):
    x, y = data()
    path = tmp_path / "run.ckpt"
    kfit.fit(make_model(), x, y, epochs=3, callbacks=[kfit.callbacks.Checkpoint(path, frequency=50, preserve_all=True)], **FIT)
    # Sizes 8, 8, 8, then 16 (cut at epoch ends): 50, 100 and 150 are crossed at 56, 108 (mid-epoch) and 152;
    # the final checkpoint is at 180 (an epoch end).
    listing = list_checkpoints(path)
    assert listing[0] == (180, str(path))
    assert [s for s, _ in listing[1:]] == [180, 152, 108, 56]
    assert sorted(os.listdir(tmp_path)) == sorted(["run.ckpt", "run.ckpt.56", "run.ckpt.108", "run.ckpt.152", "run.ckpt.180"])
    for samples, file in listing:
        assert read_checkpoint_info(file).samples == samples


def test_keep_prunes_to_the_newest(tmp_path):
    x, y = data()
    path = tmp_path / "run.ckpt"
    kfit.fit(make_model(), x, y, epochs=3, callbacks=[kfit.callbacks.Checkpoint(path, frequency=50, keep=2)], **FIT)
    assert sorted(os.listdir(tmp_path)) == ["run.ckpt", "run.ckpt.152", "run.ckpt.180"]
    kfit.fit(make_model(), x, y, epochs=3, callbacks=[kfit.callbacks.Checkpoint(path, epochs=1, restore=False)], **FIT)
    assert os.listdir(tmp_path) == ["run.ckpt"]  # keep=1: only the newest, no numbered files


@pytest.mark.parametrize("history", [dict(keep=2), dict(preserve_all=True)])
def test_a_run_started_over_replaces_the_numbered_checkpoints_an_earlier_run_left(tmp_path, history):
    """An earlier, longer run left run.ckpt.152 and .180; a run started over with restore=False saved at 56 and
    108. Its own numbered files were pruned as the oldest, and the next restore resumed the earlier run at 180."""
    x, y = data()
    path = tmp_path / "run.ckpt"
    kfit.fit(make_model(), x, y, epochs=3, callbacks=[kfit.callbacks.Checkpoint(path, frequency=50, **history)], **FIT)
    kfit.fit(make_model(), x, y, epochs=5, max_samples=108,
             callbacks=[kfit.callbacks.Checkpoint(path, frequency=50, restore=False, **history)], **FIT)
    assert sorted(os.listdir(tmp_path)) == ["run.ckpt", "run.ckpt.108", "run.ckpt.56"]
    assert list_checkpoints(path)[0] == (108, str(path))
    callback = kfit.callbacks.Checkpoint(path, frequency=50, **history)
    kfit.fit(make_model(), x, y, epochs=5, max_samples=120, callbacks=[callback], **FIT)
    assert callback.restored_from.samples == 108  # the run that was started over goes on, not the earlier one


def test_save_checkpoint_over_the_numbered_files_of_an_earlier_longer_run_keeps_its_own(tmp_path):
    """kfit.save_checkpoint(keep=3) of a custom loop started over where an earlier run left path.100/.200/.300:
    its own numbered files were pruned as the oldest, and a restore took the earlier run's 300 for the newest."""
    x, y = data()
    path = tmp_path / "run.ckpt"
    model = built(make_model(), x)
    model.evaluate(x[:8], y[:8], verbose=0)  # (its metrics built, as after training)
    for samples in (100, 200, 300, 50, 100):  # the earlier run, then the new one
        kfit.save_checkpoint(path, model, clock=kfit.Clock(samples=samples, minibatches=samples // 10), keep=3)
    assert sorted(os.listdir(tmp_path)) == ["run.ckpt", "run.ckpt.100", "run.ckpt.50"]
    assert [samples for samples, _ in list_checkpoints(path)] == [100, 100, 50]
    callback = kfit.callbacks.Checkpoint(path, frequency=1000)
    kfit.fit(make_model(), x, y, epochs=2, callbacks=[callback], **FIT)
    assert callback.restored_from.samples == 100


def test_a_path_that_is_a_symbolic_link_writes_its_target_and_keeps_the_link(tmp_path, capsys):
    """run.ckpt -> data/run.ckpt (say, a run folder linked to a larger disk): each write replaced the link by a
    regular file, with the lock and numbered files beside the link. The target is written, the link stays, and
    restores, list_checkpoints and `kfit inspect` through the link find the target's files."""
    x, y = data()
    (tmp_path / "data").mkdir()
    link = tmp_path / "run.ckpt"
    os.symlink(tmp_path / "data" / "run.ckpt", link)  # (no file there yet)
    model = make_model()
    kfit.fit(model, x, y, epochs=2, callbacks=[kfit.callbacks.Checkpoint(link, frequency=50, keep=2)], **FIT)
    kfit.save_checkpoint(link, model, clock=kfit.Clock(samples=130, minibatches=14), keep=3)
    assert os.path.islink(link) and sorted(os.listdir(tmp_path)) == ["data", "run.ckpt"]
    assert sorted(os.listdir(tmp_path / "data")) == ["run.ckpt", "run.ckpt.108", "run.ckpt.120", "run.ckpt.130"]
    assert list_checkpoints(link) == [(130, str(link)), (130, str(tmp_path / "data" / "run.ckpt.130")),
                                      (120, str(tmp_path / "data" / "run.ckpt.120")),
                                      (108, str(tmp_path / "data" / "run.ckpt.108"))]
    callback = kfit.callbacks.Checkpoint(link, frequency=50)
    kfit.fit(make_model(), x, y, epochs=3, callbacks=[callback], **FIT)
    assert callback.restored_from.samples == 130 and os.path.islink(link)
    capsys.readouterr()
    assert cli(["inspect", str(link)]) == 0 and "samples:         180" in capsys.readouterr().out
    os.symlink(tmp_path / "data", tmp_path / "folder.ckpt")  # a link to a folder: refused naming the path given
    with pytest.raises(ValueError, match="folder.ckpt' is a directory"):
        kfit.callbacks.Checkpoint(tmp_path / "folder.ckpt")


# -- plain model.fit -----------------------------------------------------------------------------------
def test_plain_model_fit_saves_and_restores_what_it_can(tmp_path):
    x, y = data(96)
    path = tmp_path / "run.ckpt"
    model = make_model()
    model.fit(x, y, batch_size=16, epochs=2, verbose=0,
              callbacks=[kfit.callbacks.SampleClock(batch_size=16, num_samples=96), kfit.callbacks.Checkpoint(path, frequency=40)])
    info = read_checkpoint_info(path)
    assert info.samples == 192 and info.epoch == 2 and not info.kfit_fit
    assert info.last_metrics.keys() == {"loss", "mae"}

    resumed = make_model()
    callback = kfit.callbacks.Checkpoint(path, frequency=40)
    clock = kfit.callbacks.SampleClock(batch_size=16, num_samples=96)
    with pytest.warns(UserWarning, match="Train with kfit.fit"):
        history = resumed.fit(x, y, batch_size=16, epochs=4, verbose=0, callbacks=[clock, callback])
    assert callback.restored_from.samples == 192
    assert history.epoch == [0, 1, 2, 3]  # went on from the saved epoch; the history holds all four
    assert len(history.history["loss"]) == 4
    assert kfit.get_clock(resumed).samples == 4 * 96
    assert getattr(resumed, "_initial_epoch", None) is None  # not left for the next fit


class StepCounter(kfit.callbacks.KfitCallback):
    """A user's callback in Keras's usual style: it starts afresh in on_train_begin, and has a state."""

    default_name = "step_counter"

    def on_train_begin(self, logs=None):
        self.steps = 0

    def on_step_end(self, clock, logs):
        self.steps += 1

    def get_state(self):
        return {"steps": self.steps}

    def set_state(self, state):
        self.steps = state["steps"]


@pytest.mark.parametrize("checkpoint_first", [True, False])
def test_plain_model_fit_restores_after_every_kfit_callback_has_begun(tmp_path, checkpoint_first):
    """The restore is a step taken once every kfit callback has begun, wherever the Checkpoint stands in
    model.fit's list: a callback that starts afresh in its on_train_begin keeps the state restored into it."""
    x, y = data(96)
    path = tmp_path / "run.ckpt"

    def run(epochs):
        checkpoint, counter = kfit.callbacks.Checkpoint(path, epochs=1), StepCounter()
        others = [kfit.callbacks.SampleClock(batch_size=16, num_samples=96), counter]
        callbacks = [checkpoint, *others] if checkpoint_first else [*others, checkpoint]
        make_model().fit(x, y, batch_size=16, epochs=epochs, verbose=0, callbacks=callbacks)
        return checkpoint, counter

    assert run(1)[1].steps == 6
    with pytest.warns(UserWarning, match="Train with kfit.fit"):
        checkpoint, counter = run(2)
    assert checkpoint.restored_from.samples == 96
    assert counter.steps == 12  # 6 restored, 6 trained


def test_plain_model_fit_mid_epoch_restarts_the_epoch(tmp_path):
    x, y = data(96)
    model = built(make_model(), x)
    path = tmp_path / "run.ckpt"
    clock = kfit.Clock(samples=128, minibatches=8, epoch_size=96, minibatch_size=16)
    kfit.save_checkpoint(path, model, clock=clock)
    resumed = make_model()
    callback = kfit.callbacks.Checkpoint(path, epochs=1)
    with pytest.warns(UserWarning, match="from the start of epoch 2 "):
        history = resumed.fit(x, y, batch_size=16, epochs=2, verbose=0,
                              callbacks=[kfit.callbacks.SampleClock(batch_size=16, num_samples=96), callback])
    assert history.epoch == [1]
    assert kfit.get_clock(resumed).samples == 192 and kfit.get_clock(resumed).minibatches == 12


def test_plain_model_fit_without_a_clock_saves_per_epoch(tmp_path):
    x, y = data(96)
    path = tmp_path / "run.ckpt"
    model = make_model()
    model.fit(x, y, batch_size=32, epochs=2, verbose=0, callbacks=[kfit.callbacks.Checkpoint(path, keep=3)])
    assert [s for s, _ in list_checkpoints(path)] == [None, 2, 1]  # numbered by epochs without a clock
    with pytest.raises(RuntimeError, match="SampleClock"):
        model.fit(x, y, batch_size=32, epochs=1, verbose=0, callbacks=[kfit.callbacks.Checkpoint(path, frequency=10)])


# -- arguments and callbacks ------------------------------------------------------------------------------
@pytest.mark.parametrize("kwargs, match", [
    (dict(path=3), "`path`"),
    (dict(path="x", frequency=0), "`frequency`"),
    (dict(path="x", frequency=1.5), "`frequency`"),
    (dict(path="x", epochs=-1), "`epochs`"),
    (dict(path="x", frequency=10, epochs=1), "not both"),
    (dict(path="x", keep=0), "`keep`"),
    (dict(path="x", preserve_all="yes"), "`preserve_all`"),
    (dict(path="x", restore=1), "`restore`"),
    (dict(path="x", async_write=None), "`async_write`"),
    # CNTK's CheckpointConfig(filename, frequency, restore, preserve_all) order, positional: named as such.
    (dict(path="x", frequency=1000, epochs=False), r"epochs=False.*CNTK's `restore`.*restore=\.\.\. and preserve_all"),
])
def test_invalid_arguments(kwargs, match):
    with pytest.raises(ValueError, match=match):
        kfit.callbacks.Checkpoint(**kwargs)


def test_cntks_filename_keyword_names_the_file(tmp_path):
    """CNTK's CheckpointConfig(filename=checkpoint, frequency=checkpoint_frequency), as the CNTK manual writes it."""
    x, y = data()
    path = tmp_path / "training_session.tmp"
    checkpoint = kfit.callbacks.Checkpoint(filename=path, frequency=60)
    kfit.fit(make_model(), x, y, epochs=1, callbacks=[checkpoint], **FIT)
    assert checkpoint.path == str(path) and kfit.checkpoint.read_checkpoint_info(path).samples == 60
    with pytest.raises(TypeError, match=r"Checkpoint needs its file once.*path=.*filename="):
        kfit.callbacks.Checkpoint(tmp_path / "a", filename=tmp_path / "b")
    with pytest.raises(TypeError, match=r"give path=\.\.\..*Received: neither"):
        kfit.callbacks.Checkpoint()


def test_directory_path_is_refused(tmp_path):
    with pytest.raises(ValueError, match="is a directory"):
        kfit.callbacks.Checkpoint(tmp_path)


def test_two_callbacks_with_one_key_are_refused(tmp_path):
    x, y = data()
    lr = [kfit.callbacks.LearningRateSchedule(0.01), kfit.callbacks.LearningRateSchedule(0.02)]
    with pytest.raises(ValueError, match="same key 'learning_rate_schedule'.*name="):
        kfit.fit(make_model(), x, y, epochs=1, callbacks=lr + [kfit.callbacks.Checkpoint(tmp_path / "c")], **FIT)


# -- the command line ------------------------------------------------------------------------------------
def test_cli_inspect(tmp_path, capsys):
    x, y = data()
    path = tmp_path / "run.ckpt"
    kfit.fit(make_model(), x, y, epochs=2, callbacks=[kfit.callbacks.Checkpoint(path, frequency=50)], **FIT)
    assert cli(["inspect", str(path)]) == 0
    text = capsys.readouterr().out
    for expected in ("checksum:        ok", "samples:         120", "epoch:           2",
                     "learning rate:   0.01 (the last step's)", "momentum:        0.9 (the last step's)",
                     "minibatch size:  12 (the last step's)",  # (epochs of 60 in minibatches of 16: the last has 12)
                     "last metrics:    loss = ", "format version:  2",
                     "sequential", "(4, 8)"):
        assert expected in text, (expected, text)
    assert cli(["inspect", str(path), "--json"]) == 0
    info = json.loads(capsys.readouterr().out)
    assert info["samples"] == 120 and info["checksum_ok"] is True and info["format_version"] == 2
    assert info["variables"][0]["shape"] == [4, 8] and info["variables"][5]["group"] == "optimizer"

    flip_byte(path, os.path.getsize(path) // 2)
    assert cli(["inspect", str(path)]) == 1
    assert "is damaged: the checksum of the file" in capsys.readouterr().err
    assert cli(["inspect", str(tmp_path / "missing")]) == 1
    assert "does not exist" in capsys.readouterr().err


def test_background_writes_finish_and_report_their_errors():
    import time

    from kfit.callbacks._checkpoint import _BackgroundWriter

    writer, done = _BackgroundWriter(), []
    writer.submit(lambda: (time.sleep(0.05), done.append(1)))
    assert not writer._thread.daemon  # the interpreter waits for it at exit (and atexit joins it too)
    writer.submit(lambda: done.append(2))  # waits for the first write before starting the next
    writer.wait()
    assert done == [1, 2]

    def fail():
        raise CheckpointError("disk full")

    writer.submit(fail)
    with pytest.raises(CheckpointError, match="disk full"):
        writer.wait()
    writer.wait()  # reported once
