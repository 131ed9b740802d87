"""TensorBoardProgressWriter: event files read back by TensorBoard (or TensorFlow), steps on the sample clock."""

import glob
import os
import struct

import keras
import numpy as np
import pytest

import kfit
from kfit.callbacks import KfitCallback, TensorBoardProgressWriter
from kfit.callbacks._tensorboard import EventFileWriter, _masked_crc32c


def read_scalars(log_dir):
    """{tag: [(step, value), ...]} as TensorBoard shows them (a restart drops the points it trains again)."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    accumulator = EventAccumulator(str(log_dir))
    accumulator.Reload()
    return {tag: [(e.step, e.value) for e in accumulator.Scalars(tag)] for tag in accumulator.Tags()["scalars"]}


def data(n=96):
    rng = np.random.default_rng(0)
    x = rng.normal(size=(n, 4)).astype("float32")
    return x, x[:, :3].argmax(axis=1).astype("int64")


def classifier():
    model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(8, activation="tanh"), keras.layers.Dense(3)])
    model.compile(
        optimizer=kfit.optimizers.MomentumSGD(learning_rate=0.05),
        loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
        metrics=["accuracy"],
    )
    return model


class PublishEvaluations(KfitCallback):
    order = -10

    def on_step_end(self, clock, logs):
        if clock.samples == 48:
            self.publish("on_cross_validation_end", 0, {
                "val_loss": 0.5, "val_accuracy": 0.75, "val_average_error": 0.25,
                "val_samples": 40.0, "val_minibatches": 3.0, "val_index": 0.0, "samples": 48.0,
            })

    def on_train_end(self, logs=None):
        self.publish("on_final_test_end", {"test_loss": 0.25, "test_accuracy": 0.875, "test_samples": 50.0, "test_minibatches": 3.0})


def test_scalars_against_the_sample_clock(tmp_path):
    x, y = data()
    callbacks = [
        kfit.callbacks.LearningRateSchedule(kfit.schedules.learning_rate_per_sample([0.001, 0.0002], epoch_size=96)),
        kfit.callbacks.MomentumSchedule(kfit.schedules.momentum_as_time_constant(100)),
        PublishEvaluations(),
        TensorBoardProgressWriter(freq=3, log_dir=tmp_path),
    ]
    history = kfit.fit(classifier(), x, y, minibatch_size=16, epochs=2, seed=0, verbose=0, callbacks=callbacks,
                       validation_data=(x[:32], y[:32]))
    scalars = read_scalars(tmp_path)

    def steps(tag):
        return [s for s, _ in scalars[tag]]

    def values(tag):
        return [v for _, v in scalars[tag]]

    for tag in ("loss", "accuracy"):
        assert steps(tag) == [96, 192]
        assert values(tag) == pytest.approx(history.history[tag], rel=1e-6)
    # Cross-validation results at the clock reading they were taken at (48); Keras's validation at epoch ends.
    for tag, published in (("val_loss", 0.5), ("val_accuracy", 0.75)):
        assert steps(tag) == [48, 96, 192]
        assert values(tag) == pytest.approx([published, *history.history[tag]], rel=1e-6)
    assert scalars["val_average_error"] == [(48, 0.25)]
    # The learning rate per minibatch: at each change (lr_s * 16) and at each epoch end.
    assert scalars["lr"] == [(0, pytest.approx(0.016)), (96, pytest.approx(0.016)), (96, pytest.approx(0.0032)), (192, pytest.approx(0.0032))]
    assert scalars["momentum"][0] == (0, pytest.approx(np.exp(-16 / 100), rel=1e-6))
    assert scalars["minibatch_size"] == [(0, 16), (96, 16), (192, 16)]
    assert steps("samples_per_second") == [96, 192] and all(v > 0 for v in values("samples_per_second"))
    # Minibatch scalars every 3 minibatches: the interval means average to the epoch's.
    assert steps("minibatch/loss") == [48, 96, 144, 192]
    for epoch in range(2):
        mean = np.mean(values("minibatch/loss")[2 * epoch : 2 * epoch + 2])
        assert mean == pytest.approx(history.history["loss"][epoch], abs=1e-5)
    assert scalars["test_accuracy"] == [(192, 0.875)] and scalars["test_loss"] == [(192, 0.25)]
    assert "val_index" not in scalars and "val_samples" not in scalars and "test_samples" not in scalars


def test_a_resumed_run_replaces_the_points_it_trains_again(tmp_path):
    x, y = data()
    model = classifier()
    first = kfit.fit(model, x, y, minibatch_size=32, epochs=3, seed=0, verbose=0,
                     callbacks=[TensorBoardProgressWriter(log_dir=tmp_path)])
    # A restart from the checkpoint at the end of epoch 1 (the clock at 96 samples).
    test = kfit.callbacks.Test((x[:40], y[:40]), minibatch_size=20, verbose=0)
    second = kfit.fit(model, x, y, minibatch_size=32, epochs=3, initial_epoch=1, seed=0, verbose=0,
                      callbacks=[TensorBoardProgressWriter(log_dir=tmp_path), test])
    # One file per run; the final test (after on_train_end) goes into the run's file.
    assert len(glob.glob(str(tmp_path / "events.out.tfevents.*"))) == 2
    scalars = read_scalars(tmp_path)
    assert scalars["test_accuracy"] == [(288, pytest.approx(test.results["test_accuracy"], rel=1e-6))]
    loss = scalars["loss"]
    assert [s for s, _ in loss] == [96, 192, 288]
    assert [v for _, v in loss] == pytest.approx([first.history["loss"][0], *second.history["loss"]], rel=1e-6)


def test_a_run_continued_from_a_stop_inside_an_epoch_shows_the_uninterrupted_runs_points(tmp_path):
    """Stopped at 48 samples, inside the first epoch, right after a cross-validation there: the partial epoch's points
    at 48 (written after the checkpoint was taken) go, the cross-validation's (before it) stay, and the continued run
    writes no point again for a value that has not changed (minibatch size, rate, momentum)."""
    x, y = data()

    def run(log_dir, **options):
        callbacks = [kfit.callbacks.LearningRateSchedule(kfit.schedules.learning_rate_per_sample(0.002)),
                     kfit.callbacks.MomentumSchedule(kfit.schedules.momentum_as_time_constant(100)),
                     PublishEvaluations(), TensorBoardProgressWriter(log_dir),
                     kfit.callbacks.Checkpoint(str(tmp_path / f"{log_dir.name}.ckpt"))]
        keras.utils.set_random_seed(0)
        kfit.fit(classifier(), x, y, minibatch_size=16, epochs=2, seed=0, verbose=0, callbacks=callbacks, **options)
        return {tag: points for tag, points in read_scalars(log_dir).items() if tag != "samples_per_second"}

    whole = run(tmp_path / "whole")
    stopped = run(tmp_path / "stopped", max_samples=48)
    assert stopped["loss"] == [(48, pytest.approx(stopped["loss"][0][1]))] and stopped["val_loss"] == [(48, 0.5)]
    continued = run(tmp_path / "stopped")
    assert continued == whole
    assert [s for s, _ in whole["loss"]] == [96, 192] and [s for s, _ in whole["lr"]] == [0, 96, 192]


def test_event_file_records(tmp_path):
    # CRC-32C's check value, through the TFRecord mask.
    masked = _masked_crc32c(b"123456789")
    rotated = (masked - 0xA282EAD8) & 0xFFFFFFFF
    assert ((rotated << 15) | (rotated >> 17)) & 0xFFFFFFFF == 0xE3069283
    writer = EventFileWriter(tmp_path / "logs")
    writer.scalar("a/b", 1.5, step=3)
    writer.scalar("a/b", -2.0, step=2**40)
    writer.close()
    with open(writer.path, "rb") as f:
        raw = f.read()
    length = struct.unpack("<Q", raw[:8])[0]
    assert struct.unpack("<I", raw[8:12])[0] == _masked_crc32c(raw[:8]) and b"brain.Event:2" in raw[12 : 12 + length]
    assert read_scalars(tmp_path / "logs") == {"a/b": [(3, 1.5), (2**40, -2.0)]}


def test_only_the_chief_writes(tmp_path, monkeypatch):
    monkeypatch.setattr(kfit.distributed, "is_chief", lambda: False)
    x, y = data(n=32)
    kfit.fit(classifier(), x, y, batch_size=16, epochs=1, verbose=0,
             callbacks=[TensorBoardProgressWriter(freq=1, log_dir=tmp_path / "tb")])
    assert not (tmp_path / "tb").exists() or not os.listdir(tmp_path / "tb")


@pytest.mark.parametrize("kwargs,name", [({"freq": 0}, "freq"), ({"freq": -3}, "freq"), ({"freq": 2.0}, "freq"), ({"log_dir": 7}, "log_dir")])
def test_invalid_arguments_are_named(kwargs, name):
    with pytest.raises(ValueError, match=rf"`{name}`.*{name}="):
        TensorBoardProgressWriter(**kwargs)


def test_log_dir_comes_first_as_in_keras(tmp_path):
    """``TensorBoardProgressWriter("runs/tb")`` as ``keras.callbacks.TensorBoard("runs/tb")``; CNTK's order too."""
    x, y = data(n=32)
    writer = TensorBoardProgressWriter(tmp_path / "tb", 1)
    kfit.fit(classifier(), x, y, batch_size=16, epochs=1, verbose=0, callbacks=[writer])
    assert (writer.log_dir, writer.freq) == (str(tmp_path / "tb"), 1)
    assert len(os.listdir(tmp_path / "tb")) == 1
    assert TensorBoardProgressWriter(str(tmp_path)).log_dir == str(tmp_path)
    cntk_order = TensorBoardProgressWriter(5, str(tmp_path / "cntk"))
    assert (cntk_order.log_dir, cntk_order.freq) == (str(tmp_path / "cntk"), 5)
    counted = TensorBoardProgressWriter(np.int64(5), tmp_path / "cntk")  # (a frequency computed with NumPy)
    assert (counted.log_dir, counted.freq) == (str(tmp_path / "cntk"), 5) and type(counted.freq) is int
    keywords = TensorBoardProgressWriter(freq=5, log_dir=tmp_path)
    assert (keywords.log_dir, keywords.freq) == (str(tmp_path), 5)
    with pytest.raises(ValueError, match=r"log_dir=50\. For a frequency write freq=50\."):
        TensorBoardProgressWriter(50)


