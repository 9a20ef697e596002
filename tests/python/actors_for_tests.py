"""Actor classes used by the tests (an importable module without side effects, so procs can
unpickle them by reference)."""
import asyncio
import importlib
import os
import sys
import time

from xmesh import Actor, context, current_rank, current_size, endpoint


def my_rank() -> int:
    """Which actor this is: its rank in its mesh (current_rank() is the message's point, which
    differs when a slice was called)."""
    return context().actor_instance.rank.rank


class Counter(Actor):
    def __init__(self, start=0):
        self.value = start
        self.rank = current_rank().rank

    @endpoint
    def incr(self, by=1):
        self.value += by
        return self.value

    @endpoint
    def get(self):
        return self.value

    @endpoint
    async def aget(self):
        await asyncio.sleep(0)
        return self.value

    @endpoint
    async def arank(self):
        await asyncio.sleep(0.01)
        return current_rank().rank, current_size()

    @endpoint
    def whoami(self):
        me = context().actor_instance.rank  # the actor's own point; current_rank() is the message's
        p = current_rank()
        return {"rank": me.rank, "coords": dict(me), "size": dict(me.extent), "message_rank": p.rank,
                "message_coords": dict(p), "message_size": current_size(), "pid": os.getpid(),
                "cuda": os.environ.get("CUDA_VISIBLE_DEVICES"), "hostd_dir": os.environ.get("XMESH_RUNTIME_DIR")}

    @endpoint
    def process_facts(self):
        """What the process looks like from inside: signal masks, modules, its socket."""
        import sys

        status = dict(line.split(":", 1) for line in open("/proc/self/status").read().splitlines() if ":" in line)
        return {"sigblk": int(status["SigBlk"].strip(), 16), "sigign": int(status["SigIgn"].strip(), 16),
                "zmq_imported": "zmq" in sys.modules, "addr": os.environ.get("XMESH_PROC_ADDR"),
                "pgid": os.getpgid(0), "pid": os.getpid()}

    @endpoint
    def shout(self, n):
        for i in range(n):
            print(f"line {i} from rank {self.rank}")
        return n

    @endpoint
    def sleep(self, seconds):
        time.sleep(seconds)
        return self.rank

    @endpoint
    def spin(self, seconds):
        """Busy in Python (not in one C call), so a cancellation lands at once."""
        end = time.monotonic() + seconds
        while time.monotonic() < end:
            time.sleep(0.01)
        return self.rank

    @endpoint
    async def asleep(self, seconds):
        await asyncio.sleep(seconds)
        return self.rank

    @endpoint
    def fail(self, text):
        raise ValueError(f"{text} on rank {self.rank}")

    @endpoint
    def die(self, code):
        os._exit(code)

    @endpoint
    def echo(self, x):
        return x

    @endpoint
    def unpicklable_result(self):
        return (x for x in [])  # a generator cannot be pickled

    @endpoint
    def raise_picky(self):
        raise Picky(1, 2)

    def not_an_endpoint(self):
        return 1


class Picky(Exception):
    """Pickles, but cannot be rebuilt (its __init__ wants two arguments)."""

    def __init__(self, a, b):
        super().__init__(f"{a}-{b}")


class BadInit(Actor):
    def __init__(self):
        raise RuntimeError("init exploded")

    @endpoint
    def ping(self):
        return "pong"


class Ponger(Actor):
    @endpoint
    def ping(self, n):
        return f"pong {n} from {context().actor_instance.rank.rank}"


class Spawner(Actor):
    """Spawns a child actor on its own proc (this_proc) and calls it."""

    @endpoint
    def spawn_child_and_call(self, start):
        from xmesh import this_proc

        child = this_proc().spawn("child", Counter, start)
        return child.incr.call_one(1).get(), child.whoami.call_one().get()["pid"], os.getpid()


