"""What a rerun says and does: resumed runs print where they resume, finished runs stay finished.

Each test runs training, then reruns it as a user (or a scheduler that requeues the job) would, and checks
what the user sees: the line on stderr, the weights and the history returned, the status `kfit inspect`
shows.
"""

from __future__ import annotations

import json
import math
import re
import warnings

import keras
import pytest

import kfit
from kfit.checkpoint import CheckpointMismatchError, read_checkpoint_info
from tests.helpers import assert_same_weights, classification_data, mlp


def make_model(hidden: int = 8, learning_rate: float = 0.05):
    model = mlp(features=4, outputs=3, hidden=hidden)
    model.compile(optimizer=kfit.optimizers.MomentumSGD(learning_rate=learning_rate),
                  loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True), metrics=["accuracy"])
    return model


class StepCounter(keras.callbacks.Callback):
    def __init__(self):
        super().__init__()
        self.steps = 0

    def on_train_batch_end(self, batch, logs=None):
        self.steps += 1


class FailAtEpoch(keras.callbacks.Callback):
    """Stands for a crash: raises at the start of epoch ``epoch`` (after the checkpoint of the one before)."""

    def __init__(self, epoch):
        super().__init__()
        self.epoch = epoch

    def on_epoch_begin(self, epoch, logs=None):
        if epoch == self.epoch:
            raise RuntimeError("crash")


X, Y = classification_data(64)


def train(path, epochs=2, callbacks=(), hidden=8, **checkpoint_args):
    model = make_model(hidden)
    counter = StepCounter()
    checkpoint = kfit.callbacks.Checkpoint(path, **checkpoint_args)
    history = kfit.fit(model, X, Y, minibatch_size=16, epochs=epochs, seed=0, verbose=0,
                       callbacks=[*callbacks, checkpoint, counter])
    return model, history, counter, checkpoint


def test_a_rerun_of_a_complete_run_trains_nothing_and_says_why(tmp_path, capsys):
    path = str(tmp_path / "run.ckpt")
    first, history, counter, _ = train(path)
    assert counter.steps == 8
    assert read_checkpoint_info(path).status_text() == "complete (reached epochs=2)"
    capsys.readouterr()

    again, rerun, counter, checkpoint = train(path)
    err = capsys.readouterr().err
    assert counter.steps == 0
    assert f"kfit: run already complete at sample 128 (reached epochs=2); nothing to train. Restored its final state from {path}." in err
    assert f"Pass restore=False or delete {path} to start over, or raise epochs or max_samples to continue it." in err
    assert "resumed from" not in err
    assert checkpoint.finished_before
    assert_same_weights(first, again)  # the final state is returned
    assert rerun.history["loss"] == history.history["loss"]
    assert [s.samples for s in rerun.epoch_summaries] == [64, 64]


def test_raising_epochs_continues_a_complete_run(tmp_path, capsys):
    path = str(tmp_path / "run.ckpt")
    train(path)
    capsys.readouterr()
    _, history, counter, _ = train(path, epochs=3)
    err = capsys.readouterr().err
    assert counter.steps == 4
    assert re.search(rf"kfit: resumed from {re.escape(path)} at sample 128 \(end of epoch 2; written \S+\); the run was "
                     r"complete \(reached epochs=2\): going on to the new end", err), err
    assert len(history.history["loss"]) == 3
    assert read_checkpoint_info(path).status_text() == "complete (reached epochs=3)"


def test_an_interrupted_run_resumes_and_says_where(tmp_path, capsys):
    path = str(tmp_path / "run.ckpt")
    with pytest.raises(RuntimeError, match="crash"):
        train(path, epochs=3, callbacks=[FailAtEpoch(1)], async_write=False)
    info = read_checkpoint_info(path)
    assert (info.status, info.samples) == ("running", 64)
    capsys.readouterr()
    _, history, counter, _ = train(path, epochs=3)
    err = capsys.readouterr().err
    lines = [line for line in err.splitlines() if line.startswith("kfit:")]
    assert len(lines) == 1
    assert re.fullmatch(rf"kfit: resumed from {re.escape(path)} at sample 64 \(end of epoch 1; written "
                        r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\+00:00\)", lines[0]), lines
    assert counter.steps == 8 and len(history.history["loss"]) == 3


