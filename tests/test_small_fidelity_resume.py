"""A run resumed in the same Python process (a notebook cell run again) in the model built again: Keras numbers the
names of the metrics it names itself anew (``keras.metrics.AUC()`` is ``auc``, then ``auc_1``), and what the checkpoint
restores under the first model's names (the History, the epoch summaries, the CSV history's columns, the progress
printer's running means, the cross-validation results) goes on under the rebuilt model's, as one run's would; the
TensorBoard writer goes on under the tags the run began with, one curve per metric."""

import csv
import re

import keras
import numpy as np
import pytest
from test_tensorboard import read_scalars

import kfit
from kfit import _backend
from kfit.checkpoint._state import _renamed_keys

rng = np.random.default_rng(0)
X = rng.normal(size=(60, 4)).astype("float32")
Y = (X[:, :1] + 0.3 * X[:, 1:2] > 0).astype("float32")


def classifier():
    """Its AUC is named by Keras: ``auc``, ``auc_1``... one more each time it is built in the process."""
    keras.utils.set_random_seed(1)
    model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(1, activation="sigmoid")])
    model.compile(optimizer=keras.optimizers.SGD(0.1, momentum=0.9), loss="binary_crossentropy",
                  metrics=[keras.metrics.AUC(), "accuracy"])
    return model


def auc_name(model):
    return next(name for name in _backend.metric_names(model) if name.startswith("auc"))


def by_role(model, keys):
    """The keys with the model's AUC named ``AUC``: the same for every build of the model."""
    pattern = re.compile(rf"(?<![^_/]){re.escape(auc_name(model))}$")
    return [pattern.sub("AUC", key) for key in keys]


def test_a_notebook_resume_reads_as_one_run_under_the_rebuilt_models_metric_names(tmp_path):
    options = dict(minibatch_size=8, seed=0, epochs=4, verbose=0)

    def callbacks(name):
        return [kfit.callbacks.Checkpoint(tmp_path / f"{name}.ckpt"), kfit.callbacks.CSVHistory(tmp_path / f"{name}.csv"),
                kfit.callbacks.ProgressPrinter(freq=2, log_to_file=str(tmp_path / f"{name}.log")),
                kfit.callbacks.CrossValidation((X[:20], Y[:20]), frequency="1ep"),
                kfit.callbacks.TensorBoardProgressWriter(tmp_path / f"{name}_tb", freq=2)]

    reference, uninterrupted = classifier(), callbacks("reference")
    expected = kfit.fit(reference, X, Y, callbacks=uninterrupted, **options)
    killed = classifier()
    kfit.fit(killed, X, Y, max_samples=144, callbacks=callbacks("run"), **options)  # 24 samples into epoch 3
    model, resumed = classifier(), callbacks("run")
    history = kfit.fit(model, X, Y, callbacks=resumed, **options)

    assert auc_name(model) != auc_name(reference)
    assert_same_history(model, history, reference, expected)
    assert [sorted(by_role(model, s.metrics)) for s in history.epoch_summaries] == [
        sorted(by_role(reference, s.metrics)) for s in expected.epoch_summaries]
    assert [sorted(by_role(model, r)) for r in resumed[3].results] == [
        sorted(by_role(reference, r)) for r in uninterrupted[3].results]
    with open(tmp_path / "run.csv") as run, open(tmp_path / "reference.csv") as file:
        assert sorted(by_role(model, next(csv.reader(run)))) == sorted(by_role(reference, next(csv.reader(file))))

    def minibatch_lines(name, model):  # the progress lines of the minibatches, the AUC named by its role
        lines = (tmp_path / f"{name}.log").read_text().split("Minibatch size")[-1].splitlines()  # (the last run's)
        return [re.sub(rf"\b{auc_name(model)}\b", "AUC", line) for line in lines if line.startswith("Minibatch[")]

    # The resumed run's first interval (minibatches 3-4 of epoch 3, its 3rd before the kill) is their mean, and so on.
    resumed_lines = minibatch_lines("run", model)
    assert resumed_lines[0].startswith("Minibatch[   3-   4]")
    assert resumed_lines == minibatch_lines("reference", reference)[-len(resumed_lines):]

    # TensorBoard: the resumed run's points (after sample 144) go on under the tags the run began with (one curve
    # per metric), the same as the reference's.
    def scalars(name, model):
        return {tag: [(step, pytest.approx(value, rel=1e-6)) for step, value in points if step > 144]
                for tag, points in zip(by_role(model, read_scalars(tmp_path / f"{name}_tb")),
                                       read_scalars(tmp_path / f"{name}_tb").values(), strict=True)
                if "AUC" in tag}

    assert not [tag for tag in read_scalars(tmp_path / "run_tb") if auc_name(model) in tag]
    assert sorted(scalars("run", killed)) == ["AUC", "minibatch/AUC", "val_AUC"]
    assert scalars("run", killed) == scalars("reference", reference)


