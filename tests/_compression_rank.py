"""Rank-side functions of tests/test_compression.py (module level, so they pickle by
reference), and the test data: each rank's contribution is a function of rank, size
and dtype alone, so the parent can compute the float64 reference."""

from __future__ import annotations

import warnings

import ml_dtypes
import numpy as np

from ringreduce.compression import (
    BlockIntCodec,
    Codec,
    CompressionWarning,
    ErrorFeedback,
    configure,
    settings,
)
from ringreduce.compression.codecs import use_kernels

CODECS = ("bf16", "fp16", "int8", "int4")
DTYPES = {"float32": np.float32, "float16": np.float16, "bfloat16": ml_dtypes.bfloat16}


def contribution(rank: int, n: int, dtype: str, scale: float = 1.0) -> np.ndarray:
    """Gaussian noise, exactly representable in ``dtype``."""
    rng = np.random.default_rng(1000 * rank + n)
    return (rng.standard_normal(n) * scale).astype(DTYPES[dtype])


def matrix(comm, sizes):
    """Every codec x dtype x size: (all_reduce result, reduce_scatter block, input left
    untouched) per case."""
    got = {}
    for codec in CODECS:
        for dtype in DTYPES:
            for n in sizes:
                x = contribution(comm.rank, n, dtype)
                before = x.copy()
                y = comm.all_reduce(x, compression=codec)
                block = comm.reduce_scatter(x, compression=codec)
                got[codec, dtype, n] = (
                    y,
                    block,
                    bool(np.array_equal(x.view(np.uint8), before.view(np.uint8))),
                )
    return got


def average_and_outputs(comm, codec):
    """avg, out=, out=x (in place), async_op, reduce_scatter(out=), 2-d input."""
    n = 1000
    x = contribution(comm.rank, n, "float32").reshape(40, 25)
    avg = comm.all_reduce(x, "avg", compression=codec)
    total = comm.all_reduce(x, compression=codec)
    out = np.empty_like(x)
    same = comm.all_reduce(x, compression=codec, out=out)
    inplace = x.copy()
    res = comm.all_reduce(inplace, compression=codec, out=inplace)
    work = comm.all_reduce(x, compression=codec, async_op=True)
    waited = work.wait()
    lo, hi = __import__("ringreduce").chunk_bounds(n, comm.world_size, comm.rank)
    block_out = np.empty(hi - lo, np.float32)
    block = comm.reduce_scatter(x, compression=codec, out=block_out)
    return {
        "avg": avg,
        "total": total,
        "out_is_out": same is out,
        "out": out,
        "inplace_is_x": res is inplace,
        "inplace": inplace,
        "done": work.done(),
        "waited": waited,
        "block_is_out": block is block_out,
        "block": block,
    }


def refusals(comm):
    """Each bad argument's error, as (type name, message); then a call that works."""
    x = np.ones(10, np.float32)
    cases = {
        "int32": lambda: comm.all_reduce(np.ones(10, np.int32), compression="int8"),
        "float64": lambda: comm.all_reduce(np.ones(10), compression="int8"),
        "unknown": lambda: comm.all_reduce(x, compression="int3"),
        "max": lambda: comm.all_reduce(x, "max", compression="bf16"),
        "length": lambda: comm.all_reduce(x, compression="int8", error_feedback=_ef_of(7)),
        "feedback": lambda: comm.all_reduce(x, compression="int8", error_feedback="yes"),
    }
    out = {}
    for name, call in cases.items():
        try:
            call()
            out[name] = ("none", "")
        except Exception as exc:  # noqa: BLE001 - the test reads the type
            out[name] = (type(exc).__name__, str(exc))
    out["after"] = comm.all_reduce(np.ones(4, np.float32), compression="int8")
    out["float64_auto"] = comm.all_reduce(np.ones(4), compression="auto")
    return out


def _ef_of(n):
    ef = ErrorFeedback().key("w")
    ef.residual(n)
    return ef


