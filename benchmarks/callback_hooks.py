"""What kfit's schedule callbacks add to each training step's callback hooks under plain ``model.fit``.

Keras's ``CallbackList`` is driven as ``model.fit`` drives it (``on_train_batch_begin``/``end`` for every step of
an epoch), with no model step in between, so that only the hooks are timed: once with ``model.fit``'s own
``History`` alone (A) and once with kfit's ``SampleClock``, ``LearningRateSchedule`` (per sample, two values) and
``MomentumSchedule`` (time constant, two values) added (B). Both sides alternate in one process; the difference
of the medians is what the callbacks cost per step, to be set against a step's time (``benchmarks/overhead.py``:
about 250 us on JAX at minibatch 64, the fastest step measured there).

A second measure times the same hooks inside real ``model.fit`` calls (the small MLP of ``overhead.py`` at
minibatch 64), where they run between train steps and find colder caches: ``CallbackList``'s
``on_train_batch_begin`` and ``on_train_batch_end`` are timed at every step, and each step's wall time (from its
begin hook to the next step's), for three sides in rotating order, one epoch per call: no callback, three Keras
callbacks that do nothing (what any three callbacks cost Keras's loop), and kfit's three. The hooks' median per step
does not move with the machine's load as wall-clock epoch ratios do; it is set against the median step as the share
of a step the callbacks cost.

Run:  python benchmarks/callback_hooks.py  [--repeats 9] [--backends jax] [--steps 4096]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(__file__))
from _common import BACKENDS, run_per_backend, setup_threads, small_mlp_task  # noqa: E402


def measure(backend: str, repeats: int, steps: int) -> None:
    import keras

    import kfit

    setup_threads()
    batch, samples = 64, 64 * steps
    model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(2)])
    model.compile(optimizer=kfit.optimizers.MomentumSGD(0.01), loss="mse")

    def callbacks(with_kfit: bool) -> list:
        if not with_kfit:
            return []
        return [kfit.callbacks.SampleClock(batch_size=batch, num_samples=samples),
                kfit.callbacks.LearningRateSchedule(kfit.schedules.learning_rate_per_sample([1e-4, 5e-5], epoch_size=samples)),
                kfit.callbacks.MomentumSchedule(kfit.schedules.momentum_as_time_constant([0, 1024], epoch_size=samples))]

    def epoch(with_kfit: bool) -> float:
        hooks = keras.callbacks.CallbackList(callbacks(with_kfit), model=model, add_history=True, add_progbar=False,
                                             epochs=2, steps=steps, verbose=0)
        hooks.on_train_begin()
        start = time.perf_counter()
        for e in range(2):  # two epochs: the schedules change value once
            hooks.on_epoch_begin(e)
            for step in range(steps):
                hooks.on_train_batch_begin(step)
                hooks.on_train_batch_end(step, {})
            hooks.on_epoch_end(e, {"loss": 0.0})
        elapsed = time.perf_counter() - start
        hooks.on_train_end()
        return elapsed / (2 * steps) * 1e6

    epoch(False), epoch(True)  # warm up
    times: dict[bool, list[float]] = {False: [], True: []}
    for _ in range(repeats):
        for with_kfit in (False, True):
            times[with_kfit].append(epoch(with_kfit))
    a, b = statistics.median(times[False]), statistics.median(times[True])
    print(f"hooks per step, median of {repeats}: model.fit's own (A) {a:.1f} us, with kfit's schedule callbacks (B) "
          f"{b:.1f} us; kfit adds {b - a:.1f} us per step", flush=True)
    print(f"HOOKS {backend} A={a:.1f} B={b:.1f} added={b - a:.1f}", flush=True)
    in_fit(repeats)


def in_fit(repeats: int, batch: int = 64, samples: int = 16384) -> None:
    """Times ``CallbackList``'s batch hooks at every step of real ``model.fit`` calls, and the steps themselves, for
    three sides: no callback, three Keras callbacks that do nothing (the floor that any three callbacks pay), and kfit's
    three schedule callbacks. One epoch per call; the order of the sides and their models rotate from round to round."""
    import keras
    from keras.src.callbacks.callback_list import CallbackList  # the class model.fit builds (Keras internal)

    import kfit

    x, y, make_model = small_mlp_task(samples)
    hook_times: list[float] = []
    step_starts: list[float] = []
    originals = {hook: getattr(CallbackList, hook) for hook in ("on_train_batch_begin", "on_train_batch_end")}

    def timed(hook):
        def wrapper(self, *args, **kwargs):
            start = time.perf_counter()
            try:
                return hook(self, *args, **kwargs)
            finally:
                hook_times.append(time.perf_counter() - start)
                if hook.__name__ == "on_train_batch_begin":
                    step_starts.append(start)
        return wrapper

    class DoNothing(keras.callbacks.Callback):
        def on_train_batch_begin(self, batch, logs=None):
            pass

    sides = {
        "model.fit": lambda: [],
        "3 no-op Keras callbacks": lambda: [DoNothing(), DoNothing(), DoNothing()],
        "kfit's 3 schedule callbacks": lambda: [
            kfit.callbacks.SampleClock(batch_size=batch, num_samples=samples),
            kfit.callbacks.LearningRateSchedule(kfit.schedules.learning_rate_per_sample(1e-4)),
            kfit.callbacks.MomentumSchedule(kfit.schedules.momentum_as_time_constant(1024))],
    }
    names = list(sides)

    def call(model, name: str) -> tuple[float, float]:
        """(median hooks per step, median time from one step's begin hook to the next's), in us."""
        hook_times.clear()
        step_starts.clear()
        model.fit(x, y, batch_size=batch, epochs=1, verbose=0, callbacks=sides[name]())
        hooks = [hook_times[2 * i] + hook_times[2 * i + 1] for i in range(len(hook_times) // 2)]
        steps = [b - a for a, b in zip(step_starts, step_starts[1:])]
        return statistics.median(hooks) * 1e6, statistics.median(steps) * 1e6

    models = [make_model() for _ in names]
    results: dict[str, list[tuple[float, float]]] = {name: [] for name in names}
    try:
        for hook, original in originals.items():
            setattr(CallbackList, hook, timed(original))
        for model, name in zip(models, names):
            call(model, name)  # compile and warm up
        for round_ in range(repeats):
            for i in range(len(names)):
                name = names[(i + round_) % len(names)]
                results[name].append(call(models[(names.index(name) + round_) % len(models)], name))
    finally:
        for hook, original in originals.items():
            setattr(CallbackList, hook, original)
    hooks = {name: statistics.median(r[0] for r in results[name]) for name in names}
    steps = {name: statistics.median(r[1] for r in results[name]) for name in names}
    base = names[0]
    print(f"inside model.fit (minibatch {batch}, median of {repeats} one-epoch calls per side):", flush=True)
    for name in names:
        print(f"  {name:28s} hooks per step {hooks[name]:5.1f} us (+{hooks[name] - hooks[base]:.1f}), "
              f"step {steps[name]:6.0f} us (+{steps[name] - steps[base]:.1f})", flush=True)
    added = hooks[names[2]] - hooks[base]
    print(f"  kfit's hooks: {100 * added / steps[base]:.1f}% of a step (throughput ratio at most "
          f"{steps[base] / (steps[base] + added):.3f} from the hooks)", flush=True)
    print(f"IN_FIT {backend_name()} A={hooks[base]:.1f} NOOP={hooks[names[1]]:.1f} B={hooks[names[2]]:.1f} "
          f"added={added:.1f} step={steps[base]:.0f} stepNOOP={steps[names[1]]:.0f} stepB={steps[names[2]]:.0f}",
          flush=True)


def backend_name() -> str:
    import keras

    return keras.backend.backend()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--backend", help=argparse.SUPPRESS)
    parser.add_argument("--backends", default=",".join(BACKENDS))
    parser.add_argument("--repeats", type=int, default=9)
    parser.add_argument("--steps", type=int, default=4096)
    args = parser.parse_args()
    if args.backend:
        measure(args.backend, args.repeats, args.steps)
        return 0
    return run_per_backend(__file__, ["--repeats", str(args.repeats), "--steps", str(args.steps)],
                           args.backends.split(","))


if __name__ == "__main__":
    sys.exit(main())