class Pinger(Actor):
    """Holds a handle to another mesh and calls it from here (actor to actor)."""

    def __init__(self, pongers):
        self.pongers = pongers

    @endpoint
    def ping_all(self, n):
        return [v for _, v in self.pongers.ping.call(n).get().items()]

    @endpoint
    async def ping_one_async(self, n):
        r = my_rank()
        return await self.pongers.slice(gpus=r).ping.call_one(n)


class Printer(Actor):
    """Writes to fds 1 and 2 every way a proc can (the log tests)."""

    @endpoint
    def every_way(self, tag):
        import ctypes
        import subprocess
        import sys

        r = my_rank()
        print(f"{tag} print {r}")
        os.write(1, f"{tag} os.write {r}\n".encode())
        libc = ctypes.CDLL(None)
        libc.printf(f"{tag} printf {r}\n".encode())  # C stdio: flushed at the marker
        subprocess.run(["echo", f"{tag} child {r}"], check=True)
        print(f"{tag} stderr {r}", file=sys.stderr)
        return r

    @endpoint
    def lines(self, n, text="line"):
        r = my_rank()
        for i in range(n):
            print(f"{text} r={r} i={i}")
        return n

    @endpoint
    def slow_line(self, parts, pause):
        """One line printed in pieces, pausing between them longer than the host agent waits
        before it sends a partial line on."""
        import time

        for part in parts:
            print(part, end="")
            time.sleep(pause)
        print()

    @endpoint
    def bar(self, steps, pause):
        """A hand-written progress bar, slower on higher ranks, then a line."""
        import time

        r = my_rank()
        for i in range(1, steps + 1):
            print(f"\rstep {i}/{steps}", end="", flush=True)
            time.sleep(pause * (1 + r))
        print()
        print(f"trained {r}")

    @endpoint
    def raw(self, data):
        os.write(1, data)
        return len(data)

    @endpoint
    def log(self):
        import logging

        logging.getLogger("trainer").info("info from %d", my_rank())
        logging.getLogger("trainer").warning("warning from %d", my_rank())

    @endpoint
    def crash(self, text):
        print(text, flush=True)
        os._exit(9)


def busy_result(until_total):
    total = i = 0
    while total < until_total:
        i += 1
        total += i % 7
    return total, i


def _deep(i, depth):
    return i if depth == 0 else _deep(i, depth - 1)


class Stopper(Actor):
    """Stops in pdb on the ranks it is told to (the debugger tests)."""

    @endpoint
    def step(self, x, stop_ranks=(0,), sleep=1.0):
        y = x * 2 + my_rank()
        z = y + 1
        if my_rank() in stop_ranks:
            breakpoint()
        else:
            time.sleep(sleep)
        return y + z - z

    @endpoint
    async def astep(self, x):
        y = x + 100
        breakpoint()
        return y

    @endpoint
    def busy(self, until_total):
        """Spins in a Python loop (busy_result computes the same locally)."""
        return busy_result(until_total)

    @endpoint
    async def count_async(self, rounds, nap):
        """Awaits asyncio.sleep `rounds` times, counting (an attach stops it between naps)."""
        done = 0
        for _ in range(rounds):
            await asyncio.sleep(nap)
            done += 1
        return done

    @endpoint
    async def churn(self, seconds):
        """Pushes and pops frames as fast as it can, on the loop's thread and on its own."""
        async def leaf(i):
            return _deep(i, 30)

        turns = 0
        end = time.monotonic() + seconds
        while time.monotonic() < end:
            turns += 1 + await leaf(0)
            await asyncio.sleep(0)
        return turns > 0

    @endpoint
    def spin_until(self, path):
        """Spins in Python until the file `path` exists; how many times it looked."""
        looks = 0
        while not os.path.exists(path):
            looks += 1
        return looks

    @endpoint
    def walk(self):
        a = 1
        breakpoint()
        b = a + 1
        c = b * 10
        d = c + 1
        return d

    @endpoint
    def hold_gil(self, seconds):
        import ctypes

        ctypes.PyDLL(None).sleep(int(seconds))  # libc sleep() called with the GIL held
        return my_rank()

    @endpoint
    async def await_nap(self, seconds):
        await self._nap(seconds)
        return my_rank()

    async def _nap(self, seconds):
        await asyncio.sleep(seconds)

    @endpoint
    def fail(self, x):
        local_value = x * 3
        raise ValueError(f"bad input {local_value}")

    @endpoint
    def pid(self):
        return os.getpid()

    @endpoint
    def chatter(self, n, gap):
        for i in range(n):
            print("chatter", i, flush=True)
            time.sleep(gap)


