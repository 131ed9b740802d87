"""Small points where ``kfit.fit`` must behave as ``model.fit`` does, on every backend.

- A mistake ``model.fit`` refuses (``class_weight`` with sample weights, a ``validation_split`` that leaves no
  training or no validation sample) gets ``model.fit``'s own error, exception type and text (kfit may add how to fix
  it), whichever way ``kfit.fit`` trains (``model.fit`` itself, or kfit's stream) and from ``FitOptions``.
- What kfit cannot reproduce it says, once: ``steps_per_execution`` on a source of unknown length at resume.
"""

import warnings

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


# -- steps_per_execution on a source of unknown length read on across epochs --------------------------------------
class _CrashAfter(keras.callbacks.Callback):
    """Crashes as a call of the train function begins once the run has trained ``steps`` steps (kfit's clock)."""

    def __init__(self, steps):
        super().__init__()
        self.steps = steps

    def on_train_batch_begin(self, batch, logs=None):
        if kfit.get_clock(self.model).minibatches >= self.steps:
            raise RuntimeError("crash")


@pytest.mark.skipif(keras.backend.backend() == "torch", reason="Keras's PyTorch trainer refuses steps_per_execution")
def test_steps_per_execution_on_a_source_of_unknown_length_says_once_at_resume_that_it_may_not_be_exact(tmp_path):
    """``compile(steps_per_execution=2)``, a ``tf.data`` pipeline of unknown cardinality (7 batches a pass) read on
    across epochs (``steps_per_epoch=3``): whether the call that finds a pass's end trains the batches it read before it
    depends on the backend's loop, which kfit does not follow; a resumed run says so once, and nothing before."""
    import tensorflow as tf

    from kfit.data import _source

    def train(said, *callbacks):
        keras.utils.set_random_seed(4)
        model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(1)])
        model.compile(optimizer="sgd", loss="mse", steps_per_execution=2)
        data = tf.data.Dataset.from_tensor_slices((X.repeat(5, 0), X[:, :1].repeat(5, 0))).batch(8)
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            try:
                kfit.fit(model, data.filter(lambda x, y: True), epochs=4, steps_per_epoch=3, seed=0, verbose=0,
                         callbacks=[kfit.callbacks.Checkpoint(tmp_path / "run.ckpt", frequency="1mb",
                                                              async_write=False), *callbacks])
            finally:
                said += [str(w.message) for w in caught if "steps_per_execution" in str(w.message)]

    before, at_resume = [], []
    with pytest.raises(RuntimeError, match="crash"):
        train(before, _CrashAfter(4))
    train(at_resume)
    assert before == []
    assert at_resume == [_source.UNKNOWN_LENGTH_MULTI_STEP_RESUME]
    assert at_resume[0].startswith("This resume may not be exact: with compile(steps_per_execution=N) for N > 1, a "
                                   "source whose length Keras does not know (a tf.data pipeline of unknown cardinality")
    assert "For an exact resume use steps_per_execution=1" in at_resume[0]
