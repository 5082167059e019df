"""The CUDA kernels and the collectives on CUDA arrays, on a real device.

The CPU and CUDA kernels call the same functors (csrc/reduce/ops.h), so their
results must agree bit for bit, signed zeros and all; numpy is the independent
reference. Device memory comes from the extension itself (DeviceBuffer), so
these tests need neither torch nor cupy; one test checks torch interop when
torch.cuda is usable. The collectives run on 2 ranks sharing one GPU over TCP,
with the extension's own device arrays and with torch.cuda tensors. Skipped
cleanly without a device.
"""

from __future__ import annotations

import numpy as np
import pytest
from _kernels import (
    DTYPE_CODES,
    FLOATS,
    GUARD,
    OP_CODES,
    POISON,
    codec_values,
    describe,
    divide_reference,
    mismatches,
    random_operands,
    reference,
    run,
)

import ringreduce as rr
from ringreduce import _core
from ringreduce._arrays.cuda import DeviceArrayView, DeviceBuffer, cuda_available

from _data import DTYPES, FLOATING, OPS, contribution, expected, np_dtype, same_bits
from _ranks import RankGroup

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(
        not cuda_available(),
        reason="needs a CUDA device and the CUDA build (reinstall with nvcc on PATH)",
    ),
]

# Sizes around a 16-byte pack of every dtype, and one large enough that every
# thread of the grid-stride loop goes round several times.
SIZES = [1, 7, 8, 9, 15, 16, 17, 33, 4099, (1 << 20) + 3]


# Element offsets of (out, a, b) from a 256-byte boundary: all aligned (packs
# throughout), equally misaligned (a head of single elements, then packs), and
# differently misaligned (single elements throughout).
LAYOUTS = {"aligned": (0, 0, 0), "same-offset": (1, 1, 1), "mixed-offsets": (0, 1, 2)}


def reduce_on_device(dtype: str, op: str, a: np.ndarray, b: np.ndarray, shifts) -> np.ndarray:
    """out = a op b on the device, each buffer `shifts` elements past a 256-byte boundary."""
    n, size = a.size, a.itemsize
    offs = [shift * size for shift in shifts]
    bufs = [DeviceBuffer(off + n * size + GUARD) for off in offs]
    try:
        out, da, db = bufs
        out.upload(np.full(out.nbytes, POISON, dtype=np.uint8))
        # Other bytes around the inputs, so an overrun cannot copy poison into poison.
        for buf in (da, db):
            buf.upload(np.full(buf.nbytes, POISON ^ 0xFF, dtype=np.uint8))
        da.upload(a, offs[1])
        db.upload(b, offs[2])
        ptrs = [buf.ptr + off for buf, off in zip(bufs, offs)]
        _core.testing.cuda_reduce(DTYPE_CODES[dtype], OP_CODES[op], *ptrs, n)
        raw = out.download(np.uint8, out.nbytes)
    finally:
        for buf in bufs:
            buf.close()
    off = offs[0]
    assert (raw[:off] == POISON).all() and (raw[off + n * size :] == POISON).all(), "overrun"
    return raw[off : off + n * size].view(a.dtype)


def check_against_cpu_and_numpy(dtype: str, op: str, a, b, got) -> None:
    cpu = run(dtype, op, a, b)
    assert mismatches(got, cpu).size == 0, "GPU vs CPU: " + describe(got, cpu, a, b)
    want = reference(dtype, op, a, b)
    zeros = op not in ("min", "max")
    assert mismatches(got, want, zeros).size == 0, "GPU vs numpy: " + describe(got, want, a, b)


def test_device_is_counted():
    assert _core.cuda_device_count() >= 1


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("op", OPS)
@pytest.mark.parametrize("dtype", DTYPES)
def test_every_dtype_and_op(dtype, op, layout):
    for i, n in enumerate(SIZES):
        a = random_operands(dtype, n, seed=100 + 2 * i)
        b = random_operands(dtype, n, seed=101 + 2 * i)
        got = reduce_on_device(dtype, op, a, b, LAYOUTS[layout])
        check_against_cpu_and_numpy(dtype, op, a, b, got)


