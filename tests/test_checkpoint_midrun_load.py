"""kfit.load_checkpoint in the middle of a run (from a callback at an epoch end) trains on as a resume of the same
checkpoint does: what the run sets before its steps (the optimizer's minibatch size, a schedule's value) is set again
from the restored state, not left as the checkpoint holds it."""

from __future__ import annotations

import os
import re
import shutil
import warnings

import keras
import numpy as np
import pytest

import kfit


def make_model():
    keras.utils.set_random_seed(1)
    model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(8, activation="tanh"), keras.layers.Dense(1)])
    model.compile(optimizer=kfit.optimizers.MomentumSGD(learning_rate=0.05, momentum=0.9), loss="mse")
    return model


def data():
    rng = np.random.default_rng(0)
    return rng.normal(size=(100, 4)).astype("float32"), rng.normal(size=(100, 1)).astype("float32")


class LoadAtEpochEnd(keras.callbacks.Callback):
    def __init__(self, path, epoch):
        super().__init__()
        self.path, self.epoch = path, epoch

    def on_epoch_end(self, epoch, logs=None):
        if epoch == self.epoch:
            kfit.load_checkpoint(self.path, self.model)


def train(loop, model, epochs, callbacks):
    x, y = data()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # (the restore notes: checked elsewhere)
        if loop == "kfit.fit":
            sizes = kfit.schedules.minibatch_size([16, 20], epoch_size=100)  # epoch 1: 16 x 6 + 4; epoch 2: 20 x 5
            return kfit.fit(model, x, y, minibatch_size=sizes, epoch_size=100, epochs=epochs, shuffle=False, seed=5,
                            verbose=0, callbacks=callbacks)
        else:
            return model.fit(x, y, batch_size=16, epochs=epochs, shuffle=False, verbose=0,
                             callbacks=[kfit.callbacks.SampleClock(batch_size=16, num_samples=100), *callbacks])


def assert_same_weights(a, b):
    assert kfit.get_clock(a).samples == kfit.get_clock(b).samples
    for va, vb in zip(a.variables, b.variables, strict=True):
        np.testing.assert_allclose(keras.ops.convert_to_numpy(va.value), keras.ops.convert_to_numpy(vb.value),
                                   rtol=1e-6, atol=1e-7, err_msg=va.path)


def test_the_minibatch_size_is_set_again_after_a_load_in_the_middle_of_kfit_fit(tmp_path):
    """The checkpoint of sample 100 holds minibatch_size=4 (the epoch's last step); loaded at the end of the second
    epoch, whose steps were of 20, as the restored epoch's are: the clock's driver, which sets the size only when it
    changes, left 4 for the whole epoch (with momentum, other weights than the resume's)."""
    path = str(tmp_path / "c.ckpt")
    train("kfit.fit", make_model(), 2, [kfit.callbacks.Checkpoint(path, preserve_all=True, async_write=False)])
    first = path + ".100"
    loaded = make_model()
    train("kfit.fit", loaded, 3, [LoadAtEpochEnd(first, epoch=1)])  # trains samples 0-200, then 100-200 again
    shutil.copy(first, tmp_path / "r.ckpt")
    resumed = make_model()
    train("kfit.fit", resumed, 2, [kfit.callbacks.Checkpoint(str(tmp_path / "r.ckpt"), frequency="100ep")])
    assert kfit.get_clock(loaded).samples == 200
    assert_same_weights(loaded, resumed)


@pytest.mark.parametrize("loop", ["kfit.fit", "model.fit"])
def test_a_scheduled_value_is_set_again_after_a_load_in_the_middle_of_a_run(tmp_path, loop):
    """A checkpoint written without a LearningRateSchedule (learning_rate=0.05), loaded at an epoch end of a run with
    one (per sample 0.002: 0.032 for 16 samples): the schedule starts afresh, as in a resume, but it had set its value
    for the coming steps already and skipped them, leaving 0.05 until the value changed."""
    path = str(tmp_path / "c.ckpt")
    train(loop, make_model(), 1, [kfit.callbacks.Checkpoint(path, async_write=False)])

    def schedule():
        return kfit.callbacks.LearningRateSchedule(kfit.schedules.learning_rate_per_sample(0.002))

    loaded = make_model()
    train(loop, loaded, 2, [schedule(), LoadAtEpochEnd(path, epoch=0)])  # trains samples 0-100, then 100-200
    shutil.copy(path, tmp_path / "r.ckpt")
    resumed = make_model()
    train(loop, resumed, 2, [schedule(), kfit.callbacks.Checkpoint(str(tmp_path / "r.ckpt"), frequency="100ep")])
    assert kfit.get_clock(loaded).samples == 200
    assert_same_weights(loaded, resumed)
    assert os.path.exists(path)