def test_a_rerun_of_an_early_stopped_run_trains_nothing_and_says_why(tmp_path, capsys):
    path = str(tmp_path / "run.ckpt")

    def stopper():  # val_loss cannot improve by 10 per evaluation: stops after patience=1 evaluations
        return kfit.callbacks.EarlyStopping(monitor="val_loss", patience=1, min_delta=10.0)

    cv = kfit.callbacks.CrossValidation((X[:32], Y[:32]), frequency=32, minibatch_size=16)
    first, history, counter, _ = train(path, epochs=20, callbacks=[cv, stopper()])
    assert counter.steps < 80
    info = read_checkpoint_info(path)
    assert info.status == "stopped" and info.status_text() == "stopped by EarlyStopping on val_loss"
    capsys.readouterr()

    cv = kfit.callbacks.CrossValidation((X[:32], Y[:32]), frequency=32, minibatch_size=16)
    again, rerun, counter, _ = train(path, epochs=20, callbacks=[cv, stopper()])
    err = capsys.readouterr().err
    assert counter.steps == 0
    assert (f"kfit: run already complete at sample {info.samples} (stopped by EarlyStopping on val_loss); nothing "
            f"to train. Restored its final state from {path}. Pass restore=False or delete {path} to start over, "
            "or pass Checkpoint(..., resume_finished=True) to continue it.") in err
    assert_same_weights(first, again)
    assert rerun.history["loss"] == history.history["loss"]

    # resume_finished=True goes on training (and the early stopping can stop it again)
    cv = kfit.callbacks.CrossValidation((X[:32], Y[:32]), frequency=32, minibatch_size=16)
    _, _, counter, _ = train(path, epochs=20, callbacks=[cv, stopper()], resume_finished=True)
    err = capsys.readouterr().err
    assert counter.steps > 0
    assert "it had stopped by EarlyStopping on val_loss: going on (resume_finished=True)" in err


def test_a_cross_validation_stop_is_recorded_and_kept(tmp_path, capsys):
    path = str(tmp_path / "run.ckpt")

    def enough(index, average_error, samples, minibatches):
        return index < 2  # False at the third evaluation: stop

    def callbacks():
        return [kfit.callbacks.CrossValidation((X[:32], Y[:32]), frequency=32, minibatch_size=16, callback=enough)]

    _, _, counter, _ = train(path, epochs=10, callbacks=callbacks())
    assert counter.steps == 6
    reason = "stopped by the cross-validation callback enough, which returned False at val_index 2"
    assert read_checkpoint_info(path).status_text() == reason
    capsys.readouterr()
    _, _, counter, _ = train(path, epochs=10, callbacks=callbacks())
    assert counter.steps == 0
    assert f"kfit: run already complete at sample 96 ({reason}); nothing to train." in capsys.readouterr().err


def test_a_mismatch_says_how_to_start_over(tmp_path):
    path = str(tmp_path / "run.ckpt")
    train(path, epochs=1)
    with pytest.raises(CheckpointMismatchError, match=r"To start over instead of resuming: pass restore=False to Checkpoint, or delete"):
        train(path, epochs=2, hidden=5)


def test_model_fit_rerun_of_a_complete_run_trains_nothing(tmp_path, capsys):
    path = str(tmp_path / "run.ckpt")

    def run():
        model = make_model()
        counter = StepCounter()
        with pytest.warns(UserWarning) if (tmp_path / "run.ckpt").exists() else _nothing():
            history = model.fit(X, Y, batch_size=16, epochs=2, verbose=0, shuffle=False,
                                callbacks=[counter, kfit.callbacks.Checkpoint(path, async_write=False)])
        return model, counter, history

    first, counter, history = run()
    assert counter.steps == 8
    assert read_checkpoint_info(path).status_text() == "complete (reached epochs=2)"
    capsys.readouterr()
    again, counter, again_history = run()
    assert counter.steps == 0
    assert "kfit: run already complete at the end of epoch 2 (reached epochs=2); nothing to train." in capsys.readouterr().err
    assert_same_weights(first, again)
    # The History model.fit returns is the finished run's, its epochs included (as kfit.fit's rerun returns it)
    assert again_history.epoch == history.epoch == [0, 1]
    assert again_history.history == history.history


