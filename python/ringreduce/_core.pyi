"""Type stubs for the C++ extension ringreduce._core (internal API)."""

from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple, Union

class DType:
    """Element types the engine reduces."""

    float16: DType
    bfloat16: DType
    float32: DType
    float64: DType
    int8: DType
    uint8: DType
    int32: DType
    int64: DType
    __members__: Dict[str, DType]
    def __init__(self, value: int) -> None: ...
    def __int__(self) -> int: ...
    def __index__(self) -> int: ...
    @property
    def name(self) -> str: ...
    @property
    def value(self) -> int: ...

class Op:
    """Reduction operators."""

    SUM: Op
    PROD: Op
    MIN: Op
    MAX: Op
    AVG: Op
    __members__: Dict[str, Op]
    def __init__(self, value: int) -> None: ...
    def __int__(self) -> int: ...
    def __index__(self) -> int: ...
    @property
    def name(self) -> str: ...
    @property
    def value(self) -> int: ...

class Collective:
    """The collectives a communicator runs."""

    ALL_REDUCE: Collective
    REDUCE_SCATTER: Collective
    ALL_GATHER: Collective
    BROADCAST: Collective
    BARRIER: Collective
    REDUCE: Collective
    GATHER: Collective
    SCATTER: Collective
    ALL_TO_ALL: Collective
    COMPRESSED_ALL_REDUCE: Collective
    COMPRESSED_REDUCE_SCATTER: Collective
    __members__: Dict[str, Collective]
    def __init__(self, value: int) -> None: ...
    def __int__(self) -> int: ...
    def __index__(self) -> int: ...
    @property
    def name(self) -> str: ...
    @property
    def value(self) -> int: ...

class Options:
    """A communicator's settings (see csrc/engine/options.h). A default-made one holds
    the engine's defaults, the only copy of them: Python reads them from it."""

    timeout_seconds: float
    segment_bytes: int
    small_bytes: int
    algorithm: str
    transport: str
    host_id: str
    spin_us: int
    shm_single_copy_bytes: int
    shm_slot_bytes: int
    device_staging_bytes: int
    device_land_in_place: bool
    stream_store_bytes: int
    socket_addr: str
    token: str
    log_algorithm: bool
    tcp_streams: int
    tcp_keepalive_seconds: int
    fake_device: bool
    point_to_point: bool
    def __init__(self) -> None: ...

class Work:
    @property
    def description(self) -> str: ...
    def wait(self, seconds: float) -> bool: ...
    def done(self) -> bool: ...
    @property
    def source(self) -> int: ...

class TcpStore:
    """A TCP key-value store: is_server=True serves one (port 0: the kernel picks)."""

    def __init__(
        self,
        host: str,
        port: int,
        is_server: bool,
        timeout: float,
        io_seconds: float,
        token: str = ...,
        keepalive_seconds: int = ...,
    ) -> None: ...
    @property
    def port(self) -> int: ...
    def set(self, key: str, value: bytes) -> None: ...
    def try_get(self, key: str) -> Optional[bytes]: ...
    def claim(self, key: str, value: bytes) -> bytes:
        """set_if_absent without telling the other clients (a seat)."""
    def set_many(self, items: List[Tuple[str, bytes]]) -> None:
        """set of each (key, value), in order, in one round trip."""
    def try_get_many(self, keys: List[str]) -> List[Optional[bytes]]:
        """try_get of each key, in order (None where missing), in one round trip."""
    def wait_get(self, key: str, ms: int) -> Optional[bytes]: ...
    def set_if_absent(self, key: str, value: bytes) -> bytes: ...
    def erase_prefix(self, prefix: str) -> int:
        """On the store's host: drops every key that starts with prefix; how many."""
    def key_count(self) -> int:
        """On the store's host: how many keys it holds."""
    def host_lost(self) -> bool: ...
    def host_unreachable(self) -> bool: ...
    def set_host_stop_check(self, on: bool) -> None: ...
    def seal(self) -> None: ...
    def close(self) -> None: ...

