"""The sample stream: sweeps, shuffling, seeking, sharding, h5py, bad input."""

import h5py
import numpy as np
import pytest

from kfit.data import Prefetcher, PrefetcherClosed, SampleStream, share


def sequential_positions(stream, sizes):
    start = 0
    for size in sizes:
        yield start, size
        start += size


def test_sweeps_are_permutations_and_minibatches_span_sweeps():
    stream = SampleStream(np.arange(10), seed=3)
    idx = stream.indices(0, 30)
    for sweep in range(3):
        assert sorted(idx[sweep * 10 : (sweep + 1) * 10].tolist()) == list(range(10))
    # different sweeps are shuffled differently, and the same (seed, sweep) gives the same order
    assert idx[:10].tolist() != idx[10:20].tolist()
    assert SampleStream(np.arange(10), seed=3).indices(10, 20).tolist() == idx[10:20].tolist()
    x, _, _ = stream.read(8, 5)
    assert x.tolist() == idx[8:13].tolist()


def test_seek_gives_the_minibatch_that_reading_up_to_it_gives():
    data = np.random.default_rng(0).normal(size=(37, 3)).astype("float32")
    sizes = [5, 7, 3, 11, 13, 2, 40, 9]
    reader = SampleStream(data, seed=11)
    batches = [reader.read(start, size)[0] for start, size in sequential_positions(reader, sizes)]
    starts = list(sequential_positions(reader, sizes))
    for k, (start, size) in enumerate(starts):
        fresh = SampleStream(data, seed=11)
        fresh.set_state({"position": start, "seed": 11, "shuffle": True, "num_samples": 37})
        np.testing.assert_array_equal(fresh.read(fresh.position, size)[0], batches[k])


def test_no_shuffle_reads_in_order():
    stream = SampleStream(np.arange(6), shuffle=False)
    assert stream.read(4, 4)[0].tolist() == [4, 5, 0, 1]


@pytest.mark.parametrize("size,workers", [(8, 2), (9, 2), (10, 3), (3, 3)])
def test_worker_shares_cover_each_global_minibatch_exactly_once(size, workers):
    data = np.arange(50)
    global_stream = SampleStream(data, seed=5)
    for start in (0, 17, 45):
        expected = global_stream.indices(start, start + size)
        parts = [SampleStream(data, seed=5, rank=r, num_workers=workers).read(start, size)[0] for r in range(workers)]
        assert np.concatenate(parts).tolist() == expected.tolist()
        lengths = [len(p) for p in parts]
        assert max(lengths) - min(lengths) <= 1
    assert share(0, 9, 0, 2) == (0, 5) and share(0, 9, 1, 2) == (5, 9)


def test_dict_and_tuple_structures(rng):
    x = {"image": rng.normal(size=(12, 2, 2)), "meta": rng.normal(size=(12, 3))}
    y = (np.arange(12), np.arange(12) * 10)
    stream = SampleStream(x, y, shuffle=False)
    bx, by, sw = stream.read(3, 4)
    assert set(bx) == {"image", "meta"} and bx["image"].shape == (4, 2, 2)
    assert isinstance(by, tuple) and by[1].tolist() == [30, 40, 50, 60]
    assert sw is None


def test_h5py_datasets_are_read_by_minibatch(tmp_path):
    path = tmp_path / "data.h5"
    with h5py.File(path, "w") as f:
        f["x"] = np.arange(40, dtype="float32").reshape(20, 2)
        f["y"] = np.arange(20, dtype="int64")
    with h5py.File(path, "r") as f:
        stream = SampleStream(f["x"], f["y"], seed=2)
        memory = SampleStream(np.asarray(f["x"]), np.asarray(f["y"]), seed=2)
        for start, size in [(0, 6), (6, 6), (18, 6), (7, 20)]:
            a, b = stream.read(start, size), memory.read(start, size)
            np.testing.assert_array_equal(a[0], b[0])
            np.testing.assert_array_equal(a[1], b[1])
        with pytest.raises(ValueError, match="h5py dataset holds only 20 samples"):
            stream.read(0, 21)


