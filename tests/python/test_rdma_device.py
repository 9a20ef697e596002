"""RDMA buffers of device memory (issue 24): CUDA memory is staged through pinned host memory by
the CUDA driver, which xmesh loads at run time. This machine has no GPU: the tests load the
driver's stand-in (tests/fake_cuda, XMESH_FAKE_CUDA_DRIVER, set by ctest) exactly as the real one
is loaded, through XMESH_CUDA_DRIVER; its device memory faults when touched other than through
the driver, so a path that skipped staging fails here. The CUDA tensor test runs only where a
GPU is, and says so when skipped."""
import os

import numpy as np
import pytest
from actors_for_tests import DevicePeer, FakeDeviceArray, crc, pattern
from xmesh_testing import run_program

from xmesh import this_host
from xmesh.rdma import RDMABuffer, RDMAError

MiB = 1 << 20
FAKE = os.environ.get("XMESH_FAKE_CUDA_DRIVER")
needs_stand_in = pytest.mark.skipif(not FAKE, reason="XMESH_FAKE_CUDA_DRIVER is not set (the build's "
                                    "tests/libxmesh_fake_cuda.so; ctest sets it)")


@pytest.fixture(scope="module")
def device_peers():
    os.environ["XMESH_CUDA_DRIVER"] = FAKE  # this process loads it at its first device buffer
    pm = this_host().spawn_procs({"gpus": 2}, env={"XMESH_CUDA_DRIVER": FAKE})
    yield pm.spawn("dev", DevicePeer)
    pm.stop()


@needs_stand_in
def test_procs_read_and_write_the_controllers_device_memory(device_peers):
    n = 3 * MiB + 7
    mine = FakeDeviceArray(n, 21)
    buf = RDMABuffer(mine)
    assert list(device_peers.read.call(buf).get(timeout=60).values()) == [crc(mine.contents())] * 2
    host = np.zeros(n, dtype=np.uint8)
    buf.read_into(host).get(timeout=60)
    assert host.tobytes() == mine.contents() == pattern(n, 21).tobytes()
    written = device_peers.slice(gpus=1).write.call_one(buf, n, 22).get(timeout=60)
    assert crc(mine.contents()) == written  # on the device when the writer's Future resolved
    buf.write_from(np.full(100, 7, dtype=np.uint8)).get(timeout=60)  # small: the lease's messages
    assert mine.contents()[:100] == bytes([7]) * 100 and mine.contents()[100:] == pattern(n, 22).tobytes()[100:]
    buf.drop().get()


@needs_stand_in
def test_a_procs_device_memory_is_read_and_written_by_the_controller_and_other_procs(device_peers):
    n = 5 * MiB
    theirs = device_peers.slice(gpus=0).lend.call_one("w", n, 23).get()
    dst = FakeDeviceArray(n)
    theirs.read_into(dst).get(timeout=60)
    assert dst.contents() == pattern(n, 23).tobytes()
    assert device_peers.slice(gpus=1).read.call_one(theirs).get(timeout=60) == crc(dst.contents())
    theirs.write_from(FakeDeviceArray(MiB, 24)).get(timeout=60)
    expected = pattern(MiB, 24).tobytes() + pattern(n, 23).tobytes()[MiB:]
    assert device_peers.slice(gpus=0).contents.call_one("w").get() == crc(expected)
    theirs.drop().get()


class _Interface:
    def __init__(self, **cai):
        self.__cuda_array_interface__ = {"version": 3, "typestr": "|u1", "strides": None, **cai}


@needs_stand_in
def test_device_memory_that_cannot_be_used_is_refused_naming_why(device_peers):
    host = np.zeros(100, dtype=np.uint8)
    with pytest.raises(ValueError, match="not 100 bytes of device memory known to CUDA"):
        RDMABuffer(_Interface(shape=(100,), data=(host.ctypes.data, False)))
    dev = FakeDeviceArray(4096)
    with pytest.raises(ValueError, match="not 8192 bytes of device memory"):  # past the allocation
        RDMABuffer(_Interface(shape=(8192,), data=(dev.ptr, False)))
    with pytest.raises(ValueError, match="not C-contiguous"):
        RDMABuffer(_Interface(shape=(64, 32), strides=(1, 64), data=(dev.ptr, False)))
    with pytest.raises(TypeError, match="malformed __cuda_array_interface__"):
        RDMABuffer(_Interface(shape="many", data=(dev.ptr, False)))
    ro = FakeDeviceArray(4096, 3, readonly=True)
    buf = RDMABuffer(ro)
    with pytest.raises(ValueError, match="read-only device memory"):
        buf.read_into(ro)
    with pytest.raises(RDMAError, match="read-only"):
        buf.write_from(np.zeros(10, dtype=np.uint8))
    buf.drop()


def test_without_a_cuda_driver_device_memory_is_refused_saying_why():
    program = """
from xmesh.rdma import RDMABuffer
class Device:
    __cuda_array_interface__ = {"shape": (10,), "typestr": "|u1", "data": (1 << 40, False), "version": 3}
try:
    RDMABuffer(Device())
except RuntimeError as e:
    print("REFUSED", e)
"""
    r = run_program(program, env={"XMESH_CUDA_DRIVER": "/nonexistent/libcuda.so.1"})
    assert r.returncode == 0, r.stderr
    assert "REFUSED the CUDA driver could not be loaded" in r.stdout and "no NVIDIA driver" in r.stdout


GPU_PROGRAM = """
import torch, xmesh
from xmesh.rdma import RDMABuffer

class Puller(xmesh.Actor):
    @xmesh.endpoint
    def pull(self, buf, n):
        dst = torch.zeros(n, dtype=torch.uint8, device="cuda")
        buf.read_into(dst).get(timeout=60)
        return int(dst.sum().item())

    @xmesh.endpoint
    def push(self, buf, n):
        buf.write_from(torch.full((n,), 3, dtype=torch.uint8, device="cuda")).get(timeout=60)

weights = torch.arange(1 << 20, dtype=torch.int64, device="cuda").to(torch.uint8)
buf = RDMABuffer(weights)
procs = xmesh.this_host().spawn_procs({"gpus": 1})
p = procs.spawn("p", Puller)
assert p.pull.call_one(buf, weights.numel()).get() == int(weights.sum().item())
p.push.call_one(buf, 1000).get()
assert int(weights[:1000].sum().item()) == 3000
procs.stop()
print("GPU OK")
"""


def test_cuda_tensors_move_where_a_gpu_is():
    torch = pytest.importorskip("torch", reason="torch is not installed: CUDA tensors were not tested")
    if not torch.cuda.is_available():
        pytest.skip("no GPU on this machine (torch.cuda.is_available() is False): CUDA tensors were not tested; "
                    "the staging path ran over the driver's stand-in above")
    env = {k: v for k, v in os.environ.items() if k != "XMESH_CUDA_DRIVER"}
    r = run_program(GPU_PROGRAM, env=env, timeout=110)
    assert "GPU OK" in r.stdout, r.stderr
