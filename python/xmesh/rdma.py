"""xmesh.rdma: Monarch's RDMA buffers (`monarch.rdma`) on xmesh's data plane.

An `RDMABuffer` lends a range of its process's memory (a contiguous torch CPU tensor, numpy
array, bytearray or memoryview) and pickles into a small handle; whoever holds the handle reads
the bytes into its own memory (`read_into`) or writes its memory into them (`write_from`)
itself, on its process's data threads, without the owner's actor thread (docs/architecture/
06-data-plane.md). Procs of one host copy by cross-memory attach, one copy; procs of two hosts
move them by RDMA (libibverbs) where both have a working device, else stream them over TCP,
sealed under a key made for each transfer.

    buf = RDMABuffer(weights.view(-1))          # in the trainer
    generators.pull.call(buf).get()            # the handle travels in the call
    buf.read_into(local_weights).get()          # in a generator: the bytes come
"""
from __future__ import annotations

import operator
import sys
import threading
import warnings
from typing import Any, Dict, List, Tuple

from . import _core
from ._base.errors import SupervisionError
from ._api.future import Done, Future
from ._base.protocol import ErrorKind, error_kind, read_error
from ._runtime.process import Kind, get_runtime

__all__ = [
    "RDMAAction", "RDMABuffer", "RDMAError", "RDMAReadTransferWarning", "RDMATcpFallbackWarning",
    "RDMAWriteTransferWarning", "get_rdma_backend", "is_ibverbs_available", "is_rdma_available",
]


class RDMAError(RuntimeError):
    """A transfer was refused or failed: the buffer was dropped, a range or a write was refused
    by its owner, a copy failed. (An owner that died raises SupervisionError, a transfer past its
    timeout TimeoutError.)"""


class RDMAReadTransferWarning(Warning):
    """Monarch's; defined so that programs filtering it run unchanged (xmesh never warns it)."""


class RDMAWriteTransferWarning(Warning):
    """Monarch's; defined so that programs filtering it run unchanged (xmesh never warns it)."""


class RDMATcpFallbackWarning(Warning):
    """Said once per process when an RDMA device is listed here but none works (buffers move
    over xmesh's other transports); never where there is no device at all."""


def is_ibverbs_available() -> bool:
    """Whether ibverbs RDMA hardware works on this system (Monarch's meaning): a device that
    carried a loopback RDMA write when probed (registered memory, a queue pair connected to
    itself), not merely one that is listed. Probed once per process; XMESH_IBVERBS=0 skips it."""
    return bool(_core.probe_ibverbs()["usable"])


def _say_how_buffers_move() -> None:
    """Once per process, where it matters: RDMA devices listed of which none works, so that
    buffers between hosts move over sealed TCP streams."""
    global _said
    if _said:
        return
    _said = True
    probe = _core.probe_ibverbs()
    if not probe["usable"] and probe["listed"]:
        warnings.warn(f"RDMA devices are listed ({', '.join(probe['listed'])}) but none works: {probe['why']}; "
                      "RDMA buffers move over cross-memory attach and sealed TCP streams",
                      RDMATcpFallbackWarning, stacklevel=3)


_said = False


def is_rdma_available() -> bool:
    """Monarch's older name for is_ibverbs_available()."""
    return is_ibverbs_available()


def get_rdma_backend() -> str:
    """Which transport serves buffers between hosts from this process: 'ibverbs' where a device
    works here (is_ibverbs_available(); a peer without one is still reached by stream), else
    'tcp', Monarch's name for its other transports (here sealed TCP streams between hosts).
    Procs of one host copy by cross-memory attach either way."""
    return "ibverbs" if is_ibverbs_available() else "tcp"


# -- memory -------------------------------------------------------------------------------------
def _is_torch_tensor(obj: object) -> bool:
    torch = sys.modules.get("torch")
    return torch is not None and isinstance(obj, torch.Tensor)


