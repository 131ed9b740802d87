"""Training run for the kill-and-resume test (tests/test_checkpoint_resume.py).

    python tests/scripts/resume_train.py CHECKPOINT RESULT

Trains a small model with Dropout (seed-generator state), kfit's MomentumSGD (slots, minibatch-size
variable), a minibatch-size schedule, a learning-rate schedule callback, ``epoch_size`` apart from the data
size, and a Checkpoint every 110 samples (mid-epoch, some while the minibatch size changes). With
``KFIT_RESUME_SOURCE=tf.data|DataLoader|generator`` it trains on that source instead (fixed minibatches of
16; no minibatch-size schedule, which such a source refuses), resumed by skipping ahead (tf.data, reshuffled at
every pass, from its iterator's saved state). With
``restore=True`` every start resumes from the newest intact checkpoint. Prints one JSON line when training
starts (what was restored), and on completion writes the final weights, optimizer variables and history to
RESULT (``.npz`` + ``.json``). The parent test kills this process at random points and restarts it.
"""

import json
import os
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
os.environ.setdefault("OMP_NUM_THREADS", "1")

import keras  # noqa: E402
import numpy as np  # noqa: E402

import kfit  # noqa: E402

if keras.backend.backend() == "torch":
    import torch

    torch.set_num_threads(1)


class AnnounceStart(kfit.callbacks.KfitCallback):
    """Prints, at the first step, where training starts and which checkpoint it was restored from."""

    order = 200  # after the Checkpoint's restore

    def __init__(self, checkpoint):
        super().__init__(name="announce")
        self.checkpoint = checkpoint
        self.done = False

    def on_step_begin(self, clock):
        if self.done:
            return
        self.done = True
        info = self.checkpoint.restored_from
        line = {"event": "start", "samples": clock.samples, "pid": os.getpid(),
                "restored_from": None if info is None else os.path.basename(info.path),
                "restored_samples": None if info is None else info.samples,
                "checksum_ok": None if info is None else info.checksum_ok}
        print(json.dumps(line), flush=True)


def _source(kind: str, x: np.ndarray, y: np.ndarray) -> tuple:
    """The same 200 samples in minibatches of 16 (the last of a pass: 8) from a source that batches by itself, in
    the same order at every pass, except tf.data's, which reshuffles at every pass (seeded: its iterator state in
    the checkpoint resumes it); and the fit options it needs."""
    if kind == "tf.data":
        import tensorflow as tf

        return tf.data.Dataset.from_tensor_slices((x, y)).shuffle(len(x), seed=5).batch(16), {}
    if kind == "DataLoader":
        dataset = torch.utils.data.TensorDataset(torch.from_numpy(x), torch.from_numpy(y))
        return torch.utils.data.DataLoader(dataset, batch_size=16, shuffle=False), {}
    if kind == "generator":
        def batches():
            while True:
                for start in range(0, len(x), 16):
                    yield x[start:start + 16], y[start:start + 16]

        return batches(), {"steps_per_epoch": 13}
    raise ValueError(f"KFIT_RESUME_SOURCE: unknown source {kind!r}")


def main(checkpoint_path: str, result_path: str) -> None:
    keras.utils.set_random_seed(1234)
    data = np.random.default_rng(0)
    x = data.normal(size=(200, 16)).astype("float32")
    y = (x[:, :4] @ data.normal(size=(4, 4)) + 0.1 * data.normal(size=(200, 4))).astype("float32")
    model = keras.Sequential([
        keras.Input((16,)),
        keras.layers.Dense(64, activation="tanh"),
        keras.layers.Dropout(0.25, seed=7),
        keras.layers.Dense(64, activation="tanh"),
        keras.layers.Dense(4),
    ])
    model.compile(optimizer=kfit.optimizers.MomentumSGD(learning_rate=0.01, momentum=0.9), loss="mse", metrics=["mae"])
    checkpoint = kfit.callbacks.Checkpoint(checkpoint_path, frequency=110, keep=2, restore=True)
    callbacks = [
        kfit.callbacks.LearningRateSchedule(kfit.schedules.learning_rate_per_sample([0.002] * 6 + [0.001], epoch_size=150)),
        checkpoint,
        AnnounceStart(checkpoint),
    ]
    source = os.environ.get("KFIT_RESUME_SOURCE", "arrays")
    if source == "arrays":
        history = kfit.fit(
            model, x, y, minibatch_size=kfit.schedules.minibatch_size([16] * 5 + [24], epoch_size=150),
            epoch_size=150, epochs=16, seed=11, callbacks=callbacks, verbose=0,
        )
    else:  # a source that batches by itself: resumed by skipping ahead
        data, options = _source(source, x, y)
        history = kfit.fit(model, data, epochs=10, seed=11, callbacks=callbacks, verbose=0, **options)
    arrays = {f"model_{i}": keras.ops.convert_to_numpy(v.value) for i, v in enumerate(model.variables)}
    arrays.update({f"optimizer_{i}": keras.ops.convert_to_numpy(v.value) for i, v in enumerate(model.optimizer.variables)})
    np.savez(result_path + ".npz", **arrays)
    with open(result_path + ".json", "w") as f:
        json.dump({"history": history.history, "epoch": history.epoch}, f)
    print(json.dumps({"event": "done"}), flush=True)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
    sys.stdout.flush()
    os._exit(0)  # the results are written and the last checkpoint is on disk: skip the backends' slow teardown