class WorkspaceUser(Actor):
    """Imports code from the synced workspace ($XMESH_WORKSPACE first on sys.path) and keeps an
    instance of one of its classes alive across syncs."""

    def __init__(self, module):
        self.module = module
        self.obj = None

    @endpoint
    def where(self):
        return os.environ.get("XMESH_WORKSPACE"), sys.path[0]

    @endpoint
    def value(self):
        return importlib.import_module(self.module).value()

    @endpoint
    def keep_instance(self):
        self.obj = importlib.import_module(self.module).Thing()
        return self.obj.describe()

    @endpoint
    def describe_kept(self):
        return self.obj.describe()

    @endpoint
    def kept_is_current_class(self):
        return type(self.obj) is importlib.import_module(self.module).Thing


class Escaper(Actor):
    """Starts a child that leaves the proc's process group (its own session), as daemons and
    some launchers do, and says its pid."""

    @endpoint
    def start_escaping_child(self) -> int:
        import subprocess

        child = subprocess.Popen(["sleep", "300"], start_new_session=True, stdin=subprocess.DEVNULL,
                                 stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        return child.pid


def pattern(n: int, seed: int):
    """n bytes that differ with seed and along the buffer (a 1 MiB random block, repeated)."""
    import numpy as np

    block = np.random.default_rng(seed).integers(0, 256, size=min(n, 1 << 20), dtype=np.uint8)
    return np.resize(block, n)


def make_memory(kind: str, n: int, seed: int):
    """n bytes of pattern(n, seed) as a numpy array, a torch tensor or a bytearray."""
    data = pattern(n, seed)
    if kind == "torch":
        import torch

        return torch.from_numpy(data)
    if kind == "bytearray":
        return bytearray(data.tobytes())
    return data


def crc(memory) -> int:
    import zlib

    if hasattr(memory, "numpy"):
        memory = memory.numpy()
    return zlib.crc32(memoryview(memory).cast("B"))


def kill_owner_mid_read(buf, owner_pid: int) -> str:
    """Starts reading buf, kills its owner once the copy is under way (run with
    XMESH_DATA_STEP_PAUSE_MS so that it lasts), and says how the read ended."""
    import signal

    import numpy as np

    fut = buf.read_into(np.empty(buf.size(), dtype=np.uint8))
    time.sleep(0.5)
    assert not fut.done(), "the transfer ended before the owner was killed"
    os.kill(owner_pid, signal.SIGKILL)
    try:
        fut.get(timeout=30)
        return "NO ERROR"
    except Exception as e:
        return f"{type(e).__name__} {e}"


class BufferPeer(Actor):
    """One side of RDMA buffer transfers (tests/python/test_rdma.py): lends its memory, or reads
    and writes the buffers of others, answering with checksums."""

    def __init__(self):
        self.memory = {}
        self.buffers = {}

    @endpoint
    def lend(self, name: str, kind: str, n: int, seed: int):
        from xmesh.rdma import RDMABuffer

        self.memory[name] = make_memory(kind, n, seed)
        self.buffers[name] = RDMABuffer(self.memory[name])
        return self.buffers[name]

    @endpoint
    def checksum(self, name: str) -> int:
        return crc(self.memory[name])

    @endpoint
    def pid(self) -> int:
        return os.getpid()

    @endpoint
    def transports(self) -> tuple:
        """(transfers streamed, transfers by cross-memory attach) this proc made."""
        from xmesh.rdma import _plane

        s = _plane.transfers().stats()
        return s.streamed, s.same_host

    @endpoint
    def drop(self, name: str) -> None:
        self.buffers[name].drop().get()

    @endpoint
    def read(self, buf, kind: str, timeout: float = 60) -> int:
        dst = make_memory(kind, buf.size(), 0)
        buf.read_into(dst, timeout=timeout).get()
        return crc(dst)

    @endpoint
    def write(self, buf, kind: str, n: int, seed: int) -> int:
        src = make_memory(kind, n, seed)
        buf.write_from(src).get()
        return crc(src)

    @endpoint
    def read_all(self, bufs) -> list:
        from xmesh.rdma import RDMAAction

        import numpy as np

        dsts = [np.empty(b.size(), dtype=np.uint8) for b in bufs]
        action = RDMAAction()
        for d, b in zip(dsts, bufs):
            action.read_remote(d, b)
        action.submit().get()
        return [crc(d) for d in dsts]


# -- device memory: the CUDA driver's stand-in (tests/fake_cuda; no GPU here) ---------------------
def fake_cuda():
    """The stand-in driver xmesh loads too (XMESH_CUDA_DRIVER: the same file, so the same
    library in this process), initialized."""
    import ctypes

    lib = ctypes.CDLL(os.environ["XMESH_CUDA_DRIVER"])
    assert lib.cuInit(0) == 0
    return lib


class FakeDeviceArray:
    """n bytes of the stand-in's device memory (pattern(n, seed)), shown as CuPy and Numba show
    theirs: __cuda_array_interface__. Touching it other than through the driver faults."""

    def __init__(self, n: int, seed: int = 0, readonly: bool = False):
        import ctypes

        self._lib, self.n, self.readonly = fake_cuda(), n, readonly
        ptr = ctypes.c_ulonglong()
        assert self._lib.cuMemAlloc_v2(ctypes.byref(ptr), ctypes.c_size_t(n)) == 0
        self.ptr = ptr.value
        data = pattern(n, seed).tobytes()
        assert self._lib.fake_cuda_copy_in(ctypes.c_ulonglong(self.ptr), data, ctypes.c_size_t(n)) == 0

    @property
    def __cuda_array_interface__(self) -> dict:
        return {"shape": (self.n,), "typestr": "|u1", "data": (self.ptr, self.readonly), "version": 3,
                "strides": None}

    def contents(self) -> bytes:
        import ctypes

        out = ctypes.create_string_buffer(self.n)
        assert self._lib.fake_cuda_copy_out(out, ctypes.c_ulonglong(self.ptr), ctypes.c_size_t(self.n)) == 0
        return out.raw

    def __del__(self):
        import ctypes

        self._lib.cuMemFree_v2(ctypes.c_ulonglong(self.ptr))


class DevicePeer(Actor):
    """A proc's side of transfers with device memory (tests/python/test_rdma_device.py)."""

    def __init__(self):
        self.memory = {}
        self.buffers = {}

    @endpoint
    def lend(self, name: str, n: int, seed: int):
        from xmesh.rdma import RDMABuffer

        self.memory[name] = FakeDeviceArray(n, seed)
        self.buffers[name] = RDMABuffer(self.memory[name])
        return self.buffers[name]

    @endpoint
    def read(self, buf) -> int:
        dst = FakeDeviceArray(buf.size())
        buf.read_into(dst).get(timeout=60)
        return crc(dst.contents())

    @endpoint
    def write(self, buf, n: int, seed: int) -> int:
        src = FakeDeviceArray(n, seed)
        buf.write_from(src).get(timeout=60)
        return crc(src.contents())

    @endpoint
    def contents(self, name: str) -> int:
        return crc(self.memory[name].contents())


class Churner(Actor):
    """Python between short C calls, each line calling into the standard library (isinstance on
    an ABC runs ABCMeta.__instancecheck__) and into xmesh."""

    @endpoint
    def churn(self, seconds: float) -> int:
        import collections.abc

        end = time.monotonic() + seconds
        while time.monotonic() < end and isinstance({}, collections.abc.Mapping) and current_rank().rank >= 0:
            time.sleep(0.01)
        return current_rank().rank
