"""Training data as an endless, seekable stream of samples.

Arrays (NumPy, h5py datasets, anything with ``__len__`` and NumPy-style indexing) and nested dicts,
lists and tuples of them are read sweep after sweep; each sweep is shuffled by ``(seed, sweep)``.
A minibatch is a range of stream positions ``[start, start + size)`` and may span two sweeps. The
position is a pure function of the sample clock: reading the minibatch at position ``S`` needs nothing
that came before it, so resuming at ``S`` seeks in constant time.

Under data-parallel training each of ``num_workers`` workers reads its own contiguous share of every
global minibatch: worker ``r`` of ``n`` takes ``size // n`` positions (the first ``size % n`` workers
one more), so each sweep's samples are seen exactly once over all workers. A global minibatch of fewer samples
than workers (an epoch's or ``max_samples``'s last, cut short) leaves some shares empty: such a worker reads one
padding row instead, the global minibatch's last (:func:`read_share`), which its step trains with weight 0
(``kfit/distributed/_optimizer.py``).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from kfit import _checks

try:  # h5py is a dependency, but the stream works without it for plain arrays.
    import h5py
except ImportError:  # pragma: no cover
    h5py = None

ARGUMENT_NAMES = ("x", "y", "sample_weight")


def flatten(structure: Any) -> list:
    """Leaves of a nested dict/list/tuple structure, dict keys in sorted order; None is a leaf."""
    if isinstance(structure, Mapping):
        return [leaf for key in sorted(structure) for leaf in flatten(structure[key])]
    if isinstance(structure, (list, tuple)):
        return [leaf for item in structure for leaf in flatten(item)]
    return [structure]


def pack(structure: Any, leaves: list) -> Any:
    """Inverse of :func:`flatten`: rebuilds ``structure`` with ``leaves`` in place of its leaves."""
    it = iter(leaves)

    def build(node: Any) -> Any:
        if isinstance(node, Mapping):
            return {key: build(node[key]) for key in sorted(node)}
        if isinstance(node, (list, tuple)):
            return type(node)(build(item) for item in node)
        return next(it)

    return build(structure)


def to_host(structure: Any) -> Any:
    """Backend tensors in ``structure`` to NumPy; arrays and h5py datasets stay as they are (read by minibatch)."""
    if structure is None:
        return None
    leaves = []
    for leaf in flatten(structure):
        if leaf is not None and not isinstance(leaf, np.ndarray) and not type(leaf).__module__.startswith("h5py"):
            import keras

            if keras.ops.is_tensor(leaf) or hasattr(leaf, "__array__"):
                leaf = keras.ops.convert_to_numpy(leaf)
        leaves.append(leaf)
    return pack(structure, leaves)


def is_h5py_dataset(a: Any) -> bool:
    return h5py is not None and isinstance(a, h5py.Dataset)


def _is_array_like(a: Any) -> bool:
    return hasattr(a, "__len__") and hasattr(a, "shape") and hasattr(a, "__getitem__")


def take(source: Any, indices: np.ndarray) -> np.ndarray:
    """Rows ``indices`` of ``source``; h5py datasets are read by increasing unique index, never whole."""
    if type(source) is np.ndarray:  # the common case first: a gather from memory, once per minibatch and leaf
        return source[indices]
    if is_h5py_dataset(source):
        if len(indices) and np.all(np.diff(indices) == 1):
            return source[int(indices[0]) : int(indices[-1]) + 1]
        unique, inverse = np.unique(indices, return_inverse=True)
        if len(unique) and unique[-1] - unique[0] + 1 == len(unique):  # one range in another order (shuffle="batch")
            return source[int(unique[0]) : int(unique[-1]) + 1][inverse]
        return source[unique][inverse]
    if isinstance(source, np.ndarray):
        return source[indices]
    return np.asarray(source[indices])


def _shuffle_mode(shuffle: Any) -> bool | str:
    """True (each sweep shuffled), False (in order) or ``"batch"`` (in order, shuffled inside each minibatch)."""
    return "batch" if shuffle == "batch" else bool(shuffle)


def share(start: int, size: int, rank: int, num_workers: int) -> tuple[int, int]:
    """The positions ``[lo, hi)`` of worker ``rank``'s share of the global minibatch ``[start, start+size)``."""
    base, extra = divmod(size, num_workers)
    lo = start + rank * base + min(rank, extra)
    hi = lo + base + (1 if rank < extra else 0)
    return lo, hi


