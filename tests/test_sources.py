"""Sources that batch by themselves (tf.data, Grain, generators, torch DataLoaders, endless PyDatasets), sparse
inputs and Keras's ``steps_per_epoch`` epochs on arrays, with kfit's features.

They train through ``kfit.fit`` as through ``model.fit``; kfit's clock counts their samples; a checkpoint
resumes them by skipping ahead, which reproduces an uninterrupted run when the source yields the same
minibatches in the same order.
"""

import functools
import importlib.util
import warnings

import keras
import numpy as np
import pytest
import tensorflow as tf
from helpers import mlp, regression_data, weights

import kfit


def compiled(model, optimizer=None):
    model.compile(optimizer=optimizer or kfit.optimizers.MomentumSGD(learning_rate=0.01, momentum=0.9), loss="mse")
    return model


X, Y = regression_data(50)


def tf_dataset(batch_size=8):
    return tf.data.Dataset.from_tensor_slices((X, Y)).batch(batch_size)


def finite_generator(batch_size=8):
    for start in range(0, len(X), batch_size):
        yield X[start:start + batch_size], Y[start:start + batch_size]


def endless_generator(batch_size=8):
    while True:
        yield from finite_generator(batch_size)


def torch_loader(batch_size=8):
    import torch

    dataset = torch.utils.data.TensorDataset(torch.from_numpy(X), torch.from_numpy(Y))
    return torch.utils.data.DataLoader(dataset, batch_size=batch_size, shuffle=False)


def grain_dataset(batch_size=8):
    import grain

    class Rows(grain.sources.RandomAccessDataSource):
        def __len__(self):
            return len(X)

        def __getitem__(self, index):
            return X[index], Y[index]

    return grain.MapDataset.source(Rows()).batch(batch_size)


SOURCES = {
    "grain": (grain_dataset, {}),
    "tf.data": (tf_dataset, {}),
    "generator": (finite_generator, {}),
    "endless_generator": (endless_generator, {"steps_per_epoch": 7}),
    "DataLoader": (torch_loader, {}),
}


#: Keras reads Grain datasets from 3.11 (model.fit refuses one before: "Unrecognized data type").
_READS_GRAIN = importlib.util.find_spec("keras.src.trainers.data_adapters.grain_dataset_adapter") is not None


def kinds(*params):
    """The kinds of source (or tuples beginning with one) as parameters: Grain's only where Keras reads Grain."""
    no_grain = pytest.mark.skipif(not _READS_GRAIN, reason=f"Keras {keras.__version__} reads no Grain dataset "
                                  "(Keras 3.11 and later do; model.fit refuses one)")
    return [pytest.param(*(p if isinstance(p, tuple) else (p,)),
                         marks=[no_grain] if (p[0] if isinstance(p, tuple) else p) == "grain" else [])
            for p in params]


UNKNOWN_CARDINALITY = "tf.data of unknown cardinality"
#: Sources read from their start at every epoch; the last two' length Keras's adapter does not know.
SOURCES_OF_ONE_PASS = {
    "DataLoader": SOURCES["DataLoader"],
    "tf.data": SOURCES["tf.data"],
    "grain": SOURCES["grain"],
    UNKNOWN_CARDINALITY: (lambda batch_size=8: tf_dataset(batch_size).filter(lambda x, y: True), {}),
}


@pytest.mark.parametrize("kind", kinds(*sorted(SOURCES)))
def test_a_source_trains_as_under_model_fit_and_the_clock_counts_its_samples(kind):
    make, options = SOURCES[kind]
    epochs = 1 if kind == "generator" else 2
    results = []
    for loop in ("model.fit", "kfit.fit"):
        model = compiled(mlp(), keras.optimizers.SGD(0.01, momentum=0.9))
        if loop == "model.fit":
            history = model.fit(make(), epochs=epochs, verbose=0, **options)
        else:
            history = kfit.fit(model, make(), epochs=epochs, seed=0, verbose=0, **options)
        results.append((weights(model), history))
    (w_keras, h_keras), (w_kfit, h_kfit) = results
    for a, b in zip(w_keras, w_kfit):
        np.testing.assert_array_equal(a, b)
    assert h_kfit.history == h_keras.history
    # One pass over 50 samples (an endless generator's 7 steps are one pass too: 6 of 8, one of 2).
    assert [s.samples for s in h_kfit.epoch_summaries] == [50] * epochs


@pytest.mark.parametrize("kind", kinds("grain"))
def test_a_grain_dataset_trains_as_under_model_fit_where_keras_reads_it_as_numpy_no_more(kind, monkeypatch):
    """Keras 3.11-3.13 read a Grain dataset as NumPy (``get_numpy_iterator``) through a module Grain 0.2.16 moved:
    with a newer Grain that method fails, while model.fit (the backend's own iterator) trains. kfit.fit (which
    looks at the first batch as NumPy) trains as model.fit. The failure is made here, on any Keras."""
    from keras.src.trainers.data_adapters.grain_dataset_adapter import GrainDatasetAdapter

    def moved(self):
        raise ModuleNotFoundError("No module named 'grain._src.python.shared_memory_array'")

    monkeypatch.setattr(GrainDatasetAdapter, "get_numpy_iterator", moved)
    results = []
    for loop in ("model.fit", "kfit.fit"):
        model = compiled(mlp(), keras.optimizers.SGD(0.01, momentum=0.9))
        if loop == "model.fit":
            history = model.fit(grain_dataset(), epochs=2, verbose=0)
        else:
            history = kfit.fit(model, grain_dataset(), epochs=2, seed=0, verbose=0)
        results.append((weights(model), history.history))
    for a, b in zip(results[0][0], results[1][0]):
        np.testing.assert_array_equal(a, b)
    assert results[1][1] == results[0][1]


class _BatchEnds(keras.callbacks.Callback):
    """Records Keras's batch-end hooks: the step index and the logs each one gets."""

    def __init__(self):
        super().__init__()
        self.seen = []

    def on_train_batch_end(self, batch, logs=None):
        self.seen.append((batch, dict(logs or {})))


@pytest.mark.skipif(keras.backend.backend() == "torch", reason="Keras: steps_per_execution must be 1 with PyTorch")
@pytest.mark.parametrize("kind", ["tf.data", "endless tf.data", UNKNOWN_CARDINALITY, "DataLoader"])
def test_a_source_trained_in_calls_of_several_steps_trains_as_under_model_fit(kind):
    """``compile(steps_per_execution=3)`` on passes of 7 batches (the last call runs one step, of 2 samples) and on an
    endless pipeline read 6 steps an epoch: the same weights, optimizer iterations (Adam's bias correction counts
    them), batch hooks with their logs, and History as model.fit's; kfit's clock counts the samples trained."""
    make, options, samples = {
        "tf.data": (tf_dataset, {}, 100),
        "endless tf.data": (lambda: tf_dataset().repeat(), {"steps_per_epoch": 6}, 48 + 2 + 40),
        UNKNOWN_CARDINALITY: (SOURCES_OF_ONE_PASS[UNKNOWN_CARDINALITY][0], {}, 100),
        "DataLoader": (torch_loader, {}, 100),
    }[kind]
    results = []
    for loop in ("model.fit", "kfit.fit"):
        model = mlp()
        model.compile(optimizer=keras.optimizers.Adam(0.01), loss="mse", steps_per_execution=3)
        ends = _BatchEnds()
        if loop == "model.fit":
            history = model.fit(make(), epochs=2, verbose=0, callbacks=[ends], **options)
        else:
            history = kfit.fit(model, make(), epochs=2, seed=0, verbose=0, callbacks=[ends], **options)
        results.append((model, history, ends.seen))
    (keras_model, keras_history, keras_ends), (model, history, ends) = results
    for a, b in zip(weights(keras_model), weights(model)):
        np.testing.assert_array_equal(a, b)
    assert int(model.optimizer.iterations) == int(keras_model.optimizer.iterations)
    assert ends == keras_ends
    assert history.history == keras_history.history
    assert kfit.get_clock(model).samples == samples


