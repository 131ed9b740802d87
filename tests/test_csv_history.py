"""CSVHistory: one row per epoch, cross-validation and test; appended across restarts without duplicates."""

import csv
import warnings

import keras
import numpy as np
import pytest

import kfit
from kfit.callbacks import CSVHistory, KfitCallback
from kfit.clock import Clock, attach_clock


def read(path):
    with open(path, newline="") as f:
        reader = csv.DictReader(f)
        return reader.fieldnames, list(reader)


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


def test_rows_per_epoch_cross_validation_and_test(tmp_path):
    x, y = data()
    path = tmp_path / "runs" / "history.csv"
    callbacks = [
        kfit.callbacks.LearningRateSchedule(kfit.schedules.learning_rate_per_sample([0.001, 0.0002], epoch_size=96)),
        kfit.callbacks.MomentumSchedule(kfit.schedules.momentum_as_time_constant(100)),
        PublishEvaluations(),
        CSVHistory(path),
    ]
    history = kfit.fit(classifier(), x, y, minibatch_size=16, epochs=2, seed=0, verbose=0, callbacks=callbacks)
    columns, rows = read(path)
    # Results in the order they first appear: the cross-validation at 48 samples came first.
    assert columns[:4] == ["kind", "epoch", "samples", "minibatches"]
    assert columns[4:-4] == ["val_loss", "val_accuracy", "val_average_error", "val_samples", "val_minibatches", "val_index",
                             "loss", "accuracy", "test_loss", "test_accuracy", "test_samples", "test_minibatches"]
    assert columns[-4:] == ["lr", "momentum", "minibatch_size", "time"]
    assert path.read_text().count("kind,epoch") == 1
    assert [(r["kind"], r["samples"], r["minibatches"], r["epoch"]) for r in rows] == [
        ("cross_validation", "48", "3", "0.5"),
        ("epoch", "96", "6", "1"),
        ("epoch", "192", "12", "2"),
        ("test", "192", "12", "2"),
    ]
    cv, epoch1, epoch2, test = rows
    assert float(cv["val_accuracy"]) == 0.75 and float(cv["val_samples"]) == 40 and cv["loss"] == ""
    for row, loss, accuracy in zip((epoch1, epoch2), history.history["loss"], history.history["accuracy"], strict=True):
        assert float(row["loss"]) == pytest.approx(loss, rel=1e-7) and float(row["accuracy"]) == pytest.approx(accuracy, rel=1e-7)
    assert float(test["test_accuracy"]) == 0.875
    assert [float(r["lr"]) for r in rows] == pytest.approx([0.016, 0.016, 0.0032, 0.0032])
    assert all(float(r["momentum"]) == pytest.approx(np.exp(-16 / 100)) for r in rows)
    assert all(r["minibatch_size"] == "16" for r in rows)
    assert all(float(r["time"]) > 1e9 for r in rows)


def test_a_resumed_run_appends_without_duplicate_rows(tmp_path):
    x, y = data()
    path = tmp_path / "history.csv"
    model = classifier()
    first = kfit.fit(model, x, y, minibatch_size=32, epochs=3, seed=0, verbose=0, callbacks=[CSVHistory(path)])
    assert [r["samples"] for r in read(path)[1]] == ["96", "192", "288"]
    # A restart from the checkpoint at the end of epoch 1 (the clock at 96 samples) trains epochs 2 and 3 again.
    second = kfit.fit(model, x, y, minibatch_size=32, epochs=3, initial_epoch=1, seed=0, verbose=0, callbacks=[CSVHistory(path)])
    columns, rows = read(path)
    assert [r["samples"] for r in rows] == ["96", "192", "288"]
    losses = [float(r["loss"]) for r in rows]
    assert losses == pytest.approx([first.history["loss"][0], *second.history["loss"]], rel=1e-7)
    assert path.read_text().count("kind,epoch") == 1


def test_a_run_restored_from_an_older_checkpoint_rewrites_the_rows_after_it(tmp_path):
    import shutil

    x, y = data()
    path = tmp_path / "history.csv"
    checkpoint = tmp_path / "run.ckpt"
    model = classifier()
    weights = model.get_weights()
    kfit.fit(model, x, y, minibatch_size=16, epochs=2, seed=0, verbose=0,
             callbacks=[kfit.callbacks.Checkpoint(str(checkpoint), frequency=48, preserve_all=True), CSVHistory(path)])
    whole = read(path)[1]
    assert [r["samples"] for r in whole] == ["96", "192"]
    # Resume from the checkpoint at 144 samples (mid-epoch 2): the row at 192 is written again, once.
    shutil.copy(f"{checkpoint}.144", tmp_path / "older.ckpt")
    again = classifier()
    again.set_weights(weights)
    kfit.fit(again, x, y, minibatch_size=16, epochs=2, seed=0, verbose=0,
             callbacks=[kfit.callbacks.Checkpoint(str(tmp_path / "older.ckpt"), frequency=48, restore=True), CSVHistory(path)])
    rows = read(path)[1]
    assert [r["samples"] for r in rows] == ["96", "192"]
    assert rows[0] == whole[0]
    assert {k: v for k, v in rows[1].items() if k != "time"} == {k: v for k, v in whole[1].items() if k != "time"}
    assert rows[1]["time"] != whole[1]["time"]


