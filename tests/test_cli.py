"""The ``kfit`` command line as a user runs it: ``inspect --json``, ``runs``, ``plot`` errors, escaped output,
and a start that imports neither Keras nor a backend. (``kfit runs`` over real runs: test_run_status.py.)"""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
import warnings
from pathlib import Path

import keras
import numpy as np
import pytest

import kfit
from kfit.cli import main as cli

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    """A finished run's checkpoint (2 epochs of 32 samples)."""
    path = tmp_path_factory.mktemp("cli") / "model.ckpt"
    keras.utils.set_random_seed(1)
    model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(2, name="dense")])
    model.compile(optimizer=kfit.optimizers.MomentumSGD(learning_rate=0.01), loss="mse", metrics=["mae"])
    x, y = np.ones((32, 3), "float32"), np.zeros((32, 2), "float32")
    kfit.fit(model, x, y, minibatch_size=8, epochs=2, seed=0, verbose=0,
             callbacks=[kfit.callbacks.Checkpoint(path, async_write=False)])
    return str(path)


def test_inspect_json_is_plain_data_with_the_run_status(checkpoint, capsys):
    assert cli(["inspect", checkpoint, "--json"]) == 0
    info = json.loads(capsys.readouterr().out)
    assert info["path"] == checkpoint and info["checksum_ok"] is True and info["problem"] is None
    assert (info["samples"], info["epoch"], info["minibatches"], info["epoch_size"]) == (64, 2, 8, 32)
    assert (info["status"], info["status_reason"]) == ("complete", "reached epochs=2")
    assert info["optimizer"] == "MomentumSGD" and info["kfit_fit"] is True
    assert info["backend"] == keras.backend.backend()
    kernel = [v for v in info["variables"] if v["path"].endswith("dense/kernel")]
    assert kernel == [{"group": "model", "path": kernel[0]["path"], "shape": [3, 2], "dtype": "float32"}]
    assert set(info["last_metrics"]) >= {"loss", "mae"}


def test_inspect_json_of_a_diverged_run_is_strict_json(tmp_path, capsys):
    """A loss that became NaN or infinite is written as a string float() reads back, not as a bare NaN that
    strict JSON readers refuse."""
    path = tmp_path / "diverged.ckpt"
    model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(2)])
    model.compile(optimizer=kfit.optimizers.MomentumSGD(learning_rate=1e30), loss="mse")
    x = np.full((16, 3), 1e30, "float32")
    kfit.fit(model, x, x[:, :2], minibatch_size=8, epochs=1, seed=0, verbose=0,
             callbacks=[kfit.callbacks.Checkpoint(path, async_write=False)])
    assert cli(["inspect", str(path), "--json"]) == 0
    out = capsys.readouterr().out
    info = json.loads(out, parse_constant=lambda name: pytest.fail(f"bare {name} in the JSON"))
    assert info["last_metrics"]["loss"] in ("NaN", "Infinity")
    assert not math.isfinite(float(info["last_metrics"]["loss"]))


def test_inspect_text_shows_the_status(checkpoint, capsys):
    assert cli(["inspect", checkpoint]) == 0
    out = capsys.readouterr().out
    assert "run status:      complete (reached epochs=2)\n" in out
    assert "checksum:        ok\n" in out


def test_inspect_json_of_a_damaged_file(tmp_path, capsys):
    bad = tmp_path / "bad.ckpt"
    bad.write_bytes(b"not hdf5 at all")
    assert cli(["inspect", str(bad), "--json"]) == 1
    captured = capsys.readouterr()
    assert json.loads(captured.out) == {"path": str(bad), "checksum_ok": False,
                                        "problem": json.loads(captured.out)["problem"]}
    assert "is not a kfit checkpoint" in json.loads(captured.out)["problem"]
    assert captured.err.startswith("kfit inspect: ")