@pytest.mark.parametrize("loop", ["kfit.fit", "model.fit"])
def test_the_progress_printer_numbers_and_counts_epochs_across_a_load_as_a_resume_does(tmp_path, loop):
    """The checkpoint of sample 100 (the end of epoch 1) loaded at the end of the second epoch, by a callback before
    the printer: the second epoch's line counted the samples from the restored clock (0, at 0 samples/s), and the
    epoch trained after the load was numbered 3 (the run's third), where a resume of the file prints epoch 2."""
    path = str(tmp_path / "c.ckpt")

    def printed(name, model, epochs, callbacks):
        log = tmp_path / f"{name}.log"
        train(loop, model, epochs, [*callbacks, kfit.callbacks.ProgressPrinter(freq=2, log_to_file=log)])
        lines = [line for line in log.read_text().splitlines() if line.startswith(("Finished Epoch", "Minibatch["))]
        assert all(float(re.search(r"\(\s*(\S+) samples/s", line)[1]) > 0 for line in lines if "Epoch" in line), lines
        return [re.sub(r" \d+\.\d{3}s \(.*\);$", "", line) for line in lines]  # without the timing

    whole = printed("whole", make_model(), 2, [kfit.callbacks.Checkpoint(path, preserve_all=True, async_write=False)])
    loaded = printed("loaded", make_model(), 3, [LoadAtEpochEnd(path + ".100", epoch=1)])
    shutil.copy(path + ".100", tmp_path / "r.ckpt")
    resumed = printed("resumed", make_model(), 2, [kfit.callbacks.Checkpoint(str(tmp_path / "r.ckpt"), frequency="100ep")])
    ends = [i for i, line in enumerate(whole) if line.startswith("Finished")]
    assert [whole[i].split(":")[0] for i in ends] == ["Finished Epoch[1]", "Finished Epoch[2]"]
    assert resumed == whole[ends[0] + 1:]  # the minibatch and epoch lines of the second epoch
    assert loaded == whole + resumed


@pytest.mark.parametrize("loop", ["kfit.fit", "model.fit"])
def test_the_rate_reduce_lr_on_plateau_sets_is_printed_again_after_a_load_in_the_middle_of_a_run(tmp_path, loop):
    """Without a LearningRateSchedule, ReduceLROnPlateau sets the optimizer's rate and cuts it at every epoch end but
    the first. The checkpoint of sample 100 (learning_rate=0.05), loaded at the end of the second epoch after its cut to
    0.025, trained the third epoch at 0.05 while the log's last rate line said 0.025, and that epoch's own cut to
    0.025 printed nothing (the printer repeats only a change)."""
    path = str(tmp_path / "c.ckpt")
    train(loop, make_model(), 1, [kfit.callbacks.Checkpoint(path, async_write=False)])
    log = tmp_path / "progress.log"
    reduce = kfit.callbacks.ReduceLROnPlateau("loss", factor=0.5, patience=0, min_delta=100.0)
    train(loop, make_model(), 3, [reduce, LoadAtEpochEnd(path, epoch=1), kfit.callbacks.ProgressPrinter(log_to_file=log)])
    lines = [line for line in log.read_text().splitlines() if not line.startswith("Minibatch size")]
    shown = [line.split(":")[0] if line.startswith("Finished") else f"lr {float(line.split(': ')[1]):.6g}"
             for line in lines]
    assert shown == ["lr 0.05", "Finished Epoch[1]", "lr 0.025", "lr 0.05", "Finished Epoch[2]", "lr 0.025",
                     "Finished Epoch[2]"], lines


def test_a_load_listed_before_the_sample_clock_leaves_the_last_step_with_the_clock_it_ran_on(tmp_path):
    """Under plain model.fit the clock counts a step at the next kfit hook: a load at an epoch end by a callback
    listed before every kfit callback found the epoch's last step not counted yet, and it was counted on the restored
    clock (216 samples after the third epoch, where a resume of the file ends at 200)."""
    path = str(tmp_path / "c.ckpt")
    train("model.fit", make_model(), 1, [kfit.callbacks.Checkpoint(path, async_write=False)])
    x, y = data()
    loaded = make_model()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        loaded.fit(x, y, batch_size=16, epochs=2, shuffle=False, verbose=0,
                   callbacks=[LoadAtEpochEnd(path, epoch=0), kfit.callbacks.SampleClock(batch_size=16, num_samples=100)])
    shutil.copy(path, tmp_path / "r.ckpt")
    resumed = make_model()
    train("model.fit", resumed, 2, [kfit.callbacks.Checkpoint(str(tmp_path / "r.ckpt"), frequency="100ep")])
    assert kfit.get_clock(loaded).samples == 200
    assert_same_weights(loaded, resumed)


