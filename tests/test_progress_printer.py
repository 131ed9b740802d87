"""ProgressPrinter: CNTK's lines over real runs, interval means, hyperparameter lines, files, state."""

import re

import keras
import numpy as np
import pytest

import kfit
from kfit.callbacks import KfitCallback, ProgressPrinter
from kfit.clock import Clock, attach_clock

# Every value is labelled with its Keras name; the accuracy is shown as CNTK's error, "1 - accuracy" in %.
MINIBATCH = re.compile(r"^Minibatch\[\s*(\d+)-\s*(\d+)\]: loss = (\d+\.\d{6}) \* (\d+), 1 - accuracy = (\d+\.\d{2})%;$")
EPOCH = re.compile(
    r"^Finished Epoch\[(\d+)\]: loss = (\d+\.\d{6}) \* (\d+), 1 - accuracy = (\d+\.\d{2})% \d+\.\d{3}s "
    r"\(\s*\d+\.\d samples/s(; the first minibatch, compiling, took \d+\.\d{3}s)?\);$"
)
# Cross-validations are numbered by val_index (from 0); the final test is "Finished Test".
EVALUATION = re.compile(
    r"^Finished (?:Evaluation \[val_index=(\d+)\]|Test): Minibatch\[1-(\d+)\]: (?:val|test)_loss = \d+\.\d{6} \* (\d+), "
    r"1 - (?:val|test)_accuracy = (\d+\.\d{2})%;$"
)
HYPERPARAMETER = re.compile(r"^(Learning rate per 1 samples|Learning rate per minibatch|Momentum per 1 samples|Momentum per minibatch): \S+$")
SIZE = re.compile(r"^Minibatch size: \d+$")


def data(n=96, seed=0):
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(n, 4)).astype("float32")
    return x, x[:, :3].argmax(axis=1).astype("int64")


def classifier(optimizer=None, metrics=("accuracy",)):
    model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(8, activation="tanh"), keras.layers.Dense(3)])
    model.compile(
        optimizer=optimizer or kfit.optimizers.MomentumSGD(learning_rate=0.05),
        loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
        metrics=list(metrics),
    )
    return model


def lines_of(path):
    return path.read_text().splitlines()


def test_lines_match_cntk_format_and_count_the_samples_trained(tmp_path):
    x, y = data()
    log = tmp_path / "progress.log"
    history = kfit.fit(
        classifier(), x, y, minibatch_size=16, epochs=2, seed=0, verbose=0,
        callbacks=[ProgressPrinter(freq=2, first=1, log_to_file=log), ProgressPrinter(metric_is_pct=False, log_to_file=tmp_path / "acc.log")],
    )
    # metric_is_pct=False: the accuracy as is.
    accuracies = [re.search(r"accuracy = (0\.\d{6}) ", line) for line in lines_of(tmp_path / "acc.log") if "Finished Epoch" in line]
    assert [float(m[1]) for m in accuracies] == [pytest.approx(a, abs=1e-6) for a in history.history["accuracy"]]
    lines = lines_of(log)
    assert lines and all(MINIBATCH.match(line) or EPOCH.match(line) or SIZE.match(line) for line in lines), lines
    epochs = [EPOCH.match(line) for line in lines if EPOCH.match(line)]
    assert [int(m[1]) for m in epochs] == [1, 2]
    assert all(int(m[3]) == 96 for m in epochs)
    # Epoch means are Keras's; the error rate is 1 - accuracy.
    for m, loss, acc in zip(epochs, history.history["loss"], history.history["accuracy"], strict=True):
        assert float(m[2]) == pytest.approx(loss, abs=1e-6)
        assert float(m[4]) == pytest.approx((1 - acc) * 100, abs=0.006)
    # Per epoch: [1-1] (first), [2-2], [3-4], [5-6]; the intervals cover the epoch, their means average to the epoch's.
    per_epoch = " ".join(lines).split("Finished Epoch")[:-1]
    for text, m in zip(per_epoch, epochs, strict=True):
        intervals = [MINIBATCH.match(line) for line in re.findall(r"Minibatch\[[^;]*;", text)]
        assert [(int(i[1]), int(i[2])) for i in intervals] == [(1, 1), (2, 2), (3, 4), (5, 6)]
        assert [int(i[4]) for i in intervals] == [16, 16, 32, 32]
        mean = sum(float(i[3]) * int(i[4]) for i in intervals) / 96
        assert mean == pytest.approx(float(m[2]), abs=2e-5)


