"""Small points where ``kfit.fit`` must behave as ``model.fit`` does, on every backend.

- A mistake ``model.fit`` refuses (``class_weight`` with sample weights, a ``validation_split`` that leaves no
  training or no validation sample) gets ``model.fit``'s own error, exception type and text (kfit may add how to fix
  it), whichever way ``kfit.fit`` trains (``model.fit`` itself, or kfit's stream) and from ``FitOptions``.
"""

import keras
import numpy as np
import pytest

import kfit
from kfit.training._options import FitOptions

N = 10
rng = np.random.default_rng(0)
X = rng.normal(size=(N, 3)).astype("float32")
LABELS = rng.integers(0, 2, size=N)
WEIGHTS = np.ones(N, "float32")
CLASS_WEIGHT = {0: 1.0, 1: 2.0}


def classifier():
    keras.utils.set_random_seed(1)
    model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(2, activation="softmax")])
    model.compile(optimizer="sgd", loss="sparse_categorical_crossentropy")
    return model


def two_outputs():
    keras.utils.set_random_seed(1)
    inputs = keras.Input((3,))
    outputs = {"a": keras.layers.Dense(2, activation="softmax", name="a")(inputs),
               "b": keras.layers.Dense(2, activation="softmax", name="b")(inputs)}
    model = keras.Model(inputs, outputs)
    model.compile(optimizer="sgd", loss="sparse_categorical_crossentropy")
    return model


class WeightedBatches(keras.utils.PyDataset):
    """Batches of ``(x, y, sample_weight)``."""

    def __len__(self):
        return 2

    def __getitem__(self, index):
        rows = slice(5 * index, 5 * index + 5)
        return X[rows], LABELS[rows], WEIGHTS[rows]


def _raised(call):
    with pytest.raises(Exception) as info:
        call()
    return info.value


# (model, the data and arguments given to both model.fit and kfit.fit)
MISTAKES = {
    "class_weight with sample_weight": (classifier, dict(x=X, y=LABELS, sample_weight=WEIGHTS,
                                                         class_weight=CLASS_WEIGHT)),
    "class_weight with a dataset's sample weights": (classifier, dict(x=WeightedBatches(), class_weight=CLASS_WEIGHT)),
    "class_weight with several outputs": (two_outputs, dict(x=X, y={"a": LABELS, "b": LABELS},
                                                            class_weight=CLASS_WEIGHT)),
    "validation_split=1.0": (classifier, dict(x=X, y=LABELS, validation_split=1.0)),
    "validation_split=1": (classifier, dict(x=X, y=LABELS, validation_split=1)),
    "validation_split leaving no training row": (classifier, dict(x=X, y=LABELS, validation_split=0.95)),
    "validation_split with class_weight and sample_weight": (classifier, dict(
        x=X, y=LABELS, sample_weight=WEIGHTS, class_weight=CLASS_WEIGHT, validation_split=1.0)),
}


@pytest.mark.parametrize("name", MISTAKES)
@pytest.mark.parametrize("path", [{}, {"seed": 0}], ids=["model.fit", "kfit's stream"])
def test_kfit_fit_refuses_as_model_fit_does(name, path):
    make, arguments = MISTAKES[name]
    expected = _raised(lambda: make().fit(**arguments, verbose=0))
    got = _raised(lambda: kfit.fit(make(), **arguments, **path, verbose=0))
    assert isinstance(got, type(expected)), (type(got), type(expected))
    assert str(got).startswith(str(expected)), (str(got), str(expected))


@pytest.mark.parametrize("name", ["class_weight with sample_weight", "validation_split=1.0",
                                  "validation_split leaving no training row"])
def test_fit_options_refuse_as_model_fit_does(name):
    make, arguments = MISTAKES[name]
    expected = _raised(lambda: make().fit(**arguments, verbose=0))
    options = {k: v for k, v in arguments.items() if k not in ("x", "y")}
    got = _raised(lambda: FitOptions.from_arguments(num_samples=len(arguments["x"]), **options))
    assert isinstance(got, type(expected)) and str(got).startswith(str(expected)), (str(got), str(expected))


@pytest.mark.parametrize("path", [{}, {"seed": 0}], ids=["model.fit", "kfit's stream"])
def test_validation_data_overrides_validation_split_as_in_model_fit(path):
    """``model.fit`` ignores ``validation_split`` when ``validation_data`` is given: every row trains."""
    arguments = dict(x=X, y=LABELS, validation_split=1.0, validation_data=(X[:4], LABELS[:4]), batch_size=4,
                     shuffle=False, verbose=0)
    expected = classifier().fit(**arguments).history
    history = kfit.fit(classifier(), **arguments, **path)
    assert [s.samples for s in history.epoch_summaries] == [N]
    np.testing.assert_allclose(history.history["val_loss"], expected["val_loss"], rtol=1e-6)