@pytest.mark.parametrize("loop", ["kfit.fit", "model.fit"])
def test_a_load_inside_an_epoch_is_refused_naming_what_works_and_changes_nothing(tmp_path, loop):
    """kfit.fit plans an epoch's minibatches as it begins: a checkpoint loaded from a batch hook left the plan and the
    clock apart, and the next step failed with "This is a bug in kfit". Plain model.fit goes on with the epoch's next
    minibatches from its own place in the data, which kfit cannot move: the checkpoint of sample 100 loaded after the
    second step of the second epoch left the clock at 180 where model.fit ended that epoch (a resume of the file ends
    it at 200), and every later epoch out of line. The load is refused before it changes anything, naming the epoch
    end and a resume."""
    path = str(tmp_path / "c.ckpt")
    train(loop, make_model(), 1, [kfit.callbacks.Checkpoint(path, async_write=False)])

    class LoadAtBatchEnd(keras.callbacks.Callback):
        def on_train_batch_end(self, batch, logs=None):
            if batch == 1:
                self.weights = [np.array(keras.ops.convert_to_numpy(v.value)) for v in self.model.variables]
                self.samples = kfit.get_clock(self.model).samples
                kfit.load_checkpoint(path, self.model)

    model, load = make_model(), LoadAtBatchEnd()
    with pytest.raises(RuntimeError, match=rf"inside an epoch of {re.escape(loop)} \(at sample 32\).*on_epoch_end.*"
                                           r"Checkpoint\(path, restore=True\).*Nothing was restored"):
        train(loop, model, 2, [load])
    assert load.samples == 32
    for before, variable in zip(load.weights, model.variables, strict=True):
        np.testing.assert_array_equal(before, keras.ops.convert_to_numpy(variable.value), err_msg=variable.path)


@pytest.mark.parametrize("loop", ["kfit.fit", "model.fit"])
def test_a_load_in_the_middle_of_a_run_says_nothing_of_a_minibatch_size_in_code_that_the_clock_sets(tmp_path, loop):
    """Code that compiles MomentumSGD(minibatch_size=32) loads, at an epoch end, a checkpoint written with the default
    1: the load said "This code sets the optimizer's minibatch_size=32; the run that wrote the checkpoint set
    minibatch_size=1, and the checkpoint's minibatch_size=4 is restored ... assign it once the run has resumed", a false
    note: the run's clock sets the size before every step (the code's plays no part), and a resume of the same file
    says nothing. The load says nothing now and trains as that resume does."""
    path = str(tmp_path / "c.ckpt")
    train(loop, make_model(), 1, [kfit.callbacks.Checkpoint(path, async_write=False)])

    def sized():
        model = make_model()
        model.optimizer.minibatch_size.assign(32.0)
        return model

    class LoadAndListen(LoadAtEpochEnd):
        said = []

        def on_epoch_end(self, epoch, logs=None):
            with warnings.catch_warnings(record=True) as caught:
                warnings.simplefilter("always")
                super().on_epoch_end(epoch, logs)
            self.said += [str(w.message) for w in caught]

    loaded = sized()
    load = LoadAndListen(path, epoch=0)
    train(loop, loaded, 2, [load])
    assert not [note for note in load.said if "optimizer's" in note], load.said
    shutil.copy(path, tmp_path / "r.ckpt")
    resumed = sized()
    train(loop, resumed, 2, [kfit.callbacks.Checkpoint(str(tmp_path / "r.ckpt"), frequency="100ep")])
    assert kfit.get_clock(loaded).samples == 200
    assert_same_weights(loaded, resumed)


