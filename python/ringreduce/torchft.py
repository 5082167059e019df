"""torchft on ringreduce: the all-reduce across replica groups runs on ringreduce.

torchft (``pip install torchft``) keeps data-parallel training going when a replica
group fails: a Lighthouse decides, step by step, which replica groups take part, and
each group's ``torchft.Manager`` rebuilds the process group that joins them whenever
that membership changes. `ProcessGroupRingReduceFT` is such a process group, in place
of torchft's ``ProcessGroupGloo``::

    import torchft
    from ringreduce.torchft import ProcessGroupRingReduceFT

    manager = torchft.Manager(pg=ProcessGroupRingReduceFT(), min_replica_size=1,
                              load_state_dict=load_state_dict, state_dict=state_dict)
    model = torchft.DistributedDataParallel(manager, model)
    optimizer = torchft.Optimizer(manager, torch.optim.Adam(model.parameters()))

Each membership gets a new `ringreduce.torch.ProcessGroupRingReduce`, which meets
through the store address torchft hands it (a fresh prefix each time, so ranks of an
old membership never meet a new one); the one it replaces is aborted, so whatever
still runs on it fails within milliseconds instead of waiting for its timeout.

When a replica group dies mid-step, the others' all-reduce fails at once (its
connections close). A collective's failure is reported the way torchft's Manager
asks for it: its ``wait()`` returns, and `errored` says what went wrong, so the Manager
drops the step (``should_commit()`` is False) and the next step runs on a new group.
(Raised from ``wait()``, it would break torchft's DDP hook.) Point-to-point messages,
which carry the checkpoint a healing group fetches (torchft's ``PGTransport``), raise
as usual: torchft catches those itself. See docs/torchft.md.
"""

from __future__ import annotations

import logging
from datetime import timedelta
from typing import Any, List, Optional

import torch.distributed as dist

try:
    from torchft.process_group import ProcessGroupWrapper as _Wrapper
except ImportError as exc:  # pragma: no cover - depends on what is installed
    raise ImportError(
        "ringreduce.torchft needs torchft: pip install torchft (ringreduce is tested "
        f"with torchft 0.2.0); importing it failed: {exc}"
    ) from exc

from .torch import ProcessGroupRingReduce

__all__ = ["ProcessGroupRingReduceFT"]

_log = logging.getLogger(__name__)


class ProcessGroupRingReduceFT(_Wrapper):
    """A torchft process group whose collectives and point-to-point messages run on
    ringreduce.

    ``timeout``: how long a collective waits for a peer, and how long a new group
    waits for its members to meet, before it fails (and torchft drops the step).
    torchft's default is 60 s. A replica that dies closes its connections, which fails
    its peers' collectives at once: the timeout is for a replica that hangs instead.
    """

    def __init__(self, timeout: timedelta = timedelta(seconds=60)) -> None:
        super().__init__(timeout=timeout)
        self._errored: Optional[Exception] = None

    def _create_pg(self, store: Any, rank: int, world_size: int) -> ProcessGroupRingReduce:
        """Called by ``configure()`` (on the Manager's quorum thread) with the store of
        the new membership, once the previous group has been aborted."""
        self._errored = None
        return ProcessGroupRingReduce(store, rank, world_size, self._timeout)

    def getBackendName(self) -> str:  # noqa: N802 (torch's name)
        return "torchft-ringreduce"

    def _wrap_work(self, work: Any, opts: object) -> Any:
        return _Reported(self, work)

    def _report(self, exc: Exception) -> None:
        if self._errored is None:
            _log.warning(
                "ringreduce.torchft: a collective failed, torchft will drop this step: %s", exc
            )
            self._errored = exc

    # Point-to-point: errors raise, as torchft's checkpoint transport expects.
    def send(self, tensors: List[Any], dst_rank: int, tag: int) -> Any:
        return self.parent.send(tensors, dst_rank, tag)

    def recv(self, tensors: List[Any], src_rank: int, tag: int) -> Any:
        return self.parent.recv(tensors, src_rank, tag)

    def abort(self, errored: bool = True) -> None:
        """Fails every collective still running or queued on the current group (from
        any thread), tells its peers, and drops it. ``errored``: a failure (torchft
        logs it, and `errored` reports it until the next ``configure``) rather than a
        reconfiguration."""
        if errored:
            self._report(RuntimeError("ringreduce: the process group was aborted"))
        super().abort(errored=errored)

    def errored(self) -> Optional[Exception]:
        """The first error of a collective of the current group (or its abort), None
        if there was none: the Manager asks before it commits a step."""
        return self._errored

    def shutdown(self) -> None:
        """Closes the current group (its connections and threads)."""
        pg, self._pg = self._pg, None
        if pg is not None:
            pg.shutdown()

    def __repr__(self) -> str:
        return f"ProcessGroupRingReduceFT(pg={self._pg!r})"


class _Reported(dist._Work):
    """A collective's Work whose failure goes to `ProcessGroupRingReduceFT.errored`
    rather than out of ``wait()``. Its future still fails: torchft's Manager wraps
    futures and reports their errors itself."""

    def __init__(self, pg: ProcessGroupRingReduceFT, work: Any) -> None:
        super().__init__()
        self._pg = pg
        self._work = work

    def wait(self, timeout: Optional[timedelta] = None) -> bool:
        try:
            self._work.wait()
        except Exception as exc:  # noqa: BLE001 - handed to torchft through errored()
            self._pg._report(exc)
        return True

    def get_future(self) -> Any:
        return self._work.get_future()

    def is_completed(self) -> bool:
        return self._work.is_completed()

    def exception(self) -> Any:
        return self._work.exception()