@pytest.mark.skipif(keras.backend.backend() == "torch", reason="Keras: steps_per_execution must be 1 with PyTorch")
@pytest.mark.parametrize(("stop_at", "restored_at"), [(40, 48), (56, 74)])  # inside a call; in the call across an epoch's end
def test_a_source_trained_in_calls_of_several_steps_resumes_to_the_uninterrupted_run(stop_at, restored_at, tmp_path):
    """``steps_per_execution=3`` on a reshuffling tf.data pipeline: a run stops after the call that reaches
    ``max_samples`` and resumes from there to the uninterrupted run's weights and optimizer iterations (Adam)."""
    def reshuffling():
        return tf.data.Dataset.from_tensor_slices((X, Y)).shuffle(50, seed=3).batch(8)

    def model():
        m = mlp()
        m.compile(optimizer=keras.optimizers.Adam(0.01), loss="mse", steps_per_execution=3)
        return m

    reference = model()
    kfit.fit(reference, reshuffling(), epochs=3, seed=0, verbose=0)
    path = tmp_path / "run.ckpt"
    kfit.fit(model(), reshuffling(), epochs=3, seed=0, verbose=0, max_samples=stop_at,
             callbacks=[kfit.callbacks.Checkpoint(path, frequency=1000)])
    resumed = model()
    checkpoint = kfit.callbacks.Checkpoint(path, frequency=1000)
    kfit.fit(resumed, reshuffling(), epochs=3, seed=0, verbose=0, callbacks=[checkpoint])
    assert checkpoint.restored_from.samples == restored_at
    assert kfit.get_clock(resumed).samples == 150
    for a, b in zip(weights(reference), weights(resumed)):
        np.testing.assert_array_equal(a, b)
    assert int(resumed.optimizer.iterations) == int(reference.optimizer.iterations) == 21


@pytest.mark.skipif(keras.backend.backend() != "tensorflow", reason="the TensorFlow train function's Python path")
def test_kerass_tensorflow_train_function_reads_kfits_reader_in_calls_to_the_passs_end():
    """What Keras's loop relies on, asked of its own train function (``steps_per_execution=3``) over a pass of 4
    batches handed by ``_backend.python_steps_dataset``: a call of 3 steps, a call of the last step (its logs), then
    the pass's end as tf.data says it (OutOfRangeError, which Keras's loop takes for the epoch's end), also when
    asked again."""
    from kfit import _backend

    model = mlp()
    model.compile(optimizer=keras.optimizers.SGD(0.01), loss="mse", steps_per_execution=3)
    batches = [(tf.constant(X[i:i + 8]), tf.constant(Y[i:i + 8])) for i in range(0, 32, 8)]
    spec = tf.data.Dataset.from_tensor_slices((X, Y)).batch(8).element_spec
    model.make_train_function()
    iterator = iter(_backend.python_steps_dataset(lambda: iter(batches), spec, 3))
    model.train_function(iterator)
    assert int(model.optimizer.iterations) == 3
    logs = model.train_function(iterator)
    assert int(model.optimizer.iterations) == 4 and "loss" in logs
    for _ in range(2):
        with pytest.raises(tf.errors.OutOfRangeError):
            model.train_function(iterator)
    assert int(model.optimizer.iterations) == 4


# An endless generator read with steps_per_epoch (Keras's usual way with generators) resumes exactly; a finite
# generator trained for one epoch is not claimed exact here (Keras re-yields a generator's peeked first batches
# when it reopens it).
@pytest.mark.parametrize("kind", kinds("DataLoader", "endless_generator", "grain", "tf.data"))
def test_a_source_resumes_by_skipping_ahead_to_the_uninterrupted_run(kind, tmp_path, capfd):
    make, options = SOURCES[kind]
    epochs = 1 if kind == "generator" else 3
    reference = compiled(mlp())
    kfit.fit(reference, make(), epochs=epochs, seed=0, verbose=0, **options)

    path = tmp_path / "run.ckpt"
    kfit.fit(compiled(mlp()), make(), epochs=epochs, max_samples=32 if kind == "generator" else 80, seed=0,
             verbose=0, callbacks=[kfit.callbacks.Checkpoint(path, frequency=1000)], **options)
    resumed = compiled(mlp())
    checkpoint = kfit.callbacks.Checkpoint(path, frequency=1000)
    history = kfit.fit(resumed, make(), epochs=epochs, seed=0, verbose=0, callbacks=[checkpoint], **options)
    # The step that reaches max_samples ends the run: 8 * 4 = 32; 50 (a pass) + 8 * 4 = 82 >= 80.
    assert checkpoint.restored_from.samples == (32 if kind == "generator" else 82)
    err = capfd.readouterr().err
    if kind == "tf.data":  # it also restarts the epoch's saved pass
        assert "the tf.data source restarts epoch 2 from its iterator's state" in err, err
    elif kind == "DataLoader":  # and the random states its pass was drawn from
        assert "the DataLoader source restarts epoch 2 from the states of the random generators" in err, err
    else:
        assert "cannot seek: resuming at sample" in err, err
    for a, b in zip(weights(reference), weights(resumed)):
        np.testing.assert_array_equal(a, b)
    assert kfit.get_clock(resumed).samples == 50 * epochs and history.epoch_summaries[-1].samples == (
        50 if kind != "generator" else 50 - 32)  # the last epoch: whole, or what was left after the resume


@pytest.mark.parametrize(("kind", "stop_at", "frequency"), kinds(
    *((kind, 50, 10) for kind in SOURCES_OF_ONE_PASS),  # the first pass's end, saved at every step
    *((kind, 20, 1000) for kind in SOURCES_OF_ONE_PASS),  # inside it, saved when it stops
))
def test_a_run_stopped_in_or_at_the_end_of_the_first_pass_resumes_to_the_uninterrupted_run(kind, stop_at, frequency,
                                                                                           tmp_path):
    """Before the first pass ends kfit does not know a source's epoch length. A run stopped at the first pass's last
    step (of a pass of whole minibatches: 5 of 10) was saved as "epoch 1, 50 samples in": the resumed run trained a
    whole epoch more (the optimizer 5 steps ahead). A run stopped inside it was saved without marking its partial
    epoch: the resumed run's history held epoch 0 twice. The clock now learns the epoch length at the pass's last step
    (from the source's number of batches, or where Keras's adapter does not know it, a Grain dataset or a tf.data
    pipeline of unknown cardinality, from kfit's reader, one batch ahead, finding the pass ended), and a stop at
    ``max_samples`` inside the first pass is saved as a partial epoch. On TensorFlow, Keras's loop finds a pass of
    unknown length ended by one more call of the train function, which TensorFlow runs in part (an optimizer
    iteration more, read by Adam): a checkpoint written at the pass's last step says the call is due, and the resumed
    run makes it (it was one iteration short, and Adam's weights differed)."""
    make, options = SOURCES_OF_ONE_PASS[kind]
    reference = compiled(mlp(), keras.optimizers.Adam(0.01))  # (its bias correction reads the optimizer's iterations)
    expected = kfit.fit(reference, make(10), epochs=3, seed=0, verbose=0, **options)
    path = tmp_path / "run.ckpt"
    kfit.fit(compiled(mlp(), keras.optimizers.Adam(0.01)), make(10), epochs=3, max_samples=stop_at, seed=0, verbose=0,
             callbacks=[kfit.callbacks.Checkpoint(path, frequency=frequency)], **options)
    resumed = compiled(mlp(), keras.optimizers.Adam(0.01))
    checkpoint = kfit.callbacks.Checkpoint(path, frequency=1000)
    history = kfit.fit(resumed, make(10), epochs=3, seed=0, verbose=0, callbacks=[checkpoint], **options)
    assert checkpoint.restored_from.samples == stop_at
    for a, b in zip(weights(reference), weights(resumed)):
        np.testing.assert_array_equal(a, b)
    # Keras's TensorFlow loop counts an optimizer iteration more as it finds a pass of unknown length ended (6 for an
    # epoch of 5 steps, under model.fit too), after the step a checkpoint at the pass's end is written at: the resumed
    # run makes that call as it resumes (Adam's bias correction reads the count).
    assert int(resumed.optimizer.iterations) == int(reference.optimizer.iterations)
    assert history.epoch == expected.epoch == [0, 1, 2]
    np.testing.assert_allclose(history.history["loss"], expected.history["loss"], rtol=1e-6)