def test_the_metrics_of_a_checkpoint_written_inside_an_epoch_go_on_after_a_load_at_an_epoch_end(tmp_path):
    """The checkpoint of sample 140 (40 samples into the second epoch) loaded at the end of the second epoch of
    kfit.fit: Keras resets the metrics as the next epoch begins, so that epoch's History entry and printed means covered
    only the 60 samples trained after the load, where a resume of the file continues the file's metric state and gives
    the uninterrupted epoch's means."""
    path = str(tmp_path / "c.ckpt")

    def run(name, model, epochs, callbacks):
        log = tmp_path / f"{name}.log"
        history = train("kfit.fit", model, epochs, [*callbacks, kfit.callbacks.ProgressPrinter(freq=2, log_to_file=log)])
        lines = [re.sub(r" \d+\.\d{3}s \(.*\);$", "", line) for line in log.read_text().splitlines()
                 if line.startswith(("Finished Epoch", "Minibatch["))]  # (without the timing)
        return history.history["loss"], lines

    whole = run("whole", make_model(), 2, [kfit.callbacks.Checkpoint(path, frequency=140, preserve_all=True,
                                                                     async_write=False)])
    loaded_model = make_model()
    loaded = run("loaded", loaded_model, 3, [LoadAtEpochEnd(path + ".140", epoch=1)])
    shutil.copy(path + ".140", tmp_path / "r.ckpt")
    resumed_model = make_model()
    resumed = run("resumed", resumed_model, 2, [kfit.callbacks.Checkpoint(str(tmp_path / "r.ckpt"), frequency="100ep")])
    assert resumed[0] == whole[0]  # (an exact resume)
    assert loaded[0] == whole[0] + resumed[0][1:]
    assert resumed[1] == whole[1][-2:]  # the minibatches 3-4 of the second epoch, and its end
    assert loaded[1] == whole[1] + resumed[1]
    assert_same_weights(loaded_model, resumed_model)


@pytest.mark.parametrize("loop", ["kfit.fit", "model.fit"])
def test_the_tensorboard_writer_shows_a_load_in_the_middle_of_a_run_as_a_resume_of_the_file(tmp_path, loop):
    """The checkpoint of sample 100 (the end of epoch 1) loaded at the end of the second epoch, by a callback before
    the writer: the second epoch's points went to the restored reading, 100, beside the first epoch's, with a
    samples_per_second of 0 (counted from the restored clock), and the epoch trained again after the load wrote its
    points at 140, 180 and 200 a second time. TensorBoard now shows what it shows for a resume of the same file."""
    from test_tensorboard import read_scalars

    path = str(tmp_path / "c.ckpt")

    def shown(log_dir, model, epochs, callbacks):
        train(loop, model, epochs, [*callbacks, kfit.callbacks.TensorBoardProgressWriter(log_dir, freq=2)])
        scalars = read_scalars(log_dir)
        speeds = scalars.pop("samples_per_second")
        assert all(speed > 0 for _, speed in speeds), speeds
        return {**scalars, "samples_per_second": [step for step, _ in speeds]}  # (without the timing)

    whole = shown(tmp_path / "whole", make_model(), 2, [kfit.callbacks.Checkpoint(path, preserve_all=True,
                                                                                   async_write=False)])
    loaded = shown(tmp_path / "loaded", make_model(), 3, [LoadAtEpochEnd(path + ".100", epoch=1)])
    shutil.copytree(tmp_path / "whole", tmp_path / "resumed")  # (the resume adds its file to the stopped run's)
    shutil.copy(path + ".100", tmp_path / "r.ckpt")
    resumed = shown(tmp_path / "resumed", make_model(), 2, [kfit.callbacks.Checkpoint(str(tmp_path / "r.ckpt"),
                                                                                       frequency="100ep")])
    assert [step for step, _ in loaded["loss"]] == whole["samples_per_second"] == [100, 200]
    assert loaded == resumed


def test_the_epoch_summaries_count_the_epoch_a_load_ends_as_trained(tmp_path):
    """kfit.fit's History.epoch_summaries: the epoch at whose end a callback loaded the checkpoint of sample 100 was
    summed from the restored clock (0 samples, at 0 samples/s)."""
    path = str(tmp_path / "c.ckpt")
    train("kfit.fit", make_model(), 1, [kfit.callbacks.Checkpoint(path, async_write=False)])
    history = train("kfit.fit", make_model(), 3, [LoadAtEpochEnd(path, epoch=1)])
    assert [s.samples for s in history.epoch_summaries] == [100, 100, 100]
    assert all(s.samples_per_second > 0 for s in history.epoch_summaries)