def _memory(obj: Any, writable: bool, role: str) -> Tuple[int, int, Any, bool]:
    """(address, bytes, what keeps the memory alive and unmoved, whether it is CUDA device
    memory) of a contiguous torch tensor (CPU or CUDA), an object with __cuda_array_interface__
    (CuPy, Numba) or a buffer-protocol object; ValueError/TypeError naming what is wrong with it,
    RuntimeError when device memory is given and no CUDA driver loads (saying why)."""
    if _is_torch_tensor(obj):
        if obj.device.type not in ("cpu", "cuda"):
            raise NotImplementedError(f"{role} is a {obj.device.type} tensor: xmesh moves CPU and CUDA memory")
        if not obj.is_contiguous():
            raise ValueError(f"{role} is not contiguous: use .contiguous() (a copy), or a contiguous view")
        addr, size = obj.data_ptr(), obj.numel() * obj.element_size()
        on_device = obj.device.type == "cuda"
        if on_device and size:
            _core.check_device_memory(addr, size)
        return addr, size, obj, on_device
    if hasattr(obj, "__cuda_array_interface__"):
        addr, size = _cuda_array(obj.__cuda_array_interface__, writable, role)
        if size:
            _core.check_device_memory(addr, size)
        return addr, size, obj, True
    try:
        view = memoryview(obj)  # holds the export: a bytearray cannot be resized under a transfer
    except TypeError:
        raise TypeError(f"{role} must be a torch tensor or a buffer (numpy array, bytearray, memoryview), "
                        f"not {type(obj).__name__}") from None
    try:
        addr, size, _readonly = _core.buffer_info(view, writable)
    except ValueError as e:
        raise ValueError(f"{role}: {e}") from None
    return addr, size, view, False


def _cuda_array(cai: Any, writable: bool, role: str) -> Tuple[int, int]:
    """(address, bytes) of a C-contiguous __cuda_array_interface__ (version 2 or later)."""
    try:
        shape = tuple(int(n) for n in cai["shape"])
        itemsize = int(cai["typestr"][2:])
        addr, readonly = int(cai["data"][0]), bool(cai["data"][1])
        strides = cai.get("strides")
    except (KeyError, TypeError, ValueError, IndexError) as e:
        raise TypeError(f"{role} has a malformed __cuda_array_interface__: {type(e).__name__}: {e}") from None
    expected: List[int] = []
    step = itemsize
    for n in reversed(shape):
        expected.insert(0, step)
        step *= n
    if strides is not None and tuple(strides) != tuple(expected) and step:
        raise ValueError(f"{role} is not C-contiguous: use a contiguous copy")
    if writable and readonly:
        raise ValueError(f"{role} is read-only device memory: it cannot be read into")
    return addr, step


# -- this process's side: lending, and the data threads ------------------------------------------
class _Plane:
    """This process's data plane: its data threads, and the memory it lends (kept alive here
    until dropped and no lease holds it)."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.node: Any = None
        self.threads: Any = None
        self.lent: Dict[int, Any] = {}      # id -> what keeps its memory alive
        self.dropped: Dict[int, Any] = {}   # dropped, waiting for the leases that held them

    def _bind(self) -> None:
        """This runtime's node (a new one, after a restart, starts afresh); self.lock held."""
        node = get_runtime().node
        if self.node is not node:
            self.node, self.threads = node, None
            self.lent.clear()
            self.dropped.clear()

    def transfers(self) -> Any:
        """The data threads, started at the first transfer (a process that only lends has none)."""
        with self.lock:
            self._bind()
            if self.threads is None:
                self.threads = _core.DataPlane(self.node)
            return self.threads

    def lend(self, addr: int, size: int, writable: bool, keep: Any, on_device: bool = False) -> Tuple[str, int]:
        with self.lock:
            self._bind()
            buffer_id = self.node.lend_buffer(addr, size, writable, on_device)
            self.lent[buffer_id] = keep
            self._sweep()
            return self.node.addr, buffer_id

    def drop(self, buffer_id: int) -> None:
        with self.lock:
            self._bind()
            keep = self.lent.pop(buffer_id, None)
            if keep is not None:
                self.node.drop_buffer(buffer_id)
                if self.node.buffer_held(buffer_id):  # a lease or a stream still copies it
                    self.dropped[buffer_id] = keep
            self._sweep()

    def _sweep(self) -> None:
        for buffer_id in [b for b in self.dropped if not self.node.buffer_held(b)]:
            del self.dropped[buffer_id]