def test_control_characters_from_files_are_escaped(tmp_path, checkpoint, capsys):
    """A file name (or anything read from a file) cannot clear the screen or forge a line of output."""
    name = tmp_path / "evil\x1b[2J\rok.ckpt"
    name.write_bytes(Path(checkpoint).read_bytes())
    assert cli(["inspect", str(name)]) == 0
    out = capsys.readouterr().out
    assert "\x1b" not in out and "\r" not in out
    assert "evil\\x1b[2J\\rok.ckpt" in out
    assert cli(["runs", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert "\x1b" not in out and "evil\\x1b[2J\\rok.ckpt" in out
    damaged = tmp_path / "bad\x07.ckpt"
    damaged.write_bytes(b"\x89HDF\r\n\x1a\n" + b"\x00" * 100)
    assert cli(["runs", str(tmp_path)]) == 1
    captured = capsys.readouterr()
    assert "\x07" not in captured.out + captured.err and "bad\\x07.ckpt" in captured.err


def test_runs_of_an_empty_or_missing_directory(tmp_path, capsys):
    assert cli(["runs", str(tmp_path)]) == 0
    assert capsys.readouterr().out == f"No kfit checkpoints under {tmp_path}.\n"
    assert cli(["runs", str(tmp_path / "nowhere")]) == 2
    assert "is not a directory" in capsys.readouterr().err


def test_runs_lists_checkpoints_damaged_at_their_start_and_no_other_hdf5_files(tmp_path, checkpoint, capsys):
    """A checkpoint whose first bytes are damaged (or that is cut to nothing) is still listed, as DAMAGED; an HDF5
    file kfit did not write (a Keras weights file, a dataset) in the run folder is not a checkpoint at all."""
    import h5py

    data = Path(checkpoint).read_bytes()
    (tmp_path / "model.ckpt").write_bytes(data)
    (tmp_path / "model.ckpt.64").write_bytes(b"X" + data[1:])  # its first byte changed
    (tmp_path / "model.ckpt.32").write_bytes(b"")  # cut to nothing
    (tmp_path / "other.h5").write_bytes(b"\0" * 100)  # named as a checkpoint, with nothing of one
    with h5py.File(tmp_path / "train_data.h5", "w") as f:
        f["x"] = np.zeros((4, 3))
    keras.Sequential([keras.Input((3,)), keras.layers.Dense(2)]).save_weights(tmp_path / "best.weights.h5")
    assert cli(["runs", "--json", str(tmp_path)]) == 1
    rows = json.loads(capsys.readouterr().out)
    listed = {os.path.basename(row["path"]): row["intact"] for row in rows}
    assert listed == {"model.ckpt": True, "model.ckpt.32": False, "model.ckpt.64": False, "other.h5": False}
    assert [os.path.basename(row["path"]) for row in rows][:3] == ["model.ckpt", "model.ckpt.32", "model.ckpt.64"]
    (tmp_path / "model.ckpt").unlink()  # numbered files without their PATH: still by number, not as text
    (tmp_path / "model.ckpt.128").write_bytes(data)
    assert cli(["runs", "--json", str(tmp_path)]) == 1
    rows = json.loads(capsys.readouterr().out)
    assert [os.path.basename(row["path"]) for row in rows][:3] == ["model.ckpt.32", "model.ckpt.64", "model.ckpt.128"]


def test_runs_lists_the_numbered_files_beside_a_linked_checkpoints_target(tmp_path, capsys):
    """run/model.ckpt -> data/model.ckpt (a run folder linked to a larger disk): kfit writes the numbered files
    beside the target, outside the folder listed. They are the run's history, so `kfit runs run` lists them
    after the link, with where they are; the link shows its target."""
    (tmp_path / "run").mkdir()
    (tmp_path / "data").mkdir()
    link = tmp_path / "run" / "model.ckpt"
    os.symlink(tmp_path / "data" / "model.ckpt", link)
    keras.utils.set_random_seed(1)
    model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(2)])
    model.compile(optimizer="sgd", loss="mse")
    x, y = np.ones((32, 3), "float32"), np.zeros((32, 2), "float32")
    kfit.fit(model, x, y, minibatch_size=8, epochs=3, seed=0, verbose=0,
             callbacks=[kfit.callbacks.Checkpoint(link, keep=3, async_write=False)])
    assert sorted(os.listdir(tmp_path / "data")) == ["model.ckpt", "model.ckpt.32", "model.ckpt.64", "model.ckpt.96"]
    assert cli(["runs", "--json", str(tmp_path / "run")]) == 0
    rows = json.loads(capsys.readouterr().out)
    twins = [str(tmp_path / "data" / f"model.ckpt.{n}") for n in (32, 64, 96)]
    assert [(row["path"], row["samples"], row["intact"]) for row in rows] == [
        (str(link), 96, True), (twins[0], 32, True), (twins[1], 64, True), (twins[2], 96, True)]
    assert cli(["runs", str(tmp_path / "run")]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert [line.split("  ")[0] for line in lines[1:]] == [f"model.ckpt -> {tmp_path / 'data' / 'model.ckpt'}",
                                                            *twins]
    os.symlink(tmp_path / "data" / "model.ckpt", tmp_path / "data" / "latest.ckpt")  # a link inside the folder:
    assert cli(["runs", "--json", str(tmp_path)]) == 0  # each file once
    paths = [row["path"] for row in json.loads(capsys.readouterr().out)]
    assert sorted(paths) == sorted([str(tmp_path / "data" / "latest.ckpt"), str(tmp_path / "data" / "model.ckpt"),
                                    *twins, str(link)])


@pytest.mark.parametrize("content, message", [
    (b"kind,samples,loss\nepoch,10,0.5\xff\xfe\n", "is not UTF-8 text (byte 0xff at offset 30)"),
    (b"", "is empty"),
    (b"epoch,loss\n1,0.5\n", "has no `samples` column"),
])
def test_plot_errors_are_one_line_not_a_traceback(tmp_path, capsys, content, message):
    history = tmp_path / "history.csv"
    history.write_bytes(content)
    assert cli(["plot", str(history), "-o", str(tmp_path / "out.png")]) == 1
    err = capsys.readouterr().err
    assert err.startswith(f"kfit plot: {history} ") and message in err and err.count("\n") == 1
    assert not (tmp_path / "out.png").exists()


def test_plot_of_a_missing_file(tmp_path, capsys):
    assert cli(["plot", str(tmp_path / "none.csv"), "-o", str(tmp_path / "out.png")]) == 1
    assert capsys.readouterr().err == f"kfit plot: no such file: {tmp_path / 'none.csv'}\n"


def test_the_cli_imports_neither_keras_nor_a_backend(checkpoint):
    """``import kfit`` is lazy (PEP 562): the command line reads a checkpoint with h5py and NumPy alone."""
    code = (
        "import sys, kfit, kfit.cli\n"
        f"status = kfit.cli.main(['inspect', {checkpoint!r}, '--json'])\n"
        "heavy = sorted(m for m in ('keras', 'tensorflow', 'jax', 'torch') if m in sys.modules)\n"
        "print('HEAVY', heavy, status)\n"
    )
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]))
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=120)
    assert result.returncode == 0, result.stderr[-2000:]
    assert result.stdout.splitlines()[-1] == "HEAVY [] 0"