class Window:
    """A window's bytes (Communicator.allocate_window): a buffer."""

    @property
    def id(self) -> int: ...
    @property
    def nbytes(self) -> int: ...
    def __buffer__(self, flags: int) -> memoryview: ...

class DeviceWindow:
    """A device window's memory (Communicator.allocate_device_window)."""

    @property
    def ptr(self) -> int: ...
    @property
    def device(self) -> int: ...
    @property
    def id(self) -> int: ...
    @property
    def nbytes(self) -> int: ...
    @property
    def shared(self) -> bool: ...
    @property
    def unshared_reason(self) -> str: ...

class Communicator:
    @staticmethod
    def create_tcp(
        rank: int,
        world_size: int,
        master_addr: str,
        master_port: int,
        store_dir: str,
        options: Options,
        port_ready: Optional[Callable[[int], None]] = None,
    ) -> Communicator: ...
    @staticmethod
    def create_with_store(
        store: Any,
        rank: int,
        world_size: int,
        advertise: str,
        meeting: str,
        options: Options,
        parent: Optional[Communicator] = None,
        old_ranks: Optional[List[int]] = None,
    ) -> Communicator: ...
    @property
    def rank(self) -> int: ...
    @property
    def world_size(self) -> int: ...
    @property
    def local_rank(self) -> int: ...
    @property
    def local_world_size(self) -> int: ...
    @property
    def transport(self) -> str: ...
    @property
    def timeout(self) -> float: ...
    @property
    def fake_device(self) -> bool: ...
    def abort(self) -> None: ...
    def release_links(self) -> None: ...
    def interrupt(self) -> None: ...
    def submit(
        self,
        kind: Collective,
        send: int,
        recv: int,
        count: int,
        dtype: DType,
        op: Op,
        root: int,
        device: int = -1,
        stream: int = 0,
        blocks: List[List[int]] = ...,
        compression: Optional[Tuple[str, int, int, int, int, int, int, str, float]] = None,
    ) -> Work: ...
    def run(
        self,
        kind: Collective,
        send: int,
        recv: int,
        count: int,
        dtype: DType,
        op: Op,
        root: int,
        device: int = -1,
        stream: int = 0,
        blocks: List[List[int]] = ...,
        compression: Optional[Tuple[str, int, int, int, int, int, int, str, float]] = None,
    ) -> None: ...
    def wait(self, work: Work, seconds: float) -> bool: ...
    def send(self, data: int, bytes: int, dst: int, tag: int) -> Work: ...
    def recv(self, data: int, bytes: int, src: int, tag: int) -> Work: ...
    def close(self) -> None: ...
    def note_refused_call(self, call: str, reason: str) -> None: ...
    def set_issuer(self, tag: int) -> None: ...
    def stats(self) -> Dict[str, Any]: ...
    def allocate_window(self, bytes: int) -> Optional[Window]: ...
    def allocate_device_window(self, bytes: int, device: int) -> DeviceWindow: ...
    def publish(self, key: str, value: bytes) -> None: ...
    def fetch(self, key: str, seconds: float) -> bytes: ...
    def try_fetch_many(self, keys: List[str]) -> List[Optional[bytes]]:
        """The published values of keys (None where not yet), read together."""
    @property
    def id(self) -> str: ...
    @property
    def failure(self) -> str: ...

PEER_LOOK_MS: int

def chunk_bounds(count: int, parts: int, index: int) -> Tuple[int, int]: ...
def local_ip_towards(host: str) -> str: ...
def this_process() -> Optional[Tuple[int, int, str]]: ...
def process_halted(pid: int, start: int, machine: str) -> bool: ...
def build_info() -> Dict[str, Union[str, bool, List[str]]]: ...
def install_fault_report() -> bool: ...
def small_message_bytes(small_bytes: int, world_size: int) -> int:
    """all_reduce up to this many bytes takes a latency path at world_size ranks."""

