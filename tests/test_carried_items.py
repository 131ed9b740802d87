"""Items carried over: a resume in the model built again whose per-output metrics Keras numbers anew; a checkpoint of
a run on data of known length resumed on data of unknown length, and the reverse."""

import csv
import re

import keras
import numpy as np
import pytest
import torch

import kfit
from kfit.callbacks._base import KfitCallback

rng = np.random.default_rng(0)
X = rng.normal(size=(60, 4)).astype("float32")
Y = (X[:, :1] + 0.3 * X[:, 1:2] > 0).astype("float32")


def two_outputs():
    """Outputs ``zeta`` then ``alpha`` (a list: not in sorted order), each with a ``keras.metrics.AUC()``, given as a dict:
    Keras names them ``auc``, ``auc_1``... one more each time the model is built in the process."""
    keras.utils.set_random_seed(1)
    inputs = keras.Input((4,))
    outputs = [keras.layers.Dense(1, activation="sigmoid", name=name)(inputs) for name in ("zeta", "alpha")]
    model = keras.Model(inputs, outputs)
    model.compile(optimizer=keras.optimizers.SGD(0.1), loss="binary_crossentropy",
                  metrics={"zeta": [keras.metrics.AUC()], "alpha": [keras.metrics.AUC(), "accuracy"]})
    return model


def by_role(keys):
    """Each key with Keras's numbering of the AUC removed: the same for every build of the model."""
    return sorted(re.sub(r"auc(_\d+)?$", "AUC", key) for key in keys)


def test_a_resume_in_the_rebuilt_model_renames_per_output_metrics_given_as_a_dict(tmp_path):
    y = {"zeta": Y, "alpha": 1 - Y}
    options = dict(minibatch_size=8, seed=0, epochs=3, verbose=0)

    def callbacks(name):
        return [kfit.callbacks.Checkpoint(tmp_path / f"{name}.ckpt"), kfit.callbacks.CSVHistory(tmp_path / f"{name}.csv"),
                kfit.callbacks.CrossValidation((X[:20], {"zeta": Y[:20], "alpha": 1 - Y[:20]}), frequency="1ep")]

    reference, uninterrupted = two_outputs(), callbacks("reference")
    expected = kfit.fit(reference, X, y, callbacks=uninterrupted, **options)
    kfit.fit(two_outputs(), X, y, max_samples=96, callbacks=callbacks("run"), **options)
    model, resumed = two_outputs(), callbacks("run")
    history = kfit.fit(model, X, y, callbacks=resumed, **options)

    zeta_auc = next(key for key in history.history if key.startswith("zeta_auc"))
    assert zeta_auc != next(key for key in expected.history if key.startswith("zeta_auc"))  # renumbered
    assert by_role(history.history) == by_role(expected.history)
    for key in history.history:
        assert len(history.history[key]) == 3, key
    assert [by_role(r) for r in resumed[2].results] == [by_role(r) for r in uninterrupted[2].results]
    with open(tmp_path / "run.csv") as run, open(tmp_path / "reference.csv") as file:
        assert by_role(next(csv.reader(run))) == by_role(next(csv.reader(file)))


def test_plain_model_fit_resumes_per_output_metrics_given_as_a_dict_under_the_rebuilt_models_names(tmp_path):
    # (on TensorFlow the restore comes before Keras builds the compiled metrics: their names are read from compile's)
    y, path = {"zeta": Y, "alpha": 1 - Y}, tmp_path / "run.ckpt"
    reference = two_outputs()
    expected = reference.fit(X, y, batch_size=8, epochs=3, shuffle=False, verbose=0)
    two_outputs().fit(X, y, batch_size=8, epochs=1, shuffle=False, verbose=0, callbacks=[kfit.callbacks.Checkpoint(path)])
    history = two_outputs().fit(X, y, batch_size=8, epochs=3, shuffle=False, verbose=0,
                                callbacks=[kfit.callbacks.Checkpoint(path)])
    assert by_role(history.history) == by_role(expected.history)
    for key, values in expected.history.items():
        renamed = next(k for k in history.history if by_role([k]) == by_role([key]))
        np.testing.assert_allclose(history.history[renamed], values, rtol=1e-6, err_msg=key)


