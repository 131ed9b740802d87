"""Training data as a seekable stream of samples, and the Keras data adapters that feed it to ``model.fit``."""

from kfit.data._adapter import StreamAdapter
from kfit.data._prefetch import Prefetcher, PrefetcherClosed
from kfit.data._pydataset import PyDatasetStream
from kfit.data._source import SourceAdapter
from kfit.data._stream import SampleStream, share

__all__ = ["Prefetcher", "PrefetcherClosed", "PyDatasetStream", "SampleStream", "SourceAdapter", "StreamAdapter", "share"]
