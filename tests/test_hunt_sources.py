"""Torch DataLoaders next to kfit's evaluation callbacks and Keras's validation, resumed from a checkpoint.

A run resumed from a checkpoint ends as the uninterrupted run did, on every backend, where something besides the
training loader draws from torch's default generator (an evaluation of a DataLoader makes an iterator, which draws
its workers' base seed there): the training loader's next shuffle order follows those draws.
"""

import keras
import numpy as np
import pytest
import torch
from helpers import mlp, regression_data, weights

import kfit

X, Y = regression_data(60)
X_VAL, Y_VAL = regression_data(20, seed=3)


def loader(x, y, shuffle):
    return torch.utils.data.DataLoader(torch.utils.data.TensorDataset(torch.from_numpy(x), torch.from_numpy(y)),
                                       batch_size=8 if shuffle else 6, shuffle=shuffle)


def compiled():
    model = mlp()
    model.compile(optimizer=keras.optimizers.SGD(0.05, momentum=0.9), loss="mse", metrics=["mae"])
    return model


class _DrawsAsRead(torch.utils.data.Sampler):
    """Rows drawn from torch's default generator one at a time, as the loader reads them."""

    def __len__(self):
        return len(X)

    def __iter__(self):
        for _ in range(len(X)):
            yield int(torch.randint(0, len(X), ()).item())


# On TensorFlow Keras's loop reads a DataLoader on a thread of tf.data's: where torch's default generator stands as a
# checkpoint is written is not tied to the batches read, and a resumed run goes on from the pass's own draws (exact for
# a sampler that draws as it is read, not after an evaluation inside the epoch: a known limit there). With both, the
# order of their draws varies from run to run, under model.fit too.
@pytest.mark.parametrize(("sampler", "evaluated"), [
    ("shuffle", False), ("draws_as_read", False),
    *([("shuffle", True), ("draws_as_read", True)] if keras.backend.backend() != "tensorflow" else []),
])
def test_a_dataloader_resumed_mid_epoch_leaves_torchs_default_generator_where_the_uninterrupted_run_had_it(
        sampler, evaluated, tmp_path):
    """A CrossValidation of a DataLoader inside an epoch draws from torch's default generator between the training
    pass's draws and the checkpoint. On JAX the resumed run drew the epoch's pass again from its saved states and went
    on from there, one evaluation's draw short: the next epoch's shuffle order, and every weight after it, differed
    from the uninterrupted run's (by 0.42). On PyTorch a sampler that draws as it is read found the generator put back
    to the checkpoint's state before the pass was read as far as it had been: it drew those rows again (weights off by
    1.2). torch's default generator is now put where the checkpoint found it once the reopened pass is read as far as
    it was then (JAX, PyTorch); on TensorFlow the resumed run goes on from the pass's draws, as before."""
    def run(model, **more):
        torch.manual_seed(0)
        callbacks = more.pop("callbacks", [])
        if evaluated:
            callbacks.append(kfit.callbacks.CrossValidation(loader(X_VAL, Y_VAL, shuffle=False), frequency="24sp"))
        data = torch.utils.data.TensorDataset(torch.from_numpy(X), torch.from_numpy(Y))
        train = (loader(X, Y, shuffle=True) if sampler == "shuffle"
                 else torch.utils.data.DataLoader(data, batch_size=8, sampler=_DrawsAsRead()))
        return kfit.fit(model, train, epochs=3, seed=0, verbose=0, callbacks=callbacks, **more)

    reference = compiled()
    expected = run(reference)
    path = tmp_path / "run.ckpt"
    run(compiled(), max_samples=70, callbacks=[kfit.callbacks.Checkpoint(path, frequency=10**6)])
    resumed = compiled()
    checkpoint = kfit.callbacks.Checkpoint(path, frequency=10**6)
    history = run(resumed, callbacks=[checkpoint])
    assert checkpoint.restored_from.samples == 76  # in epoch 2 (after the cross-validation at 72)
    for a, b in zip(weights(reference), weights(resumed)):
        np.testing.assert_array_equal(a, b)
    assert history.history == expected.history
    assert kfit.get_clock(resumed).samples == 180


@pytest.mark.parametrize(("stop_at", "validation_freq"), [
    (30, 1),  # in epoch 1, before any validation
    (70, 1),  # in epoch 2, after epoch 1's
    (120, 1),  # at epoch 2's end
    (70, 2),  # in epoch 2, with no validation before it
])
def test_a_dataloader_given_as_validation_data_leaves_the_resumed_run_on_the_uninterrupted_runs_shuffle(
        stop_at, validation_freq, tmp_path):
    """On TensorFlow, model.fit's first validation reads a batch of a validation DataLoader to find its tensor specs,
    which draws from torch's default generator, once per fit call. A run resumed after an epoch that validated drew it
    again at its first validation: the training DataLoader's next shuffle order, and every weight after it, differed
    from the uninterrupted run's (by up to 0.57). kfit now makes that validation iterator as the resumed run begins,
    drawing nothing; a run resumed before any validation still draws it where the uninterrupted run did."""
    def run(model, **more):
        torch.manual_seed(0)
        return kfit.fit(model, loader(X, Y, shuffle=True), epochs=4, seed=0, verbose=0,
                        validation_data=loader(X_VAL, Y_VAL, shuffle=False), validation_freq=validation_freq, **more)

    plain = compiled()
    torch.manual_seed(0)
    plain.fit(loader(X, Y, shuffle=True), epochs=4, verbose=0, validation_data=loader(X_VAL, Y_VAL, shuffle=False),
              validation_freq=validation_freq)
    reference = compiled()
    expected = run(reference)
    for a, b in zip(weights(plain), weights(reference)):  # kfit.fit validates as model.fit does
        np.testing.assert_array_equal(a, b)
    path = tmp_path / "run.ckpt"
    run(compiled(), max_samples=stop_at, callbacks=[kfit.callbacks.Checkpoint(path, frequency=10**6)])
    resumed = compiled()
    history = run(resumed, callbacks=[kfit.callbacks.Checkpoint(path, frequency=10**6)])
    for a, b in zip(weights(reference), weights(resumed)):
        np.testing.assert_array_equal(a, b)
    assert history.history == expected.history