def test_a_load_at_the_last_step_of_a_model_fit_epoch_leaves_the_files_metric_state_out_of_the_epochs_means(tmp_path):
    """Plain model.fit reads the epoch's means for its History after the epoch's last step: the file's metric state (of
    the epoch the file was written in), restored by a load at that step's end, was that epoch's History entry. A resume
    under model.fit restarts the epoch and restores no metrics; the load now leaves them out too: the same file with
    another metric state trains to the same History."""
    path = str(tmp_path / "c.ckpt")
    model = make_model()
    train("model.fit", model, 1, [kfit.callbacks.Checkpoint(path, async_write=False)])
    for variable in model.metrics_variables:  # the same state but for the metrics
        variable.assign(keras.ops.ones_like(variable.value) * 50)
    kfit.save_checkpoint(str(tmp_path / "other.ckpt"), model, clock=kfit.get_clock(model))

    class LoadAtLastBatchEnd(keras.callbacks.Callback):
        def __init__(self, path):
            super().__init__()
            self.path = path

        def on_train_batch_end(self, batch, logs=None):
            if batch == 6 and self.path:  # (the epoch's last step: the clock at 100, between two epochs)
                kfit.load_checkpoint(self.path, self.model)
                self.path = None

    def trained(file):
        history = train("model.fit", make_model(), 2, [LoadAtLastBatchEnd(file)])
        return history.history["loss"][-2:]  # (the first file also restores its History of epoch 1)

    assert trained(path) == trained(str(tmp_path / "other.ckpt"))


def test_a_load_at_an_epoch_end_of_model_fit_of_a_file_written_inside_an_epoch_trains_as_a_resume_of_it(tmp_path):
    """Plain model.fit trains its next epoch from the first step: the checkpoint of sample 148 (48 samples into the
    second epoch), loaded at the end of the second epoch, left the clock at 148, and model.fit's third epoch ended it
    at 248 (a resume of the file puts the clock at the epoch's start, 100, and ends that epoch at 200): every schedule
    and checkpoint after it was out of line with model.fit's epochs. The load now puts the clock at the epoch's start,
    as that resume does, and trains to the same weights and History."""
    path = str(tmp_path / "c.ckpt")
    train("model.fit", make_model(), 2, [kfit.callbacks.Checkpoint(path, frequency=140, preserve_all=True,
                                                                   async_write=False)])
    loaded = make_model()
    with pytest.warns(UserWarning, match=r"written 48 samples into epoch 2: .*start of epoch 2 \(sample 100\)"):
        x, y = data()
        history = loaded.fit(x, y, batch_size=16, epochs=3, shuffle=False, verbose=0, callbacks=[
            kfit.callbacks.SampleClock(batch_size=16, num_samples=100), LoadAtEpochEnd(path + ".148", epoch=1)])
    shutil.copy(path + ".148", tmp_path / "r.ckpt")
    resumed = make_model()
    resumed_history = train("model.fit", resumed, 2, [kfit.callbacks.Checkpoint(str(tmp_path / "r.ckpt"),
                                                                                frequency="100ep")])
    assert kfit.get_clock(loaded).samples == 200
    assert_same_weights(loaded, resumed)
    assert history.history["loss"][-1] == resumed_history.history["loss"][-1]


@pytest.mark.parametrize("loop", ["kfit.fit", "model.fit"])
def test_a_load_tells_that_a_callback_the_file_has_no_state_for_keeps_its_own(tmp_path, loop):
    """A load at an epoch end of a file written without the run's EarlyStopping said "holds no state for callback
    'early_stopping': it starts afresh", while the callback kept its state (its best loss and wait): only a resume's
    callbacks have just started afresh. The note now says what happens."""
    path = str(tmp_path / "c.ckpt")
    train(loop, make_model(), 1, [kfit.callbacks.Checkpoint(path, async_write=False),
                                  kfit.callbacks.ProgressPrinter(log_to_file=tmp_path / "log")])  # (another state)

    class LoadAndListen(LoadAtEpochEnd):
        def on_epoch_end(self, epoch, logs=None):
            if epoch == self.epoch:
                self.before = stopping.get_state()
                with warnings.catch_warnings(record=True) as caught:
                    warnings.simplefilter("always")
                    super().on_epoch_end(epoch, logs)
                self.after = stopping.get_state()
                self.said = [str(w.message) for w in caught]

    stopping = kfit.callbacks.EarlyStopping(monitor="loss", patience=5)
    load = LoadAndListen(path, epoch=1)
    train(loop, make_model(), 3, [stopping, load])
    assert load.after == load.before and load.before["best"] is not None
    assert [note for note in load.said if "no state for callback 'early_stopping'" in note] == [
        f"The checkpoint {path!r} holds no state for callback 'early_stopping': it keeps the state it has."], load.said