def read_share(start: int, size: int, rank: int, num_workers: int) -> tuple[int, int]:
    """The positions ``[lo, hi)`` worker ``rank`` reads for the global minibatch ``[start, start+size)``: its
    :func:`share`, or for an empty share one padding row, the global minibatch's last (a step needs a row; the
    padding row's weight is 0, :func:`real_count`)."""
    lo, hi = share(start, size, rank, num_workers)
    return (lo, hi) if hi > lo else (start + size - 1, start + size)


def real_count(size: int, rank: int, num_workers: int) -> int:
    """The real samples of worker ``rank``'s share of a global minibatch of ``size`` (0: it reads a padding row)."""
    lo, hi = share(0, size, rank, num_workers)
    return hi - lo


def check_global_minibatch(size: int, num_workers: int, pads_empty_shares: bool) -> None:
    """Refuses a global minibatch that ``num_workers`` workers cannot train: an empty one, or one of fewer samples
    than workers where the workers' steps cannot train a padding row (``pads_empty_shares``)."""
    if size < 1:
        raise ValueError(f"Invalid minibatch size {size}: a global minibatch holds at least 1 sample.")
    if size < num_workers and not pads_empty_shares:
        from kfit import _backend

        raise ValueError(
            f"A global minibatch of {size} sample(s) (an epoch's or max_samples's last minibatch is cut short) "
            f"cannot be shared among {num_workers} workers here: some workers would have no sample, and only the "
            f"PyTorch backend and the JAX engine's compiled step (KFIT_JAX_COLLECTIVES=step, the default of kfit's "
            f"native engine) train such a worker on a padding row of weight 0; this run is on "
            f"{_backend.BACKEND}. Choose minibatch_size, epoch_size and max_samples so that every minibatch holds "
            f"at least {num_workers} samples (an epoch's last minibatch holds epoch_size % minibatch_size).")