def test_a_run_continued_from_a_stop_inside_an_epoch_writes_the_uninterrupted_runs_rows(tmp_path):
    """Stopped at 80 samples (inside the second epoch), the run wrote that partial epoch's row, and the final test's,
    after its last step was saved; the continued run drops both: the file is the uninterrupted run's."""
    x, y = data()

    def run(directory, **options):
        callbacks = [PublishEvaluations(), CSVHistory(directory / "history.csv"),
                     kfit.callbacks.Checkpoint(str(directory / "run.ckpt"))]
        keras.utils.set_random_seed(0)
        kfit.fit(classifier(), x, y, minibatch_size=16, epochs=2, seed=0, verbose=0, callbacks=callbacks, **options)
        return read(directory / "history.csv")

    (tmp_path / "whole").mkdir()
    (tmp_path / "stopped").mkdir()
    columns, whole = run(tmp_path / "whole")
    _, stopped = run(tmp_path / "stopped", max_samples=160)
    assert [(r["kind"], r["samples"]) for r in stopped] == [
        ("cross_validation", "48"), ("epoch", "96"), ("epoch", "160"), ("test", "160")]
    continued_columns, continued = run(tmp_path / "stopped")
    assert [(r["kind"], r["samples"]) for r in continued] == [
        ("cross_validation", "48"), ("epoch", "96"), ("epoch", "192"), ("test", "192")]
    assert continued_columns == columns
    assert [{k: v for k, v in r.items() if k != "time"} for r in continued] == [
        {k: v for k, v in r.items() if k != "time"} for r in whole]


def test_a_multi_output_model_built_again_in_one_process_goes_on_in_its_columns(tmp_path):
    """The same two-output model built again in one process (a notebook cell run again): Keras names its outputs anew
    (dense_7 for dense_4), and the resumed run's rows went to new columns beside the checkpointed run's, each half
    empty. The columns of the restored rows now take this run's names: the file is the uninterrupted run's, but for
    the names."""
    x, y = data()
    targets = [y, (y == 0).astype("float32")]

    def model():
        keras.utils.set_random_seed(1)
        inputs = keras.Input((4,))
        hidden = keras.layers.Dense(8, activation="tanh")(inputs)
        built = keras.Model(inputs, [keras.layers.Dense(3)(hidden), keras.layers.Dense(1)(hidden)])
        built.compile(optimizer=kfit.optimizers.MomentumSGD(learning_rate=0.05),
                      loss=[keras.losses.SparseCategoricalCrossentropy(from_logits=True), "mse"])
        return built

    def run(directory, **options):
        trained = model()
        kfit.fit(trained, x, targets, minibatch_size=16, epochs=3, seed=0, verbose=0, callbacks=[
            CSVHistory(directory / "history.csv"), kfit.callbacks.Checkpoint(str(directory / "run.ckpt"))], **options)
        columns, rows = read(directory / "history.csv")
        names = dict(zip(trained.output_names, ("output_0", "output_1"), strict=True))  # (the names by place)
        columns = [names.get(c.removesuffix("_loss"), c.removesuffix("_loss")) for c in columns]
        return columns, [[v for k, v in row.items() if k != "time"] for row in rows]

    whole = run(tmp_path / "whole")
    run(tmp_path / "resumed", max_samples=96)
    assert run(tmp_path / "resumed") == whole
    assert whole[0][4:7] == ["loss", "output_0", "output_1"]


def test_under_model_fit_with_a_sample_clock(tmp_path):
    x, y = data(n=40)
    path = tmp_path / "history.csv"
    model = classifier()
    model.fit(x, y, batch_size=16, epochs=2, verbose=0,
              callbacks=[kfit.callbacks.SampleClock(batch_size=16, num_samples=40), CSVHistory(path)])
    rows = read(path)[1]
    # Epochs of 40 samples end on a minibatch of 8: the scheduled size stays 16.
    assert [(r["samples"], r["minibatches"], r["minibatch_size"]) for r in rows] == [("40", "3", "16"), ("80", "6", "16")]