def test_plain_model_fit_with_a_checkpoint_resumes_under_the_rebuilt_models_metric_names(tmp_path):
    path = tmp_path / "run.ckpt"
    reference = classifier()
    expected = reference.fit(X, Y, batch_size=8, epochs=4, shuffle=False, verbose=0)
    classifier().fit(X, Y, batch_size=8, epochs=2, shuffle=False, verbose=0, callbacks=[kfit.callbacks.Checkpoint(path)])
    model = classifier()
    history = model.fit(X, Y, batch_size=8, epochs=4, shuffle=False, verbose=0,
                        callbacks=[kfit.callbacks.Checkpoint(path)])
    assert history.epoch == [0, 1, 2, 3]
    assert_same_history(model, history, reference, expected)


def assert_same_history(model, history, reference, expected):
    """The same keys (by role) and values, each key's list as long as the run."""
    got = dict(zip(by_role(model, history.history), history.history.values(), strict=True))
    want = dict(zip(by_role(reference, expected.history), expected.history.values(), strict=True))
    assert sorted(got) == sorted(want)
    for key in want:
        np.testing.assert_allclose(got[key], want[key], rtol=1e-6, err_msg=key)


@pytest.mark.parametrize("saved, now, keys, expected", [
    # a metric renumbered: a key it ends is renamed, after a prefix or an output's name
    ({"metrics": ["auc", "accuracy"]}, {"metrics": ["auc_1", "accuracy"]},
     ["auc", "val_auc", "minibatch/auc", "loss", "accuracy", "val_loss"],
     ["auc_1", "val_auc_1", "minibatch/auc_1", "loss", "accuracy", "val_loss"]),
    ({"metrics": ["auc", "auc_1"]}, {"metrics": ["auc_1", "auc_2"]},  # each once: not auc -> auc_1 -> auc_2
     ["auc", "auc_1", "val_auc", "val_auc_1"], ["auc_1", "auc_2", "val_auc_1", "val_auc_2"]),
    ({"outputs": ["dense_1", "dense_2"], "metrics": ["auc", "auc_1"]},
     {"outputs": ["dense_4", "dense_5"], "metrics": ["auc_2", "auc_3"]},
     ["dense_1_auc", "val_dense_2_auc_1", "dense_1_loss"], ["dense_4_auc_2", "val_dense_5_auc_3", "dense_4_loss"]),
    # another metric in a place (not a renumbering), another count, or a checkpoint that names none: none renamed
    ({"metrics": ["auc", "precision"]}, {"metrics": ["auc_1", "recall"]}, ["auc", "precision"], None),
    ({"metrics": ["auc"]}, {"metrics": ["auc_1", "accuracy"]}, ["auc"], None),
    ({}, {"metrics": ["auc_1"]}, ["auc"], None),
])
def test_which_log_keys_a_resume_renames(saved, now, keys, expected):
    renamed = _renamed_keys(saved, {"outputs": [], **now})
    assert (None if renamed is None else [renamed(key) for key in keys]) == expected