def engine_algorithm(
    kind: Collective,
    nbytes: int,
    world_size: int,
    ranks_per_host: int,
    reaches_all: bool,
    options: Options,
) -> str:
    """The algorithm the engine runs ``kind`` with (choose_algorithm)."""

def explain_engine_algorithm(
    kind: Collective,
    nbytes: int,
    world_size: int,
    ranks_per_host: int,
    reaches_all: bool,
    options: Options,
) -> str:
    """Why the engine picks that algorithm (explain_algorithm)."""

def codec_payload_bytes(codec: str, n: int) -> int:
    """The payload size of n values ("bf16", "fp16", "int8" or "int4")."""

def codec_encode(
    codec: str, x: Any, key: int, payload: Any, residual: Optional[Any] = None, first: int = 0
) -> None:
    """Encodes float32 x into the uint8 payload (stochastic-rounding key: 64 bits); with
    a residual, encodes x + residual and leaves what the encode dropped in residual.
    ``first``: x[0]'s index in the array x is a piece of (the dither's index)."""

def codec_decode(codec: str, payload: Any, n: int, out: Any) -> None:
    """out[:n] = the n float32 values the uint8 payload stands for."""

def codec_decode_add(codec: str, payloads: Sequence[Any], n: int, acc: Any) -> None:
    """acc[:n] += each payload's decoded values, in float32, in the payloads' order."""

def codec_kernel_isa() -> str:
    """The instruction set the codec kernels run with ("avx512", "avx2" or "generic")."""

def codec_kernel_isas() -> List[str]:
    """The instruction sets of the codec kernels this machine runs, best first."""

def use_codec_kernel_isa(isa: str) -> None:
    """Runs the codec kernels with one of codec_kernel_isas() in this process from now on
    (every one computes the same bits; for tests and benchmarks). ValueError for another."""

class DeviceCodec:
    """The codec kernels on device memory (CUDA, or the CPU emulation with fake=True),
    each call waited for. Addresses are ints; payloads are host uint8 arrays."""

    def __init__(self, device: int, fake: bool, timeout_seconds: float) -> None: ...
    def begin(self, stream: int) -> None: ...
    def buffer(self, role: str, nbytes: int) -> int: ...
    def trim(self, limit: int) -> None: ...
    @property
    def kept_bytes(self) -> int: ...
    def encode(
        self,
        codec: str,
        x: int,
        n: int,
        key: int,
        payload: Any,
        residual: int = 0,
        residual_out_only: bool = False,
    ) -> None: ...
    def decode(self, codec: str, payload: Any, n: int, out: int) -> None: ...
    def decode_add(self, codec: str, payloads: Sequence[Any], n: int, acc: int) -> None: ...
    def add(self, out: int, a: int, b: int, n: int) -> None: ...
    def copy(self, dst: int, src: int, nbytes: int) -> None: ...
    def zero(self, ptr: int, nbytes: int) -> None: ...
    def convert(self, to: int, dst: int, from_: int, src: int, n: int) -> None: ...
    def divide(self, data: int, n: int, divisor: int) -> None: ...

def cuda_device_count() -> int: ...
def cuda_device_properties(device: int = 0) -> Dict[str, Any]: ...
def cuda_pointer_device(ptr: int) -> int: ...