@pytest.mark.parametrize("op", OPS)
@pytest.mark.parametrize("dtype", DTYPES)
def test_in_place(dtype, op):
    n = 100_003
    a = random_operands(dtype, n, seed=5)
    b = random_operands(dtype, n, seed=6)
    with DeviceBuffer.from_array(a) as da, DeviceBuffer.from_array(b) as db:
        _core.testing.cuda_reduce(DTYPE_CODES[dtype], OP_CODES[op], da.ptr, da.ptr, db.ptr, n)
        got = da.download(a.dtype, n)
    check_against_cpu_and_numpy(dtype, op, a, b, got)


@pytest.mark.parametrize("divisor", [1, 3, 8])
@pytest.mark.parametrize("dtype", FLOATS)
def test_divide(dtype, divisor):
    for n in SIZES:
        x = random_operands(dtype, n, seed=n)
        with DeviceBuffer.from_array(x) as dx:
            _core.testing.cuda_divide(DTYPE_CODES[dtype], dx.ptr, n, divisor)
            got = dx.download(x.dtype, n)
        cpu = x.copy()
        _core.testing.divide_local(DTYPE_CODES[dtype], cpu.ctypes.data, n, divisor)
        assert mismatches(got, cpu).size == 0, describe(got, cpu, x, x)
        want = divide_reference(dtype, x, divisor)
        assert mismatches(got, want).size == 0, describe(got, want, x, x)


def test_zero_elements_touch_nothing():
    with DeviceBuffer(64) as buf:
        buf.upload(np.full(64, POISON, dtype=np.uint8))
        _core.testing.cuda_reduce(
            DTYPE_CODES["float32"], OP_CODES["sum"], buf.ptr, buf.ptr, buf.ptr, 0
        )
        assert (buf.download(np.uint8, 64) == POISON).all()


def test_host_memory_is_rejected():
    x = np.zeros(16, dtype=np.float32)
    with DeviceBuffer.from_array(x) as d, pytest.raises(ValueError, match="not CUDA device"):
        _core.testing.cuda_reduce(DTYPE_CODES["float32"], 0, d.ptr, x.ctypes.data, d.ptr, 16)


def test_torch_tensors_on_torch_stream():
    # Pointers and streams made by torch's own CUDA runtime work with ours.
    torch = pytest.importorskip(
        "torch", reason="needs torch: pip install torch (the CPU wheel is enough; docs/install.md)"
    )
    if not torch.cuda.is_available():
        pytest.skip("needs torch built with CUDA (a CUDA wheel) and a GPU")
    n = 1 << 20
    a = random_operands("float32", n, seed=1)
    b = random_operands("float32", n, seed=2)
    ta, tb = torch.from_numpy(a).cuda(), torch.from_numpy(b).cuda()
    out = torch.full_like(ta, float("nan"))
    stream = torch.cuda.current_stream().cuda_stream
    _core.testing.cuda_reduce(
        DTYPE_CODES["float32"],
        OP_CODES["sum"],
        out.data_ptr(),
        ta.data_ptr(),
        tb.data_ptr(),
        n,
        stream,
    )
    check_against_cpu_and_numpy("float32", "sum", a, b, out.cpu().numpy())


# ---- collectives on CUDA arrays: 2 ranks on one GPU, over TCP ----------------


@pytest.fixture(scope="module")
def gpu_pair():
    """Two ranks on GPU 0; 4 KiB segments, so every chunk crosses many staging slots."""
    group = RankGroup(2, env={"RINGREDUCE_SEGMENT_BYTES": "4096"})
    yield group
    group.close()