@pytest.mark.parametrize("steps_per_execution", [1, pytest.param(2, marks=pytest.mark.skipif(
    keras.backend.backend() == "torch", reason="Keras's PyTorch backend runs one step per call (steps_per_execution=1)"))])
@pytest.mark.parametrize("kind", kinds("grain", UNKNOWN_CARDINALITY))
def test_a_pass_of_unknown_length_trains_as_under_model_fit_with_adam_and_dropout(kind, steps_per_execution):
    """Keras's TensorFlow loop finds a pass of unknown length ended by one more call of the train function, which
    TensorFlow runs in part (an optimizer iteration more, read by Adam's bias correction; the dropout's seed generator
    drawn): kfit hands such a pass to the train step from Python and makes that call where the pass ends, so the
    optimizer's count, the weights and the logs are model.fit's on every backend (5 batches of 10 per epoch)."""
    make, options = SOURCES_OF_ONE_PASS[kind]

    def model_with_dropout():
        keras.utils.set_random_seed(3)
        model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(8, activation="tanh"),
                                  keras.layers.Dropout(0.3, seed=5), keras.layers.Dense(1)])
        model.compile(optimizer=keras.optimizers.Adam(0.01), loss="mse", steps_per_execution=steps_per_execution)
        return model

    results = []
    for loop in ("model.fit", "kfit.fit"):
        model = model_with_dropout()
        keras.utils.set_random_seed(0)
        if loop == "model.fit":
            history = model.fit(make(10), epochs=3, verbose=0, **options)
        else:
            history = kfit.fit(model, make(10), epochs=3, seed=0, verbose=0, **options)
        results.append((weights(model), int(model.optimizer.iterations), history.history))
    (w_keras, iterations_keras, h_keras), (w_kfit, iterations_kfit, h_kfit) = results
    assert iterations_kfit == iterations_keras
    for a, b in zip(w_keras, w_kfit):
        np.testing.assert_array_equal(a, b)
    assert h_kfit == h_keras


@pytest.mark.parametrize("kind", kinds("grain", UNKNOWN_CARDINALITY))
def test_a_checkpoint_written_at_the_end_of_a_pass_of_unknown_length_resumes_exactly_after_a_crash(kind, tmp_path):
    """A save interval that a pass's last step crosses, the run going on and crashing later: on TensorFlow, Keras's
    loop finds the pass ended by one more call of the train function (an optimizer iteration more), and the run
    resumed from the checkpoint has counted it as the uninterrupted run had (the checkpoint is written as the epoch
    ends, after that call; written before it, it would say the call is due, as a stop there does: the test above),
    so Adam's weights are the uninterrupted run's."""
    make, options = SOURCES_OF_ONE_PASS[kind]
    reference = compiled(mlp(), keras.optimizers.Adam(0.01))
    kfit.fit(reference, make(10), epochs=3, seed=0, verbose=0, **options)

    class Crash(keras.callbacks.Callback):
        def on_train_batch_end(self, batch, logs=None):
            if kfit.get_clock(self.model).samples == 70:
                raise RuntimeError("crashed")

    path = tmp_path / "run.ckpt"
    with pytest.raises(RuntimeError, match="crashed"):
        kfit.fit(compiled(mlp(), keras.optimizers.Adam(0.01)), make(10), epochs=3, seed=0, verbose=0,
                 callbacks=[kfit.callbacks.Checkpoint(path, frequency=50), Crash()], **options)
    resumed = compiled(mlp(), keras.optimizers.Adam(0.01))
    checkpoint = kfit.callbacks.Checkpoint(path, frequency=1000)
    kfit.fit(resumed, make(10), epochs=3, seed=0, verbose=0, callbacks=[checkpoint], **options)
    assert checkpoint.restored_from.samples == 50
    assert int(resumed.optimizer.iterations) == int(reference.optimizer.iterations)
    for a, b in zip(weights(reference), weights(resumed)):
        np.testing.assert_array_equal(a, b)


@pytest.mark.parametrize("stop_at", [82, 100, 150])  # in epoch 1; where epoch 1 ends; where the last epoch ends
def test_a_tf_data_pipeline_that_reshuffles_resumes_from_its_saved_iterator_state(stop_at, tmp_path, capfd):
    """The checkpoint holds the tf.data iterator's state as the epoch's pass began: a resumed run sees the shuffle
    order the uninterrupted run saw in that epoch and the next (skipping ahead alone would replay the first
    epoch's order), on every backend."""
    def reshuffling():
        return tf.data.Dataset.from_tensor_slices((X, Y)).shuffle(50, seed=7).batch(8)

    reference = compiled(mlp())
    kfit.fit(reference, reshuffling(), epochs=4, seed=0, verbose=0)
    path = tmp_path / "run.ckpt"
    kfit.fit(compiled(mlp()), reshuffling(), epochs=4, max_samples=stop_at, seed=0, verbose=0,
             callbacks=[kfit.callbacks.Checkpoint(path, frequency=1000)])
    capfd.readouterr()
    resumed = compiled(mlp())
    checkpoint = kfit.callbacks.Checkpoint(path, frequency=1000)
    kfit.fit(resumed, reshuffling(), epochs=4, seed=0, verbose=0, callbacks=[checkpoint])
    err = capfd.readouterr().err
    assert checkpoint.restored_from.samples == stop_at
    assert kfit.get_clock(resumed).samples == 200
    assert f"restarts epoch {stop_at // 50 + 1} from its iterator's state" in err, err
    for a, b in zip(weights(reference), weights(resumed)):
        np.testing.assert_array_equal(a, b, err_msg="the resumed run did not see the uninterrupted run's order")