_plane = _Plane()


# -- buffers --------------------------------------------------------------------------------------
class RDMABuffer:
    """A range of memory lent to whoever holds its handle (Monarch's RDMABuffer). `data`: a
    contiguous torch tensor, CPU or CUDA (any shape; Monarch asks for 1-D), an object with
    __cuda_array_interface__, a numpy array, bytearray, bytes or memoryview; read-only memory
    (bytes) may be read, not written into. CUDA memory is staged through pinned host memory by
    the CUDA driver, loaded at run time. The memory stays lent until `drop()`: keep it unchanged
    while others read it."""

    def __init__(self, data: Any) -> None:
        addr, size, keep, on_device = _memory(data, False, "RDMABuffer's data")
        if size == 0:
            raise ValueError("Cannot create RDMABuffer with size 0.")
        _say_how_buffers_move()
        writable = not (isinstance(keep, memoryview) and keep.readonly)
        if on_device and not _is_torch_tensor(keep):
            writable = not bool(keep.__cuda_array_interface__["data"][1])
        self._owner, self._id = _plane.lend(addr, size, writable, keep, on_device)
        self._size = size
        self._writable = writable

    @classmethod
    def _handle(cls, owner: str, buffer_id: int, size: int, writable: bool) -> "RDMABuffer":
        b = cls.__new__(cls)
        b._owner, b._id, b._size, b._writable = owner, buffer_id, size, writable
        return b

    def __reduce__(self) -> Any:
        return (RDMABuffer._handle, (self._owner, self._id, self._size, self._writable))

    @property
    def backend(self) -> str:
        """The transport family serving this buffer (get_rdma_backend())."""
        return get_rdma_backend()

    def size(self) -> int:
        """Its size in bytes."""
        return self._size

    @property
    def owner(self) -> str:
        """The address of the process that lent the memory."""
        return self._owner

    def read_into(self, dst: Any, *, timeout: "float | None" = 60) -> Future:
        """Reads the whole buffer into dst (at least size() bytes, writable, contiguous): a
        Future that resolves to None once the bytes are there."""
        return RDMAAction().read_remote(dst, self).submit(timeout=timeout)

    def write_from(self, src: Any, *, timeout: "float | None" = 60) -> Future:
        """Writes src (at most size() bytes) into the start of the buffer: a Future of None."""
        return RDMAAction().write_remote(self, src).submit(timeout=timeout)

    def drop(self) -> Any:
        """Lends the memory no more: transfers that start after it fail naming the drop; one
        under way finishes first. Returns a Future of None (resolved at once in the owner)."""
        rt = get_runtime()
        if self._owner == rt.node.addr:
            _plane.drop(self._id)
            return Done(None)
        call = rt.node.call([(self._owner, "")], int(Kind.BufferDrop), "",
                            _core.BufferReleaseBody(buffer=self._id, lease=0).to_dict())
        return Future(call, _drop_outcome, description=f"RDMABuffer.drop() of a buffer of {self._owner}")

    def __repr__(self) -> str:
        return f"<xmesh.rdma.RDMABuffer {_core.format_bytes(self._size)} of {self._owner}>"


def _drop_outcome(results: dict, fut: Future) -> None:
    ok, body, _frames = results[0]
    if not ok:
        raise _transfer_error(body, fut.description)


# -- transfers --------------------------------------------------------------------------------------
def _transfer_error(body: Any, what: str) -> BaseException:
    kind = error_kind(body)
    text = read_error(body).text or "failed"
    if kind == ErrorKind.Timeout:
        return TimeoutError(f"{what}: {text}")
    if kind == ErrorKind.Supervision:
        return SupervisionError(f"{what}: {text}")
    return RDMAError(f"{what}: {text}")