def test_under_model_fit_a_checkpoint_listed_first_resumes_with_every_epochs_row(tmp_path):
    """model.fit calls its callbacks in the user's order: a Checkpoint listed before CSVHistory saved each epoch
    before the epoch's row was written, and the resumed run cut that row from the file (epochs 1, 3, 4). The
    checkpoint now saves once every kfit callback has ended the epoch, whatever their order."""
    x, y = data(n=40)

    def run(directory, epochs):
        keras.utils.set_random_seed(0)
        model = classifier()
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # (the note that model.fit resumes at an epoch's start)
            model.fit(x, y, batch_size=16, epochs=epochs, shuffle=False, verbose=0,
                      callbacks=[kfit.callbacks.Checkpoint(str(directory / "run.ckpt"), epochs=1),
                                 kfit.callbacks.SampleClock(batch_size=16, num_samples=40),
                                 CSVHistory(directory / "history.csv")])
        return [{k: v for k, v in r.items() if k != "time"} for r in read(directory / "history.csv")[1]]

    (tmp_path / "whole").mkdir()
    (tmp_path / "resumed").mkdir()
    whole = run(tmp_path / "whole", 4)
    run(tmp_path / "resumed", 2)
    resumed = run(tmp_path / "resumed", 4)
    assert [r["samples"] for r in resumed] == ["40", "80", "120", "160"]
    assert resumed == whole


def test_a_new_result_widens_the_file(tmp_path):
    path = tmp_path / "history.csv"
    model = keras.Sequential([keras.Input((1,)), keras.layers.Dense(1)])
    clock = attach_clock(model, Clock(epoch_size=10))
    history = CSVHistory(path)
    history.set_model(model)
    history.on_train_begin()
    history.on_epoch_begin(0)
    clock.advance(10)
    history.on_epoch_end(0, {"loss": 1.25})
    history.on_cross_validation_end(0, {"val_loss": 1.5, "val_mae": 0.5, "samples": 10})
    clock.advance(10)
    history.on_epoch_end(1, {"loss": 0.75, "mae": 0.25})
    columns, rows = read(path)
    assert columns == ["kind", "epoch", "samples", "minibatches", "loss", "val_loss", "val_mae", "mae", "lr", "momentum", "minibatch_size", "time"]
    assert [(r["kind"], r["loss"], r["val_mae"], r["mae"]) for r in rows] == [
        ("epoch", "1.25", "", ""), ("cross_validation", "", "0.5", ""), ("epoch", "0.75", "", "0.25"),
    ]


def test_a_file_that_is_not_a_history_is_refused(tmp_path):
    path = tmp_path / "other.csv"
    path.write_text("a,b\n1,2\n")
    model = keras.Sequential([keras.Input((1,)), keras.layers.Dense(1)])
    attach_clock(model, Clock(epoch_size=10))
    history = CSVHistory(path)
    history.set_model(model)
    history.on_train_begin()
    with pytest.raises(ValueError, match="no `samples` column"):
        history.on_epoch_begin(0)


def test_only_the_chief_writes(tmp_path, monkeypatch):
    monkeypatch.setattr(kfit.distributed, "is_chief", lambda: False)
    x, y = data(n=32)
    kfit.fit(classifier(), x, y, batch_size=16, epochs=1, verbose=0, callbacks=[CSVHistory(tmp_path / "h.csv")])
    assert not (tmp_path / "h.csv").exists()


@pytest.mark.parametrize("path", [None, 3, ""])
def test_invalid_path_is_named(path):
    with pytest.raises(ValueError, match="`path`.*path="):
        CSVHistory(path)


@pytest.mark.parametrize("make, name, kind", [
    (lambda path: CSVHistory(path), "path", "file"),
    (lambda path: kfit.callbacks.ProgressPrinter(log_to_file=path), "log_to_file", "file"),
    (lambda path: kfit.callbacks.TensorBoardProgressWriter(path), "log_dir", "folder"),
], ids=["CSVHistory", "ProgressPrinter", "TensorBoardProgressWriter"])
def test_an_output_path_that_cannot_be_written_is_refused_when_the_callback_is_made(make, name, kind, tmp_path):
    """Refused as the callback is made, naming the argument (not an OSError once training has begun)."""
    (tmp_path / "afile").write_text("x")
    with pytest.raises(ValueError, match=rf"`{name}`: .*afile/out' cannot be made, because .*afile' is a file, not a "
                                         "folder"):
        make(tmp_path / "afile" / "out")
    if kind == "file":
        with pytest.raises(ValueError, match=rf"`{name}`: .* is a directory; give a file name in it"):
            make(tmp_path)
    else:
        with pytest.raises(ValueError, match=rf"`{name}`: .*afile' is a file; give a folder"):
            make(tmp_path / "afile")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["afile"] and (tmp_path / "afile").read_text() == "x"