def test_a_worker_whose_share_is_empty_reads_the_global_minibatchs_last_row_as_padding():
    from kfit.data._stream import real_count

    workers = [SampleStream(np.arange(10), shuffle=False, num_workers=3, rank=r) for r in range(3)]
    for stream in workers:
        stream.pads_empty_shares = True
    # A global minibatch of 2 at position 4: ranks 0 and 1 read a sample each, rank 2 the last one again (padding).
    assert [s.read(4, 2)[0].tolist() for s in workers] == [[4], [5], [5]]
    assert [real_count(2, r, 3) for r in range(3)] == [1, 1, 0]
    assert [s.read(4, 4)[0].tolist() for s in workers] == [[4, 5], [6], [7]]  # no share empty: no padding


def test_bad_input_names_the_argument_and_the_lengths():
    with pytest.raises(ValueError, match=r"same number of samples.*x: 10.*y: 9"):
        SampleStream(np.zeros((10, 2)), np.zeros(9))
    with pytest.raises(ValueError, match=r"sample_weight: 3"):
        SampleStream(np.zeros((10, 2)), np.zeros(10), np.zeros(3))
    with pytest.raises(ValueError, match="`x`.*different lengths \\(5 and 4\\)"):
        SampleStream({"a": np.zeros(5), "b": np.zeros(4)})
    with pytest.raises(ValueError, match="empty"):
        SampleStream(np.zeros((0, 3)))
    with pytest.raises(ValueError, match="`x`"):
        SampleStream(None)
    with pytest.raises(ValueError, match="`seed`"):
        SampleStream(np.zeros(3), seed=-1)
    with pytest.raises(ValueError, match="1 sample.*cannot be shared among 2 workers.*at least 2 samples"):
        SampleStream(np.zeros(10), num_workers=2, rank=0).read(0, 1)  # a step that cannot train a padding row
    with pytest.raises(ValueError, match="training data holds 10"):
        SampleStream(np.zeros(10)).set_state({"position": 3, "num_samples": 11})


def test_prefetcher_reads_ahead_and_survives_a_mispredicted_position():
    stream = SampleStream(np.arange(100), seed=1)
    plan = iter([(0, 10), (10, 10), (20, 10), (30, 10)])
    prefetcher = Prefetcher(stream.read, plan, depth=2)
    try:
        assert prefetcher.get(0, 10)[0].tolist() == stream.read(0, 10)[0].tolist()
        assert prefetcher.get(10, 10)[0].tolist() == stream.read(10, 10)[0].tolist()
        # a seek the plan did not predict: the right minibatch all the same
        assert prefetcher.get(55, 5)[0].tolist() == stream.read(55, 5)[0].tolist()
        assert prefetcher.get(60, 5)[0].tolist() == stream.read(60, 5)[0].tolist()
    finally:
        prefetcher.close()
    with pytest.raises(ValueError, match="`prefetch`"):
        Prefetcher(stream.read, iter([]), depth=-1)


def test_a_get_waiting_when_the_prefetcher_is_closed_on_another_thread_ends():
    """A tf.data iterator's generator thread waiting in ``get`` for a minibatch when the run ended (``close`` on the
    trainer's thread, the read in flight dropped) waited forever, and the iterator's destructor, in a later garbage
    collection on the trainer's thread, waited for it (seen in CI: the TensorFlow tests hung). Now that ``get``
    raises PrefetcherClosed, which ends the generator, and nothing is read after close."""
    import threading

    release, reads = threading.Event(), []

    def read(start, size):
        reads.append(start)
        release.wait(10)  # the read in flight when the run ends
        return start

    prefetcher = Prefetcher(read, iter([(0, 1), (1, 1)]), depth=1)
    outcome = []

    def consume():
        try:
            outcome.append(prefetcher.get(0, 1))
        except PrefetcherClosed as error:
            outcome.append(error)

    consumer = threading.Thread(target=consume, daemon=True)
    consumer.start()
    threading.Timer(0.3, release.set).start()
    prefetcher.close()  # waits for the read in flight, then drops it
    consumer.join(timeout=5)
    assert not consumer.is_alive() and len(outcome) == 1 and isinstance(outcome[0], PrefetcherClosed), outcome
    assert reads == [0]


