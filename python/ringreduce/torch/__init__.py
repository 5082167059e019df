"""PyTorch adapter: the torch.distributed backend "ringreduce", and data-parallel
gradient averaging on top of GradientBucketer (GradSync) for use without DDP.

Import it as ``ringreduce.torch`` (``rr.torch``); importing ``ringreduce`` alone never
imports torch. Importing it registers the backend::

    import ringreduce.torch
    torch.distributed.init_process_group("ringreduce")    # any init method
    ringreduce.torch.init_process_group()                 # or: from any launcher (mpirun...)

Example::

    comm = rr.init()
    rr.torch.broadcast_parameters(model, comm)          # replicas start identical
    sync = rr.torch.GradSync(model, comm)
    for x, y in loader:
        loss_fn(model(x), y).backward()                 # buckets reduce during backward
        sync.wait()                                     # .grad holds the average
        opt.step(); opt.zero_grad()
"""

from . import hooks
from .backend import ProcessGroupRingReduce
from .gradsync import GradSync, broadcast_optimizer_state, broadcast_parameters
from .init import init_process_group
from .registration import register
from .windows import communicator, empty

__all__ = [
    "GradSync",
    "ProcessGroupRingReduce",
    "broadcast_optimizer_state",
    "broadcast_parameters",
    "communicator",
    "empty",
    "hooks",
    "init_process_group",
]

# torch.distributed.init_process_group("ringreduce") works once this module is imported.
register()