@pytest.mark.parametrize("model_state", [
    "built", "not_built", "trained_before",
    pytest.param("sparse_inputs", marks=pytest.mark.skipif(
        keras.backend.backend() == "torch",
        reason="Keras's own model.fit on PyTorch cannot read a sparse tf.data pipeline (Invalid dtype: object)")),
])
def test_a_tf_data_pipeline_that_reshuffles_trains_as_under_model_fit(model_state):
    """The same shuffle order as model.fit's at every epoch: kfit makes an iterator over the pipeline (which draws its
    next shuffle seed) exactly where Keras's own loop makes one: at each epoch's start, at its end on TensorFlow
    (never read), and before the first epoch on JAX and PyTorch while the model is not built."""
    def reshuffling():
        x = tf.sparse.from_dense(np.where(np.abs(X) > 0.8, X, 0.0)) if model_state == "sparse_inputs" else X
        return tf.data.Dataset.from_tensor_slices((x, Y)).shuffle(50, seed=7).batch(8)

    initial = keras.initializers.RandomNormal(stddev=0.3, seed=1)
    results = []
    for loop in ("model.fit", "kfit.fit"):
        if model_state == "not_built":
            keras.utils.set_random_seed(1)
            model = keras.Sequential([keras.layers.Dense(8, activation="tanh", kernel_initializer=initial),
                                      keras.layers.Dense(1, kernel_initializer=initial)])  # built by fit
        else:
            model = mlp()
        compiled(model, keras.optimizers.SGD(0.01, momentum=0.9))
        if model_state == "trained_before":
            model.fit(X, Y, batch_size=10, epochs=1, shuffle=False, verbose=0)  # builds the loss and the metrics
        keras.utils.set_random_seed(0)
        if loop == "model.fit":
            model.fit(reshuffling(), epochs=3, verbose=0)
        else:
            kfit.fit(model, reshuffling(), epochs=3, seed=0, verbose=0)
        results.append(weights(model))
    for a, b in zip(*results):
        np.testing.assert_array_equal(a, b)


def test_a_tf_data_pipeline_tensorflow_cannot_save_resumes_by_skipping_ahead(tmp_path, capfd):
    """A py_function in the pipeline: TensorFlow cannot save its iterator, and the run says it skips ahead."""
    def with_py_function():
        def identity(x, y):
            x_again = tf.py_function(lambda v: v, [x], tf.float32)
            x_again.set_shape(x.shape)
            return x_again, y

        return tf.data.Dataset.from_tensor_slices((X, Y)).map(identity).batch(8)

    path = tmp_path / "run.ckpt"
    kfit.fit(compiled(mlp()), with_py_function(), epochs=3, max_samples=82, seed=0, verbose=0,
             callbacks=[kfit.callbacks.Checkpoint(path, frequency=1000)])
    reference = compiled(mlp())
    kfit.fit(reference, with_py_function(), epochs=3, seed=0, verbose=0)
    capfd.readouterr()
    resumed = compiled(mlp())
    kfit.fit(resumed, with_py_function(), epochs=3, seed=0, verbose=0,
             callbacks=[kfit.callbacks.Checkpoint(path, frequency=1000)])
    assert "cannot seek: resuming at sample 82 by drawing and dropping the first 32 samples" in capfd.readouterr().err
    for a, b in zip(weights(reference), weights(resumed)):  # the same order at every pass: exact all the same
        np.testing.assert_array_equal(a, b)


@pytest.mark.parametrize("built", [False, True], ids=["unbuilt", "built"])
@pytest.mark.parametrize("shuffle", [True, "batch"])
def test_shuffled_arrays_read_by_kerass_adapter_train_in_model_fits_order(shuffle, built, tmp_path):
    """Arrays with a steps_per_epoch kfit's stream cannot reproduce go through Keras's own adapter, which shuffles
    each pass with the process's random state (NumPy's on JAX, torch's default generator on PyTorch). kfit's look at
    the first batch draws where model.fit's does: from the generator Keras's loop reads the batch through while the
    model is not built (on PyTorch, the adapter's DataLoader, not its NumPy iterator), and from none when it is."""
    results = []
    for loop in ("model.fit", "kfit.fit"):
        model = compiled(mlp(), keras.optimizers.SGD(0.01, momentum=0.9))
        if built:
            model.evaluate(X[:8], Y[:8], verbose=0)
        np.random.seed(0)  # (mlp() seeded torch's default generator)
        if loop == "model.fit":
            model.fit(X, Y, batch_size=8, epochs=6, steps_per_epoch=3, shuffle=shuffle, verbose=0)
        else:  # (a Checkpoint: kfit's loop)
            kfit.fit(model, X, Y, batch_size=8, epochs=6, steps_per_epoch=3, shuffle=shuffle, verbose=0,
                     callbacks=[kfit.callbacks.Checkpoint(tmp_path / "run.ckpt")])
        results.append(weights(model))
    for a, b in zip(*results):
        np.testing.assert_array_equal(a, b)


@pytest.mark.parametrize("shuffle", [True, "batch"])
def test_shuffled_arrays_read_by_kerass_adapter_resume_exactly_or_say_they_do_not(shuffle, tmp_path, capfd):
    """Arrays with a steps_per_epoch kfit's stream cannot reproduce (3 steps of 8 in sweeps of 50) go through Keras's
    own adapter. On TensorFlow its pass is a tf.data pipeline whose state the checkpoint holds. On JAX and PyTorch it
    shuffles with the process's random state as each pass begins (NumPy's; torch's default generator): the
    checkpoint holds that state as the pass being read began, and where the pass began. Exact, dropout included,
    but for shuffle="batch" on PyTorch, which draws at every batch between the steps: the resume says it is not
    exact, and what is (epoch_size=, kfit's own stream)."""
    def run(path, **options):
        model = compiled(mlp(dropout=0.5), keras.optimizers.SGD(0.01, momentum=0.9))
        np.random.seed(0)
        kfit.fit(model, X, Y, minibatch_size=8, epochs=9, steps_per_epoch=3, shuffle=shuffle, verbose=0,
                 callbacks=[kfit.callbacks.Checkpoint(path, frequency=1000)], **options)
        return weights(model)

    reference = run(tmp_path / "reference.ckpt")
    path = tmp_path / "run.ckpt"
    run(path, max_samples=80)  # in the second pass (7 steps: 3 epochs, the last of one step)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        resumed = run(path)
    err = capfd.readouterr().err
    said = [str(w.message) for w in caught if "This resume is not exact" in str(w.message)]
    if keras.backend.backend() == "torch" and shuffle == "batch":
        assert "cannot seek: resuming at sample 82" in err, err
        assert len(said) == 1 and "epoch_size=steps_per_epoch * minibatch_size" in said[0]
        return
    assert said == []
    if keras.backend.backend() != "tensorflow":
        assert ("resuming at sample 82: the Array source restarts the pass it was reading from the random state its "
                "shuffle order came from, saved in the checkpoint, and the first 32 samples") in err, err
    for a, b in zip(reference, resumed):
        np.testing.assert_array_equal(a, b)


def test_a_minibatch_size_schedule_on_a_source_that_batches_itself_is_refused():
    model = compiled(mlp())
    with pytest.raises(ValueError, match="minibatch-size schedule needs data that kfit cuts into minibatches.*PyDataset"):
        kfit.fit(model, tf_dataset(), minibatch_size=kfit.schedules.minibatch_size([8, 16], epoch_size=50), verbose=0)
    with pytest.raises(ValueError, match="`epoch_size`.*steps_per_epoch"):
        kfit.fit(model, tf_dataset(), epoch_size=100, verbose=0)


def test_max_samples_on_a_source_stops_after_the_step_that_reaches_it():
    model = compiled(mlp())
    history = kfit.fit(model, tf_dataset(), epochs=5, max_samples=60, verbose=0)
    assert [s.samples for s in history.epoch_summaries] == [50, 16]  # 6 steps of 8 and one of 2; then 58, 66 >= 60