def _collectives_on_device_arrays(comm, counts):
    # DeviceArrayView has no device attribute: its device comes from the pointer.
    n, r = comm.world_size, comm.rank
    failures = []

    def dev(a):
        return DeviceArrayView.from_array(a)

    for dtype in DTYPES:
        for count in counts:
            for op in OPS:
                if op == "avg" and dtype not in FLOATING:
                    continue
                x = dev(contribution(r, count, dtype, op))
                out = dev(np.full(count, 99, dtype=np_dtype(dtype)))
                comm.all_reduce(x, op=op, out=out)
                comm.all_reduce(x, op=op, out=x)  # in place
                want = expected(n, count, dtype, op)
                if not (same_bits(out.get(), want) and same_bits(x.get(), want)):
                    failures.append(f"all_reduce {dtype} {op} count={count}")
            start, stop = rr.chunk_bounds(count, n, r)
            block = dev(np.zeros(stop - start, dtype=np_dtype(dtype)))
            comm.reduce_scatter(dev(contribution(r, count, dtype, "sum")), out=block)
            if not same_bits(block.get(), expected(n, count, dtype, "sum")[start:stop]):
                failures.append(f"reduce_scatter {dtype} count={count}")
            rows = dev(np.zeros((n, count), dtype=np_dtype(dtype)))
            comm.all_gather(dev(contribution(r, count, dtype, "sum")), out=rows)
            want_rows = np.stack([contribution(i, count, dtype, "sum") for i in range(n)])
            if not same_bits(rows.get(), want_rows):
                failures.append(f"all_gather {dtype} count={count}")
            y = dev(contribution(r, count, dtype, "sum"))
            comm.broadcast(y, root=1)
            if not same_bits(y.get(), contribution(1, count, dtype, "sum")):
                failures.append(f"broadcast {dtype} count={count}")
    return failures


def test_collectives_on_device_arrays(gpu_pair):
    counts = [0, 1, 3, 4099, (1 << 20) + 3]
    assert gpu_pair.run(_collectives_on_device_arrays, counts, timeout=600) == [[], []]


@pytest.fixture(scope="module")
def gpu_shm_pair():
    """Two ranks on GPU 0 over shared memory: an all_reduce of at most 80 bytes goes
    through the bulletin (staged through pinned memory), up to 64 KiB the direct path."""
    group = RankGroup(2, transport="shm")
    yield group
    group.close()


def test_collectives_on_device_arrays_over_shared_memory(gpu_shm_pair):
    counts = [0, 1, 3, 20, 21, 4099, (1 << 16) + 1]
    assert gpu_shm_pair.run(_collectives_on_device_arrays, counts, timeout=300) == [[], []]


def _device_and_host_ranks_meet(comm, counts):
    # Rank 0 passes CUDA arrays, rank 1 numpy arrays: both must take the same path.
    failures = []
    for count in counts:
        for dtype in ("float32", "bfloat16", "int64"):
            x = contribution(comm.rank, count, dtype, "sum")
            out = np.zeros(count, dtype=np_dtype(dtype))
            if comm.rank == 0:
                dx, dout = DeviceArrayView.from_array(x), DeviceArrayView.from_array(out)
                comm.all_reduce(dx, out=dout)
                out = dout.get()
            else:
                comm.all_reduce(x, out=out)
            if not same_bits(out, expected(comm.world_size, count, dtype, "sum")):
                failures.append(f"{dtype} count={count}")
    return failures


def test_device_and_host_ranks_in_one_call_over_shared_memory(gpu_shm_pair):
    counts = [1, 10, 20, 21, 4099, 1 << 20]
    assert gpu_shm_pair.run(_device_and_host_ranks_meet, counts, timeout=300) == [[], []]


