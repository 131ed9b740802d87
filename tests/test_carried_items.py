"""Items carried over: a resume in the model built again whose per-output metrics Keras numbers anew; a checkpoint of
a run on data of known length resumed on data of unknown length, and the reverse."""

import csv

import keras
import numpy as np

import kfit

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
    import re
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