# -- what kfit's stream cannot read: Keras's own adapter reads it, as under model.fit -----------------------
class _Steps(keras.callbacks.Callback):
    """The number of training steps of every epoch."""

    def on_train_begin(self, logs=None):
        self.per_epoch = []

    def on_epoch_begin(self, epoch, logs=None):
        self.per_epoch.append(0)

    def on_train_batch_end(self, batch, logs=None):
        self.per_epoch[-1] += 1


def _both_loops(data, **options):
    """Trains the same model under model.fit and under kfit.fit with a kfit-only feature (seed); returns
    ``[(weights, history, steps per epoch)]`` for each."""
    results = []
    for loop in ("model.fit", "kfit.fit"):
        model = compiled(mlp(), keras.optimizers.SGD(0.01, momentum=0.9))
        steps = _Steps()
        x, y = data()
        if loop == "model.fit":
            history = model.fit(x, y, verbose=0, callbacks=[steps], **options)
        else:
            history = kfit.fit(model, x, y, verbose=0, callbacks=[steps], seed=0, **options)
        results.append((weights(model), history, steps.per_epoch))
    return results


@pytest.mark.parametrize("steps_per_epoch", [4, 9])
def test_steps_per_epoch_on_arrays_gives_kerass_epochs(steps_per_epoch):
    # 50 samples in minibatches of 8: 7 per sweep. Keras ends an epoch at the end of a sweep (4, 3, 4: the
    # sweep's last 3 steps make an epoch; 9: every epoch is one sweep of 7), where kfit's stream would run
    # 4 * 8 or 9 * 8 samples across sweeps.
    (w_keras, h_keras, s_keras), (w_kfit, h_kfit, s_kfit) = _both_loops(
        lambda: (X, Y), batch_size=8, epochs=3, steps_per_epoch=steps_per_epoch, shuffle=False)
    assert s_kfit == s_keras == ([4, 3, 4] if steps_per_epoch == 4 else [7, 7, 7])
    for a, b in zip(w_keras, w_kfit):
        np.testing.assert_array_equal(a, b)
    assert h_kfit.history == h_keras.history
    assert [s.samples for s in h_kfit.epoch_summaries] == ([32, 18, 32] if steps_per_epoch == 4 else [50] * 3)


def test_steps_per_epoch_that_divides_the_data_keeps_kfits_seekable_stream(tmp_path):
    # 48 samples, 3 steps of 8 per epoch: a sweep is two epochs, as Keras counts them too; the stream (exact
    # resume, no "cannot seek" note) stays.
    x, y = X[:48], Y[:48]
    (w_keras, _, s_keras), (w_kfit, _, s_kfit) = _both_loops(
        lambda: (x, y), batch_size=8, epochs=4, steps_per_epoch=3, shuffle=False)
    assert s_kfit == s_keras == [3, 3, 3, 3]
    for a, b in zip(w_keras, w_kfit):
        np.testing.assert_array_equal(a, b)
    model = compiled(mlp())
    kfit.fit(model, x, y, batch_size=8, epochs=2, steps_per_epoch=3, verbose=0,
             callbacks=[kfit.callbacks.Checkpoint(tmp_path / "run.ckpt", frequency=1000)])
    assert kfit.get_clock(model).epoch_size == 24


class _EpochsOfCalls(keras.callbacks.Callback):
    """The batch numbers Keras's batch-end hooks get, a list per epoch (one hook per call of the train function);
    raises after ``crash_at`` calls (a crash in the middle of a run)."""

    def __init__(self, crash_at=None):
        super().__init__()
        self.epochs, self.calls, self.crash_at = {}, 0, crash_at

    def on_epoch_begin(self, epoch, logs=None):
        self.epochs[epoch] = []

    def on_train_batch_end(self, batch, logs=None):
        self.epochs[next(reversed(self.epochs))].append(batch)
        self.calls += 1
        if self.calls == self.crash_at:
            raise RuntimeError("crash")


@pytest.mark.skipif(keras.backend.backend() == "torch", reason="Keras: steps_per_execution must be 1 with PyTorch")
@pytest.mark.parametrize(("rows", "steps_per_epoch", "per_call", "crash_at", "restored_at", "calls_per_epoch"), [
    (80, 4, 3, 4, 72, [2, 2, 2]),  # passes of 10 steps: epochs of 6 (two calls of 3), then 4 (3 + 1)
    (80, 5, 2, 5, 64, [3, 2, 3]),  # epochs of 6 (three calls of 2), then 4
    (48, 4, 3, 4, 72, [2, 2, 2]),  # passes of 6 steps: every epoch is a pass
])
def test_steps_per_epoch_on_arrays_in_calls_of_several_steps_gives_kerass_epochs_and_resumes_exactly(
        rows, steps_per_epoch, per_call, crash_at, restored_at, calls_per_epoch, tmp_path):
    """With ``compile(steps_per_execution=N)`` Keras runs an epoch in whole calls of ``N`` steps, cut where a pass
    ends: ``steps_per_epoch=4`` with ``N=3`` gives epochs of 6 steps, not 4. kfit.fit with a Checkpoint (Keras's
    adapter, kfit's loop) trains as model.fit (weights, History, the hooks' batch numbers), and a run that crashes
    inside its second epoch resumes from its last checkpoint, mid-epoch, to the uninterrupted run: the epoch's
    remaining call with its batch number, then the rest (kfit took epochs of ``steps_per_epoch`` steps: the resumed
    run began an epoch too early or ended the resumed one early, and trained other steps)."""
    x, y = regression_data(rows)
    options = dict(batch_size=8, epochs=3, steps_per_epoch=steps_per_epoch, shuffle=False, verbose=0)

    def model():
        m = mlp()
        m.compile(optimizer=keras.optimizers.SGD(0.01, momentum=0.9), loss="mse", steps_per_execution=per_call)
        return m

    plain, plain_calls = model(), _EpochsOfCalls()
    plain_history = plain.fit(x, y, callbacks=[plain_calls], **options)
    # (the batch number a hook gets for a call is its last step's on Keras 3.15, its first step's on 3.10)
    assert [len(calls) for calls in plain_calls.epochs.values()] == calls_per_epoch
    reference, calls = model(), _EpochsOfCalls()
    history = kfit.fit(reference, x, y, seed=0, callbacks=[
        calls, kfit.callbacks.Checkpoint(tmp_path / "reference.ckpt", frequency=1000)], **options)
    assert calls.epochs == plain_calls.epochs
    assert history.history == plain_history.history
    for a, b in zip(weights(plain), weights(reference)):
        np.testing.assert_array_equal(a, b)

    path = tmp_path / "run.ckpt"
    with pytest.raises(RuntimeError, match="crash"):
        kfit.fit(model(), x, y, seed=0, callbacks=[kfit.callbacks.Checkpoint(path, frequency=8),
                                                   _EpochsOfCalls(crash_at=crash_at)], **options)
    resumed, calls = model(), _EpochsOfCalls()
    checkpoint = kfit.callbacks.Checkpoint(path, frequency=8)
    history = kfit.fit(resumed, x, y, seed=0, callbacks=[calls, checkpoint], **options)
    assert checkpoint.restored_from.samples == restored_at  # one call into the second epoch
    assert calls.epochs == {1: plain_calls.epochs[1][1:], 2: plain_calls.epochs[2]}
    assert history.history == plain_history.history
    for a, b in zip(weights(plain), weights(resumed)):
        np.testing.assert_array_equal(a, b)