def test_close_leaves_a_read_that_does_not_return_behind_and_says_so(monkeypatch):
    """``close`` waited without bound for the reader thread, so a read stuck in the data's ``__getitem__`` (one that
    hangs) hung the end of kfit.fit, or its exception path, forever. It waits ``CLOSE_WAIT_S`` now, then leaves the
    thread, a daemon thread, running, with a warning naming the minibatch and where the read waits; the thread ends
    once the read returns."""
    import threading
    import warnings

    from kfit.data import _prefetch

    monkeypatch.setattr(_prefetch, "CLOSE_WAIT_S", 0.5)
    waiting, release = threading.Event(), threading.Event()

    class Hangs:
        def __getitem__(self, index):
            if index >= 4:
                waiting.set()
                release.wait()  # until the end of the test
            return index

    data = Hangs()
    prefetcher = Prefetcher(lambda start, size: data[start], iter([(0, 4), (4, 4), (8, 4)]), depth=1)
    thread = prefetcher._thread
    try:
        assert prefetcher.get(0, 4) == 0
        assert waiting.wait(10)
        closing = threading.Thread(target=prefetcher.close, daemon=True)  # (without a bound: fails, not hangs)
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            closing.start()
            closing.join(5)
        assert not closing.is_alive(), "close() still waits for the read"
        (message,) = [str(w.message) for w in caught if issubclass(w.category, UserWarning)]
        assert "its read of the minibatch of 4 samples at sample 4 has not returned after 0.5 s" in message
        assert f"waits in {Hangs.__qualname__}.__getitem__ ({__file__}, line " in message
        assert thread.is_alive() and thread.daemon  # (a daemon thread does not keep Python from exiting)
    finally:
        release.set()
    thread.join(10)
    assert not thread.is_alive()


