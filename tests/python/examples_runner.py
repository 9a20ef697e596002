"""Runs the programs in examples/ as a user would and checks what they print."""
import os

import pytest
from xmesh_testing import EXAMPLES, run_program

EXPECTED = {
    "quickstart.py": ["every __init__ ran", "steps per rank: [2, 2, 2, 2, 1, 1, 1, 1]",
                      "even gpus: {'hosts': 2, 'gpus': 2} are ranks [0, 2, 4, 6]", "one actor: 1",
                      "caught an actor error from rank 7 {'hosts': 1, 'gpus': 3}: rank 7 ran out of patience",
                      "the actor still serves: 1", "done"],
    "ping_pong.py": ["ping 0: ['hello from 0 -> answered by 0', 'hello from 0 -> answered by 1']",
                     "pong received: [20, 20]"],
    "streaming.py": ["first to arrive: 30", "sum: 60"],
    "choose.py": ["ranks used: [(0, 3), (1, 3), (2, 3)]", "total served: 9"],
    "slicing.py": ["tp=1 column: [1, 3, 5, 7]", "dp=2 row: [4, 5]",
                   "tp=1 column, as each actor sees the call: [(0, 4), (1, 4), (2, 4), (3, 4)]",
                   "renamed+flattened: {'all': 8} [5, 6, 7]",
                   "TypeError: mesh has no dimension 'hosts'", "IndexError: index 8 out of range"],
    "supervision.py": ["supervision error from rank 2 {'gpus': 2}", "exited with code 7",
                       "survivors answer: [0, 1]", "the dead rank stays dead: SupervisionError"],
    "numpy_args.py": ["rank 1: sum=33554432 over 64 MiB", "received 64 MiB of float32 filled with 1.0"],
    "torch_args.py": ["rank 1: norm=4096 shape=(4096, 4096) dtype=torch.float32",
                      "doubled: Tensor (4096, 4096) 2.0 33554432.0"],
    "counter.py": ["values: [3, 2, 2, 2]"],
    "async_fanout.py": ["gathered: [0, 1, 2, 3]", "call: [0, 1, 2, 3]"],
    "weight_sync.py": ["published 525568 parameters (2 MiB) as one buffer",
                       "step 1: 2 generators in sync with the trainer: True",
                       "step 3: 2 generators in sync with the trainer: True"],
}


def check_example(name, tmp_path, package):
    src = open(os.path.join(EXAMPLES, name)).read()
    if package == "xmesh":
        src = src.replace("from monarch.actor import", "from xmesh import")
    path = tmp_path / name
    path.write_text(src)
    r = run_program(path=str(path), timeout=90)
    assert r.returncode == 0, f"{name} failed:\n{r.stdout}\n{r.stderr}"
    for line in EXPECTED[name]:
        assert line in r.stdout, f"{name}: {line!r} not in output:\n{r.stdout}\n{r.stderr}"
    return r


def make_tests(names):
    """The two tests for a share of the examples (each test file takes a share, so that ctest
    runs them on both cores): as written, and with xmesh imports."""

    @pytest.mark.parametrize("name", names)
    def test_example(name, tmp_path):
        check_example(name, tmp_path, "monarch")

    @pytest.mark.parametrize("name", names)
    def test_example_with_xmesh_imports(name, tmp_path):
        check_example(name, tmp_path, "xmesh")

    return test_example, test_example_with_xmesh_imports