@pytest.mark.skipif(keras.backend.backend() == "torch", reason="Keras: steps_per_execution must be 1 with PyTorch")
def test_an_endless_source_with_steps_per_epoch_in_calls_of_several_steps_resumes_exactly(tmp_path):
    """An endless tf.data pipeline, ``steps_per_epoch=4`` and ``steps_per_execution=3``: Keras's epochs are 6 steps
    (two calls); a run that crashes one call into its second epoch resumes there (not in its first epoch, as when
    kfit took epochs of 4 steps) to model.fit's weights, History and batch numbers."""
    def data():
        return tf.data.Dataset.from_tensor_slices((X, Y)).batch(8).repeat()

    def model():
        m = mlp()
        m.compile(optimizer=keras.optimizers.SGD(0.01, momentum=0.9), loss="mse", steps_per_execution=3)
        return m

    options = dict(epochs=3, steps_per_epoch=4, verbose=0)
    plain, plain_calls = model(), _EpochsOfCalls()
    plain_history = plain.fit(data(), callbacks=[plain_calls], **options)
    assert [len(calls) for calls in plain_calls.epochs.values()] == [2, 2, 2]
    path = tmp_path / "run.ckpt"
    with pytest.raises(RuntimeError, match="crash"):
        kfit.fit(model(), data(), seed=0, callbacks=[kfit.callbacks.Checkpoint(path, frequency=8),
                                                     _EpochsOfCalls(crash_at=4)], **options)
    resumed, calls = model(), _EpochsOfCalls()
    checkpoint = kfit.callbacks.Checkpoint(path, frequency=8)
    history = kfit.fit(resumed, data(), seed=0, callbacks=[calls, checkpoint], **options)
    assert checkpoint.restored_from.samples == 66  # 6 steps (50 samples a pass: 8 * 6 + 2) and 3 more
    assert calls.epochs == {1: plain_calls.epochs[1][1:], 2: plain_calls.epochs[2]}
    assert history.history == plain_history.history
    for a, b in zip(weights(plain), weights(resumed)):
        np.testing.assert_array_equal(a, b)


def test_sparse_inputs_train_with_kfits_features_as_under_model_fit():
    import scipy.sparse as scipy_sparse  # scipy comes with scikit-learn, a dev dependency

    def data():
        dense = np.where(np.abs(X) > 0.8, X, 0.0).astype("float32")
        return scipy_sparse.csr_matrix(dense), Y

    (w_keras, h_keras, s_keras), (w_kfit, h_kfit, s_kfit) = _both_loops(data, batch_size=8, epochs=2, shuffle=False)
    assert s_kfit == s_keras == [7, 7]
    for a, b in zip(w_keras, w_kfit):
        np.testing.assert_allclose(a, b, rtol=1e-6, atol=1e-7)
    assert [s.samples for s in h_kfit.epoch_summaries] == [50, 50]


@pytest.mark.parametrize("stop_at", [80, 100])  # in epoch 2 (the step that reaches it ends at 82), at its end
def test_shuffled_sparse_inputs_train_in_model_fits_order_and_resume_exactly(stop_at, tmp_path):
    """Sparse arrays go through Keras's own adapter, which shuffles each pass with the process's random state (on
    PyTorch: torch's default generator, which the unread iterator Keras's loop makes at each epoch's end draws from
    too). kfit draws where model.fit draws, and the checkpoint holds the state each pass drew from."""
    import scipy.sparse as scipy_sparse

    sparse = scipy_sparse.csr_matrix(np.where(np.abs(X) > 0.8, X, 0.0).astype("float32"))

    def run(loop, path=None, **options):
        model = compiled(mlp(), keras.optimizers.SGD(0.01, momentum=0.9))
        np.random.seed(0)
        if loop == "model.fit":
            model.fit(sparse, Y, batch_size=8, epochs=4, shuffle=True, verbose=0)
        else:
            kfit.fit(model, sparse, Y, batch_size=8, epochs=4, shuffle=True, verbose=0,
                     callbacks=[kfit.callbacks.Checkpoint(path, frequency=1000)], **options)
        return weights(model)

    reference = run("kfit.fit", tmp_path / "reference.ckpt")
    for a, b in zip(run("model.fit"), reference):
        np.testing.assert_allclose(a, b, rtol=1e-6, atol=1e-7)  # (sparse matmuls: as in the test above)
    run("kfit.fit", tmp_path / "run.ckpt", max_samples=stop_at)
    for a, b in zip(reference, run("kfit.fit", tmp_path / "run.ckpt")):
        np.testing.assert_array_equal(a, b)


class _EndlessBatches(keras.utils.PyDataset):
    """An endless PyDataset (``num_batches`` None): batch ``i`` is minibatch ``i % 7`` of X, Y."""

    @property
    def num_batches(self):
        return None

    def __getitem__(self, index):
        start = (index % 7) * 8
        return X[start:start + 8], Y[start:start + 8]


@pytest.mark.parametrize("workers", [0, 2])
def test_an_endless_pydataset_trains_as_under_model_fit_and_resumes_by_skipping_ahead(tmp_path, capfd, workers):
    # With workers, Keras reads the batches through a queue, one stream: kfit's look at the first batch (to size the
    # first step) must not take it from there (model.fit's first step trains on it).
    def source():
        return _EndlessBatches(workers=workers)

    results = []
    for loop in ("model.fit", "kfit.fit"):
        model = compiled(mlp(), keras.optimizers.SGD(0.01, momentum=0.9))
        run = model.fit if loop == "model.fit" else functools.partial(kfit.fit, model, seed=0)
        run(source(), epochs=3, steps_per_epoch=5, verbose=0)
        results.append(weights(model))
    for a, b in zip(*results):
        np.testing.assert_array_equal(a, b)

    path = tmp_path / "run.ckpt"
    kfit.fit(compiled(mlp(), keras.optimizers.SGD(0.01, momentum=0.9)), source(), epochs=3,
             steps_per_epoch=5, max_samples=60, verbose=0, callbacks=[kfit.callbacks.Checkpoint(path, frequency=1000)])
    resumed = compiled(mlp(), keras.optimizers.SGD(0.01, momentum=0.9))
    kfit.fit(resumed, source(), epochs=3, steps_per_epoch=5, verbose=0,
             callbacks=[kfit.callbacks.Checkpoint(path, frequency=1000)])
    assert "cannot seek: resuming at sample" in capfd.readouterr().err
    for a, b in zip(results[1], weights(resumed)):
        np.testing.assert_array_equal(a, b)


def test_a_run_stopped_inside_an_epoch_of_a_pydataset_with_workers_leaves_no_thread_running():
    """Keras's loop stops a PyDataset's enqueuer (its ``workers``) at an epoch's end only: a run stopped inside an
    epoch (``max_samples``) would leave its threads running (``model.fit`` does, on TensorFlow), and the ``tf.data``
    iterator reading them would stall a later garbage collection for seconds. kfit stops it as its run ends."""
    import threading

    before = set(threading.enumerate())
    model = compiled(mlp(), keras.optimizers.SGD(0.01))
    kfit.fit(model, _EndlessBatches(workers=2), epochs=3, steps_per_epoch=5, max_samples=60, verbose=0)
    assert kfit.get_clock(model).samples == 66  # (the step that reaches max_samples ends the run, inside epoch 2)
    assert [t.name for t in set(threading.enumerate()) - before if t.is_alive()] == []