def repeated(comm, codec, calls, feedback, n=3000):
    """The running sum of ``calls`` results of the same input (float64)."""
    x = contribution(comm.rank, n, "float32")
    ef = ErrorFeedback().key("x") if feedback else None
    total = np.zeros(n)
    for _ in range(calls):
        total += comm.all_reduce(x, compression=codec, error_feedback=ef)
    return total, (ef.norm() if ef else 0.0)


def feedback_round_trip(comm):
    """bf16 (deterministic rounding): 3 calls with one ErrorFeedback, against 2 calls,
    a checkpoint restored into a new one, and the third call."""
    x = contribution(comm.rank, 777, "float32")
    ef = ErrorFeedback()
    straight = [
        comm.all_reduce(x, compression="bf16", error_feedback=ef.key("a")) for _ in range(3)
    ]
    ef2 = ErrorFeedback()
    for _ in range(2):
        comm.all_reduce(x, compression="bf16", error_feedback=ef2.key("a"))
    state = ef2.state_dict()
    ef3 = ErrorFeedback()
    ef3.load_state_dict(state)
    resumed = comm.all_reduce(x, compression="bf16", error_feedback=ef3.key("a"))
    return straight[2], resumed, straight[0]


def canary(comm, name, async_op=False, kernels=True):
    """Contributions that cancel (rank 1 sends minus rank 0's, plus a little): a codec
    error proportional to the parts is large against their small sum. Returns the
    warnings, the results and the stats. ``async_op``: the three calls queued, then
    waited for; ``kernels``: False runs the codec's numpy methods (the Python path)."""
    old = settings().canary_every, use_kernels()
    configure(canary_every=1)
    use_kernels(kernels)
    codec = BlockIntCodec(8, name, max_error=0.1)
    try:
        a = contribution(0, 5000, "float32")
        x = a if comm.rank == 0 else -a + 1e-3 * contribution(1, 5000, "float32")
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            calls = [comm.all_reduce(x, compression=codec, async_op=async_op) for _ in range(3)]
            first, second, third = (c.wait() if async_op else c for c in calls)
        exact = comm.all_reduce(x)
        ours = [str(w.message) for w in caught if issubclass(w.category, CompressionWarning)]
        return ours, first, second, third, exact, comm.stats()["compression"][name]
    finally:
        configure(canary_every=old[0])
        use_kernels(old[1])


def wire(comm, n):
    """Bytes this rank sent for one exact fp32 all_reduce and one per codec (the canary
    off: its all_gather, on a communicator's first compressed call, is not payload)."""
    x = contribution(comm.rank, n, "float32")
    sent = {}
    old = settings().canary_every
    configure(canary_every=0)
    try:
        for codec in (None,) + CODECS:
            before = comm.stats()["bytes_sent"]
            comm.all_reduce(x, compression=codec)
            sent[codec or "exact"] = comm.stats()["bytes_sent"] - before
    finally:
        configure(canary_every=old)
    return sent, comm.stats()


def non_finite(comm, codec):
    """inf, -inf and nan at chosen places of some ranks' inputs."""
    n = 2000
    x = contribution(comm.rank, n, "float32")
    if comm.rank == 0:
        x[[3, 700, 1500]] = [np.inf, np.inf, np.nan]
    if comm.rank == 1:
        x[[3, 701]] = [-np.inf, -np.inf]
    with np.errstate(invalid="ignore"):
        return comm.all_reduce(x, compression=codec), x


def mismatch(comm, counts=(100, 101), after=8):
    """Ranks reduce different counts (``counts``, by rank): both must raise; then a call
    of ``after`` values on every rank, which the broken communicator refuses (as after
    any collective whose ranks disagree): (the first error, the second's)."""
    x = np.ones(counts[comm.rank], np.float32)
    outcomes = []
    for n in (None, after):
        try:
            comm.all_reduce(x if n is None else np.ones(n, np.float32), compression="int8")
            outcomes.append(("none", ""))
        except Exception as exc:  # noqa: BLE001
            outcomes.append((type(exc).__name__, str(exc)))
    return outcomes