def test_lazy_names_still_work():
    assert kfit.fit is kfit.training.fit and kfit.Clock is kfit.clock.Clock
    assert kfit.load_checkpoint is kfit.checkpoint.load_checkpoint
    assert {"callbacks", "fit", "schedules"} <= set(dir(kfit))
    with pytest.raises(AttributeError, match="no attribute 'nothing'"):
        kfit.nothing  # noqa: B018


@pytest.mark.parametrize("loss_scaled", [False, True])
def test_inspect_shows_a_learning_rate_schedule_and_the_optimizer_a_loss_scale_optimizer_wraps(tmp_path, capsys,
                                                                                               loss_scaled):
    """An optimizer whose learning rate is a Keras LearningRateSchedule has no learning_rate variable: `kfit inspect`
    showed "learning rate:   -" (under a LossScaleOptimizer, its own unused rate, 0), and "optimizer:
    LossScaleOptimizer" without the optimizer it wraps."""
    path = tmp_path / "run.ckpt"
    keras.utils.set_random_seed(1)
    model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(2)])
    optimizer = keras.optimizers.SGD(keras.optimizers.schedules.ExponentialDecay(0.1, decay_steps=4, decay_rate=0.5))
    model.compile(optimizer=keras.optimizers.LossScaleOptimizer(optimizer) if loss_scaled else optimizer, loss="mse")
    x = np.ones((32, 3), "float32")
    kfit.fit(model, x, x[:, :2], minibatch_size=8, epochs=2, seed=0, verbose=0,
             callbacks=[kfit.callbacks.Checkpoint(path, async_write=False)])
    assert cli(["inspect", str(path)]) == 0
    out = capsys.readouterr().out
    # 8 steps taken: the next step's rate is 0.1 * 0.5 ** (8 / 4)
    assert "learning rate:   ExponentialDecay at step 8: 0.025 (the next step's)\n" in out, out
    assert ("optimizer:       LossScaleOptimizer(SGD)\n" if loss_scaled else "optimizer:       SGD\n") in out, out
    assert cli(["inspect", str(path), "--json"]) == 0
    info = json.loads(capsys.readouterr().out)
    assert info["learning_rate_schedule"] == {"class": "ExponentialDecay", "step": 8, "value": pytest.approx(0.025)}
    assert "learning_rate" not in info["hyperparameters"]
    assert (info["optimizer"], info["inner_optimizer"]) == (("LossScaleOptimizer", "SGD") if loss_scaled else ("SGD", None))
    assert info["optimizer_options"]["nesterov"] is False