@pytest.mark.parametrize("loop", ["model.fit", "kfit"])
def test_interval_means_equal_a_recomputation_on_frozen_weights(tmp_path, loop):
    # With a zero learning rate every minibatch's loss can be recomputed from the data, in order.
    x, y = data(n=80)
    model = classifier(keras.optimizers.SGD(learning_rate=0.0))
    log = tmp_path / "progress.log"
    extra = {"seed": 0} if loop == "kfit" else {}
    kfit.fit(model, x, y, batch_size=8, epochs=1, shuffle=False, verbose=0, callbacks=[ProgressPrinter(freq=3, log_to_file=log)], **extra)
    logits = keras.ops.convert_to_numpy(model(x))
    losses = keras.ops.convert_to_numpy(keras.losses.sparse_categorical_crossentropy(y, logits, from_logits=True))
    errors = (logits.argmax(axis=1) != y).astype("float64")
    intervals = [MINIBATCH.match(line) for line in lines_of(log) if MINIBATCH.match(line)]
    assert [(int(i[1]), int(i[2])) for i in intervals] == [(1, 3), (4, 6), (7, 9)]
    for i in intervals:
        lo, hi = (int(i[1]) - 1) * 8, int(i[2]) * 8
        assert int(i[4]) == hi - lo
        assert float(i[3]) == pytest.approx(losses[lo:hi].mean(), abs=2e-5)
        assert float(i[5]) == pytest.approx(errors[lo:hi].mean() * 100, abs=0.006)


def test_geometric_intervals_and_first_minibatches(tmp_path):
    x, y = data(n=80)
    cases = {  # (freq, first): the intervals of an epoch of 10 minibatches
        (0, 0): [(1, 1), (2, 3), (4, 7)],  # CNTK's geometric schedule: intervals of 1, 2, 4, ...
        (None, 2): [(1, 1), (2, 2)],
        (None, 0): [],
        (4, 2): [(1, 1), (2, 2), (3, 4), (5, 8)],
        (3, 0): [(1, 3), (4, 6), (7, 9)],
    }
    printers = {case: ProgressPrinter(freq=case[0], first=case[1], log_to_file=tmp_path / f"{case}.log") for case in cases}
    kfit.fit(classifier(), x, y, minibatch_size=8, epochs=1, seed=0, verbose=0, callbacks=list(printers.values()))
    for case, expected in cases.items():
        lines = lines_of(tmp_path / f"{case}.log")
        intervals = [MINIBATCH.match(line) for line in lines if MINIBATCH.match(line)]
        assert [(int(i[1]), int(i[2])) for i in intervals] == expected, case
        assert sum(1 for line in lines if EPOCH.match(line)) == 1


@pytest.mark.skipif(keras.backend.backend() == "torch", reason="Keras: steps_per_execution must be 1 with PyTorch")
def test_intervals_due_inside_a_call_of_several_steps_end_with_the_call(tmp_path):
    """``compile(steps_per_execution=3)``: Keras's hooks come after each call of 3 steps, so an interval due at a
    minibatch inside a call ends with the call (it was skipped: only the call's last minibatch was tested)."""
    x, y = data(n=80)
    model = classifier()
    model.compile(optimizer=kfit.optimizers.MomentumSGD(learning_rate=0.05), metrics=["accuracy"],
                  loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True), steps_per_execution=3)
    cases = {  # (freq, first): the intervals of an epoch of 10 minibatches, in calls of 1-3, 4-6, 7-9 and 10
        (4, 0): [(1, 6), (7, 9)],  # 4 lies in the second call, 8 in the third
        (0, 0): [(1, 3), (4, 9)],  # CNTK's geometric schedule: 1 and 3 in the first call, 7 in the third
        (None, 2): [(1, 3)],
    }
    printers = {case: ProgressPrinter(freq=case[0], first=case[1], log_to_file=tmp_path / f"{case}.log") for case in cases}
    kfit.fit(model, x, y, minibatch_size=8, epochs=1, seed=0, verbose=0, callbacks=list(printers.values()))
    for case, expected in cases.items():
        intervals = [MINIBATCH.match(line) for line in lines_of(tmp_path / f"{case}.log") if MINIBATCH.match(line)]
        assert [(int(i[1]), int(i[2])) for i in intervals] == expected, case