def auto(comm, n, calls):
    """``calls`` auto all_reduces of n values: results and the exact one."""
    x = contribution(comm.rank, n, "float32")
    results = [comm.all_reduce(x, compression="auto") for _ in range(calls)]
    return results, comm.all_reduce(x), comm.stats()["compression"]


def auto_async(comm, n, calls):
    """``calls`` auto all_reduces of n values with async_op=True (as the bucketer
    issues them): the results, the exact one, auto's counters, and whether each Work
    was done when the call returned."""
    x = contribution(comm.rank, n, "float32")
    works, done_at_return = [], []
    for _ in range(calls):
        works.append(comm.all_reduce(x, compression="auto", async_op=True))
        done_at_return.append(works[-1].done())
    results = [w.wait() for w in works]
    return results, comm.all_reduce(x), comm.stats()["compression"], done_at_return


class Exact32(Codec):
    """A "gather" codec that sends float32 as it is: sums must come out exact (in rank
    order), on every rank alike."""

    name = "exact32-test"
    algebra = "gather"

    def payload_bytes(self, n):
        return 4 * n

    def encode(self, x, seed=0):
        return x.astype(np.float32).view(np.uint8)

    def decode(self, payload, n):
        return payload.view(np.float32).copy()


def custom(comm):
    x = contribution(comm.rank, 999, "float32")
    ef = ErrorFeedback()
    y = comm.all_reduce(x, compression=Exact32(), error_feedback=ef)
    block = comm.reduce_scatter(x, compression=Exact32())
    return y, block, ef.norm()


class PythonInt8(BlockIntCodec):
    """int8 whose encode is its own (the numpy reference): the collective takes the
    codec's Python methods instead of the C++ kernels."""

    def encode(self, x, seed=0):
        return super().encode(x, seed, use_numpy=True)


def _fresh_numbers(comm):
    """Forgets comm's compression state: call numbers (and so seeds) start again at 0."""
    from ringreduce._comm.compressed import route as compressed

    compressed._STATES.pop(comm, None)


def reuse(comm, n=5003):
    """Results never share the communicator's scratch buffers; in-place float16; the
    kernel path and a codec's Python path give the same bits and residuals."""
    x = contribution(comm.rank, n, "float32")
    first = comm.all_reduce(x, compression="int8")
    kept = first.copy()
    second = comm.all_reduce(2 * x, compression="int8")
    block = comm.reduce_scatter(x, compression="bf16")
    kept_block = block.copy()
    comm.reduce_scatter(3 * x, compression="bf16")
    half = contribution(comm.rank, n, "float16")
    copied = comm.all_reduce(half, "avg", compression="bf16")  # bf16: no dither, same bits
    inplace = half.copy()
    comm.all_reduce(inplace, "avg", compression="bf16", out=inplace)
    runs = []
    for codec in ("int8", PythonInt8(8, "int8-python", 0.1)):
        _fresh_numbers(comm)
        ef = ErrorFeedback()
        got = [comm.all_reduce(x, compression=codec, error_feedback=ef) for _ in range(2)]
        got.append(comm.reduce_scatter(x, compression=codec, error_feedback=ef.key("rs")))
        runs.append(([g.tobytes() for g in got], ef.state_dict()["residuals"]))
    return {
        "first_kept": first.tobytes() == kept.tobytes()
        and first is not second
        and not np.shares_memory(first, second),
        "block_kept": block.tobytes() == kept_block.tobytes(),
        "inplace": inplace,
        "copied": copied,
        "same_paths": runs[0][0] == runs[1][0]
        and all(a.tobytes() == runs[1][1][k].tobytes() for k, a in runs[0][1].items()),
    }


