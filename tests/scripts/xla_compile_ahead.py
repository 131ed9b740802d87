"""A TensorFlow run with ``jit_compile=True`` whose second epoch trains a new minibatch size (for
tests/test_fit.py::test_tensorflows_xla_does_not_compile_again_a_size_compiled_ahead_when_training_reaches_it).

    TF_CPP_VMODULE=device_compiler=2 TF_CPP_MIN_LOG_LEVEL=0 python tests/scripts/xla_compile_ahead.py ahead|none

A schedule of 8 then 16 over epochs of 100 samples (so the first epoch ends on a 4, and one trace of the step, of
unknown batch dimension, serves every size). kfit's own compile-ahead is off; as the first epoch ends, ``ahead``
has :class:`kfit.training._compile_ahead.CompileAhead` compile the 16 and waits for it, ``none`` does not. Then a
line ``KFIT-MARK second epoch`` on stderr: XLA's log lines after it are the second epoch's compiles.
"""

import os
import sys

os.environ["KERAS_BACKEND"] = "tensorflow"
os.environ["KFIT_COMPILE_AHEAD"] = "0"

import keras  # noqa: E402
import numpy as np  # noqa: E402

import kfit  # noqa: E402
from kfit.training._compile_ahead import CompileAhead  # noqa: E402

AHEAD = sys.argv[1] == "ahead"


class CompileAtFirstEpochEnd(keras.callbacks.Callback):
    def on_epoch_end(self, epoch, logs=None):
        if epoch == 0 and AHEAD:
            os.environ["KFIT_COMPILE_AHEAD"] = "1"
            ahead = CompileAhead(self.model, None)
            ahead.request([16])
            ahead.wait()
            ahead.close()
            print(f"compiled ahead: {sorted(ahead.compiled)} errors: {ahead.errors}", file=sys.stderr, flush=True)
        if epoch == 0:
            print("KFIT-MARK second epoch", file=sys.stderr, flush=True)


keras.utils.set_random_seed(1)
rng = np.random.default_rng(0)
x, y = rng.normal(size=(100, 4)).astype("float32"), rng.normal(size=(100, 1)).astype("float32")
model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(8, activation="tanh"), keras.layers.Dense(1)])
model.compile(optimizer=keras.optimizers.SGD(0.05), loss="mse", jit_compile=True)
kfit.fit(model, x, y, minibatch_size=kfit.schedules.minibatch_size([8, 16], epoch_size=100), epoch_size=100,
         epochs=2, seed=1, verbose=0, callbacks=[CompileAtFirstEpochEnd()])
print(f"trained: {kfit.get_clock(model).samples} samples", file=sys.stderr, flush=True)