def _without_printer_and_writer_state(tmp_path):
    """The checkpoint of sample 140 (two minibatches of 20 into the second epoch of kfit.fit), written by a run without
    a ProgressPrinter or a TensorBoardProgressWriter."""
    path = str(tmp_path / "c.ckpt")
    train("kfit.fit", make_model(), 2, [kfit.callbacks.Checkpoint(path, frequency=140, preserve_all=True,
                                                                  async_write=False)])
    shutil.copy(path + ".140", tmp_path / "r.ckpt")
    return path + ".140"


def test_the_progress_printer_numbers_the_minibatches_after_a_load_of_a_file_without_its_state_as_a_resume_does(
        tmp_path):
    """The checkpoint of sample 140, without printer state, loaded at the end of the second epoch of kfit.fit: the
    epoch's first interval after the load was 'Minibatch[1-2]' (numbered from the load) where a resume of the file
    prints 'Minibatch[3-4]' for the same minibatches and means."""
    file = _without_printer_and_writer_state(tmp_path)

    def printed(name, epochs, callbacks):
        log = tmp_path / f"{name}.log"
        train("kfit.fit", make_model(), epochs, [*callbacks, kfit.callbacks.ProgressPrinter(freq=2, log_to_file=log)])
        return [re.sub(r" \d+\.\d{3}s \(.*\);$", "", line) for line in log.read_text().splitlines()
                if line.startswith(("Finished Epoch", "Minibatch["))]  # (without the timing)

    whole = printed("whole", 2, [])
    loaded = printed("loaded", 3, [LoadAtEpochEnd(file, epoch=1)])
    resumed = printed("resumed", 2, [kfit.callbacks.Checkpoint(str(tmp_path / "r.ckpt"), frequency="100ep")])
    assert resumed[0].startswith("Minibatch[   3-   4]") and resumed == whole[-2:]
    assert loaded == whole + resumed


def test_the_tensorboard_writer_puts_the_epoch_a_load_ends_where_a_resume_of_a_file_without_its_state_shows_it(
        tmp_path):
    """The checkpoint of sample 140, without the writer's state, loaded at the end of the second epoch of kfit.fit by a
    callback before the writer: that epoch's points went to the restored reading, 140, and stayed there after the
    restart mark (at 141, as for any file without the writer's state), where a resume of the file shows the stopped
    run's points of that epoch (at 200) hidden by the mark. The minibatch size too: the resumed writer, without
    state, marks the size again at 140; the loaded one kept the size it had marked at 100 and wrote none there."""
    from test_tensorboard import read_scalars

    file = _without_printer_and_writer_state(tmp_path)

    def shown(log_dir, epochs, callbacks):
        train("kfit.fit", make_model(), epochs, [*callbacks, kfit.callbacks.TensorBoardProgressWriter(log_dir, freq=2)])
        scalars = read_scalars(log_dir)
        speeds = scalars.pop("samples_per_second")
        assert all(speed > 0 for _, speed in speeds), speeds
        return {**scalars, "samples_per_second": [step for step, _ in speeds]}  # (without the timing)

    shown(tmp_path / "whole", 2, [])
    loaded = shown(tmp_path / "loaded", 3, [LoadAtEpochEnd(file, epoch=1)])
    shutil.copytree(tmp_path / "whole", tmp_path / "resumed")  # (the resume adds its file to the stopped run's)
    resumed = shown(tmp_path / "resumed", 2, [kfit.callbacks.Checkpoint(str(tmp_path / "r.ckpt"), frequency="100ep")])
    assert [step for step, _ in loaded["loss"]] == [100, 200]
    assert resumed["minibatch_size"] == [(0, 16.0), (100, 16.0), (100, 20.0), (140, 20.0), (200, 20.0)]
    assert loaded == resumed


