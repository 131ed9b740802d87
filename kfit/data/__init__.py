"""Training data as a seekable stream of samples."""

from kfit.data._prefetch import Prefetcher
from kfit.data._pydataset import PyDatasetStream
from kfit.data._stream import SampleStream, share

__all__ = ["Prefetcher", "PyDatasetStream", "SampleStream", "share"]