class SampleStream:
    """An endless, shuffled, seekable stream over array-like training data.

    Args:
        x: inputs: an array, an h5py dataset, or a dict/list/tuple of them.
        y: targets, same forms, or None.
        sample_weight: per-sample weights, or None.
        shuffle: shuffle each sweep (by ``(seed, sweep)``); False reads in order; ``"batch"`` reads the
            minibatches in order and shuffles the samples inside each (by ``(seed, its position)``), as
            ``model.fit(shuffle="batch")`` does: every minibatch reads one contiguous range of rows.
        seed: the stream's seed.
        rank: this worker's index under data-parallel training.
        num_workers: number of workers sharing each global minibatch.

    Raises:
        ValueError: empty data, leaves of different lengths (naming the arguments and the lengths),
            or data that cannot be indexed by sample.

    Example:
        >>> stream = SampleStream(np.arange(10), np.arange(10) * 2, shuffle=False)
        >>> x, y, sw = stream.read(8, 4)    # spans the end of sweep 0 and the start of sweep 1
        >>> x.tolist(), y.tolist(), sw
        ([8, 9, 0, 1], [16, 18, 0, 2], None)
    """

    def __init__(
        self,
        x: Any,
        y: Any = None,
        sample_weight: Any = None,
        *,
        shuffle: bool | str = True,
        seed: int = 0,
        rank: int = 0,
        num_workers: int = 1,
    ):
        _checks.choice("shuffle", shuffle, (True, False, "batch"))
        _checks.count("seed", seed)
        _checks.count("num_workers", num_workers, low=1)
        if not isinstance(rank, int) or not 0 <= rank < num_workers:
            raise ValueError(f"Invalid value for argument `rank`: expected 0 <= rank < {num_workers}. Received: rank={rank!r}")
        self.structure = (x, y, sample_weight)
        self.leaves = flatten(self.structure)
        lengths: dict[str, int] = {}
        for name, part in zip(ARGUMENT_NAMES, self.structure):
            for leaf in flatten(part):
                if leaf is None:
                    continue
                if not _is_array_like(leaf):
                    raise ValueError(
                        f"Invalid value for argument `{name}`: kfit reads training data by sample and needs arrays "
                        f"(NumPy arrays, h5py datasets) or dicts/lists/tuples of them. Received: {type(leaf).__name__}"
                    )
                lengths.setdefault(name, len(leaf))
                if len(leaf) != lengths[name]:
                    raise ValueError(
                        f"Invalid value for argument `{name}`: its arrays have different lengths "
                        f"({lengths[name]} and {len(leaf)}). Every array must hold one row per sample."
                    )
        if "x" not in lengths:
            raise ValueError("Invalid value for argument `x`: no training data was given. Received: x=None")
        if len(set(lengths.values())) > 1:
            detail = ", ".join(f"{k}: {v}" for k, v in lengths.items())
            raise ValueError(f"Arguments `x`, `y` and `sample_weight` must have the same number of samples. Received lengths {detail}.")
        self.num_samples = lengths["x"]
        if self.num_samples == 0:
            raise ValueError("Invalid value for argument `x`: the training data is empty (0 samples).")
        self.has_h5py = any(is_h5py_dataset(leaf) for leaf in self.leaves)
        #: Every array is a NumPy array in memory: reading a minibatch is a gather, faster than a reader thread.
        self.in_memory = all(leaf is None or isinstance(leaf, np.ndarray) for leaf in self.leaves)
        #: True (each sweep shuffled), False (in order) or ``"batch"`` (in order, shuffled inside each minibatch).
        self.shuffle: bool | str = _shuffle_mode(shuffle)
        self.seed = int(seed)
        self.rank = rank
        self.num_workers = num_workers
        #: Whether the workers' steps train an empty share as one padding row of weight 0 (else such a global
        #: minibatch is refused): set by ``kfit.fit`` from the engine (``distributed.pads_empty_shares``).
        self.pads_empty_shares = False
        self.position = 0
        #: The stream position that reads the first row: positions ``[origin, origin + num_samples)`` are sweep 0.
        #: ``kfit.fit`` moves it where an ``initial_epoch`` that is not a whole number of sweeps begins, since Keras's
        #: ``model.fit`` reads from the first row there.
        self.origin = 0
        self._order_cache: tuple[int, np.ndarray] | None = None
        #: ``x``, ``y`` and ``sample_weight`` are each one array or None: a minibatch is the tuple of its leaves.
        self._flat = not any(isinstance(part, (Mapping, list, tuple)) for part in self.structure)

    def order(self, sweep: int) -> np.ndarray:
        """The sample order of ``sweep`` (a permutation when each sweep is shuffled)."""
        if self.shuffle is not True:
            return np.arange(self.num_samples)
        cache = self._order_cache  # read once: tf.data's thread reads ahead (kfit.data._epochs_ahead)
        if cache is None or cache[0] != sweep:
            cache = (sweep, np.random.default_rng([self.seed, sweep]).permutation(self.num_samples))
            self._order_cache = cache
        return cache[1]

    def indices(self, start: int, stop: int) -> np.ndarray:
        """Sample indices at stream positions ``[start, stop)``."""
        n = self.num_samples
        start, stop = start - self.origin, stop - self.origin
        sweep, offset = divmod(start, n)
        if stop - start <= n - offset:  # within one sweep (most minibatches): a slice of its order, no copy
            if self.shuffle is not True:
                return np.arange(offset, offset + stop - start)
            return self.order(sweep)[offset : offset + stop - start]
        parts = []
        position = start
        while position < stop:
            sweep, offset = divmod(position, n)
            take_here = min(stop - position, n - offset)
            in_order = self.shuffle is not True
            parts.append(np.arange(offset, offset + take_here) if in_order else self.order(sweep)[offset:][:take_here])
            position += take_here
        return np.concatenate(parts) if parts else np.zeros(0, dtype=np.int64)

    def check_minibatch_size(self, size: int) -> None:
        """Refuses a global minibatch that the data or the workers cannot serve."""
        check_global_minibatch(size, self.num_workers, self.pads_empty_shares)
        if self.has_h5py and size > self.num_samples:
            raise ValueError(
                f"Invalid minibatch size {size}: the h5py dataset holds only {self.num_samples} samples, so a "
                f"minibatch would read samples twice. Use a minibatch size <= {self.num_samples}."
            )

    def read(self, start: int, size: int) -> tuple:
        """This worker's share of the global minibatch at positions ``[start, start + size)``.

        Returns:
            ``(x, y, sample_weight)`` with the structure of the data given to the constructor.
        """
        idx = self.rows(start, size)
        leaves = [None if leaf is None else take(leaf, idx) for leaf in self.leaves]
        if self._flat:
            return tuple(leaves)
        return pack(self.structure, leaves)

    def rows(self, start: int, size: int) -> np.ndarray:
        """The sample indices :meth:`read` gathers for the global minibatch ``[start, start + size)``."""
        self.check_minibatch_size(size)
        lo, hi = read_share(start, size, self.rank, self.num_workers)
        if self.shuffle != "batch":
            return self.indices(lo, hi)
        rows = self.indices(start, start + size)[np.random.default_rng([self.seed, start]).permutation(size)]
        return rows[lo - start : hi - start]

    def signature(self) -> str:
        """The shapes past the first axis and the dtypes of the data's arrays (``x``, ``y``, ``sample_weight``)."""
        return repr([None if leaf is None else (tuple(leaf.shape[1:]), str(leaf.dtype)) for leaf in self.leaves])

    def get_state(self) -> dict[str, Any]:
        """The stream's position and seed (plain data).

        ``position`` is the global sample position of the next minibatch; the trainer keeps it equal to
        the clock's sample count.
        """
        return {"position": int(self.position), "seed": self.seed, "shuffle": self.shuffle, "num_samples": self.num_samples}

    def set_state(self, state: Mapping[str, Any]) -> None:
        """Seeks to a saved position. Refuses a state saved for other data."""
        if int(state.get("num_samples", self.num_samples)) != self.num_samples:
            raise ValueError(
                f"The saved stream state is for {state['num_samples']} samples, but the training data holds "
                f"{self.num_samples}. Resume with the same training data."
            )
        self.seed = int(state.get("seed", self.seed))
        self.shuffle = _shuffle_mode(state.get("shuffle", self.shuffle))
        self.position = int(state["position"])
        self._order_cache = None


def dataset_length(structure: Any) -> int | None:
    """Number of samples in array-like data, or None for other data."""
    for leaf in flatten(structure):
        if leaf is not None and _is_array_like(leaf):
            return len(leaf)
    return None


def is_sparse(a: Any) -> bool:
    """True for a sparse matrix or tensor (SciPy, ``tf.SparseTensor``, JAX ``BCOO``): Keras's own adapter
    reads those (kfit's stream gathers dense rows)."""
    module, name = type(a).__module__, type(a).__name__
    return (module.startswith("scipy.sparse") or (module.startswith("tensorflow") and name == "SparseTensor")
            or (module.startswith("jax") and name in ("BCOO", "BCSR")))


def is_streamable(x: Any) -> bool:
    """True when ``x`` is array-like data the stream can read by sample (dense: not sparse)."""
    leaves = [leaf for leaf in flatten(x) if leaf is not None]
    return bool(leaves) and all(_is_array_like(leaf) and not is_sparse(leaf) for leaf in leaves)

