"""CNTK's advanced MNIST sample (Function.train with every callback), ported to Keras 3 + kfit.

The sample of the CNTK 2.2 Python API guide, section 6-3, on the
handwritten digits that ship with scikit-learn (8x8 images, no download): per-sample learning rates and
momentum as a time constant, a minibatch size growing during training, progress lines (to a log file
and to stderr), TensorBoard events, a checkpoint at every epoch (a rerun resumes from it), cross-validation
that halves the learning rate when the error improves by less than 5% and stops training when a cut brings
the rate down to 1/128 of its first value (the schedule's own steps down count too; 50 epochs at most), and a final
test. At the end it draws the run's curves (loss, metric, learning rate and minibatch size
against samples seen) into OUT/curves.png and says where.

Run it again and it resumes from its newest checkpoint; once the run has ended (that cut, or 50 epochs) a rerun
trains nothing, says so and prints the results again. ``--fresh`` starts over.

Run:  python examples/cntk_advanced_mnist.py [--out runs/mnist] [--fresh]
      KFIT_EXAMPLE_SMALL=1 ...  for the short run CI uses.
Any backend: KERAS_BACKEND=jax|torch|tensorflow.
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys

import keras
import numpy as np
from sklearn.datasets import load_digits

import kfit
from kfit.cntk import (
    UnitType,
    learning_rate_schedule,
    minibatch_size_schedule,
    momentum_as_time_constant_schedule,
)

SMALL = os.environ.get("KFIT_EXAMPLE_SMALL") == "1"


def load_data() -> tuple:
    """Digits split like the sample splits MNIST: shuffled, train / cross-validation / test."""
    digits = load_digits()
    x = (digits.images / 16.0).astype("float32")[..., None]  # (1797, 8, 8, 1)
    y = digits.target.astype("int64")
    np.random.seed(0)  # always use the same reordering, for reproducibility
    idx = np.random.permutation(len(x))
    x, y = x[idx], y[idx]
    return (x[:1300], y[:1300]), (x[1300:1550], y[1300:1550]), (x[1550:], y[1550:])


def create_model() -> keras.Model:
    """The sample's convolutional network, sized for 8x8 images."""
    return keras.Sequential([
        keras.Input((8, 8, 1)),
        keras.layers.Conv2D(32, 3, padding="same", activation="relu"),
        keras.layers.MaxPooling2D(2),
        keras.layers.Conv2D(48, 3, padding="same", activation="relu"),
        keras.layers.MaxPooling2D(2),
        keras.layers.Conv2D(64, 2, activation="relu"),
        keras.layers.Flatten(),
        keras.layers.Dense(96, activation="relu"),
        keras.layers.Dropout(0.5),
        keras.layers.Dense(10),  # no activation in the final layer (softmax is in the criterion)
    ])


