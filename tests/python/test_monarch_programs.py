"""The compatibility suite (issue 19): programs in Monarch's documented style, one per feature
(examples/monarch/), run unchanged on xmesh; each must print exactly what the real Monarch
(torchmonarch 0.7) printed for it, recorded in examples/monarch/expected/ by
`bench/monarch_compat.py --record` (which also runs them on both, side by side)."""
import os

import pytest
from xmesh_testing import run_program

PROGRAMS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "examples", "monarch")
NAMES = sorted(f[:-3] for f in os.listdir(PROGRAMS) if f.endswith(".py"))


def test_every_program_has_monarchs_output_recorded():
    assert NAMES, "no programs found"
    missing = [n for n in NAMES if not os.path.exists(os.path.join(PROGRAMS, "expected", f"{n}.out"))]
    assert missing == []


@pytest.mark.parametrize("name", NAMES)
def test_a_monarch_program_prints_what_monarch_printed(name):
    r = run_program(path=os.path.join(PROGRAMS, f"{name}.py"), timeout=100)
    assert r.returncode == 0, f"{name}.py failed:\n{r.stdout}\n{r.stderr}"
    with open(os.path.join(PROGRAMS, "expected", f"{name}.out")) as f:
        expected = f.read()
    assert r.stdout == expected, f"{name}.py printed\n{r.stdout}\nwhere Monarch printed\n{expected}\n{r.stderr}"
