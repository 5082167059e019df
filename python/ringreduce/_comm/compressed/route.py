"""Compressed all_reduce and reduce_scatter: fewer bytes on the wire, sums in float32,
the same bits on every rank (docs/compression.md).

Terms:

- *chunk* k: the values ``chunk_bounds(n, N, k)`` of the flattened input; rank k owns
  it (reduce_scatter's blocks).
- *payload*: a codec's bytes for one chunk, sent in a *row* (compression/rows.py): a
  16-byte header that ranks check they agree on, then the payload, padded alike.

The one-hop scheme, in two named phases:

1. *scatter*: each rank encodes every chunk but its own (input plus error-feedback
   residual) and sends chunk k to rank k (one all_to_all). The owner decodes the N-1
   payloads and adds them to its own chunk, unencoded, in float32: every contribution
   is quantized at most once, and the sum itself never is.
2. *gather* (all_reduce only): the owner encodes its sum once; one all_gather of those
   payloads; every rank decodes all N, so every rank ends with the same bits.

Each rank sends 2(N-1)/N of the payload, as a ring would. A ring that decoded, added and
re-encoded at every hop would quantize partial sums N-1 times, and error feedback could
not see the middle hops' errors; here the worker errors stay with their senders and the
owner's re-encode error with the owner, so error feedback returns every dropped bit.

"gather" codecs (payloads that cannot be summed piecewise) take one all_gather of every
rank's whole payload instead, decoded and summed in rank order on every rank.

With a built-in codec the call is one engine collective: the same scheme in C++
(csrc/algorithms/one_hop.h), with one call header, queued on the engine's worker like
any other call when async, its canary judged inside it; on CUDA arrays the codec runs
on the device (its CUDA kernels, the same bits), only the rows crossing to the host.
Codecs with methods of their own and "gather" codecs take this module's Python path
(hop.py, host arrays only), on the communicator's lane when async (lane.py).

Every decision (the call's number, which seeds the dither; auto's choice; whether the
canary samples it) is made when the call is issued, on the caller's thread, in the
program's order (after the lane's calls), so it is the same on every rank, and so is the
thread each call is issued from.
"""

from __future__ import annotations

import sys
import time
import warnings
import weakref
from typing import Any, Dict

import numpy as np

from ... import _core
from ..._arrays.bfloat16 import loaded_bfloat16
from ..._arrays.buffer import describe
from ..._arrays.inout import input_buffer, output_buffer
from ..._env import debug_topics
from ...compression import canary as _canary
from ...compression import policy as _policy
from ...compression.codecs import AUTO, Codec, get_codec
from ..core.ops import ReduceOp, _op_member, op_code
from ..core.shaping import Call
from . import auto as _auto
from . import device as _device
from . import hop as _hop
from .lane import LaneWork
from .pieces import PieceChoice

__all__ = ["all_reduce", "auto_exact", "reduce_scatter", "release", "route", "stats"]

_F32 = np.float32
_SUM_AVG = frozenset(("sum", "avg", ReduceOp.SUM, ReduceOp.AVG))
_OK_DTYPES = ("float32", "float16", "bfloat16")
# numpy dtypes auto may hand to the engine unchecked (comparing dtypes, not names: a
# dtype's name costs microseconds, as much as a small exact all_reduce on one host).
# bfloat16 joins once ml_dtypes is imported (`_fast_dtype`): before that no array has it.
_FAST_DTYPES = {np.dtype(d) for d in ("float32", "float16", "float64")}


def _fast_dtype(dtype: np.dtype) -> bool:
    if dtype in _FAST_DTYPES:
        return True
    bf16 = loaded_bfloat16()
    if bf16 is None or dtype != bf16:
        return False
    _FAST_DTYPES.add(bf16)
    return True


class _State:
    """A communicator's compression state: call numbers (the same on every rank), the
    auto policy, the canary's verdicts and the counters."""

    def __init__(self, comm: Any):
        self.calls = 0
        self.auto = _policy.AutoPolicy(comm.world_size, comm.transport)
        self.debug = "algorithm" in debug_topics()
        self.codecs: Dict[str, _canary.CodecStats] = {}
        self.scratch = _hop.Scratch()
        self.pieces = PieceChoice()  # which size classes run in pieces (compressed_pieces)
        self.timing = False  # auto's calibration is timing tiny calls through the codecs
        # Engine calls the canary sampled, by codec name, whose verdict has not been
        # seen yet (`_notice`), and the codecs warned of.
        self.canaries: Dict[str, Any] = {}  # name: (calls sampled, the codec)
        self.warned: set = set()

    def of(self, name: str) -> _canary.CodecStats:
        found = self.codecs.get(name)
        if found is None:
            found = self.codecs[name] = _canary.CodecStats()
        return found