def test_an_interval_in_samples_prints_the_same_lines_whatever_the_minibatch_size(tmp_path):
    x, y = data(n=96)
    spans = {}
    for size in (8, 12):
        log = tmp_path / f"{size}.log"
        kfit.fit(classifier(), x, y, minibatch_size=size, epochs=1, seed=0, verbose=0,
                 callbacks=[ProgressPrinter(freq="24sp", log_to_file=log)])
        intervals = [MINIBATCH.match(line) for line in lines_of(log) if MINIBATCH.match(line)]
        spans[size] = [(int(i[1]) * size, int(i[2]) * size, int(i[4])) for i in intervals]
    # (samples at the end of the line's first minibatch, at its end, samples in the line): a line every 24 samples.
    assert spans[8] == [(8, 24, 24), (32, 48, 24), (56, 72, 24), (80, 96, 24)]
    assert spans[12] == [(12, 24, 24), (36, 48, 24), (60, 72, 24), (84, 96, 24)]
    with pytest.raises(ValueError, match="`freq`.*'50000sp'.*Received: freq='24 samples'"):
        ProgressPrinter(freq="24 samples")


def test_hyperparameter_and_minibatch_size_lines(tmp_path):
    x, y = data(n=100)
    log = tmp_path / "progress.log"
    callbacks = [
        kfit.callbacks.LearningRateSchedule(kfit.schedules.learning_rate_per_sample([0.001, 0.0002], epoch_size=100)),
        kfit.callbacks.MomentumSchedule(kfit.schedules.momentum_as_time_constant([0, 1024], epoch_size=100)),
        ProgressPrinter(log_to_file=log),
    ]
    sizes = kfit.schedules.minibatch_size([16, 32], epoch_size=100)
    kfit.fit(classifier(), x, y, minibatch_size=sizes, epochs=2, seed=0, verbose=0, callbacks=callbacks)
    lines = lines_of(log)
    assert all(HYPERPARAMETER.match(line) or SIZE.match(line) or EPOCH.match(line) for line in lines), lines
    # Epochs of 100 samples end on a shortened minibatch (4 samples): that is not a change of size.
    assert [line for line in lines if not EPOCH.match(line)] == [
        "Learning rate per 1 samples: 0.001",
        "Momentum per 1 samples: 0.0",
        "Minibatch size: 16",
        "Learning rate per 1 samples: 0.0002",
        "Momentum per 1 samples: 0.9990239141819757",
        "Minibatch size: 32",
    ]
    assert lines.index("Minibatch size: 32") < lines.index(next(line for line in lines if line.startswith("Finished Epoch[2]")))


class PublishEvaluations(KfitCallback):
    """Publishes a cross-validation result at 48 samples and a test result at the end, as kfit's
    CrossValidation and Test callbacks do."""

    order = -10

    def on_step_end(self, clock, logs):
        if clock.samples == 48:
            self.publish("on_cross_validation_end", 0, {
                "val_loss": 0.5, "val_accuracy": 0.9189, "val_average_error": 0.0811,
                "val_samples": 1024.0, "val_minibatches": 32.0, "val_index": 0.0, "samples": 48.0,
            })

    def on_train_end(self, logs=None):
        self.publish("on_final_test_end", {"test_loss": 0.4, "test_accuracy": 0.9942, "test_samples": 10000.0, "test_minibatches": 313.0})


def test_evaluation_lines(tmp_path):
    x, y = data()
    log = tmp_path / "progress.log"
    kfit.fit(classifier(), x, y, minibatch_size=16, epochs=1, seed=0, verbose=0,
             callbacks=[PublishEvaluations(), ProgressPrinter(freq=3, log_to_file=log)])
    lines = lines_of(log)
    evaluations = [line for line in lines if line.startswith(("Finished Evaluation", "Finished Test"))]
    assert evaluations == [
        "Finished Evaluation [val_index=0]: Minibatch[1-32]: val_loss = 0.500000 * 1024, 1 - val_accuracy = 8.11%;",
        "Finished Test: Minibatch[1-313]: test_loss = 0.400000 * 10000, 1 - test_accuracy = 0.58%;",
    ]
    assert all(EVALUATION.match(line) for line in evaluations)
    # Cross-validation runs first in a step (order -10): its line precedes the interval ending at 48 samples.
    assert lines[lines.index(evaluations[0]) + 1].startswith("Minibatch[   1-   3]")


