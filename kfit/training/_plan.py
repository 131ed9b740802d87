"""Which minibatch comes next: a pure function of the clock.

A minibatch never crosses an epoch boundary (the last minibatch of an epoch is cut short, as
``model.fit`` does with its last batch), nor ``max_samples``. Because the plan is a function of the clock
alone, the data reader can run ahead of training and a resumed run draws exactly the minibatches the
interrupted one would have.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator

SizeFunction = Callable[[int, int], int]


def next_minibatch(samples: int, minibatches: int, size_at: SizeFunction, epoch_size: int, max_samples: int | None) -> int:
    """The global size of the minibatch drawn at clock reading ``(samples, minibatches)``."""
    size = int(size_at(samples, minibatches))
    if size < 1:
        raise ValueError(f"The minibatch-size schedule gave {size} at sample {samples}; sizes must be positive.")
    epoch_end = (samples // epoch_size + 1) * epoch_size
    size = min(size, epoch_end - samples)
    if max_samples is not None:
        size = min(size, max_samples - samples)
    return size


def plan(samples: int, minibatches: int, size_at: SizeFunction, epoch_size: int, stop_at: int | None) -> Iterator[tuple[int, int]]:
    """The ``(start, size)`` of every minibatch from a clock reading up to ``stop_at`` samples."""
    while stop_at is None or samples < stop_at:
        size = next_minibatch(samples, minibatches, size_at, epoch_size, stop_at)
        yield samples, size
        samples += size
        minibatches += 1


def minibatches_before(samples: int, size_at: SizeFunction, epoch_size: int) -> int:
    """The minibatches the plan draws from the start of training up to ``samples`` (an epoch boundary)."""
    return sum(1 for _ in plan(0, 0, size_at, epoch_size, samples))
