"""The two programs from the issue, unchanged, with monarch and with xmesh imports."""
import os

import pytest
from xmesh_testing import EXAMPLES, run_program


def run_seed(name, package, tmp_path):
    src = open(os.path.join(EXAMPLES, name)).read()
    if package == "xmesh":
        src = src.replace("from monarch.actor import", "from xmesh import")
    p = tmp_path / "prog.py"
    p.write_text(src)
    r = run_program(path=str(p))
    assert r.returncode == 0, r.stderr
    return r.stdout


@pytest.mark.parametrize("package", ["monarch.actor", "xmesh"])
def test_hello_bye(package, tmp_path):
    out = run_seed("seed_hello_bye.py", package, tmp_path)
    assert out.count("'hello world'") == 4
    assert "ValueMesh({'gpus': 4})" in out
    assert "(gpus=3): 'hello world'" in out
    assert out.rstrip().endswith("got an exception saying bye")


@pytest.mark.parametrize("package", ["monarch.actor", "xmesh"])
def test_asyncio_toy(package, tmp_path):
    out = run_seed("seed_asyncio.py", package, tmp_path)
    for rank in range(4):
        assert f"[{rank}] Identity: {rank}, msg='hey there, from script!!'" in out


def test_unsupported_monarch_name_is_named():
    r = run_program("import monarch.actor as m\ntry:\n    m.traced\nexcept NotImplementedError as e:\n    print(e)\n")
    assert r.returncode == 0, r.stderr
    assert "monarch.actor.traced is Monarch's OpenTelemetry instrumentation" in r.stdout