def test_with_kfit_cross_validation_and_test(tmp_path):
    x, y = data()
    log = tmp_path / "progress.log"
    callbacks = [
        kfit.callbacks.CrossValidation((x[:40], y[:40]), frequency=48, minibatch_size=16),
        kfit.callbacks.Test((x[:50], y[:50]), minibatch_size=20),
        ProgressPrinter(log_to_file=log),
    ]
    history = kfit.fit(classifier(), x, y, minibatch_size=16, epochs=1, seed=0, verbose=0, callbacks=callbacks)
    lines = lines_of(log)
    evaluations = [EVALUATION.match(line) for line in lines if line.startswith(("Finished Evaluation", "Finished Test"))]
    assert all(evaluations), lines
    results = callbacks[0].results
    # The evaluation's number is its val_index, as in the logs, the CSV history and the callback's index.
    assert [m[1] for m in evaluations] == ["0", "1", None] == [str(int(r["val_index"])) for r in results] + [None]
    assert [(m[2], m[3]) for m in evaluations] == [("3", "40"), ("3", "40"), ("3", "50")]
    assert [float(m[4]) for m in evaluations[:2]] == [pytest.approx((1 - r["val_accuracy"]) * 100, abs=0.006) for r in results]
    assert float(evaluations[2][4]) == pytest.approx((1 - history.history["test_accuracy"][0]) * 100, abs=0.006)


def test_log_file_appends_across_runs_with_tag(tmp_path, capsys):
    x, y = data(n=32)
    log = tmp_path / "logs" / "my.log"
    for _ in range(2):
        printer = ProgressPrinter(tag="mnist", log_to_file=str(log))
        kfit.fit(classifier(), x, y, batch_size=16, epochs=1, verbose=0, callbacks=[printer])
    assert capsys.readouterr().err.count(f"Redirecting log to file {log}") == 2
    lines = lines_of(log)
    epochs = [line for line in lines if "Finished Epoch" in line]
    assert len(epochs) == 2 and all(line.startswith("[mnist] Finished Epoch[1]: ") for line in epochs)
    assert all(line.startswith("[mnist] ") for line in lines)
    assert all(EPOCH.match(line[len("[mnist] "):]) for line in epochs)


def test_other_metrics_no_metric_and_learning_rate_per_minibatch(tmp_path):
    x, y = data(n=32)
    log = tmp_path / "progress.log"
    model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(1)])
    model.compile(optimizer="sgd", loss="mse", metrics=["mae"])
    callbacks = [kfit.callbacks.LearningRateSchedule(0.05), ProgressPrinter(freq=1, log_to_file=log)]
    kfit.fit(model, x, x[:, :1] * 2.0, batch_size=16, epochs=1, verbose=0, callbacks=callbacks)
    plain = classifier(metrics=())
    kfit.fit(plain, x, y, batch_size=16, epochs=1, verbose=0, callbacks=[ProgressPrinter(freq=1, log_to_file=log)])
    lines = [line for line in lines_of(log) if not SIZE.match(line)]
    assert lines[0] == "Learning rate per minibatch: 0.05"
    assert re.match(r"^Minibatch\[   1-   1\]: loss = \d+\.\d{6} \* 16, mae = \d+\.\d{6};$", lines[1])
    assert re.match(r"^Finished Epoch\[1\]: loss = \d+\.\d{6} \* 32, mae = \d+\.\d{6} \d+\.\d{3}s", lines[3])
    assert re.match(r"^Minibatch\[   1-   1\]: loss = \d+\.\d{6} \* 16;$", lines[4])
    assert re.match(r"^Finished Epoch\[1\]: loss = \d+\.\d{6} \* 32 \d+\.\d{3}s \(\s*\d+\.\d samples/s(; the first minibatch, compiling, took \d+\.\d{3}s)?\);$", lines[6])


def test_an_accuracy_a_hair_above_one_from_rounding_shows_no_negative_error(tmp_path):
    model = keras.Sequential([keras.Input((1,)), keras.layers.Dense(1)])
    attach_clock(model, Clock(epoch_size=16))
    log = tmp_path / "progress.log"
    printer = ProgressPrinter(log_to_file=log)
    printer.set_model(model)
    printer.on_train_begin()
    printer.on_cross_validation_end(0, {"val_loss": 0.5, "val_accuracy": 1.0000001, "val_samples": 4,
                                        "val_minibatches": 1})
    assert lines_of(log) == ["Finished Evaluation [val_index=0]: Minibatch[1-1]: val_loss = 0.500000 * 4, "
                             "1 - val_accuracy = 0.00%;"]