@pytest.mark.parametrize("loop", ["kfit.fit", "model.fit"])
def test_the_tensorboard_minibatch_size_after_a_load_of_a_file_without_the_writers_state_is_a_resumes(tmp_path, loop):
    """The checkpoint of sample 100, written by a run without a TensorBoardProgressWriter, loaded at the end of the
    second epoch: a resume of the file marks the minibatch size again after its restart mark (at 100), as a writer
    that starts afresh does; the loaded writer kept the sizes it had written before the load and wrote no point at 100
    after the mark, so TensorBoard's minibatch_size curve had one point less than the resume's."""
    from test_tensorboard import read_scalars

    path = str(tmp_path / "c.ckpt")
    train(loop, make_model(), 1, [kfit.callbacks.Checkpoint(path, async_write=False)])

    def shown(log_dir, epochs, callbacks):
        train(loop, make_model(), epochs, [*callbacks, kfit.callbacks.TensorBoardProgressWriter(log_dir, freq=2)])
        return {tag: points for tag, points in read_scalars(log_dir).items() if tag != "samples_per_second"}

    shown(tmp_path / "whole", 2, [])
    loaded = shown(tmp_path / "loaded", 3, [LoadAtEpochEnd(path, epoch=1)])
    shutil.copytree(tmp_path / "whole", tmp_path / "resumed")  # (the resume adds its file to the stopped run's)
    shutil.copy(path, tmp_path / "r.ckpt")
    resumed = shown(tmp_path / "resumed", 2, [kfit.callbacks.Checkpoint(str(tmp_path / "r.ckpt"), frequency="100ep")])
    sizes = [(0, 16.0), (100, 16.0), (100, 20.0), (100, 20.0), (200, 20.0)] if loop == "kfit.fit" else [
        (0, 16.0), (100, 16.0), (100, 16.0), (200, 16.0)]  # (at 100: the epoch's end, then the mark's size)
    assert resumed["minibatch_size"] == sizes
    assert loaded == resumed


class Preempted(Exception):
    pass


@pytest.mark.parametrize("loop", ["kfit.fit", "model.fit"])
def test_a_checkpoint_written_right_after_a_load_resumes_to_the_tensorboard_points_of_the_run_with_the_load(
        tmp_path, loop):
    """A checkpoint written at the epoch end where kfit.load_checkpoint restored the file of sample 100: the writer had
    not written its restart mark yet, and the checkpoint held no points at its reading (100) where the loaded file held
    the first epoch's; a run resumed from it marked the restart at 100 and wrote none of them again, so TensorBoard
    lost the first epoch's loss, rate and sizes at 100, which the run that went on after the load shows."""
    from test_tensorboard import read_scalars

    path, second = str(tmp_path / "c.ckpt"), str(tmp_path / "second.ckpt")
    train(loop, make_model(), 1, [kfit.callbacks.Checkpoint(path, async_write=False)])

    class PreemptAtEpochBegin(keras.callbacks.Callback):
        def on_epoch_begin(self, epoch, logs=None):
            if epoch == 2:
                raise Preempted

    def shown(log_dir, epochs, callbacks):
        train(loop, make_model(), epochs, [*callbacks, kfit.callbacks.TensorBoardProgressWriter(log_dir, freq=2)])
        return {tag: points for tag, points in read_scalars(log_dir).items() if tag != "samples_per_second"}

    went_on = shown(tmp_path / "went_on", 3, [LoadAtEpochEnd(path, epoch=1)])
    with pytest.raises(Preempted):
        shown(tmp_path / "resumed", 3, [LoadAtEpochEnd(path, epoch=1), PreemptAtEpochBegin(),
                                        kfit.callbacks.Checkpoint(second, async_write=False)])
    assert kfit.checkpoint.read_checkpoint_info(second).samples == 100
    resumed = shown(tmp_path / "resumed", 2, [kfit.callbacks.Checkpoint(second, frequency="100ep")])
    assert [step for step, _ in went_on["loss"]] == [100, 200]
    assert resumed == went_on


def _unknown_length(kind):
    """96 samples in minibatches of 16, as data whose length model.fit does not know (without num_samples the clock
    counts every step as batch_size samples: no short last minibatch)."""
    x, y = (part[:96] for part in data())
    if kind == "generator":  # (one epoch: a Python generator is used up by it)
        return (((x[i:i + 16], y[i:i + 16]) for i in range(0, 96, 16)),)
    import tensorflow as tf

    return (tf.data.Dataset.from_tensor_slices((x, y)).filter(lambda *_: True).batch(16),)


def _fit_on_unknown_length(kind, model, epochs, callbacks):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # (the restore notes: checked elsewhere)
        return model.fit(*_unknown_length(kind), epochs=epochs, verbose=0,
                         callbacks=[kfit.callbacks.SampleClock(batch_size=16), *callbacks])


def _state(model):
    """The values of the model's and its optimizer's variables, and the clock's samples and minibatches."""
    return ([np.array(keras.ops.convert_to_numpy(v.value)) for v in [*model.variables, *model.optimizer.variables]],
            kfit.get_clock(model).samples, kfit.get_clock(model).minibatches)