def test_list_inputs_and_targets_reach_the_model_as_under_model_fit():
    # Lists in the data (two inputs, two outputs): on TensorFlow, tf.data nests them as tuples, as Keras does.
    def model():
        a, b = keras.Input((4,), name="a"), keras.Input((4,), name="b")
        hidden = keras.layers.Dense(4, kernel_initializer=keras.initializers.GlorotUniform(seed=3))(
            keras.layers.Concatenate()([a, b]))
        outputs = [keras.layers.Dense(1, kernel_initializer=keras.initializers.GlorotUniform(seed=s), name=n)(hidden)
                   for s, n in ((4, "p"), (5, "q"))]
        m = keras.Model([a, b], outputs)
        m.compile(optimizer=keras.optimizers.SGD(0.01), loss=["mse", "mse"], loss_weights=[1.0, 0.5])
        return m

    results = []
    for loop in ("model.fit", "kfit.fit"):
        m = model()
        run = m.fit if loop == "model.fit" else functools.partial(kfit.fit, m, seed=0)
        history = run([X, X[::-1].copy()], [Y, 2 * Y], batch_size=8, epochs=2, shuffle=False, verbose=0)
        results.append((weights(m), history.history))
    (w_keras, h_keras), (w_kfit, h_kfit) = results
    for a, b in zip(w_keras, w_kfit):
        np.testing.assert_allclose(a, b, rtol=1e-6, atol=1e-7)
    assert sorted(h_kfit) == sorted(h_keras)


@pytest.mark.parametrize("kind", kinds(*sorted(SOURCES)))
def test_kfits_callbacks_alone_keep_the_clock_on_a_source_that_batches_itself(kind):
    """Without a kfit-only option plain model.fit cannot tell kfit's callbacks the sizes such a source makes:
    they run in kfit's loop (it reads the source), as with one (``seed``), not silently clockless."""
    make, options = SOURCES[kind]
    epochs = 1 if kind == "generator" else 2
    xv, yv = regression_data(16, seed=5)
    results = []
    for extra in ({}, {"seed": 0}):
        model = compiled(mlp(), keras.optimizers.SGD(0.01))
        callbacks = [kfit.callbacks.CrossValidation((xv, yv), frequency=25),
                     kfit.callbacks.LearningRateSchedule(kfit.schedules.learning_rate_per_minibatch([0.01, 0.005], epoch_size=50))]
        history = kfit.fit(model, make(), epochs=epochs, verbose=0, callbacks=callbacks, **options, **extra)
        assert kfit.get_clock(model).samples == 50 * epochs
        np.testing.assert_allclose(history.history["learning_rate"], [0.01, 0.005][:epochs], rtol=1e-6)
        assert len(history.history["val_loss"]) == epochs
        results.append((weights(model), history.history))
    (w_alone, h_alone), (w_seed, h_seed) = results
    for a, b in zip(w_alone, w_seed):
        np.testing.assert_array_equal(a, b)
    assert h_alone == h_seed


class _Batches(keras.utils.PyDataset):
    """50 samples in batches of 16 (the last one of 2)."""

    def __init__(self):
        super().__init__()

    def __len__(self):
        return 4

    def __getitem__(self, index):
        return X[index * 16:(index + 1) * 16], Y[index * 16:(index + 1) * 16]


@pytest.mark.parametrize("feature", ["seed", "Checkpoint", "CrossValidation"])
def test_a_pydataset_trains_at_its_own_batch_size_with_kfits_features_as_under_model_fit(feature, tmp_path):
    results = []
    for loop in ("model.fit", "kfit.fit"):
        model = compiled(mlp(), keras.optimizers.SGD(0.01, momentum=0.9))
        if loop == "model.fit":
            history = model.fit(_Batches(), epochs=2, shuffle=False, verbose=0)
        else:
            option = {"seed": {"seed": 0}, "Checkpoint": {"callbacks": [kfit.callbacks.Checkpoint(tmp_path / "run.ckpt")]},
                      "CrossValidation": {"callbacks": [kfit.callbacks.CrossValidation(regression_data(16, seed=5))]}}
            history = kfit.fit(model, _Batches(), epochs=2, shuffle=False, verbose=0, **option[feature])
            assert (kfit.get_clock(model).samples, kfit.get_clock(model).minibatches) == (100, 8)  # 16, 16, 16, 2 twice
        results.append((weights(model), history.history["loss"]))
    (w_keras, loss_keras), (w_kfit, loss_kfit) = results
    for a, b in zip(w_keras, w_kfit):
        np.testing.assert_array_equal(a, b)
    assert loss_kfit == loss_keras


def shuffling_loader(own_generator: bool, batch_size=8):
    import torch

    torch.manual_seed(0)  # as a script seeds torch before it makes its DataLoader
    dataset = torch.utils.data.TensorDataset(torch.from_numpy(X), torch.from_numpy(Y))
    generator = torch.Generator().manual_seed(1) if own_generator else None
    return torch.utils.data.DataLoader(dataset, batch_size=batch_size, shuffle=True, generator=generator)


@pytest.mark.parametrize("built", [False, True], ids=["unbuilt", "built"])
@pytest.mark.parametrize("batch_size", [8, 10])  # a pass of 7 steps, the last of 2 samples; one of 5 whole steps
@pytest.mark.parametrize("own_generator", [False, True], ids=["torch_default_generator", "own_generator"])
def test_a_shuffling_dataloader_trains_in_model_fits_order(own_generator, batch_size, built):
    """kfit.fit draws each pass of a DataLoader(shuffle=True) from torch's generators as model.fit's own loop does
    (its passes, Keras's spec inference and the unread pass at each epoch's end; no draw of its own for its first
    batch, nor past a pass's last batch where model.fit's loop reads no further): the same batches, in the same
    order, epoch after epoch."""
    results = []
    for loop in ("model.fit", "kfit.fit"):
        model = compiled(mlp(), keras.optimizers.SGD(0.01, momentum=0.9))
        if built:  # its loss built: model.fit reads no first batch before its first epoch
            model.evaluate(X[:8], Y[:8], verbose=0)
        loader = shuffling_loader(own_generator, batch_size)
        if loop == "model.fit":
            history = model.fit(loader, epochs=4, verbose=0)
        else:
            history = kfit.fit(model, loader, epochs=4, seed=0, verbose=0)
        results.append((weights(model), history.history["loss"]))
    (w_keras, loss_keras), (w_kfit, loss_kfit) = results
    assert loss_kfit == loss_keras
    for a, b in zip(w_keras, w_kfit):
        np.testing.assert_array_equal(a, b)


@pytest.mark.parametrize(("batch_size", "stop_at", "restored_at"), [
    (8, 80, 82),  # in epoch 2 (the step that reaches it ends at 82)
    (8, 100, 100),  # at its end
    (10, 80, 80),  # in epoch 2, of a pass of whole steps
    (10, 100, 100),  # at its end
])
@pytest.mark.parametrize("own_generator", [False, True], ids=["torch_default_generator", "own_generator"])
def test_a_shuffling_dataloader_resumes_exactly_from_its_saved_random_states(own_generator, batch_size, stop_at,
                                                                             restored_at, tmp_path, capfd):
    """A DataLoader(shuffle=True) draws each pass's order from torch's generators as the pass begins: the checkpoint
    holds their states, so the resumed epoch reads the interrupted one's order, and the epochs after it theirs."""
    reference = compiled(mlp())
    kfit.fit(reference, shuffling_loader(own_generator, batch_size), epochs=4, verbose=0,
             callbacks=[kfit.callbacks.Checkpoint(tmp_path / "reference.ckpt", frequency=1000)])

    path = tmp_path / "run.ckpt"
    kfit.fit(compiled(mlp()), shuffling_loader(own_generator, batch_size), epochs=4, max_samples=stop_at, verbose=0,
             callbacks=[kfit.callbacks.Checkpoint(path, frequency=1000)])
    resumed = compiled(mlp())
    checkpoint = kfit.callbacks.Checkpoint(path, frequency=1000)
    kfit.fit(resumed, shuffling_loader(own_generator, batch_size), epochs=4, verbose=0, callbacks=[checkpoint])
    assert checkpoint.restored_from.samples == restored_at
    err = capfd.readouterr().err
    assert f"the DataLoader source restarts epoch {2 if stop_at == 80 else 3} from the states of the random" in err, err
    for a, b in zip(weights(reference), weights(resumed)):
        np.testing.assert_array_equal(a, b)
    assert kfit.get_clock(resumed).samples == 200


