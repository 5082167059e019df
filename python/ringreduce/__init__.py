"""ringreduce: ring all-reduce collectives for data-parallel training.

import ringreduce as rr
comm = rr.init()                      # rank/world size from the launcher's env
y = comm.all_reduce(x, op="avg")      # numpy, torch (CPU or CUDA), cupy, DLPack
"""

from ._arrays.cuda import cuda_available
from ._comm.bootstrap import init, join
from ._comm.communicator import Communicator, build_info
from ._comm.core.ops import ReduceOp
from ._comm.core.shaping import chunk_bounds
from ._comm.core.work import Work
from .bucketing import GradientBucketer
from .compression import Codec, CompressionWarning, ErrorFeedback, register_codec
from .errors import (
    AuthenticationError,
    ConcurrentUseError,
    MismatchError,
    PeerError,
    RingReduceError,
    TimeoutError,
)

__version__ = "0.1.0"

__all__ = [
    "__version__",
    "init",
    "join",
    "Communicator",
    "Work",
    "ReduceOp",
    "chunk_bounds",
    "GradientBucketer",
    "ErrorFeedback",
    "Codec",
    "register_codec",
    "CompressionWarning",
    "build_info",
    "cuda_available",
    "RingReduceError",
    "TimeoutError",
    "PeerError",
    "MismatchError",
    "AuthenticationError",
    "ConcurrentUseError",
]


def __getattr__(name: str) -> object:
    # The torch adapter is imported on first use so that importing ringreduce
    # never imports torch.
    if name == "torch":
        import importlib

        return importlib.import_module(".torch", __name__)
    raise AttributeError(f"module 'ringreduce' has no attribute {name!r}")


def __dir__() -> list:
    # The API, not the modules it is made of.
    return sorted(__all__ + ["torch"])