@pytest.mark.parametrize("kind", ["generator", "tf.data"])
def test_a_load_inside_an_epoch_of_unknown_length_is_refused_and_changes_nothing(tmp_path, kind):
    """Under plain model.fit on data of unknown length (a generator, a filtered tf.data) with SampleClock(batch_size)
    and no num_samples, the clock knows no epoch length: a load after the second step of the first epoch was not
    refused, and the clock went back to the file's 96 samples where model.fit went on with the epoch's third
    step. It is refused now as on data of known length (the epoch has begun and not ended), before it changes the
    weights, the optimizer or the clock."""
    path = str(tmp_path / "c.ckpt")
    _fit_on_unknown_length("tf.data", make_model(), 1, [kfit.callbacks.Checkpoint(path, async_write=False)])
    assert kfit.checkpoint.read_checkpoint_info(path).samples == 96

    class LoadAtBatchEnd(keras.callbacks.Callback):
        def on_train_batch_end(self, batch, logs=None):
            if batch == 1:
                self.before = _state(self.model)
                try:
                    kfit.load_checkpoint(path, self.model)
                finally:
                    self.after = _state(self.model)

    model, load = make_model(), LoadAtBatchEnd()
    with pytest.raises(RuntimeError, match=r"inside an epoch of model\.fit \(at sample 32\).*on_epoch_end.*"
                                           r"Nothing was restored"):
        _fit_on_unknown_length(kind, model, 1, [load])
    assert load.before[1:] == load.after[1:] == (32, 2)
    for before, after, variable in zip(load.before[0], load.after[0], [*model.variables, *model.optimizer.variables],
                                       strict=True):
        np.testing.assert_array_equal(before, after, err_msg=variable.path)


@pytest.mark.parametrize("hook", ["on_epoch_end", "on_epoch_begin"])
def test_a_load_between_epochs_of_unknown_length_trains_as_a_resume_of_the_file(tmp_path, hook):
    """On the same data, a load between two epochs goes on: at the end of the second epoch, or as the third begins,
    the checkpoint of sample 96 trains the third epoch as a resume of the file trains its second."""
    path = str(tmp_path / "c.ckpt")
    _fit_on_unknown_length("tf.data", make_model(), 1, [kfit.callbacks.Checkpoint(path, async_write=False)])

    class Load(keras.callbacks.Callback):
        pass

    setattr(Load, hook, lambda self, epoch, logs=None: kfit.load_checkpoint(path, self.model) if epoch == (
        1 if hook == "on_epoch_end" else 2) else None)
    loaded = make_model()
    _fit_on_unknown_length("tf.data", loaded, 3, [Load()])
    shutil.copy(path, tmp_path / "r.ckpt")
    resumed = make_model()
    _fit_on_unknown_length("tf.data", resumed, 2, [kfit.callbacks.Checkpoint(str(tmp_path / "r.ckpt"),
                                                                              frequency="100ep")])
    assert kfit.get_clock(loaded).samples == 192
    assert_same_weights(loaded, resumed)


def test_a_load_at_an_epoch_end_of_unknown_length_listed_before_the_sample_clock_is_refused_saying_where_to_list_it(
        tmp_path):
    """On data of unknown length only the epoch's end tells that its last step has run: a callback listed before every
    kfit callback loads at the epoch's end before kfit has been told of it. That load was not refused and, on JAX and
    TensorFlow, the step Keras began past the end of the data was counted on the restored clock (208 samples after the
    third epoch, where a resume of the file ends at 192). It is refused now, saying to list the callback after
    SampleClock, and changes nothing."""
    path = str(tmp_path / "c.ckpt")
    _fit_on_unknown_length("tf.data", make_model(), 1, [kfit.callbacks.Checkpoint(path, async_write=False)])

    class LoadAtEpochEndListedFirst(keras.callbacks.Callback):
        def on_epoch_end(self, epoch, logs=None):
            if epoch == 1:
                self.before = _state(self.model)
                try:
                    kfit.load_checkpoint(path, self.model)
                finally:
                    self.after = _state(self.model)

    model, load = make_model(), LoadAtEpochEndListedFirst()
    with warnings.catch_warnings(), pytest.raises(RuntimeError, match=r"\(at sample 192\).*Nothing was restored\. On "
                                                  r"data of unknown length .* after kfit\.callbacks\.SampleClock\."):
        warnings.simplefilter("ignore")
        model.fit(*_unknown_length("tf.data"), epochs=3, verbose=0,
                  callbacks=[load, kfit.callbacks.SampleClock(batch_size=16)])
    assert load.before[1:] == load.after[1:] == (192, 12)
    for before, after, variable in zip(load.before[0], load.after[0], [*model.variables, *model.optimizer.variables],
                                       strict=True):
        np.testing.assert_array_equal(before, after, err_msg=variable.path)
