"""kfit plot: training curves from a CSV history, in one PNG."""

import importlib

import keras
import numpy as np
import pytest

import kfit
from kfit.plotting import plot_history

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


@pytest.fixture(scope="module")
def history_csv(tmp_path_factory):
    """A CSV history of a real run (3 epochs, a minibatch-size and a learning-rate schedule, cross-validation)."""
    tmp_path = tmp_path_factory.mktemp("history")
    rng = np.random.default_rng(0)
    x = rng.normal(size=(96, 4)).astype("float32")
    y = x[:, :3].argmax(axis=1).astype("int64")
    model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(8, activation="tanh"), keras.layers.Dense(3)])
    model.compile(optimizer=kfit.optimizers.MomentumSGD(learning_rate=0.05),
                  loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True), metrics=["accuracy"])
    path = tmp_path / "history.csv"
    callbacks = [
        kfit.callbacks.LearningRateSchedule(kfit.schedules.learning_rate_per_sample([0.002, 0.001, 0.0002], epoch_size=96)),
        kfit.callbacks.CrossValidation((x[:48], y[:48]), frequency=48, minibatch_size=16),
        kfit.callbacks.CSVHistory(path),
    ]
    sizes = kfit.schedules.minibatch_size([16, 16, 32], epoch_size=96)
    kfit.fit(model, x, y, minibatch_size=sizes, epochs=3, seed=0, verbose=0, callbacks=callbacks,
             validation_data=(x[48:], y[48:]))
    return path


def test_plot_writes_a_png(tmp_path, history_csv):
    out = plot_history(history_csv, tmp_path / "plots" / "curves.png")
    assert out == tmp_path / "plots" / "curves.png"
    data = out.read_bytes()
    assert data.startswith(PNG_MAGIC) and len(data) > 20_000
    width, height = int.from_bytes(data[16:20], "big"), int.from_bytes(data[20:24], "big")
    assert (width, height) == (1200, 800)


def test_the_command_line(tmp_path, history_csv):
    cli = importlib.import_module("kfit.cli")
    out = tmp_path / "cli.png"
    cli.main(["plot", str(history_csv), "-o", str(out)])
    assert out.read_bytes().startswith(PNG_MAGIC)


def test_a_history_without_samples_is_refused(tmp_path):
    path = tmp_path / "bad.csv"
    path.write_text("epoch,loss\n1,0.5\n")
    with pytest.raises(ValueError, match="no `samples` column"):
        plot_history(path, tmp_path / "x.png")
    with pytest.raises(FileNotFoundError):
        plot_history(tmp_path / "missing.csv", tmp_path / "x.png")


def test_sparse_columns_still_plot(tmp_path):
    path = tmp_path / "h.csv"
    path.write_text("kind,epoch,samples,minibatches,loss,lr,momentum,minibatch_size,time\nepoch,1,10,1,0.5,,,,1\nepoch,2,20,2,0.25,,,,2\n")
    out = plot_history(str(path), str(tmp_path / "sparse.png"))
    assert out.read_bytes().startswith(PNG_MAGIC)


def test_a_last_row_cut_short_is_left_out(tmp_path, history_csv):
    """A run killed (or a disk filled) while CSVHistory appended a row leaves it cut short: the picture is the one
    of the rows before it."""
    (tmp_path / "whole").mkdir()
    (tmp_path / "cut").mkdir()
    text = history_csv.read_text()
    (tmp_path / "whole" / "history.csv").write_text(text)
    (tmp_path / "cut" / "history.csv").write_text(text + "epoch,4\n")
    whole = plot_history(tmp_path / "whole" / "history.csv", tmp_path / "whole.png").read_bytes()
    cut = plot_history(tmp_path / "cut" / "history.csv", tmp_path / "cut.png").read_bytes()
    assert cut == whole and whole.startswith(PNG_MAGIC)


def test_the_picture_is_a_file_named_with_its_format(tmp_path, history_csv, capsys):
    cli = importlib.import_module("kfit.cli")
    assert cli.main(["plot", str(history_csv), "-o", str(tmp_path / "curves")]) == 0
    assert capsys.readouterr().out == f"wrote {tmp_path / 'curves.png'}\n"
    assert (tmp_path / "curves.png").read_bytes().startswith(PNG_MAGIC)
    assert cli.main(["plot", str(history_csv), "-o", str(tmp_path)]) == 1
    assert capsys.readouterr().err == (f"kfit plot: {tmp_path} is a directory: give the picture's file name, e.g. "
                                       f"{tmp_path / 'curves.png'}.\n")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["curves.png"]