def test_the_cntk_guides_call_with_freq_first_and_log_dir_and_model_by_keyword(tmp_path):
    """The CNTK 2.2 guide's sample: TensorBoardProgressWriter(50, log_dir='my_tensorboard_logdir', model=criterion_mn)."""
    x, y = data(n=32)
    model = classifier()
    writer = TensorBoardProgressWriter(1, log_dir=tmp_path / "tb", model=model)
    assert (writer.log_dir, writer.freq) == (str(tmp_path / "tb"), 1)
    kfit.fit(model, x, y, batch_size=16, epochs=1, verbose=0, callbacks=[writer])
    assert len(os.listdir(tmp_path / "tb")) == 1
    assert TensorBoardProgressWriter(log_dir=tmp_path, freq=5, rank=None).freq == 5
    assert TensorBoardProgressWriter().log_dir == "."
    with pytest.raises(TypeError, match=r"two values for `log_dir`"):
        TensorBoardProgressWriter(tmp_path, log_dir=tmp_path / "other")
    # CNTK's rank=C.Communicator.rank(): there only rank 0 wrote event files, as kfit's writer does.
    assert TensorBoardProgressWriter(tmp_path, rank=1).log_dir == str(tmp_path)
    with pytest.raises(ValueError, match=r"`rank`.*rank=-1"):
        TensorBoardProgressWriter(tmp_path, rank=-1)
    with pytest.raises(TypeError, match=r"unexpected keyword argument 'logdir'"):
        TensorBoardProgressWriter(logdir=tmp_path)


def test_minibatch_points_reach_the_file_as_they_come_not_at_the_epochs_end(tmp_path):
    """TensorBoard shows a long epoch's minibatch-level points while it trains: each freq's points are written
    when they are made (the writer keeps events in memory until a flush, to write them whole)."""
    x, y = data(96)
    seen = []

    class ReadBack(KfitCallback):
        order = 100  # after the writer

        def on_step_end(self, clock, logs):
            if clock.samples == 64:  # the third of six steps of the epoch
                seen.append(read_scalars(tmp_path).get("minibatch/loss", []))

    kfit.fit(classifier(), x, y, batch_size=16, epochs=1, shuffle=False, verbose=0,
             callbacks=[TensorBoardProgressWriter(log_dir=str(tmp_path), freq=1), ReadBack()])
    assert [step for step, _ in seen[0]] == [16, 32, 48, 64]