def test_only_the_chief_prints(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(kfit.distributed, "is_chief", lambda: False)
    model = keras.Sequential([keras.Input((1,)), keras.layers.Dense(1)])
    clock = attach_clock(model, Clock(epoch_size=16))
    log = tmp_path / "progress.log"
    printers = [ProgressPrinter(freq=1, log_to_file=log), ProgressPrinter(freq=1)]
    for printer in printers:
        printer.set_model(model)
        printer.on_train_begin()
        printer.on_epoch_begin(0)
    clock.minibatch_size = 16
    for printer in printers:
        printer.on_step_begin(clock)
    clock.advance(16)
    for printer in printers:
        printer.on_step_end(clock, {"loss": 1.0})
        printer.on_hyperparameter_change("lr", 0.1, 0.1, "per_minibatch")
        printer.on_epoch_end(0, {"loss": 1.0})
        printer.on_cross_validation_end(0, {"val_loss": 1.0, "val_samples": 4, "val_minibatches": 1})
    assert not log.exists() and capsys.readouterr().err == ""


def test_state_resumes_the_interval_in_progress(capsys):
    # Keras's running means m_k over n_k samples; per-minibatch losses 1, 2, 3, 4 (8 samples each).
    per_batch = [1.0, 2.0, 3.0, 4.0]
    running = [np.mean(per_batch[: k + 1]) for k in range(4)]
    model = keras.Sequential([keras.Input((1,)), keras.layers.Dense(1)])
    clock = attach_clock(model, Clock(epoch_size=32))
    first = ProgressPrinter(freq=2)
    first.set_model(model)
    first.on_epoch_begin(0)
    for k in range(3):
        clock.minibatch_size = 8
        clock.advance(8)
        first.on_step_end(clock, {"loss": np.float32(running[k])})
    state = first.get_state()
    # A new run restores the state and the clock (samples 24, minibatches 3) and trains minibatch 4.
    model2 = keras.Sequential([keras.Input((1,)), keras.layers.Dense(1)])
    clock2 = attach_clock(model2, Clock(samples=24, minibatches=3, epoch_size=32))
    second = ProgressPrinter(freq=2)
    second.set_model(model2)
    second.set_state(state)
    second.on_epoch_begin(0)
    clock2.minibatch_size = 8
    clock2.advance(8)
    second.on_step_end(clock2, {"loss": running[3]})
    assert capsys.readouterr().err.splitlines() == [
        "Minibatch[   1-   2]: loss = 1.500000 * 16;",
        "Minibatch[   3-   4]: loss = 3.500000 * 16;",
    ]


def test_a_run_resumed_mid_interval_prints_what_an_uninterrupted_run_prints(tmp_path):
    x, y = data()
    weights = classifier().get_weights()

    def run(name, callbacks, **kwargs):
        model = classifier()
        model.set_weights(weights)
        log = tmp_path / f"{name}.log"
        kfit.fit(model, x, y, minibatch_size=16, epochs=2, seed=0, verbose=0,
                 callbacks=[*callbacks, ProgressPrinter(freq=2, log_to_file=log)], **kwargs)
        return [line for line in lines_of(log) if MINIBATCH.match(line) or EPOCH.match(line)]

    def means(line):  # the line without its timing
        return re.sub(r" \d+\.\d{3}s \(.*\);$", "", line)

    whole = run("whole", [])
    checkpoint = str(tmp_path / "run.ckpt")
    # Interrupted at 144 samples: minibatch 3 of epoch 2, inside the interval [3-4].
    before = run("before", [kfit.callbacks.Checkpoint(checkpoint, frequency=48)], max_samples=144)
    after = run("after", [kfit.callbacks.Checkpoint(checkpoint, frequency=48, restore=True)])
    assert before[-1].startswith("Finished Epoch[2]: loss = ") and " * 48, " in before[-1]  # the partial epoch
    assert after[0].startswith("Minibatch[   3-   4]: ") and after[0] == whole[-3]
    assert [means(line) for line in before[:-1] + after] == [means(line) for line in whole]


def test_no_batch_end_hook_without_minibatch_lines():
    # Keras converts the logs after every step (a device sync) for any callback with a batch-end hook.
    def has_hook(callback):
        return not getattr(callback.on_train_batch_end, "_is_default", False)

    assert not has_hook(ProgressPrinter()) and not has_hook(kfit.callbacks.TensorBoardProgressWriter())
    assert has_hook(ProgressPrinter(freq=10)) and has_hook(ProgressPrinter(first=1))
    assert has_hook(kfit.callbacks.TensorBoardProgressWriter(freq=10))


@pytest.mark.parametrize(
    "kwargs,name",
    [({"freq": -1}, "freq"), ({"freq": 1.5}, "freq"), ({"first": -2}, "first"), ({"first": True}, "first"),
     ({"tag": 3}, "tag"), ({"log_to_file": 5}, "log_to_file"), ({"metric_is_pct": "yes"}, "metric_is_pct")],
)
def test_invalid_arguments_are_named(kwargs, name):
    with pytest.raises(ValueError, match=rf"`{name}`.*{name}="):
        ProgressPrinter(**kwargs)


def test_cntk_options_are_accepted_or_refused_saying_what_to_do():
    # CNTK's tutorials write ProgressPrinter(tag='Training', num_epochs=N): num_epochs is metadata, kept.
    assert ProgressPrinter(tag="Training", num_epochs=5, rank=None, gen_heartbeat=False).num_epochs == 5
    for kwargs, match in [
        ({"rank": -1}, r"`rank`.*rank=-1"),
        ({"gen_heartbeat": True}, r"gen_heartbeat=True.*leave gen_heartbeat out"),
        ({"test_freq": 10}, r"test_freq=10.*Finished Evaluation"),
        ({"distributed_freq": 5}, r"distributed_freq=5"),
        ({"num_epochs": 0}, r"`num_epochs`.*num_epochs=0"),
    ]:
        with pytest.raises(ValueError, match=match):
            ProgressPrinter(50, **kwargs)


def test_cntk_rank_names_the_log_file_as_cntk_did(tmp_path, capsys):
    """CNTK's ProgressPrinter(log_to_file=path, rank=Communicator.rank()) wrote to f"{path}rank{rank}"; without a
    file, rank changes nothing. Only the chief prints, as always."""
    x, y = data(n=32)
    log = tmp_path / "log.txt"
    kfit.fit(classifier(), x, y, batch_size=16, epochs=1, verbose=0,
             callbacks=[ProgressPrinter(log_to_file=log, rank=kfit.distributed.rank()), ProgressPrinter(rank=0)])
    assert not log.exists()
    file_lines, console_lines = lines_of(tmp_path / "log.txtrank0"), capsys.readouterr().err.splitlines()
    assert EPOCH.match(file_lines[-1]) and EPOCH.match(console_lines[-1]), (file_lines, console_lines)
    assert "Redirecting log to file " + str(tmp_path / "log.txtrank0") in console_lines


def test_positional_arguments_follow_cntks_order():
    """CNTK: ProgressPrinter(freq, first, tag, log_to_file, rank, gen_heartbeat, num_epochs, test_freq, test_first,
    metric_is_pct, distributed_freq, distributed_first): a positional CNTK call means what it meant there."""
    printer = ProgressPrinter(50, 10, "t", None, None, False, 5, None, 0, False, None, 0)
    assert (printer.freq, printer.first, printer.tag, printer.num_epochs) == (50, 10, "t", 5)
    assert printer._value("accuracy", 0.9) == "accuracy = 0.900000"  # metric_is_pct=False: no '1 - accuracy'
    assert ProgressPrinter(50, 10, "t", None, None, False, 5)._value("accuracy", 0.9) == "1 - accuracy = 10.00%"
    # The fifth is CNTK's rank, not metric_is_pct; a bool there says where it went.
    assert ProgressPrinter(50, 10, "t", None, 0).rank == 0
    with pytest.raises(ValueError, match=r"`rank`.*rank=False.*fifth argument is CNTK's `rank`.*metric_is_pct=\.\.\. by keyword"):
        ProgressPrinter(50, 10, "t", None, False)
    with pytest.raises(ValueError, match=r"gen_heartbeat=True"):
        ProgressPrinter(50, 10, "t", None, None, True)
    assert ProgressPrinter(metric_is_pct=False, name="console").name == "console"


def test_every_value_is_labelled_with_its_keras_name(tmp_path):
    """Two metrics and a validation set: the loss and every metric appear, each under Keras's name."""
    x, y = data()
    log = tmp_path / "progress.log"
    model = classifier(metrics=("accuracy", keras.metrics.SparseTopKCategoricalAccuracy(k=2, name="top2_accuracy")))
    history = kfit.fit(model, x, y, minibatch_size=32, epochs=1, seed=0, verbose=0, validation_data=(x[:40], y[:40]),
                       callbacks=[ProgressPrinter(freq=1, log_to_file=log),
                                  ProgressPrinter(metric_is_pct=False, log_to_file=tmp_path / "plain.log")])
    lines = lines_of(log)
    assert re.match(r"^Minibatch\[   1-   1\]: loss = \d\.\d{6} \* 32, 1 - accuracy = \d+\.\d\d%, 1 - top2_accuracy = \d+\.\d\d%;$", lines[1]), lines
    epoch = next(line for line in lines if line.startswith("Finished Epoch[1]"))
    acc, top2 = history.history["accuracy"][0], history.history["top2_accuracy"][0]
    assert epoch.startswith(f"Finished Epoch[1]: loss = {history.history['loss'][0]:.6f} * 96, "
                            f"1 - accuracy = {(1 - acc) * 100:.2f}%, 1 - top2_accuracy = {(1 - top2) * 100:.2f}% ")
    assert "metric" not in " ".join(lines)
    plain = next(line for line in lines_of(tmp_path / "plain.log") if line.startswith("Finished Epoch[1]"))
    assert f"accuracy = {acc:.6f}, top2_accuracy = {top2:.6f} " in plain


def test_samples_per_second_after_a_resume_leave_out_the_compiling_minibatch(tmp_path):
    """The first epoch of a resumed run: the restore and the compilation of the train step are not counted
    as training time; the line says how long the first minibatch took."""
    x, y = data(n=512)
    path = str(tmp_path / "run.ckpt")
    log = tmp_path / "progress.log"

    class Crash(keras.callbacks.Callback):
        def on_epoch_begin(self, epoch, logs=None):
            if epoch == 1:
                raise RuntimeError("crash")

    def run(*extra):
        callbacks = [ProgressPrinter(log_to_file=log), kfit.callbacks.Checkpoint(path, async_write=False), *extra]
        return kfit.fit(classifier(), x, y, minibatch_size=16, epochs=3, seed=0, verbose=0, callbacks=callbacks)

    with pytest.raises(RuntimeError):
        run(Crash())
    history = run()
    epochs = [line for line in lines_of(log) if line.startswith("Finished Epoch")]
    assert [line[:17] for line in epochs] == ["Finished Epoch[1]", "Finished Epoch[2]", "Finished Epoch[3]"]
    resumed = re.search(r" (\d+\.\d{3})s \(\s*(\d+\.\d) samples/s; the first minibatch, compiling, took (\d+\.\d{3})s\);$", epochs[1])
    assert resumed, epochs[1]
    seconds, speed, first = float(resumed[1]), float(resumed[2]), float(resumed[3])
    # 31 of the epoch's 32 minibatches ran after the first one, in (seconds - first) at most.
    assert speed >= 496 / seconds
    assert speed == pytest.approx(496 / max(seconds - first, 1e-3), rel=0.5)
    assert history.epoch_summaries[-1].samples == 512


def test_the_rate_of_reduce_lr_on_plateau_without_a_schedule_is_printed_from_the_start_and_after_a_resume(tmp_path):
    """Without a LearningRateSchedule, ReduceLROnPlateau sets the optimizer's rate, and the printer heard of the rate
    only at a reduction: a run printed no rate before its first one (the log's last rate line, an earlier run's in the
    same file, or none, was not the rate trained with), and a resumed run no line for the reduced rate it restored."""
    x, y = data()
    log = tmp_path / "progress.log"
    path = str(tmp_path / "run.ckpt")

    def run(epochs, restore):
        reduce = kfit.callbacks.ReduceLROnPlateau("loss", factor=0.5, patience=0, min_delta=100.0)  # each epoch but the first
        kfit.fit(classifier(), x, y, minibatch_size=16, epochs=epochs, seed=0, verbose=0, callbacks=[
            reduce, kfit.callbacks.Checkpoint(path, restore=restore, async_write=False), ProgressPrinter(log_to_file=log)])

    run(3, restore=False)
    run(4, restore=True)
    lines = [line for line in lines_of(log) if not SIZE.match(line)]
    shown = [line.split(":")[0] if EPOCH.match(line) else line for line in lines]  # (a float32 rate by its shortest form)
    assert shown == [
        "Learning rate per minibatch: 0.05", "Finished Epoch[1]",
        "Learning rate per minibatch: 0.025", "Finished Epoch[2]",  # (announced as the epoch that led to it ends)
        "Learning rate per minibatch: 0.0125", "Finished Epoch[3]",
        "Learning rate per minibatch: 0.0125",  # the resumed run's
        "Learning rate per minibatch: 0.00625", "Finished Epoch[4]",
    ], lines


@pytest.mark.parametrize("stop_at, first_line", [(128, "Minibatch[   3-   4]: "), (144, "Minibatch[   4-   4]: ")])
def test_a_run_resumed_mid_epoch_from_a_checkpoint_without_printer_state_continues_the_epochs_lines(
        tmp_path, stop_at, first_line):
    """kfit.fit resumed inside an epoch from a file a run without a ProgressPrinter wrote: the printer took its
    baseline from the metrics Keras had just reset (the resumed epoch's running means put back later) and numbered
    the epoch's minibatches from the resume ('Minibatch[1-2]: loss = 2.772845' for the uninterrupted run's
    'Minibatch[3-4]: loss = 1.312143')."""
    x, y = data()
    weights = classifier().get_weights()
    checkpoint = str(tmp_path / "run.ckpt")

    def run(name, callbacks, **kwargs):
        model = classifier()
        model.set_weights(weights)
        log = tmp_path / f"{name}.log"
        kfit.fit(model, x, y, minibatch_size=16, epochs=2, seed=0, verbose=0, callbacks=callbacks, **kwargs)
        return [re.sub(r" \d+\.\d{3}s \(.*\);$", "", line)  # (the timing left out)
                for line in lines_of(log) if MINIBATCH.match(line) or EPOCH.match(line)] if log.exists() else []

    whole = run("whole", [ProgressPrinter(freq=2, log_to_file=tmp_path / "whole.log")])
    # Stopped inside epoch 2 (6 minibatches of 16), after its minibatch 2 (the end of an interval) or 3 (inside one).
    run("before", [kfit.callbacks.Checkpoint(checkpoint, frequency=16, async_write=False)], max_samples=stop_at)
    with pytest.warns(UserWarning, match="holds no state for callback 'progress_printer'"):
        after = run("after", [kfit.callbacks.Checkpoint(checkpoint, frequency=16, restore=True, async_write=False),
                              ProgressPrinter(freq=2, log_to_file=tmp_path / "after.log")])
    assert after[0].startswith(first_line), after
    if stop_at == 128:
        assert after == whole[-3:]  # [3-4], [5-6], Finished Epoch[2]
    else:  # the interval in progress began before the resume: its line covers minibatch 4, then as uninterrupted
        assert " * 16, " in after[0] and after[1:] == whole[-2:]


def test_tensorboard_minibatch_points_resumed_mid_epoch_without_writer_state_equal_the_uninterrupted_runs(tmp_path):
    """TensorBoardProgressWriter follows the epoch's intervals as the ProgressPrinter does (the same defect before)."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    x, y = data()
    weights = classifier().get_weights()
    checkpoint = str(tmp_path / "run.ckpt")

    def run(name, callbacks, **kwargs):
        model = classifier()
        model.set_weights(weights)
        kfit.fit(model, x, y, minibatch_size=16, epochs=2, seed=0, verbose=0, callbacks=callbacks, **kwargs)
        if not (tmp_path / name).exists():
            return None
        accumulator = EventAccumulator(str(tmp_path / name))
        accumulator.Reload()
        return {tag: [(e.step, pytest.approx(e.value, rel=1e-5)) for e in accumulator.Scalars(tag)]
                for tag in ("minibatch/loss", "minibatch/accuracy", "loss", "accuracy")}

    whole = run("whole", [kfit.callbacks.TensorBoardProgressWriter(tmp_path / "whole", freq=2)])
    run("before", [kfit.callbacks.Checkpoint(checkpoint, frequency=16, async_write=False)], max_samples=128)
    with pytest.warns(UserWarning, match="holds no state for callback 'tensorboard_progress_writer'"):
        after = run("after", [kfit.callbacks.Checkpoint(checkpoint, frequency=16, restore=True, async_write=False),
                              kfit.callbacks.TensorBoardProgressWriter(tmp_path / "after", freq=2)])
    assert after == {tag: [(step, value) for step, value in points if step > 128] for tag, points in whole.items()}
    assert [step for step, _ in after["minibatch/loss"]] == [160, 192]
