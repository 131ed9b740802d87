"""Sources that batch by themselves (tf.data, generators, torch DataLoaders) with kfit's features.

They train through ``kfit.fit`` as through ``model.fit``; kfit's clock counts their samples; a checkpoint
resumes them by skipping ahead, which reproduces an uninterrupted run when the source yields the same
minibatches in the same order.
"""

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


SOURCES = {
    "tf.data": (tf_dataset, {}),
    "generator": (finite_generator, {}),
    "endless_generator": (endless_generator, {"steps_per_epoch": 7}),
    "DataLoader": (torch_loader, {}),
}


@pytest.mark.parametrize("kind", sorted(SOURCES))
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


# Generators resume by skipping ahead too, but not yet exactly (Keras re-yields a generator's peeked first
# batches when it reopens it): only the sources that restart each epoch are claimed exact here.
@pytest.mark.parametrize("kind", ["DataLoader", "tf.data"])
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
    assert "cannot seek: resuming at sample" in capfd.readouterr().err
    for a, b in zip(weights(reference), weights(resumed)):
        np.testing.assert_array_equal(a, b)
    assert kfit.get_clock(resumed).samples == 50 * epochs and history.epoch_summaries[-1].samples == (
        50 if kind != "generator" else 50 - 32)  # the last epoch: whole, or what was left after the resume


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