_STATES: weakref.WeakKeyDictionary[Any, _State] = weakref.WeakKeyDictionary()


def _state(comm: Any) -> _State:
    st = _STATES.get(comm)
    if st is None:
        st = _STATES[comm] = _State(comm)
    return st


def release(comm: Any) -> None:
    """Frees ``comm``'s compression scratch buffers (for ``Communicator.close``; they go
    with the communicator otherwise). Counters and call numbers stay."""
    st = _STATES.get(comm)
    if st is not None:
        st.scratch.clear()


def stats(comm: Any) -> dict:
    """The compression counters of ``comm``, merged into ``comm.stats()``: per codec
    under "compression", and ``wire_bytes``, ``codec_seconds``, ``compression_error``
    (the last canary's relative error, None before one ran) as {codec: value}."""
    st = _STATES.get(comm)
    per = {} if st is None else {k: v.as_dict() for k, v in st.codecs.items()}
    if per:
        _notice(comm, st)
        # The engine counts what its compressed collectives sent, spent on codecs, and
        # what their canaries found.
        for name, engine in comm._core.stats().get("engine_codecs", {}).items():
            if name in per:
                _merge(per[name], engine)
    out: dict = {
        "compression": dict(per),
        "wire_bytes": {k: v["wire_bytes"] for k, v in per.items()},
        "codec_seconds": {k: v["codec_seconds"] for k, v in per.items()},
        "compression_error": {k: v["compression_error"] for k, v in per.items()},
    }
    auto = None if st is None else st.auto
    if auto is not None and auto.never is None and (auto.chosen or auto.measuring):
        last = auto.last
        out["compression"]["auto"] = {
            "chosen": dict(auto.chosen),
            "link_gbs": None if last is None else 1e-9 / last.beta,
            "predicted_seconds": None if auto.predicted is None else dict(auto.predicted),
            "crossover_bytes": auto.crossover_bytes(),
            "call_seconds": None if last is None else {"exact": last.alpha_exact, **last.alphas},
        }
    return out


def _merge(mine: dict, engine: dict) -> None:
    """A codec's counters from the Python path (``mine``) and the engine's, as one."""
    mine["wire_bytes"] += int(engine["wire_bytes"])
    mine["codec_seconds"] += float(engine["codec_seconds"])
    mine["fallbacks"] += int(engine["fallbacks"])
    mine["fell_back"] = bool(mine["fell_back"] or engine["fell_back"])
    if engine["canary_checks"]:
        mine["canary_checks"] += int(engine["canary_checks"])
        mine["compression_error"] = float(engine["compression_error"])
        mine["bias"] = float(engine["bias"])
        worst = mine["worst_error"]
        mine["worst_error"] = max(float(engine["worst_error"]), worst or 0.0)


# ---- the calls ---------------------------------------------------------------------


def all_reduce(
    comm: Any,
    x: Any,
    op: Any = "sum",
    *,
    out: Any = None,
    async_op: bool = False,
    compression: Any = None,
    error_feedback: Any = None,
) -> Any:
    """``comm.all_reduce(x, op, compression=..., error_feedback=...)``: see the module.
    (Communicator.all_reduce has run "auto" calls that `auto_exact` keeps exact.)"""
    return _call(comm, x, op, out, async_op, compression, error_feedback, scatter=False)


def reduce_scatter(
    comm: Any,
    x: Any,
    op: Any = "sum",
    *,
    out: Any = None,
    async_op: bool = False,
    compression: Any = None,
    error_feedback: Any = None,
) -> Any:
    """``comm.reduce_scatter(x, op, compression=..., error_feedback=...)``.
    (Communicator.reduce_scatter has run "auto" calls that `route` keeps exact.)"""
    return _call(comm, x, op, out, async_op, compression, error_feedback, scatter=True)