def _rate_of_the_day():
    return 0.05


@pytest.mark.parametrize("loss_scaled", [False, True])
@pytest.mark.parametrize("rate", [_rate_of_the_day, lambda: 0.05], ids=["function", "lambda"])
def test_inspect_names_a_learning_rate_given_as_a_python_function(tmp_path, capsys, loss_scaled, rate):
    """A Keras optimizer's learning rate given as a Python function (Keras calls it before each step) has no variable:
    `kfit inspect` showed "learning rate:   -" (under a LossScaleOptimizer "0", its own unused rate), and every
    checkpoint write of a lambda rate warned "The object being serialized includes a `lambda`" (Keras, from the
    optimizer options that the checkpoint records, where the lambda was stored as its bytecode). The text names the
    function by its qualified name; --json has it among the options; no write warns."""
    path = tmp_path / "run.ckpt"
    keras.utils.set_random_seed(1)
    model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(2)])
    optimizer = keras.optimizers.SGD(rate)
    model.compile(optimizer=keras.optimizers.LossScaleOptimizer(optimizer) if loss_scaled else optimizer, loss="mse")
    x = np.ones((16, 3), "float32")
    with warnings.catch_warnings():
        warnings.simplefilter("error", UserWarning)
        kfit.fit(model, x, x[:, :2], minibatch_size=8, epochs=1, seed=0, verbose=0,
                 callbacks=[kfit.callbacks.Checkpoint(path, async_write=False)])
    name = rate.__qualname__
    assert cli(["inspect", str(path)]) == 0
    out = capsys.readouterr().out
    assert f"\nlearning rate:   {name} (a Python function, called before each step: its values are not recorded)\n" \
        in out, out
    assert cli(["inspect", str(path), "--json"]) == 0
    info = json.loads(capsys.readouterr().out)
    assert info["optimizer_options"]["learning_rate"] == f"<function {name}>"
    assert "learning_rate" not in info["hyperparameters"]


@pytest.mark.parametrize("optimizer, line", [
    (lambda: kfit.optimizers.Adam(clipnorm=1.0, weight_decay=0.004),
     "beta_2=0.999, clipnorm=1.0, epsilon=1e-07, weight_decay=0.004"),
    (lambda: kfit.optimizers.Adam(variant="cntk", beta_2=0.9999986111120757, beta_2_minibatch_size=1, epsilon=1e-8),
     "beta_2=0.9999986111120757, beta_2_minibatch_size=1.0, epsilon=1e-08, unit_gain=True, variant='cntk'"),
    (lambda: keras.optimizers.SGD(0.1, momentum=0.9, nesterov=True, use_ema=True),
     "ema_momentum=0.99, momentum=0.9, nesterov=True, use_ema=True"),
])
def test_inspect_text_shows_the_optimizer_options_that_are_set(tmp_path, capsys, optimizer, line):
    """The checkpoint records the optimizer's options (clipnorm, weight_decay, Keras SGD's momentum, ...), which only
    --json showed. The text shows those set (not None or False; the EMA's momentum only with use_ema): without
    Keras, kfit inspect has no class defaults to compare with. Numbers as written in code (CNTK's per-sample beta_2
    is not 0.999999)."""
    path = tmp_path / "run.ckpt"
    keras.utils.set_random_seed(1)
    model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(2)])
    model.compile(optimizer=optimizer(), loss="mse")
    x = np.ones((16, 3), "float32")
    kfit.fit(model, x, x[:, :2], minibatch_size=8, epochs=1, seed=0, verbose=0,
             callbacks=[kfit.callbacks.Checkpoint(path, async_write=False)])
    assert cli(["inspect", str(path)]) == 0
    out = capsys.readouterr().out
    assert f"\noptions:         {line}\nlast metrics:" in out, out