def test_model_fit_rerun_of_a_run_stopped_inside_an_epoch_keeps_the_clock_where_it_stopped(tmp_path, capsys):
    """Plain model.fit with a SampleClock, stopped by a callback at step 6 (32 samples into the second epoch): the
    rerun trains nothing and restores the final state, clock included; its clock read 64 (the epoch's start, where
    model.fit would have restarted the epoch), not the 96 samples the run had trained and the file holds."""
    path = str(tmp_path / "run.ckpt")

    def run(*callbacks):
        model = make_model()
        counter = StepCounter()
        with pytest.warns(UserWarning) if (tmp_path / "run.ckpt").exists() else _nothing():
            model.fit(X, Y, batch_size=16, epochs=3, verbose=0, shuffle=False, callbacks=[
                kfit.callbacks.SampleClock(batch_size=16, num_samples=64), *callbacks, counter,
                kfit.callbacks.Checkpoint(path, epochs=1, async_write=False)])
        return model, counter

    stopped, _ = run(StopAtStep(6))
    assert kfit.get_clock(stopped).samples == 96
    info = read_checkpoint_info(path)
    assert (info.samples, info.status) == (96, "stopped")
    capsys.readouterr()
    again, counter = run()
    assert counter.steps == 0
    assert "kfit: run already complete at sample 96 (stopped by a callback" in capsys.readouterr().err
    assert_same_weights(stopped, again)
    clock = kfit.get_clock(again)
    assert (clock.samples, clock.minibatches) == (96, 6)


class _nothing:
    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


def test_kfit_runs_lists_status_and_integrity(tmp_path, capsys):
    from kfit.cli import main as cli

    train(str(tmp_path / "a" / "model.ckpt"), preserve_all=True)
    with pytest.raises(RuntimeError):
        train(str(tmp_path / "b.ckpt"), epochs=3, callbacks=[FailAtEpoch(1)], async_write=False)
    (tmp_path / "notes.txt").write_text("not a checkpoint")
    damaged = tmp_path / "c.ckpt"
    damaged.write_bytes((tmp_path / "b.ckpt").read_bytes()[:2000])
    capsys.readouterr()
    assert cli(["runs", str(tmp_path)]) == 1  # one file is damaged
    out = capsys.readouterr()
    rows = [line.split() for line in out.out.splitlines()]
    assert rows[0] == ["FILE", "SAMPLES", "EPOCH", "STATUS", "INTEGRITY", "WRITTEN"]
    by_file = {row[0]: row for row in rows[1:]}
    assert set(by_file) == {"a/model.ckpt", "a/model.ckpt.64", "a/model.ckpt.128", "b.ckpt", "c.ckpt"}
    assert by_file["a/model.ckpt"][1:6] == ["128", "2", "complete", "(reached", "epochs=2)"]
    assert by_file["a/model.ckpt"][6] == "ok"
    assert by_file["a/model.ckpt.64"][1:4] == ["64", "1", "running"]
    assert by_file["b.ckpt"][1:5] == ["64", "1", "running", "ok"]
    assert by_file["c.ckpt"][1:5] == ["-", "-", "-", "DAMAGED"]
    assert "c.ckpt: The checkpoint" in out.err

    assert cli(["runs", str(tmp_path / "a"), "--json"]) == 0
    listed = json.loads(capsys.readouterr().out)
    assert [(r["path"].rsplit("/", 1)[-1], r["samples"], r["status"], r["intact"]) for r in listed] == [
        ("model.ckpt", 128, "complete", True), ("model.ckpt.64", 64, "running", True), ("model.ckpt.128", 128, "complete", True)]


def test_a_changed_learning_rate_is_said_on_resume(tmp_path, capsys):
    """A schedule built from a Python callable cannot be compared as such: the value it gives for the checkpoint's
    last minibatch is (its config can: see the next test)."""
    path = str(tmp_path / "run.ckpt")

    def schedule(rate):
        return kfit.callbacks.LearningRateSchedule(kfit.schedules.learning_rate_per_sample(lambda samples: rate))

    with pytest.raises(RuntimeError):
        train(path, epochs=3, callbacks=[schedule(0.001), FailAtEpoch(1)], async_write=False)
    capsys.readouterr()
    with pytest.raises(RuntimeError):
        train(path, epochs=3, callbacks=[schedule(0.001), FailAtEpoch(2)], async_write=False)
    assert "kfit: note" not in capsys.readouterr().err  # the same schedule: nothing to say
    train(path, epochs=4, callbacks=[schedule(0.002)])
    err = capsys.readouterr().err
    assert ("kfit: note: the learning rate schedule differs from the one the run trained with: it gives 0.032 for "
            "the checkpoint's last minibatch, which trained with 0.016. Training goes on with this script's schedule.") in err


class ResetAtEpoch(keras.callbacks.Callback):
    """Resets a LearningRateSchedule's schedule when epoch ``epoch`` begins (as kfit's ReduceLROnPlateau would)."""

    def __init__(self, schedule, epoch, rate):
        super().__init__()
        self.schedule, self.epoch, self.rate = schedule, epoch, rate

    def on_epoch_begin(self, epoch, logs=None):
        if epoch == self.epoch:
            self.schedule.reset_learning_rate(self.rate)