def engine_pieces(comm, codec: str) -> int:
    """The pieces the engine's compressed calls of ``codec`` ran in so far."""
    return int(comm._core.stats()["engine_codecs"].get(codec, {}).get("pieces", 0))


def in_pieces(comm, piece_values, sizes, feedback_calls):
    """Every codec x (float32, bfloat16) x size with calls cut into pieces of
    ``piece_values`` values per chunk: (all_reduce result, reduce_scatter block, the same
    all_reduce in place, (the engine collectives one all_reduce took, the pieces it ran
    in)) per case; and the
    running sums of ``feedback_calls`` float32 int4 calls with error feedback and without
    it. Pieces always
    (where the transport allows), and the canary off, so that an all_reduce's collectives
    are its pieces' alone."""
    old = settings().piece_values, settings().canary_every, settings().pieces
    configure(piece_values=piece_values, canary_every=0, pieces="always")
    try:
        got = {}
        for codec in CODECS:
            for dtype in ("float32", "bfloat16"):
                for n in sizes:
                    x = contribution(comm.rank, n, dtype)
                    ops, cut = comm.stats()["ops"], engine_pieces(comm, codec)
                    y = comm.all_reduce(x, compression=codec)
                    ops = (comm.stats()["ops"] - ops, engine_pieces(comm, codec) - cut)
                    block = comm.reduce_scatter(x, compression=codec)
                    inplace = x.copy()
                    comm.all_reduce(inplace, compression=codec, out=inplace)
                    later = comm.all_reduce(x, compression=codec, async_op=True).wait()
                    got[codec, dtype, n] = (y, block, inplace, ops, later)
        n = sizes[-1]
        x = contribution(comm.rank, n, "float32")
        totals = []
        for ef in (ErrorFeedback().key("x"), None):
            total = np.zeros(n)
            for _ in range(feedback_calls):
                total += comm.all_reduce(x, compression="int4", error_feedback=ef)
            totals.append(total)
        return got, totals
    finally:
        configure(piece_values=old[0], canary_every=old[1], pieces=old[2])


def mismatch_in_pieces(comm):
    """Ranks reduce counts cut into different numbers of pieces (1 and 4 pieces of 512
    values): all must raise before any row travels."""
    old = settings().piece_values, settings().pieces
    configure(piece_values=512, pieces="always")
    try:
        return mismatch(comm, (1024, 4096), 8192)
    finally:
        configure(piece_values=old[0], pieces=old[1])


def pieces_chosen(comm, sizes, calls):
    """pieces="auto" with pieces of 512 values, on the Python path (the codecs' numpy
    methods, `use_kernels(False)`): per size, the engine collectives of each
    of ``calls`` int8 all_reduce calls, the size class's agreed ratio, the results, and
    the collectives of two bf16 calls run on the lane (async_op)."""
    from ringreduce._comm.compressed.pieces import PieceChoice
    from ringreduce._comm.compressed.route import _state

    old = settings().piece_values, settings().canary_every, use_kernels()
    configure(piece_values=512, canary_every=0)
    use_kernels(False)  # the Python path's choice: the engine's calls cut where they can
    _state(comm).pieces = PieceChoice()  # measured afresh, also when the test runs again
    try:
        got = {}
        for n in sizes:
            x = contribution(comm.rank, n, "float32")
            ops, ys = [], []
            for _ in range(calls):
                before = comm.stats()["ops"]
                ys.append(comm.all_reduce(x, compression="int8"))
                ops.append(comm.stats()["ops"] - before)
            ratio = _state(comm).pieces.ratios.get(("int8", int(n).bit_length()))
            lane = []  # bf16 on the lane: measured and agreed there
            for _ in range(2):
                before = comm.stats()["ops"]
                comm.all_reduce(x, compression="bf16", async_op=True).wait()
                lane.append(comm.stats()["ops"] - before)
            got[n] = (ops, ratio, ys, lane)
        return got
    finally:
        configure(piece_values=old[0], canary_every=old[1])
        use_kernels(old[2])