def route(comm: Any, x: Any, op: Any, compression: Any, error_feedback: Any, async_op: bool) -> str:
    """How Communicator's all_reduce or reduce_scatter runs a call with these arguments,
    decided once: "fast" (blocking and exact: the engine's fast path may take it),
    "exact" (the exact collective, async) or "compressed" (this module's path).

    A codec, "auto" or error feedback sends a call here, except a blocking "auto" call
    without error feedback that `auto_exact` keeps exact, which is counted like any
    compressed call (call numbers, the dither's seeds, stay the same on every rank,
    whichever path each takes) and goes on exact. An async one always comes here:
    which thread issues a call must not depend on how far this rank's lane has got
    (see `_call`)."""
    if compression is None and error_feedback is None:
        return "exact" if async_op else "fast"
    if async_op or error_feedback is not None:
        return "compressed"
    if not (isinstance(compression, str) and compression == AUTO):
        return "compressed"
    st = _STATES.get(comm)
    if st is None or type(x) is not np.ndarray or st.debug or not _fast_dtype(x.dtype):
        return "compressed"
    comm._lane.drain()  # the lane's calls are numbered before this one
    if not auto_exact(st, x, op):
        return "compressed"
    if st.auto.never is None:
        st.auto.chosen["exact"] = st.auto.chosen.get("exact", 0) + 1
    st.calls += 1
    return "fast"


def auto_exact(st: _State, x: np.ndarray, op: Any = "sum") -> bool:
    """Whether "auto" (without error feedback) runs this call exact by a rule that needs
    no more than x's dtype and size, and the communicator's compression state ``st``
    (with every earlier compressed call done): a communicator auto never compresses on
    (one host over shared memory, a world of one), or a call below auto's smallest.
    False for ops other than sum and avg (refused on every path, as with a codec).
    Asks only: `route` counts the calls it keeps exact."""
    try:
        if op not in _SUM_AVG:
            return False
    except TypeError:  # unhashable: the general path says what is wrong with it
        return False
    return st.auto.never is not None or x.nbytes < _policy.MIN_BYTES


def _checked(comm: Any, x: Any, op: Any, compression: Any, error_feedback: Any) -> tuple:
    """Every argument checked before any rank talks to another: (buffer, op, codec or
    "auto" or None, the residual array or None)."""
    member = _op_member(op)
    if member not in (ReduceOp.SUM, ReduceOp.AVG):
        raise ValueError(
            f"op: compression supports sum and avg only, not {member.name.lower()}: codecs "
            "approximate values so that their sum stays close, which says nothing of their "
            "product, minimum or maximum; pass compression=None"
        )
    codec = compression if compression in (None, AUTO) else get_codec(compression)
    buf = input_buffer(x, "x")
    if buf.host is None:
        _device.refuse(codec)
    if buf.dtype not in _OK_DTYPES:
        if buf.dtype == "float64" and codec in (None, AUTO):
            pass  # exact: "auto" never compresses float64
        elif buf.dtype == "float64":
            raise ValueError(
                "x: float64 is not compressed: the codecs sum in float32, which would drop "
                "float64's precision unannounced; cast to float32, or pass compression=None "
                "or 'auto' (which reduces float64 exactly)"
            )
        else:
            raise ValueError(
                f"x: compression is for floating-point data (float32, float16, bfloat16), "
                f"not {buf.dtype}; integers are summed exactly with compression=None"
            )
    residual = None
    if error_feedback is not None:
        if buf.host is None:
            residual = _device.residual_of(error_feedback, buf)
        elif isinstance(error_feedback, np.ndarray):
            residual = error_feedback
            if (
                residual.dtype != _F32
                or residual.shape != (buf.size,)
                or not (residual.flags.c_contiguous and residual.flags.writeable)
            ):
                raise ValueError(
                    f"error_feedback: an array residual must be writable, contiguous, "
                    f"float32 and of shape ({buf.size},), got {residual.dtype} "
                    f"{residual.shape}"
                )
        elif hasattr(error_feedback, "residual"):
            residual = error_feedback.residual(buf.size)
        else:
            raise TypeError(
                "error_feedback: expected a ringreduce ErrorFeedback (or one of its "
                f"key(...) views) or a float32 array, got {type(error_feedback).__name__}"
            )
    return buf, member, codec, residual