def test_a_schedule_changed_in_code_is_named_on_resume_with_the_one_that_goes_on(tmp_path):
    """The code's learning-rate and momentum schedules changed, in epochs the checkpoint had not reached: the resumed
    run trained with the new ones without a word (the value for the checkpoint's last minibatch, which was compared,
    is the same). Each is named now, with the checkpoint's, and the one the run goes on with; where the checkpointed
    run had replaced its schedule (reset_learning_rate), that replacement goes on, and the note says so. The same
    schedules say nothing."""
    per_sample, time_constant = kfit.schedules.learning_rate_per_sample, kfit.schedules.momentum_as_time_constant

    def schedules(rates, taus):
        return [kfit.callbacks.LearningRateSchedule(per_sample(rates, epoch_size=64)),
                kfit.callbacks.MomentumSchedule(time_constant(taus, epoch_size=64))]

    def notes(caught):
        return [str(w.message) for w in caught if "the schedule" in str(w.message)]

    first = ([0.001, 0.0005], [0, 64])
    for case, second in (("same", first), ("changed", ([0.001, 0.0005, 0.0002], [0, 64, 128])),
                         ("reset", ([0.001, 0.0005, 0.0002], [0, 64]))):
        path = str(tmp_path / case / "run.ckpt")
        callbacks = schedules(*first)
        reset = [ResetAtEpoch(callbacks[0], 1, 0.0003)] * (case == "reset")
        with pytest.raises(RuntimeError):
            train(path, epochs=3, callbacks=[*callbacks, *reset, FailAtEpoch(2)], async_write=False)
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            _, history, _, _ = train(path, epochs=3, callbacks=schedules(*second))
        said = notes(caught)
        if case == "same":
            assert said == []
            continue
        rate = said[0]
        assert rate.startswith("This code gives LearningRateSchedule 'learning_rate_schedule' the schedule "
                               "HyperparameterSchedule(kind='learning_rate', unit='per_sample', schedule=PiecewiseConstant("
                               "boundaries=[64, 128], values=[0.001, 0.0005, 0.0002]"), rate
        assert f"the run that wrote the checkpoint {path!r} had HyperparameterSchedule(kind='learning_rate', " \
            "unit='per_sample', schedule=PiecewiseConstant(boundaries=[64], values=[0.001, 0.0005]" in rate
        if case == "changed":
            assert len(said) == 2 and "The new schedule is used from here on" in rate
            assert said[1].startswith("This code gives MomentumSchedule 'momentum_schedule' the schedule ")
            assert "values=[0, 64, 128]" in said[1] and "values=[0, 64]" in said[1]
            assert history.history["lr"][2] == pytest.approx(0.0002 * 16)  # the new schedules, as the notes say
            assert history.history["momentum"][2] == pytest.approx(math.exp(-16 / 128))
        else:
            assert len(said) == 1 and "That run replaced it at sample 64 (by reset_learning_rate, which kfit's " \
                "ReduceLROnPlateau calls) with HyperparameterSchedule(kind='learning_rate', unit='per_sample', " \
                "schedule=Constant(value=0.0003)), which stays in force: the new schedule is not used." in rate, rate
            assert history.history["lr"][2] == pytest.approx(0.0003 * 16)


class StopAtStep(keras.callbacks.Callback):
    def __init__(self, step):
        super().__init__()
        self.step, self.steps = step, 0

    def on_train_batch_end(self, batch, logs=None):
        self.steps += 1
        if self.steps == self.step:
            self.model.stop_training = True


@pytest.mark.parametrize("frequency", [None, 48])
def test_a_rerun_of_a_run_stopped_inside_an_epoch_returns_its_partial_epoch_as_model_fit_did(tmp_path, frequency):
    """model.fit records the epoch a callback stopped in (its logs, its validation); the rerun of the finished run
    returned the history without it."""
    path = str(tmp_path / "run.ckpt")
    validation = dict(validation_data=classification_data(16, seed=1))
    reference = make_model()
    expected = reference.fit(X, Y, batch_size=16, epochs=3, shuffle=False, verbose=0, callbacks=[StopAtStep(6)],
                             **validation)
    assert expected.epoch == [0, 1]

    def run(*callbacks):
        model = make_model()
        checkpoint = kfit.callbacks.Checkpoint(path, frequency=frequency)
        history = kfit.fit(model, X, Y, batch_size=16, epochs=3, shuffle=False, seed=0, verbose=0,
                           callbacks=[*callbacks, checkpoint], **validation)
        return model, history

    stopped, history = run(StopAtStep(6))
    rerun, again = run()
    for returned in (history, again):
        assert returned.epoch == expected.epoch and returned.history == expected.history
    assert_same_weights(rerun, reference)