def _torch_cuda_collectives(comm):
    import torch

    torch.cuda.set_device(0)
    n, r = comm.world_size, comm.rank
    failures = []
    count = (1 << 22) + 5
    for dtype in (torch.float32, torch.bfloat16, torch.float16, torch.int64):
        base = torch.arange(count, device="cuda", dtype=torch.int64) % 7
        x = (base + r).to(dtype)
        want = sum((base + i) for i in range(n)).to(dtype)
        y = comm.all_reduce(x)
        if not (y.is_cuda and y.dtype == dtype and torch.equal(y, want)):
            failures.append(f"all_reduce {dtype}")
        if not torch.equal(x, (base + r).to(dtype)):
            failures.append(f"all_reduce {dtype} modified its input")
        comm.all_reduce(x, out=x)
        if not torch.equal(x, want):
            failures.append(f"in-place all_reduce {dtype}")
    x = torch.full((count,), float(r + 1), device="cuda", dtype=torch.float32)
    if not torch.equal(comm.all_reduce(x, op="avg"), torch.full_like(x, (n + 1) / 2)):
        failures.append("avg")
    # Non-contiguous input is copied; the result has the input's shape.
    grid = torch.arange(12, device="cuda", dtype=torch.float32).reshape(3, 4)
    m = grid.t() * (r + 1)
    if m.is_contiguous() or not torch.equal(comm.all_reduce(m), grid.t() * (n * (n + 1) // 2)):
        failures.append("non-contiguous")
    start, stop = rr.chunk_bounds(count, n, r)
    part = comm.reduce_scatter(torch.ones(count, device="cuda") * (r + 1))
    if not (part.is_cuda and part.shape == (stop - start,) and torch.all(part == 3)):
        failures.append("reduce_scatter")
    rows = comm.all_gather(torch.full((5,), float(r), device="cuda"))
    if not torch.equal(rows, torch.arange(n, device="cuda").float()[:, None].expand(n, 5)):
        failures.append("all_gather")
    return failures


def _torch_caller_stream_is_waited_for(comm, count=1 << 20):
    # The input is written on a side stream behind ~50 ms of sleep; the call is
    # made while that stream is current, so it must see the write.
    import torch

    torch.cuda.set_device(0)
    side = torch.cuda.Stream()
    with torch.cuda.stream(side):
        torch.cuda._sleep(100_000_000)
        x = torch.full((count,), float(comm.rank + 1), device="cuda")
        work = comm.all_reduce(x, async_op=True)
        y = work.wait()
    return bool(torch.all(y == 3).item())


def _torch_available_with_cuda() -> bool:
    try:
        import torch
    except ImportError:
        return False
    return bool(torch.cuda.is_available())


needs_torch_cuda = pytest.mark.skipif(
    not _torch_available_with_cuda(), reason="needs torch built with CUDA (a CUDA wheel) and a GPU"
)


@needs_torch_cuda
def test_torch_cuda_all_reduce_two_ranks_one_gpu(gpu_pair):
    assert gpu_pair.run(_torch_cuda_collectives, timeout=600) == [[], []]


@needs_torch_cuda
def test_torch_caller_stream_is_waited_for(gpu_pair):
    assert gpu_pair.run(_torch_caller_stream_is_waited_for) == [True, True]


@needs_torch_cuda
@pytest.mark.parametrize("count", [2, 1000])
def test_torch_caller_stream_is_waited_for_over_shared_memory(gpu_shm_pair, count):
    # 2 floats: the bulletin's staging copies; 1000: the direct path's.
    assert gpu_shm_pair.run(_torch_caller_stream_is_waited_for, count) == [True, True]


def _grad_sync_on_cuda_equals_cpu(comm):
    # The same model trained with GradSync on the CPU and on the GPU: the buckets of the
    # GPU run live on the device and are reduced by the device executor.
    import torch

    torch.cuda.set_device(0)
    results = {}
    for device in ("cpu", "cuda"):
        torch.manual_seed(0)
        model = torch.nn.Sequential(
            torch.nn.Linear(8, 16), torch.nn.Tanh(), torch.nn.Linear(16, 2)
        ).to(device=device, dtype=torch.float64)
        sync = rr.torch.GradSync(model, comm, bucket_mb=1e-4, first_bucket_mb=1e-4)
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        for step in range(3):
            g = torch.Generator().manual_seed(100 * step + comm.rank)
            x = torch.randn(4, 8, generator=g, dtype=torch.float64).to(device)
            y = torch.randn(4, 2, generator=g, dtype=torch.float64).to(device)
            torch.nn.functional.mse_loss(model(x), y).backward()
            sync.wait()
            opt.step()
            opt.zero_grad()
        sync.remove()
        results[device] = [p.detach().cpu() for p in model.parameters()]
    return max(float((a - b).abs().max()) for a, b in zip(results["cpu"], results["cuda"]))


@needs_torch_cuda
def test_grad_sync_with_cuda_parameters(gpu_pair):
    assert all(diff < 1e-12 for diff in gpu_pair.run(_grad_sync_on_cuda_equals_cpu))


# ---- codec kernels (csrc/kernels/codec_cuda.cu) and compressed collectives ------------


@pytest.mark.parametrize("codec", ["bf16", "fp16", "int8", "int4"])
def test_codec_kernels_give_the_cpu_bits(codec):
    dc = _core.DeviceCodec(0, False, 60.0)
    key = 0x1234_5678_9ABC_DEF0
    for n in (1, 7, 512, 1031, 2048 + 5, 70_001):
        x = codec_values(n, n)
        res = (np.random.default_rng(n + 1).standard_normal(n) * 1e-3).astype(np.float32)
        size = _core.codec_payload_bytes(codec, n)
        cpu_res = res.copy()
        cpu = np.zeros(size, np.uint8)
        _core.codec_encode(codec, x, key, cpu, cpu_res)
        with DeviceBuffer.from_array(x) as dx, DeviceBuffer.from_array(res) as dres:
            got = np.zeros(size, np.uint8)
            dc.begin(0)
            dc.encode(codec, dx.ptr, n, key, got, dres.ptr)
            assert got.tobytes() == cpu.tobytes(), f"{codec} n={n}: payload"
            assert same_bits(dres.download(np.float32, n), cpu_res), f"{codec} n={n}: residual"
            # Residual written only: x's own encode and what it dropped.
            plain = np.zeros(size, np.uint8)
            _core.codec_encode(codec, x, key, plain)
            back = np.zeros(n, np.float32)
            _core.codec_decode(codec, plain, n, back)
            dc.encode(codec, dx.ptr, n, key, got, dres.ptr, True)
            assert got.tobytes() == plain.tobytes(), f"{codec} n={n}: payload, residual out"
            with np.errstate(invalid="ignore"):  # inf - inf in the non-finite block
                owed = x - back
            assert same_bits(dres.download(np.float32, n), owed), f"{codec} n={n}"
        with DeviceBuffer(4 * n) as dout:
            dc.decode(codec, cpu, n, dout.ptr)
            want = np.zeros(n, np.float32)
            _core.codec_decode(codec, cpu, n, want)
            assert same_bits(dout.download(np.float32, n), want), f"{codec} n={n}: decode"
            acc = np.random.default_rng(n + 2).standard_normal(n).astype(np.float32)
            dout.upload(acc)
            payloads = [cpu, plain, cpu]
            dc.decode_add(codec, payloads, n, dout.ptr)
            _core.codec_decode_add(codec, payloads, n, acc)
            assert same_bits(dout.download(np.float32, n), acc), f"{codec} n={n}: decode_add"


def test_conversions_give_numpys_bits():
    import ml_dtypes

    dc = _core.DeviceCodec(0, False, 60.0)
    x = codec_values(5000, 9) * np.float32(3e4)  # past float16's range too
    for name, dtype in (("float16", np.float16), ("bfloat16", ml_dtypes.bfloat16)):
        with DeviceBuffer.from_array(x) as dx, DeviceBuffer(2 * x.size) as dh:
            dc.begin(0)
            dc.convert(DTYPE_CODES[name], dh.ptr, DTYPE_CODES["float32"], dx.ptr, x.size)
            narrow = dh.download(dtype, x.size)
            with np.errstate(over="ignore"):
                want = x.astype(dtype)
            assert same_bits(narrow, want), name
            dc.convert(DTYPE_CODES["float32"], dx.ptr, DTYPE_CODES[name], dh.ptr, x.size)
            assert same_bits(dx.download(np.float32, x.size), narrow.astype(np.float32)), name


def _compressed_on_device_arrays(comm, n):
    from ringreduce._comm.compressed import route as compressed

    got = []
    for codec in ("bf16", "fp16", "int8", "int4"):
        for dtype in ("float32", "bfloat16"):
            x = contribution(comm.rank, n, dtype, "sum")
            res = np.full(n, 1e-3, np.float32)
            compressed._STATES.pop(comm, None)
            host_res = res.copy()
            host = comm.all_reduce(x, "avg", compression=codec, error_feedback=host_res)
            compressed._STATES.pop(comm, None)
            dres = DeviceArrayView.from_array(res)
            out = DeviceArrayView.from_array(np.zeros(n, x.dtype))
            comm.all_reduce(
                DeviceArrayView.from_array(x),
                "avg",
                compression=codec,
                error_feedback=dres,
                out=out,
            )
            got.append(
                same_bits(out.get(), host) and same_bits(dres.get(), host_res) or (codec, dtype)
            )
    return got


def test_compressed_all_reduce_of_device_arrays_gives_the_host_bits(gpu_pair):
    for got in gpu_pair.run(_compressed_on_device_arrays, (1 << 20) + 3, timeout=300):
        assert all(g is True for g in got), got


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize(
    "dtype,op", [(d, o) for d in DTYPES for o in OPS if o != "avg" or d in FLOATING]
)
def test_reduce_all_kernel_has_the_cpu_bits(dtype, op, layout):
    """The device window path's one kernel: 3 inputs reduced in rank order (16-bit floats
    in float32, rounded once), avg divided, written into 2 outputs, one of them an
    input; the CPU's reduce_all bits, nothing written past the end."""
    count_in, n, size = 3, (1 << 20) + 3, np.dtype(np_dtype(dtype)).itemsize
    shifts = LAYOUTS[layout] + (LAYOUTS[layout][0],)
    inputs = [random_operands(dtype, n, seed=r) for r in range(count_in)]
    divisor = count_in if op == "avg" else 0
    want = np.empty_like(inputs[0])
    _core.testing.reduce_all_local(
        DTYPE_CODES[dtype],
        OP_CODES[op],
        [x.ctypes.data for x in inputs],
        want.ctypes.data,
        n,
        divisor,
    )
    offs = [shift * size for shift in shifts]
    bufs = [DeviceBuffer(off + n * size + GUARD) for off in offs]
    try:
        for buf, off, x in zip(bufs, offs, inputs):
            buf.upload(np.full(buf.nbytes, POISON, dtype=np.uint8))
            buf.upload(x, off)
        ptrs = [buf.ptr + off for buf, off in zip(bufs, offs)]
        # Outputs: a fresh buffer and the last input (in place).
        _core.testing.cuda_reduce_all(
            DTYPE_CODES[dtype], OP_CODES[op], ptrs[:3], [ptrs[3], ptrs[2]], n, divisor
        )
        zeros = op not in ("min", "max")
        for buf, off in ((bufs[3], offs[3]), (bufs[2], offs[2])):
            raw = buf.download(np.uint8, buf.nbytes)
            assert (raw[:off] == POISON).all() and (raw[off + n * size :] == POISON).all()
            got = raw[off : off + n * size].view(inputs[0].dtype)
            bad = mismatches(got, want, signed_zeros=zeros)
            assert bad.size == 0, f"{bad.size} wrong, first at {bad[:3]}"
    finally:
        for buf in bufs:
            buf.close()


# ---- device windows (comm.empty(..., device="cuda")): 2 ranks on one GPU ------------


def test_device_windows_every_dtype_and_op(gpu_shm_pair):
    """Each rank's kernels reduce its chunk straight out of the other's memory (CUDA
    IPC) and write it into both outputs: numpy's bits, every call on the window path."""
    import _device_window_ranks as dw

    for bad, calls, ran in gpu_shm_pair.run(dw.exact, timeout=300):
        assert bad == []
        assert ran == calls > 0


def test_device_windows_rank_order_bits_and_reuse(gpu_shm_pair):
    import _device_window_ranks as dw

    assert gpu_shm_pair.run(dw.float_order) == [(True, True)] * 2
    for bad, same, _ in gpu_shm_pair.run(dw.half_sums):
        assert bad == [] and same
    assert gpu_shm_pair.run(dw.reuse_under_pressure, 60, timeout=120) == ["ok"] * 2