def _call(comm, x, op, out, async_op, compression, error_feedback, *, scatter: bool) -> Any:
    # Every decision (call numbers, the dither's seeds, auto's choices, the canary's
    # schedule and verdicts) is made here, on the caller's thread, in the program's
    # order, after the lane's calls: the same on every rank. Then the call runs where
    # the decision says, which is therefore the same thread on every rank (call headers
    # carry the issuing thread's tag): the engine's queue for the built-in codecs on
    # host arrays and for exact calls, this thread for other blocking calls, the lane
    # for other async ones.
    lane = comm._lane
    if not lane.here():
        lane.drain()
    buf, member, codec, residual = _checked(comm, x, op, compression, error_feedback)
    n, size, rank = buf.size, comm.world_size, comm.rank
    lo, hi = _core.chunk_bounds(n, size, rank)
    shape = (hi - lo,) if scatter else buf.shape
    result, out_buf = output_buffer(out, buf, shape)
    what = "reduce_scatter" if scatter else "all_reduce"
    st = _state(comm)
    if st.canaries:
        _notice(comm, st)  # warns of a codec the engine's canary switched off
    call_no = st.calls
    st.calls += 1

    # Which path: a codec, or exact (asked for, chosen by auto, or the canary's fallback).
    why = f"{codec.name} (asked for)" if isinstance(codec, Codec) else "exact (no codec)"
    if st.timing:
        why = f"{codec.name} (auto's calibration: a tiny call, timed)"
    calibrating = False
    if codec == AUTO:
        decision = st.auto.decide(n, buf.itemsize, buf.dtype, residual is not None)
        codec = None if decision.codec is None else get_codec(decision.codec)
        why, calibrating = f"auto: {decision.why}", decision.calibrating
        st.auto.chosen[decision.codec or "exact"] = (
            st.auto.chosen.get(decision.codec or "exact", 0) + 1
        )
    if codec is not None and st.of(codec.name).fell_back:
        st.of(codec.name).fallbacks += 1
        why = f"exact: {codec.name} fell back after its canary"
        codec = None
    if st.debug:
        sys.stderr.write(
            f"ringreduce rank {rank}: compressed {what} #{call_no} of {n} {buf.dtype} "
            f"({member.name.lower()}): {why}\n"
        )

    if codec is None:
        if async_op and not calibrating and residual is None:
            # Exact, with nothing owed: the engine's own queued call.
            call = comm.reduce_scatter if scatter else comm.all_reduce
            return call(buf.obj, member.name.lower(), out=result, async_op=True)
        if not calibrating and residual is not None:
            # Exact, with a residual sent along (and cleared): the engine's one-hop
            # collective with float32 rows, blocking or queued like any call.
            return _engine(
                comm,
                st,
                None,
                buf,
                member,
                residual,
                result,
                out_buf,
                call_no,
                scatter,
                None,
                async_op,
            )

        def exact() -> Any:
            if not calibrating:
                return _exact(comm, buf, member, result, residual, scatter)
            # Timed to the end of the transfer (a blocking call, here or on the lane).
            t0 = time.perf_counter()
            got = _exact(comm, buf, member, result, residual, scatter)
            _auto.calibrate(comm, st, time.perf_counter() - t0, buf.nbytes)
            return got

        return _run_here_or_on_lane(comm, exact, async_op, f"{what} of {n} {buf.dtype}")

    idx = None
    every = _policy.settings().canary_every
    if every and call_no % every == 0:
        idx = _canary.sample_indices(
            n, _policy.settings().canary_sample, _hop.seed(call_no, _hop.SAMPLE, 0, 0)
        )
    stat = st.of(codec.name)
    stat.calls += 1
    if codec.algebra != "gather" and _hop._kernel(codec) is not None:
        return _engine(
            comm, st, codec, buf, member, residual, result, out_buf, call_no, scatter, idx, async_op
        )

    def compressed() -> Any:
        _python_path(comm, st, codec, buf, member, residual, out_buf, call_no, stat, scatter, idx)
        return result

    return _run_here_or_on_lane(comm, compressed, async_op, f"{what} of {n} {buf.dtype}")


def _run_here_or_on_lane(comm: Any, job: Any, async_op: bool, what: str) -> Any:
    """A call decided already: run now on this thread, or (async) on the lane."""
    if not async_op:
        return job()
    return comm._lane.submit(job, LaneWork(comm, what))


def _engine_pieces(comm: Any) -> int:
    """The piece_values of an engine call (0: whole). In pieces, its codec work overlaps
    its exchanges, on the same thread: that pays where the rows cross a network, and not
    where every rank shares one host (shared memory, or TCP over loopback), whose
    exchanges are copies the same cores make, so that pieces only add waits (measured:
    docs/compression.md). Over shared memory calls always run whole; elsewhere
    ``pieces="always"`` and ``"never"`` decide. Only chunks of at least twice
    ``piece_values`` values are cut."""
    settings = _policy.settings()
    if comm.world_size == 1 or comm.transport == "shm" or settings.pieces == "never":
        return 0
    if settings.pieces == "auto" and int(comm.local_world_size) == comm.world_size:
        return 0
    return max(0, int(settings.piece_values))