class Batches(torch.utils.data.IterableDataset):
    """X, Y in batches of 8 (the last of 4), of a length no one is told."""

    def __iter__(self):
        for start in range(0, 60, 8):
            yield X[start:start + 8], Y[start:start + 8]


def data(kind):
    return dict(x=X, y=Y) if kind == "arrays" else dict(x=torch.utils.data.DataLoader(Batches(), batch_size=None))


def regressor():
    keras.utils.set_random_seed(1)
    model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(1)])
    model.compile(optimizer=keras.optimizers.SGD(0.1), loss="mse")
    return model


class EpochEnds(KfitCallback):
    """The clock's samples and epoch_size as each epoch ends."""

    def __init__(self):
        super().__init__()
        self.ends = []

    def on_epoch_end(self, epoch, logs=None):
        self.ends.append((epoch, self.clock.samples, self.clock.epoch_size))


@pytest.mark.parametrize("saved_on, resumed_on, killed_at", [
    ("arrays", "loader", 40),  # 40 samples into epoch 1: at the end of the loader's 5th batch
    ("loader", "arrays", 40),  # (before the loader's epoch_size is known)
    ("loader", "arrays", 96),  # (stops at 100: 40 samples into epoch 2)
])
def test_kfit_fit_resumes_across_data_of_known_and_unknown_length_on_the_clock_of_the_checkpoint(
        tmp_path, saved_on, resumed_on, killed_at):
    path, options = tmp_path / "run.ckpt", dict(minibatch_size=8, shuffle=False, epochs=3, verbose=0)
    kfit.fit(regressor(), **data(saved_on), max_samples=killed_at, callbacks=[kfit.callbacks.Checkpoint(path)],
             **options)
    ends = EpochEnds()
    history = kfit.fit(regressor(), **data(resumed_on), callbacks=[kfit.callbacks.Checkpoint(path), ends], **options)
    assert history.epoch == [0, 1, 2]
    assert ends.ends[-2:] == [(1, 120, 60), (2, 180, 60)]  # epochs of 60 samples, as one run on either data's


def test_kfit_fit_refuses_a_resume_where_the_sources_batches_do_not_end_at_the_checkpoints_position(tmp_path):
    # Saved on arrays 36 samples into epoch 2; the loader's batches end at 32 and 40: going on would train 4 samples
    # fewer than the clock says, and every epoch would end 4 samples short of where the clock puts it.
    path, options = tmp_path / "run.ckpt", dict(minibatch_size=8, shuffle=False, epochs=3, verbose=0)
    kfit.fit(regressor(), X, Y, max_samples=96, callbacks=[kfit.callbacks.Checkpoint(path)], **options)
    with pytest.raises(ValueError, match=re.escape("36 samples") + ".*do not end there.*40"):
        kfit.fit(regressor(), **data("loader"), callbacks=[kfit.callbacks.Checkpoint(path)], **options)


@pytest.mark.parametrize("saved_on, resumed_on", [("arrays", "loader"), ("loader", "arrays")])
def test_model_fit_resumes_across_data_of_known_and_unknown_length_at_an_epochs_end(tmp_path, capfd, saved_on,
                                                                                    resumed_on):
    path, ends = tmp_path / "run.ckpt", EpochEnds()
    regressor().fit(**data(saved_on), batch_size=8, shuffle=False, epochs=1, verbose=0,
                    callbacks=[kfit.callbacks.Checkpoint(path), kfit.callbacks.SampleClock(8)])
    capfd.readouterr()
    history = regressor().fit(**data(resumed_on), batch_size=8, shuffle=False, epochs=3, verbose=0,
                              callbacks=[kfit.callbacks.Checkpoint(path), ends, kfit.callbacks.SampleClock(8)])
    assert history.epoch == [0, 1, 2]
    # The resume line says where the checkpoint was: at the end of the first epoch (not "epoch 1, 64 samples in" where
    # the clock did not know the epoch's size).
    where = "end of epoch 1" if saved_on == "arrays" else "1 epoch ended"
    assert f"resumed from {path} at sample 64 ({where}; " in capfd.readouterr().err
    # SampleClock(8) counts each of the 8 steps of an epoch as 8 samples (the last one's 4 not told apart)
    assert [(epoch, samples) for epoch, samples, _ in ends.ends] == [(1, 128), (2, 192)]