class Batches(__import__("keras").utils.PyDataset):
    """A PyDataset of 7 batches of 4 samples and a last one of 2 (30 samples)."""

    def __init__(self, n=30, batch=4):
        super().__init__()
        self.x = np.arange(n, dtype="float32").reshape(n, 1)
        self.y = np.arange(n) * 10
        self.batch = batch

    def __len__(self):
        return -(-len(self.x) // self.batch)

    def __getitem__(self, i):
        s = slice(i * self.batch, (i + 1) * self.batch)
        return self.x[s], self.y[s]


def test_pydataset_stream_sweeps_cover_every_sample_and_seek():
    from kfit.data import PyDatasetStream

    stream = PyDatasetStream(Batches(), seed=7)
    assert stream.num_samples == 30
    for sweep in range(2):
        x, y, _ = stream.read(sweep * 30, 30)
        assert sorted(x[:, 0].astype(int).tolist()) == list(range(30))
        np.testing.assert_array_equal(y, x[:, 0].astype(int) * 10)
    # minibatches of any size, spanning batches and sweeps, are what reading in order gives
    sizes = [3, 5, 9, 4, 13, 6]
    whole = stream.read(0, sum(sizes))[0]
    start = 0
    for size in sizes:
        fresh = PyDatasetStream(Batches(), seed=7)
        fresh.set_state({"position": start, "seed": 7, "shuffle": True, "num_samples": 30})
        np.testing.assert_array_equal(fresh.read(start, size)[0], whole[start:start + size])
        start += size
    # shares of two workers cover a global minibatch once
    parts = [PyDatasetStream(Batches(), seed=7, rank=r, num_workers=2).read(4, 9)[0] for r in range(2)]
    np.testing.assert_array_equal(np.concatenate(parts), whole[4:13])


class TellingBatches(Batches):
    """Batches whose targets are the number of sweeps the dataset was told of (its ``on_epoch_begin`` calls) when the
    item was fetched; notes the items fetched."""

    def __init__(self, **kwargs):
        super().__init__()
        keras = __import__("keras")
        keras.utils.PyDataset.__init__(self, **kwargs)
        self.told, self.fetched = 0, []

    def __getitem__(self, i):
        self.fetched.append(i)
        x, _ = super().__getitem__(i)
        return x, np.full(len(x), self.told)

    def on_epoch_begin(self):
        self.told += 1


def test_a_pydatasets_workers_fetch_what_the_plan_reads_and_nothing_of_a_sweep_before_it_is_told():
    """With ``workers``, the stream fetches the items an epoch's plan reads ahead on a pool: the rows are one worker's
    (minibatches spanning batches and sweeps, each of two ranks' shares), no item of a sweep is fetched before the
    dataset is told of it (its targets say how many sweeps it had been told of), and nothing past the plan."""
    from kfit.data import PyDatasetStream

    plan, start = [], 0
    for size in [3, 5, 9, 4, 13, 6, 11, 9]:  # 60 samples: two sweeps of 30
        plan.append((start, size))
        start += size
    for rank in range(2):
        expected = PyDatasetStream(TellingBatches(), seed=7, rank=rank, num_workers=2)
        stream = PyDatasetStream(TellingBatches(workers=3), seed=7, rank=rank, num_workers=2)
        expected.dataset.fetched.clear()
        stream.dataset.fetched.clear()
        stream.read_ahead(plan[:6])  # the plan stops inside the second sweep
        try:
            for start, size in plan[:6]:
                got, want = stream.read(start, size), expected.read(start, size)
                np.testing.assert_array_equal(got[0], want[0])
                np.testing.assert_array_equal(got[1], want[1])  # fetched after its sweep was told, as when read
        finally:
            stream.stop_reading_ahead()
        assert stream.dataset.told == 2
        assert sorted(stream.dataset.fetched) == sorted(expected.dataset.fetched)  # each once, none past the plan


def test_batch_shuffle_reads_each_minibatch_from_one_range_in_an_order_of_its_own(tmp_path):
    """``shuffle="batch"``: minibatches in order, each the next range of rows, shuffled inside by (seed, position);
    worker shares split that shuffled minibatch; h5py reads the range once; the state keeps the mode."""
    stream = SampleStream(np.arange(20), shuffle="batch", seed=4)
    minibatches = [stream.read(start, 8)[0].tolist() for start in (0, 8, 16)]
    assert [sorted(rows) for rows in minibatches] == [list(range(8)), list(range(8, 16)), [0, 1, 2, 3, 16, 17, 18, 19]]
    assert all(rows != sorted(rows) for rows in minibatches[:2])
    assert SampleStream(np.arange(20), shuffle="batch", seed=4).read(8, 8)[0].tolist() == minibatches[1]
    assert SampleStream(np.arange(20), shuffle="batch", seed=5).read(8, 8)[0].tolist() != minibatches[1]
    shares = [SampleStream(np.arange(20), shuffle="batch", seed=4, rank=r, num_workers=3).read(8, 8)[0] for r in range(3)]
    assert np.concatenate(shares).tolist() == minibatches[1]
    with h5py.File(tmp_path / "data.h5", "w") as f:
        f["x"] = np.arange(20)
        assert SampleStream(f["x"], shuffle="batch", seed=4).read(8, 8)[0].tolist() == minibatches[1]
    resumed = SampleStream(np.arange(20), seed=4)
    resumed.set_state(stream.get_state())
    assert resumed.shuffle == "batch" and resumed.read(16, 8)[0].tolist() == minibatches[2]
    with pytest.raises(ValueError, match="shuffle='yes'"):
        SampleStream(np.arange(20), shuffle="yes")


@pytest.mark.timeout(120)
def test_kfit_fit_ends_when_a_read_ahead_in_a_pydataset_does_not_return(monkeypatch):
    """The end of kfit.fit waited forever for a read ahead stuck in a PyDataset's ``__getitem__``: the reader's close
    joined its thread without a bound, and the stream's close waited for the lock the read held. A run stopped by a
    callback while the read waits returns within ``CLOSE_WAIT_S``, and warns where the read waits."""
    import threading
    import warnings

    import keras
    from helpers import mlp

    import kfit
    from kfit.data import _prefetch

    monkeypatch.setattr(_prefetch, "CLOSE_WAIT_S", 0.5)
    waiting, release, ahead = threading.Event(), threading.Event(), []

    class HangsAhead(Batches):
        def __getitem__(self, i):
            if threading.current_thread().name == "kfit-prefetch":
                ahead.append(i)
                # The fourth minibatch's first item, never asked for: the run stops after two steps, and Keras's JAX
                # trainer (3.10) fetches one minibatch ahead of its step, the third.
                if len(ahead) > 6:
                    waiting.set()
                    release.wait()  # until the end of the test
            return super().__getitem__(i)

    class StopWhileTheReadWaits(keras.callbacks.Callback):
        def on_train_batch_end(self, batch, logs=None):
            if batch == 1:
                assert waiting.wait(10)
                self.model.stop_training = True

    model = mlp(features=1)
    model.compile(optimizer="sgd", loss="mse")
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            kfit.fit(model, HangsAhead(), minibatch_size=8, epochs=2, shuffle=False, seed=0, prefetch=2, verbose=0,
                     callbacks=[StopWhileTheReadWaits()])
        assert kfit.get_clock(model).samples == 16
        said = [str(w.message) for w in caught if "Closing kfit's reader" in str(w.message)]
        assert len(said) == 1 and "the minibatch of 6 samples at sample 24 has not returned" in said[0], said
        assert f"waits in {HangsAhead.__qualname__}.__getitem__" in said[0]
    finally:
        release.set()