def _check_timeout(timeout: Any) -> "float | None":
    if timeout is None:
        return None
    if isinstance(timeout, bool) or not isinstance(timeout, (int, float)):
        operator.index(timeout)  # Monarch's TypeError for what is not a number
    if not timeout >= 0:
        raise ValueError(f"timeout must be >= 0 seconds, got {timeout!r}")
    return float(timeout)


class RDMAAction:
    """Several reads and writes submitted as one (Monarch's RDMAAction): they run in parallel on
    the data threads and the Future resolves once all are done, or fails with the first error."""

    def __init__(self) -> None:
        self._ops: List[Tuple[str, int, int, int, int, bool, bool]] = []
        self._keep: List[Any] = []
        self._local: List[Tuple[int, int, bool, str]] = []  # (addr, size, written here, what)

    def read_remote(self, dst: Any, src: RDMABuffer) -> "RDMAAction":
        """Queues a read of the whole buffer src into dst (at least src.size() bytes)."""
        addr, size, keep, on_device = _memory(dst, True, "read_into's destination")
        if size < src.size():
            raise ValueError(f"the destination holds {size} bytes, fewer than the buffer's {src.size()}")
        self._add(src, addr, src.size(), False, keep, "a read's destination", on_device)
        return self

    def write_remote(self, dst: RDMABuffer, src: Any) -> "RDMAAction":
        """Queues a write of src (at most dst.size() bytes) into the start of dst."""
        addr, size, keep, on_device = _memory(src, False, "write_from's source")
        if size > dst.size():
            raise ValueError(f"the source holds {size} bytes, more than the buffer's {dst.size()}")
        if size == 0:
            raise ValueError("the source is empty: nothing to write")
        if not dst._writable:
            raise RDMAError("the buffer lends read-only memory: it cannot be written into")
        self._add(dst, addr, size, True, keep, "a write's source", on_device)
        return self

    def fetch_add(self, src: RDMABuffer, dst: Any, add: int) -> "RDMAAction":
        raise NotImplementedError("RDMAAction.fetch_add: not supported (nor by Monarch 0.7)")

    def compare_and_swap(self, src: RDMABuffer, dst: Any, compare: int, swap: int) -> "RDMAAction":
        raise NotImplementedError("RDMAAction.compare_and_swap: not supported (nor by Monarch 0.7)")

    def _add(self, buf: RDMABuffer, addr: int, size: int, write: bool, keep: Any, what: str,
             on_device: bool) -> None:
        # Local memory that a read fills must not overlap other local memory of the same batch:
        # the ops run in parallel, so the bytes there would depend on timing.
        written_here = not write
        for other_addr, other_size, other_written, other_what in self._local:
            if (written_here or other_written) and addr < other_addr + other_size and other_addr < addr + size:
                raise ValueError(f"{what} overlaps {other_what} of the same RDMAAction: its bytes would "
                                 "depend on which runs first")
        self._local.append((addr, size, written_here, what))
        self._ops.append((buf._owner, buf._id, 0, size, addr, write, on_device))
        self._keep.append(keep)

    def submit(self, *, timeout: "float | None" = 60) -> Any:
        """Starts the queued operations: a Future of None (TimeoutError once timeout seconds
        pass; None: no limit). Safe to call more than once (each runs them again)."""
        limit = _check_timeout(timeout)
        if not self._ops:
            return Done(None)
        n = len(self._ops)
        total = sum(op[3] for op in self._ops)
        what = (f"RDMA {'write' if self._ops[0][5] else 'read'} of {_core.format_bytes(total)}" if n == 1
                else f"RDMAAction of {n} transfers ({_core.format_bytes(total)})")
        call = _plane.transfers().submit(list(self._ops), limit, list(self._keep))
        return Future(call, _transfer_outcome, description=what)


def _transfer_outcome(results: dict, fut: Future) -> None:
    _core.drain_releases()  # what kept the memory alive may go now
    ok, body, _frames = results[0]
    if not ok:
        raise _transfer_error(body, fut.description)