class _Testing:
    """The submodule ``_core.testing``: hooks for tests and benchmarks, not an API."""

    @staticmethod
    def reduce_scatter_step(rank: int, size: int, step: int) -> Tuple[int, int]: ...
    @staticmethod
    def all_gather_step(rank: int, size: int, step: int) -> Tuple[int, int]: ...
    @staticmethod
    def round_count(count: int, parts: int, piece_elems: int) -> int: ...
    @staticmethod
    def piece_bounds(
        count: int, parts: int, index: int, round: int, piece_elems: int
    ) -> Tuple[int, int]: ...
    @staticmethod
    def reduce_local(dtype: int, op: int, out: int, a: int, b: int, n: int) -> None: ...
    @staticmethod
    def divide_local(dtype: int, data: int, n: int, divisor: int) -> None: ...
    @staticmethod
    def reduce_all_local(
        dtype: int, op: int, inputs: List[int], out: int, n: int, divisor: int = 0
    ) -> None: ...
    @staticmethod
    def sum_divide_local(dtype: int, out: int, a: int, b: int, n: int, divisor: int) -> bool: ...
    @staticmethod
    def shm_reserve(bytes: int, offset: int, len: int, populate: bool) -> Tuple[bool, int, int]: ...
    @staticmethod
    def page_locked_ranges() -> int: ...
    @staticmethod
    def fake_stream_write(stream: int, address: int, data: bytes) -> None: ...
    @staticmethod
    def fake_stream_sync(stream: int) -> None: ...
    @staticmethod
    def hmac_sha256(key: bytes, message: bytes) -> bytes: ...
    @staticmethod
    def sha256(data: bytes) -> bytes: ...
    @staticmethod
    def fuzz_parsers(frames: int, seed: int) -> Dict[str, Dict[str, Any]]: ...
    @staticmethod
    def retired_device_windows() -> int: ...
    @staticmethod
    def stalled_wait(
        awaited: int, busy: int, busy_seconds: float, timeout: float
    ) -> Tuple[float, str, int, str]: ...
    @staticmethod
    def cuda_reduce(
        dtype: int, op: int, out: int, a: int, b: int, n: int, stream: int = 0
    ) -> None: ...
    @staticmethod
    def cuda_reduce_all(
        dtype: int, op: int, inputs: List[int], outputs: List[int], n: int, divisor: int = 0
    ) -> None: ...
    @staticmethod
    def cuda_divide(dtype: int, data: int, n: int, divisor: int, stream: int = 0) -> None: ...
    @staticmethod
    def cuda_malloc(nbytes: int, device: int = 0) -> int: ...
    @staticmethod
    def cuda_free(ptr: int) -> None: ...
    @staticmethod
    def cuda_memcpy(dst: int, src: int, nbytes: int) -> None: ...
    @staticmethod
    def cuda_time_reduce(
        dtype: int, op: int, out: int, a: int, b: int, n: int, iters: int
    ) -> float: ...
    @staticmethod
    def cuda_time_copy(dst: int, src: int, nbytes: int, iters: int) -> float: ...
    @staticmethod
    def cuda_flag_probe(
        mode: str,
        page: int,
        page_bytes: int,
        rank: int,
        first: int,
        iters: int,
        timeout_s: float,
        device: int = 0,
    ) -> Dict[str, Any]: ...

testing: _Testing

class IssueGate:
    """Which thread is issuing a collective on one communicator; all_reduce's fast path."""

    tagged: int
    fast_calls: int
    divert: bool
    def __init__(self, comm: Communicator, queue: bool) -> None: ...
    def try_enter(self, kind: int) -> int: ...
    def enter_wait(self, kind: int) -> int: ...
    def leave(self) -> None: ...
    @property
    def owner(self) -> int: ...
    @property
    def owner_kind(self) -> int: ...
    def set_conflict(self, message: str) -> None: ...
    def all_reduce(self, x: Any, out: Any, op: Any) -> Any: ...

def bind_all_reduce(comm: Any, gate: IssueGate, method: Any, declined: Any) -> Any: ...
def bind_issue(gate: IssueGate) -> Any: ...
def bind_torch_allreduce(
    gate: IssueGate,
    general: Any,
    queued: Any,
    failed: Any,
    codes: dict,
    strided: Any,
    ops: tuple,
    avg: int,
) -> Any: ...