def _engine(
    comm, st, codec, buf, member, residual, result, out_buf, call_no, scatter, idx, async_op
) -> Any:
    """A built-in codec on host arrays: one engine collective (the one-hop schedule in
    C++, csrc/algorithms/one_hop.h), queued like any other when async. On the calls it
    samples, the canary runs inside that collective: the engine gathers the sample's
    inputs and sums, judges them, and a codec that fails runs exact from the next call
    on, decided where the calls run, in their order, the same on every rank.
    ``codec`` None: an exact call that sends a residual along, with float32 rows (each
    value summed in float32 and rounded to the input's dtype once; the residual is
    cleared)."""
    sample = rows = None
    canary = (0, 0, 0)
    if idx is not None:
        sample = np.ascontiguousarray(idx, dtype=np.int64)
        rows = np.zeros((2, sample.size), _F32)  # the engine writes the inputs there, the sums
        canary = (sample.ctypes.data, sample.size, rows.ctypes.data)
        st.canaries[codec.name] = (st.canaries.get(codec.name, (0, codec))[0] + 1, codec)
    # A host residual is an array; a device one, a Buffer (device.residual_of).
    if residual is None:
        owed = 0
    elif isinstance(residual, np.ndarray):
        owed = residual.ctypes.data
    else:
        owed = residual.ptr
    kind = (
        _core.Collective.COMPRESSED_REDUCE_SCATTER
        if scatter
        else _core.Collective.COMPRESSED_ALL_REDUCE
    )
    kernel, name = ("exact", "exact") if codec is None else (codec.kernel, codec.name)
    limit = 0.0 if codec is None else _policy.settings().threshold(codec)
    call = Call(
        kind,
        buf,
        out_buf,
        op_code(member, buf.dtype),
        0,
        result,
        (buf.obj, result, getattr(residual, "obj", residual), sample, rows),
        compression=(kernel, owed, call_no, _engine_pieces(comm), *canary, name, limit),
    )
    got = comm._run(call, async_op)
    if rows is None:
        return got
    if not async_op:
        _notice(comm, st)
        return got
    return _CanaryWork(comm, st, got)


class _CanaryWork:
    """The Work of an async engine call the canary samples: waiting for it also reports
    the canary's verdict (`_notice`)."""

    def __init__(self, comm: Any, st: Any, work: Any):
        self._comm, self._st, self._work = comm, st, work

    def wait(self, timeout: Any = None) -> Any:
        got = self._work.wait(timeout)
        _notice(self._comm, self._st)
        return got

    def __getattr__(self, name: str) -> Any:  # done(), is_completed(), ... of the Work
        return getattr(self._work, name)


def _notice(comm: Any, st: Any) -> None:
    """Warns once for each codec the engine's canary switched off (CompressionWarning),
    among those whose sampled calls have not all been seen judged yet. Reads, never
    waits: the verdict itself was taken by the engine."""
    if not st.canaries:
        return
    engine = comm._core.stats().get("engine_codecs", {})
    for name, (issued, codec) in list(st.canaries.items()):
        counters = engine.get(name)
        if counters is None:
            continue
        if counters["fell_back"] and name not in st.warned:
            st.warned.add(name)
            limit = _policy.settings().threshold(codec)
            warnings.warn(
                _canary.CompressionWarning(
                    f"ringreduce rank {comm.rank}: {name} compression gave a relative "
                    f"error of {counters['compression_error']:.3g} (bias "
                    f"{counters['bias']:.3g}) on its canary, past its threshold "
                    f"{limit:.3g}; this communicator reduces exactly wherever {name} is "
                    "asked for from now on"
                ),
                stacklevel=4,
            )
        if counters["canary_checks"] + counters["fallbacks"] >= issued:
            del st.canaries[name]