@pytest.mark.parametrize(("stop_at", "restored_at", "dropped"), [
    (24, 24, 24),  # at the end of epoch 1, in the first pass (epochs of 3 steps, passes of 7)
    (80, 82, 32),  # in the second pass (the step that reaches it ends at 82)
    (100, 100, 50),  # at the second pass's end (the next pass begins with the next epoch)
])
@pytest.mark.parametrize("own_generator", [False, True], ids=["torch_default_generator", "own_generator"])
def test_a_shuffling_dataloader_read_on_across_epochs_resumes_exactly(own_generator, stop_at, restored_at, dropped,
                                                                      tmp_path, capfd):
    """With steps_per_epoch, Keras reads a DataLoader on across epochs, and a new pass (a new shuffle order) begins
    where the last ended, not at an epoch: the checkpoint holds the random states the pass being read began from and
    where it began, so a resumed run reads that pass's order again, from where it was. Dropout draws from torch's
    default generator on the PyTorch backend, as the loader does: both must be where the interrupted run had them."""
    def run(model, **more):
        return kfit.fit(model, shuffling_loader(own_generator), epochs=9, steps_per_epoch=3, verbose=0, **more)

    def model():
        return compiled(mlp(dropout=0.5), keras.optimizers.SGD(0.01, momentum=0.9))

    plain = model()
    plain.fit(shuffling_loader(own_generator), epochs=9, steps_per_epoch=3, verbose=0)
    reference = model()
    run(reference, callbacks=[kfit.callbacks.Checkpoint(tmp_path / "reference.ckpt", frequency=1000)])
    for a, b in zip(weights(plain), weights(reference)):  # the order of model.fit's passes
        np.testing.assert_array_equal(a, b)

    path = tmp_path / "run.ckpt"
    run(model(), max_samples=stop_at, callbacks=[kfit.callbacks.Checkpoint(path, frequency=1000)])
    resumed = model()
    checkpoint = kfit.callbacks.Checkpoint(path, frequency=1000)
    run(resumed, callbacks=[checkpoint])
    assert checkpoint.restored_from.samples == restored_at
    err = capfd.readouterr().err
    assert ("the DataLoader source restarts the pass it was reading from the states of the random generators"
            f" its shuffle order and workers' seeds came from, saved in the checkpoint, and the first "
            f"{dropped} samples it yields are drawn and dropped") in err, err
    for a, b in zip(weights(reference), weights(resumed)):
        np.testing.assert_array_equal(a, b)
    assert kfit.get_clock(resumed).samples == 150


def test_a_resumed_epoch_cut_to_the_steps_it_had_left_is_not_reported_as_the_data_running_out(tmp_path):
    """Keras warns "Your input ran out of data" when a source ends before ``steps_per_epoch``; the epoch a run resumes
    in ends early by kfit's doing (the steps it had left), which is no reason to warn. (A source that does run out is
    still reported, as under model.fit: tests/test_keras_fidelity.py.)"""
    make, options = SOURCES["endless_generator"]
    path = tmp_path / "run.ckpt"
    kfit.fit(compiled(mlp()), make(), epochs=3, max_samples=80, seed=0, verbose=0,
             callbacks=[kfit.callbacks.Checkpoint(path, frequency=1000)], **options)
    resumed = compiled(mlp())
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        kfit.fit(resumed, make(), epochs=3, seed=0, verbose=0, callbacks=[kfit.callbacks.Checkpoint(path, frequency=1000)],
                 **options)
    assert [str(w.message) for w in caught if "ran out of data" in str(w.message)] == []
    assert kfit.get_clock(resumed).samples == 150  # the resumed epoch's steps left, then the last epoch: all trained


class _WeightedBatches(_Batches):
    """``_Batches`` with sample weights: ``(x, y, sample_weight)``."""

    def __getitem__(self, index):
        x, y = super().__getitem__(index)
        return x, y, np.linspace(0.5, 1.5, len(x)).astype("float32")


@pytest.mark.parametrize("loop", ["model.fit", "kfit.fit"])
def test_class_weight_with_a_pydataset_that_yields_sample_weights_is_refused_as_by_model_fit(loop):
    """model.fit refuses both weightings; kfit's loop trained with the class weights alone, dropping the sample
    weights without a word."""
    model = compiled(mlp())
    before = weights(model)
    extra = {} if loop == "model.fit" else {"seed": 0}
    with pytest.raises(ValueError, match="You cannot specify `class_weight` and `sample_weight` at the same time"):
        kfit.fit(model, _WeightedBatches(), class_weight={0: 1.0, 1: 2.0}, epochs=1, verbose=0, **extra)
    for a, b in zip(before, weights(model)):
        np.testing.assert_array_equal(a, b)


def test_a_schedule_on_sparse_data_is_refused_for_what_sparse_data_is():
    import scipy.sparse as scipy_sparse

    x = scipy_sparse.csr_matrix(np.where(np.abs(X) > 0.8, X, 0.0).astype("float32"))
    with pytest.raises(ValueError, match="x is a csr_matrix, which is sparse, which Keras's own adapter reads .*Give the data as arrays"):
        kfit.fit(compiled(mlp()), x, Y, minibatch_size=kfit.schedules.minibatch_size([8, 16], epoch_size=50), verbose=0)


def test_validation_of_a_run_on_a_dataloader_takes_the_minibatch_size_model_fit_takes():
    """``model.fit`` validates in ``validation_batch_size or batch_size`` (None: Keras's 32): kfit's loop validated in
    the training DataLoader's own batch size, 8 (9 steps for 70 rows where model.fit takes 3)."""
    validation = regression_data(70, seed=3)

    class ValidationSteps(keras.callbacks.Callback):
        def on_train_begin(self, logs=None):
            self.steps = []

        def on_test_begin(self, logs=None):
            self.steps.append(0)

        def on_test_batch_end(self, batch, logs=None):
            self.steps[-1] += 1

    results = []
    for loop in ("model.fit", "kfit.fit"):
        model = compiled(mlp(), keras.optimizers.SGD(0.01, momentum=0.9))
        counter = ValidationSteps()
        fit = model.fit if loop == "model.fit" else functools.partial(kfit.fit, model, seed=0)
        history = fit(torch_loader(), epochs=2, verbose=0, validation_data=validation, callbacks=[counter])
        results.append((weights(model), history.history, counter.steps))
    (w_keras, h_keras, steps_keras), (w_kfit, h_kfit, steps_kfit) = results
    assert steps_kfit == steps_keras == [3, 3]
    for a, b in zip(w_keras, w_kfit):
        np.testing.assert_array_equal(a, b)
    assert h_kfit == h_keras