@pytest.mark.parametrize("frequency", [None, 48])
def test_a_run_continued_from_one_stopped_inside_an_epoch_has_the_uninterrupted_history(tmp_path, frequency):
    """The checkpoint of a run stopped at max_samples inside an epoch: the continued run had that epoch twice in
    its history, and (default frequency) the epoch's training loss after a validation that reset the metrics."""
    path = str(tmp_path / "run.ckpt")
    validation = dict(validation_data=classification_data(16, seed=1))

    def run(**options):
        model = make_model()
        callbacks = [kfit.callbacks.Checkpoint(path, frequency=frequency)] if options.pop("save", True) else []
        history = kfit.fit(model, X, Y, batch_size=16, epochs=3, shuffle=False, seed=0, verbose=0,
                           callbacks=callbacks, **validation, **options)
        return model, history

    reference, expected = run(save=False)
    _, stopped = run(max_samples=96)  # 32 samples into the second epoch
    assert stopped.epoch == [0, 1]  # the partial epoch, as model.fit records one
    continued, history = run()
    assert history.epoch == [0, 1, 2] and history.history == expected.history
    assert_same_weights(continued, reference)


def test_a_continued_run_keeps_the_values_of_keys_the_partial_epoch_did_not_log(tmp_path):
    """Cross-validation at sample 100 only (epochs of 64): its ``val_*`` keys have one value, the second epoch's. A run
    stopped inside the third epoch and continued drops what that partial epoch logged, not that value."""
    path = str(tmp_path / "run.ckpt")

    def run(**options):
        model = make_model()
        callbacks = [kfit.callbacks.CrossValidation(classification_data(16, seed=1), frequency=100)]
        if options.pop("save", True):
            callbacks.append(kfit.callbacks.Checkpoint(path))
        history = kfit.fit(model, X, Y, batch_size=16, epochs=3, seed=0, verbose=0, callbacks=callbacks, **options)
        return model, history

    reference, expected = run(save=False)
    assert len(expected.history["val_loss"]) == 1 and len(expected.history["loss"]) == 3
    _, stopped = run(max_samples=144)  # 16 samples into the third epoch, after the cross-validation
    assert stopped.epoch == [0, 1, 2] and len(stopped.history["val_loss"]) == 1
    continued, history = run()
    assert history.epoch == [0, 1, 2] and history.history == expected.history
    assert_same_weights(continued, reference)


@pytest.mark.parametrize("source", ["arrays", "tf.data"])
@pytest.mark.parametrize("stopper", ["keras EarlyStopping", "a plain callback"])
def test_a_callbacks_stop_at_the_step_max_samples_is_reached_stays_a_stop(source, stopper, tmp_path):
    """A callback stopped the run at the very step where ``max_samples`` was reached: the checkpoint said "complete
    (reached max_samples=128)", and the rerun without ``max_samples`` went on to the new end (epochs 0-2, weights 0.08
    off), where the uninterrupted run had stopped there. Now it is recorded as the callback's stop."""
    import tensorflow as tf

    def run(path, max_samples=None):
        model = make_model()
        counter = StepCounter()
        if stopper == "keras EarlyStopping":  # the loss cannot improve by 10: stops after epoch index 1
            stopping = keras.callbacks.EarlyStopping(monitor="loss", min_delta=10, patience=1)
        else:
            stopping = StopAtStep(8)
        data = (X, Y) if source == "arrays" else (tf.data.Dataset.from_tensor_slices((X, Y)).batch(16),)
        options = {"batch_size": 16} if source == "arrays" else {}
        history = kfit.fit(model, *data, epochs=6, seed=0, verbose=0, max_samples=max_samples, **options,
                           callbacks=[stopping, kfit.callbacks.Checkpoint(path), counter])
        return model, history, counter

    uninterrupted, expected, _ = run(str(tmp_path / "once.ckpt"))
    assert expected.epoch == [0, 1]
    path = str(tmp_path / "twice.ckpt")
    run(path, max_samples=128)
    info = read_checkpoint_info(path)
    assert info.status == "stopped", info.status_text()
    resumed, history, counter = run(path)
    assert counter.steps == 0
    assert history.epoch == expected.epoch
    assert_same_weights(uninterrupted, resumed)