def main(out: str = "runs/mnist", fresh: bool = False) -> keras.callbacks.History:
    if fresh and os.path.isdir(out):
        shutil.rmtree(out)
    os.makedirs(out, exist_ok=True)
    keras.utils.set_random_seed(1)
    (x_train, y_train), (x_cv, y_cv), (x_test, y_test) = load_data()
    epoch_size = len(x_train)

    # The sample's schedules: per-sample rates, momentum as a time constant, minibatches 256 -> 4096
    # (scaled down 8x for a dataset 40x smaller).
    lrs = learning_rate_schedule([0.001] * 12 + [0.0005] * 6 + [0.00025] * 6 + [0.000125] * 3 + [0.0000625] * 3 + [0.00003125],
                                 UnitType.sample, epoch_size=epoch_size)
    momentums = momentum_as_time_constant_schedule([0] * 5 + [1024], epoch_size=epoch_size)
    minibatch_sizes = minibatch_size_schedule([32] * 6 + [64] * 9 + [128] * 7 + [256] * 8 + [512], epoch_size=epoch_size)

    model = create_model()
    model.compile(optimizer=kfit.optimizers.MomentumSGD(), metrics=["accuracy"],
                  loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    learner = kfit.callbacks.LearningRateSchedule(lrs)  # plays CNTK's learner: read and reset the rate

    # Progress: the first 10 minibatches, then every 50th, to a log file; TensorBoard events.
    progress_writer = kfit.callbacks.ProgressPrinter(50, first=10, log_to_file=os.path.join(out, "my.log"))
    console = kfit.callbacks.ProgressPrinter(name="console")  # epoch lines on stderr
    tensorboard_writer = kfit.callbacks.TensorBoardProgressWriter(os.path.join(out, "tensorboard"), freq=50)
    history_csv = kfit.callbacks.CSVHistory(os.path.join(out, "history.csv"))

    # A checkpoint every epoch; restore=True resumes an interrupted run from the newest intact one.
    checkpoint = kfit.callbacks.Checkpoint(os.path.join(out, "model_mn.h5"), frequency=epoch_size, preserve_all=True, restore=True)

    # Halve the learning rate each time the cross-validation error improved by less than 5% relative;
    # stop after 6 adjustments. (As written in the CNTK sample.)
    prev_metric = 1  # metric from the previous call to the callback. Error = 100% at start.

    def adjust_lr_callback(index, average_error, cv_num_samples, cv_num_minibatches):
        nonlocal prev_metric
        if (prev_metric - average_error) / prev_metric < 0.05:  # did the metric improve by at least 5% rel?
            learner.reset_learning_rate(learning_rate_schedule(learner.learning_rate() / 2, UnitType.sample))
            if learner.learning_rate() < lrs[0] / (2**7 - 0.1):  # we are done after the 6th LR cut
                print(f"Learning rate {learner.learning_rate()} too small. Training complete.")
                return False  # means we are done
            print(f"Improvement of metric from {prev_metric:.3f} to {average_error:.3f} insufficient. "
                  f"Halving learning rate to {learner.learning_rate()}.")
        prev_metric = average_error
        return True  # means continue

    cv_callback = kfit.callbacks.CrossValidation((x_cv, y_cv), 3 * epoch_size if not SMALL else epoch_size,
                                                 minibatch_size=256, callback=adjust_lr_callback)
    test_callback = kfit.callbacks.Test((x_test, y_test), minibatch_size=256)

    callbacks = [learner, kfit.callbacks.MomentumSchedule(momentums), progress_writer, console, tensorboard_writer,
                 history_csv, checkpoint, cv_callback, test_callback]
    try:
        history = kfit.fit(model, x_train, y_train, minibatch_size=minibatch_sizes, epoch_size=epoch_size,
                           epochs=4 if SMALL else 50, seed=0, verbose=0, callbacks=callbacks)
    except kfit.checkpoint.CheckpointMismatchError as mismatch:
        sys.exit(f"{mismatch} Or run this script with --fresh.")

    if checkpoint.finished_before:
        print("(This run had ended: `--fresh` starts it over.)")
    # Progress is available from the return value.
    losses = [summary.loss for summary in history.epoch_summaries]
    print("loss progression =", ", ".join(f"{loss:.3f}" for loss in losses))
    print(f"test error = {1 - history.history['test_accuracy'][-1]:.2%}; files in {out}/")
    print(f"curves (loss, metric, learning rate, minibatch size against samples): {draw_curves(out)}")
    return history


def draw_curves(out: str) -> str:
    """The CSV history drawn as one PNG (``kfit plot OUT/history.csv -o OUT/curves.png`` does the same)."""
    from kfit.plotting import plot_history

    try:
        return str(plot_history(os.path.join(out, "history.csv"), os.path.join(out, "curves.png")))
    except ImportError as error:  # matplotlib is an extra: pip install 'kfit[plot]'
        return f"not drawn ({error})"


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", default="runs/mnist", help="folder for the log, TensorBoard events, checkpoints and CSV")
    parser.add_argument("--fresh", action="store_true", help="start over instead of resuming from a checkpoint")
    args = parser.parse_args()
    main(args.out, args.fresh)
