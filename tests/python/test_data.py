"""Large arguments: numpy and torch (64 MiB) travel without pickling their data in-band, and
arrive as ordinary writable arrays; oversized messages fail clearly at the sender."""
import hashlib

import numpy as np
import pytest
from actors_for_tests import Counter

from xmesh import this_host
from xmesh._base import pickling as _pickling

MiB = 1 << 20


@pytest.fixture(scope="module")
def actor():
    pm = this_host().spawn_procs({"gpus": 2})
    yield pm.spawn("data", Counter)
    pm.stop()


def test_pickling_uses_out_of_band_buffers():
    a = np.arange(16 * MiB // 8, dtype=np.float64)
    frames = _pickling.dumps(a)
    assert len(frames) == 2 and len(frames[0]) < 1024 and memoryview(frames[1]).nbytes == a.nbytes
    back = _pickling.loads(frames)
    assert np.array_equal(back, a)


def test_numpy_64mib_round_trip(actor):
    a = np.random.default_rng(0).integers(0, 255, size=64 * MiB, dtype=np.uint8)
    back = actor.slice(gpus=1).echo.call_one(a).get(timeout=60)
    assert back.dtype == np.uint8 and back.shape == a.shape
    assert hashlib.sha256(back).digest() == hashlib.sha256(a).digest()
    back[0] = 1  # writable
    vm = actor.echo.call(a[: 8 * MiB]).get(timeout=60)
    assert all(np.array_equal(v, a[: 8 * MiB]) for v in vm.values())


def test_torch_64mib_round_trip(actor):
    torch = pytest.importorskip("torch")
    t = torch.arange(16 * MiB, dtype=torch.float32)  # 64 MiB
    frames = _pickling.dumps(t)
    assert len(frames) == 2  # out of band through the numpy view
    back = actor.slice(gpus=0).echo.call_one(t).get(timeout=60)
    assert isinstance(back, torch.Tensor) and back.dtype == torch.float32
    assert torch.equal(back, t)


def test_oversized_message_fails_at_the_sender():
    from xmesh_testing import run_program

    r = run_program(
        "import numpy as np\nfrom xmesh import this_host\nfrom actors_for_tests import Counter\n"
        "pm = this_host().spawn_procs({'gpus': 1})\nc = pm.spawn('c', Counter)\n"
        "try:\n    c.echo.call_one(np.zeros(2_000_000, dtype=np.uint8))\n"
        "except Exception as e:\n    print(type(e).__name__, e)\n",
        env={"XMESH_MAX_MESSAGE_BYTES": "1000000",
             "PYTHONPATH": __import__("os").path.dirname(__file__) + ":" + __import__("os").environ["PYTHONPATH"]})
    assert r.returncode == 0, r.stderr
    assert "SendError" in r.stdout and "exceeds the maximum message size of 1000000 bytes" in r.stdout