def _python_path(comm, st, codec, buf, member, residual, out_buf, call_no, stat, scatter, idx):
    """The compressed call in Python (hop.py), on host arrays: codecs with methods of
    their own, "gather" codecs, and the built-ins under ``use_kernels(False)``."""
    n, size, rank = buf.size, comm.world_size, comm.rank
    lo, hi = _core.chunk_bounds(n, size, rank)
    # One call at a time in the communicator's buffers (see Scratch); x is read before
    # dst is written, so out=x is fine.
    scratch = st.scratch if st.scratch.lock.acquire(blocking=False) else _hop.Scratch(False)
    try:
        flat = buf.host.reshape(-1)
        sample = None if idx is None else (idx, flat[idx].astype(_F32))
        dst = out_buf.host.reshape(-1)
        # What this rank sends: its input as float32 (x itself when it is float32),
        # plus the residual that earlier calls owe the sum.
        v = _hop.widened(flat, scratch)
        whole = codec.algebra == "gather"
        if dst.dtype == _F32 and not (whole and scatter):
            target = dst  # the sum is made (decoded) where the result goes
        else:
            target = scratch.get("sum", n if whole or not scatter else hi - lo, _F32)
        if whole:
            reduced = _hop.gathered(comm, codec, v, residual, call_no, stat, scratch, target)
            if scatter:
                reduced = reduced[lo:hi]
        else:
            piece_values, measured = st.pieces.plan(comm, codec.name, n, _policy.settings())
            start = st.pieces.measure() if measured is not None else None
            codec_before = stat.codec_seconds
            reduced = _hop.one_hop(
                comm,
                codec,
                v,
                flat.dtype != _F32,
                residual,
                call_no,
                stat,
                scratch,
                target,
                scatter,
                piece_values,
            )
            if measured is not None:
                chosen = st.pieces.decide(comm, measured, start, stat.codec_seconds - codec_before)
                if st.debug:
                    sys.stderr.write(
                        f"ringreduce rank {rank}: {codec.name} calls of {1 << (measured[1] - 1)}"
                        f"-{(1 << measured[1]) - 1} values run {'in pieces' if chosen else 'whole'}"
                        f": the spare CPU over its first call (the host's idle time per "
                        f"rank) was {st.pieces.ratios[measured]:.2f}x the codec's time, on "
                        "the rank with the least\n"
                    )
        if sample is not None:
            _check_canary(comm, st, codec, call_no, sample, reduced, (lo, hi), scatter)
        if member is ReduceOp.AVG:
            reduced /= _F32(size)
        if reduced is not dst:
            dst[:] = reduced
    finally:
        if scratch is st.scratch:
            scratch.lock.release()


def _exact(comm, buf, member, result, residual, scatter) -> Any:
    """The uncompressed call, blocking (here, or on the lane). A residual left by earlier
    compressed calls is sent along (in float32) and so cleared: what it owed reaches the
    sum."""
    op = member.name.lower()
    if residual is not None and buf.host is None:  # a device residual (compressed/device.py)
        out_buf = describe(result, "out")
        return _device.exact_with_residual(
            comm, _state(comm), buf, op, result, residual, out_buf, scatter
        )
    if residual is None or not residual.any():
        if scatter:
            return comm.reduce_scatter(buf.obj, op, out=result)
        return comm.all_reduce(buf.obj, op, out=result)
    v = buf.host.reshape(-1).astype(_F32) + residual
    residual[:] = 0
    reduced = comm.reduce_scatter(v, op) if scatter else comm.all_reduce(v, op)
    describe_out = output_buffer(result, buf, (reduced.size,) if scatter else buf.shape)[1]
    describe_out.host.reshape(-1)[:] = reduced
    return result


def _check_canary(comm, st, codec, call_no, sample, reduced, bounds, scatter) -> None:
    """The canary (compression/canary.py): one all_gather of every rank's input at the
    sample and of the compressed sums it holds there; every rank computes the same
    error from the same numbers, and falls back the same way."""
    idx, inputs = sample
    lo, hi = bounds
    held = np.zeros(idx.size, _F32)
    mask = (idx >= lo) & (idx < hi)  # each rank reports its own chunk: each value once
    held[mask] = reduced[idx[mask] - lo] if scatter else reduced[idx[mask]]
    _judge(comm, st, codec, call_no, comm.all_gather(np.stack([inputs, held])))


def _judge(comm, st, codec, call_no, rows) -> None:
    """The canary's verdict from the gathered rows (rank, [input, sum held], sample):
    the same numbers, so the same verdict, on every rank."""
    stat = st.of(codec.name)
    limit = _policy.settings().threshold(codec)
    if stat.judge(rows, limit):
        warnings.warn(
            _canary.CompressionWarning(
                f"ringreduce rank {comm.rank}: {codec.name} compression gave a relative "
                f"error of {stat.compression_error:.3g} (bias {stat.bias:.3g}) on call "
                f"#{call_no}'s canary, past its threshold {limit:.3g}; this communicator "
                f"reduces exactly wherever {codec.name} is asked for from now on"
            ),
            stacklevel=4,
        )
