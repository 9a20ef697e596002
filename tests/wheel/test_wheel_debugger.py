"""The debugger in each venv's Python (issue 43): a script's terminal becomes the `xmesh_dbg>`
prompt; `where` reads the stacks of a stopped rank and of a rank asleep in C (CPython 3.10
exports no GIL-free dumper: the dump is taken with the GIL), pdb works on an attached rank, and
`pause` stops a rank running Python where it is (3.13 exports no per-thread trace setter: the
trace goes through every thread and the others put theirs back)."""
import os
import textwrap

import pexpect
import pytest
from wheel_envs import SOURCE_DIR, clean_env, shared_venv, wheel, wheel_versions
from xmesh_testing import private_tmpdir, stop_agent

PROGRAM = textwrap.dedent("""
    import os, sys
    sys.path.insert(0, {tests!r})
    from actors_for_tests import Stopper
    from xmesh import this_host

    procs = this_host().spawn_procs({{"gpus": 2}})
    stopper, spinner = procs.spawn("stopper", Stopper), procs.spawn("spinner", Stopper)
    spinning = spinner.spin_until.call({flag!r})
    print("STEP", sorted(stopper.step.call(10, stop_ranks=(0,), sleep=15).get(timeout=100).values()))
    open({flag!r}, "w").close()
    print("SPUN", all(n > 0 for n in spinning.get(timeout=60).values()))
""")


@pytest.mark.parametrize("version", wheel_versions(wheel()))
def test_a_two_rank_debugger_session_in_the_venv(version, tmp_path):
    python = shared_venv(version)
    path = tmp_path / "prog.py"
    path.write_text(PROGRAM.format(tests=os.path.join(SOURCE_DIR, "tests", "python"), flag=str(tmp_path / "flag")))
    rundir = private_tmpdir("xmw-")
    term = pexpect.spawn(python, [str(path)], env=clean_env(XMESH_RUNTIME_DIR=rundir), encoding="utf-8",
                         timeout=40, dimensions=(50, 200))
    try:
        term.expect("xmesh_dbg> ")
        term.sendline("where")
        term.expect("xmesh_dbg> ")
        out = term.before.replace("\r\n", "\n")
        assert "1 rank (rank 0) stopped in pdb (breakpoint):" in out, out
        assert "1 rank (rank 1) running:" in out and "time.sleep(sleep)" in out, out
        term.sendline("attach stopper 0")
        term.expect(r"\[stopper 0\] \(Pdb\) ")
        term.sendline("p y, z")
        term.expect(r"\[stopper 0\] \(Pdb\) ")
        assert "(20, 21)" in term.before
        term.sendline("detach")
        term.expect("xmesh_dbg> ")
        term.sendline("pause spinner ranks(0:2)")
        term.expect("xmesh_dbg> ")
        term.sendline("cast spinner ranks(0:2) p looks > 0")
        term.expect("xmesh_dbg> ")
        assert "[spinner ranks 0-1]\nTrue\n" in term.before.replace("\r\n", "\n"), term.before
        term.sendline("continue")
        term.expect(r"STEP \[20, 21\]")
        term.expect("SPUN True")
        term.expect(pexpect.EOF)
    finally:
        term.close(force=True)
        stop_agent(rundir)
