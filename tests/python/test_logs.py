"""Remote output in plain programs (DESIGN §6): fd-level capture and its order, long lines and
invalid UTF-8, mesh.logs() and `xmesh logs`, logging_option, crash tails."""
import json
import logging
import os
import subprocess

import pytest
from xmesh_testing import PYTHON, run_program

import xmesh

HERE = os.path.dirname(os.path.abspath(__file__))
PRELUDE = f"import sys\nsys.path.insert(0, {HERE!r})\nfrom xmesh import this_host\nfrom actors_for_tests import Printer\n"


def test_every_way_of_writing_is_shown_before_the_result(fresh_rundir):
    """Invariant output.1 (docs/architecture/07-output.md)."""
    r = run_program(PRELUDE + "procs = this_host().spawn_procs({'gpus': 2})\n"
                    "p = procs.spawn('p', Printer)\n"
                    "print('before', flush=True)\n"
                    "print('RESULT', sorted(p.every_way.call('X').get().values()), flush=True)\n",
                    env={"XMESH_RUNTIME_DIR": fresh_rundir})
    assert r.returncode == 0, r.stderr
    out = r.stdout.splitlines()
    result_at = out.index("RESULT [0, 1]")
    for rank in (0, 1):
        for way in ("print", "os.write", "printf", "child"):
            line = f"[{rank}] X {way} {rank}"
            assert line in out[1:result_at], (line, out)  # after 'before', before the result
        assert f"[{rank}] X stderr {rank}" in r.stderr.splitlines()
    assert "\x1b]xm;" not in r.stdout + r.stderr  # markers never reach the user


@pytest.fixture(scope="module")
def printers():
    procs = xmesh.this_host().spawn_procs({"gpus": 2}, name="printers")
    from actors_for_tests import Printer

    yield procs, procs.spawn("p", Printer)
    procs.stop()


def test_long_lines_are_split_and_garbage_is_replaced(printers, capfd):
    procs, p = printers
    long = "x" * (200 * 1024)
    p.slice(gpus=0).raw.call_one((long + "\n").encode()).get()
    p.slice(gpus=0).raw.call_one(b"bad \xff\xfe bytes \x80\n").get()
    out = capfd.readouterr().out
    pieces = [ln[len("[printers 0] "):] for ln in out.splitlines() if ln.startswith("[printers 0] x")]
    assert "".join(pieces) == long and max(map(len, pieces)) == 64 * 1024
    assert "[printers 0] bad \ufffd\ufffd bytes \ufffd" in out
    recs = procs.logs(rank=0, grep="^x")
    assert "".join(r.text for r in recs[-4:]) == long


def test_a_line_printed_in_pieces_stays_one_line(printers, capfd):
    """print() in a proc is line-buffered, as on a terminal: a line written in pieces, with
    pauses between them, is one line in the output, not a partial line sent on early."""
    procs, p = printers
    p.slice(gpus=0).slow_line.call_one(["left", " middle", " right"], 0.3).get()
    out = capfd.readouterr().out
    assert "[printers 0] left middle right" in out.splitlines(), out


def test_logs_records_and_filters(printers):
    procs, p = printers
    p.lines.call(5, text="rec").get()
    recs = procs.logs(grep=r"^rec ")
    assert len(recs) == 10
    r = recs[0]
    assert set(r._fields) == {"host", "pid", "rank", "coords", "actor", "stream", "time", "text"}
    assert r.actor == "p" and r.stream == "stdout" and r.pid in procs.pids
    assert r.coords == {"gpus": r.rank}
    assert [x.text for x in procs.logs(rank=1, grep="^rec ", tail=2)] == ["rec r=1 i=3", "rec r=1 i=4"]
    # An actor mesh's view: its own lines, ranks numbered as in the spawned actor mesh.
    one = p.slice(gpus=1)
    assert {x.rank for x in one.logs(grep="^rec ")} == {1}
    assert [x.text for x in p.logs(rank=0, grep="^rec ", tail=1)] == ["rec r=0 i=4"]
    with pytest.raises(ValueError, match="not a valid regular expression"):
        procs.logs(grep="(")
    with pytest.raises(ValueError, match="stream must be"):
        procs.logs(stream="stdin")
    with pytest.raises(IndexError, match="not in this proc mesh"):
        procs.logs(rank=7)
    with pytest.raises(ValueError, match="tail must be a whole number"):
        procs.logs(tail=-1)
    with pytest.raises(ValueError, match="tail must be a whole number"):
        p.logs(tail=1.5)
    assert procs.logs(tail=0) == []


def test_logging_option_level_visibility_and_bad_input(printers, capfd):
    procs, p = printers
    p.log.call().get()
    err = capfd.readouterr().err
    assert "[printers 0] INFO trainer: info from 0" in err and "[printers 1] WARNING trainer: warning from 1" in err
    procs.logging_option(level=logging.WARNING, aggregate_window_sec=None)
    p.log.call().get()
    err = capfd.readouterr().err
    assert "info from" not in err and "[printers 1] WARNING trainer: warning from 1" in err
    procs.logging_option(stream_to_client=False, aggregate_window_sec=None)
    p.lines.call(1, text="hidden").get()
    assert "hidden" not in capfd.readouterr().out
    assert len(procs.logs(grep="^hidden")) == 2  # the log files keep them
    with pytest.raises(ValueError, match="invalid logging level"):
        procs.logging_option(level=1000)
    with pytest.raises(ValueError, match="aggregate_window_sec"):
        procs.logging_option(aggregate_window_sec=-1)
    with pytest.raises(TypeError, match="stream_to_client"):
        procs.logging_option(stream_to_client="yes")
    procs.logging_option()  # back to showing, aggregated over 3 s
    p.lines.call(2, text="agg").get()  # the barrier ends the window early
    out = capfd.readouterr().out
    assert "[printers 0] agg r=0 i=0  [similar on rank 1]" in out and "[printers 0] agg r=0 i=1  [similar on rank 1]" in out


def test_a_crash_shows_its_last_lines(fresh_rundir):
    hosts = xmesh.hosts([fresh_rundir])
    procs = hosts.spawn_procs({"gpus": 1})
    from actors_for_tests import Printer

    p = procs.spawn("p", Printer)
    with pytest.raises(xmesh.SupervisionError) as info:
        p.crash.call_one("the last words").get()
    assert "exited with code 9; its last output:" in str(info.value)
    assert "the last words" in str(info.value)


def test_xmesh_logs_reads_live_and_finished_allocations(fresh_rundir):
    env = dict(os.environ, XMESH_RUNTIME_DIR=fresh_rundir, XMESH_LOG_MAX_BYTES="2048", XMESH_LOG_KEEP="100")
    hosts = xmesh.hosts([fresh_rundir])
    from actors_for_tests import Printer

    procs = hosts.spawn_procs({"gpus": 2}, name="job")
    p = procs.spawn("p", Printer)
    # Rotation (2 KiB files here) keeps every line, in order, across the rotated files.
    p.lines.call(300, text="rot").get()

    def logs(*args):
        r = subprocess.run([PYTHON, "-m", "xmesh.cli", "logs", *args, "--runtime-dir", fresh_rundir],
                           capture_output=True, text=True, timeout=60, env=env)
        return r

    r = logs("job", "--rank", "1", "--grep", "^rot")
    assert r.returncode == 0, r.stderr
    assert r.stdout.splitlines() == [f"[1] rot r=1 i={i}" for i in range(300)]
    r = logs("job", "--tail", "3", "--stream", "stdout", "--json")
    recs = [json.loads(x) for x in r.stdout.splitlines()]
    assert len(recs) == 3 and all(x["actor"] == "p" for x in recs)
    # --follow prints what is written while it runs, and ends when the procs are gone.
    follower = subprocess.Popen([PYTHON, "-m", "xmesh.cli", "logs", "job", "--follow", "--grep", "^late",
                                 "--runtime-dir", fresh_rundir], stdout=subprocess.PIPE, text=True, env=env)
    try:
        import time
        time.sleep(1.0)
        p.lines.call(2, text="late").get()
        time.sleep(0.5)
        procs.stop()
        out, _ = follower.communicate(timeout=30)
    finally:
        follower.kill()
    assert sorted(out.splitlines()) == sorted(f"[{r}] late r={r} i={i}" for r in (0, 1) for i in (0, 1))
    # After the allocation ended, the files still answer.
    r = logs("job", "--rank", "0", "--tail", "1", "--grep", "^late")
    assert r.stdout.splitlines() == ["[0] late r=0 i=1"]
    r = logs("job", "--tail", "-2")
    assert r.returncode == 1 and "tail must be a whole number" in r.stderr
    r = logs("nothing-here")
    assert r.returncode == 1 and "no logs of an allocation named 'nothing-here'" in r.stderr


FILL_THE_DISK = """
import sys
import xmesh
from xmesh import Actor, endpoint

class Chatty(Actor):
    @endpoint
    def talk(self, n):
        for i in range(n):
            print(f"line {i} " + "x" * 200)
        return n

pm = xmesh.hosts([sys.argv[1]]).spawn_procs({"gpus": 1}, name="fill")
print("TALKED", pm.spawn("chatty", Chatty).talk.call_one(3000).get(timeout=60), flush=True)
import warnings
with warnings.catch_warnings(record=True) as said:
    warnings.simplefilter("always")
    kept = pm.logs(tail=3)
print("KEPT", len(kept), "WARNED", [str(w.message) for w in said], flush=True)
"""


def test_a_full_disk_is_said_once_and_what_the_files_lack_is_counted(tmp_path):
    """Issue 16, defect 8: a full disk truncated the per-rank log files silently and `xmesh logs`
    returned stale tails.

    Invariant protocol.3 (docs/architecture/02-protocol.md).
    """
    from xmesh_testing import PYTHON, run_program

    small = tmp_path / "small"
    small.mkdir(mode=0o700)
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=256k,mode=0700", "tmpfs", str(small)], check=True)
    try:
        r = run_program(FILL_THE_DISK, args=[str(small)], env={"XMESH_RUNTIME_DIR": str(small)}, timeout=110)
        assert r.returncode == 0, r.stderr
        assert "TALKED 3000" in r.stdout and "line 2999 " in r.stdout  # every line was still shown
        # procs.logs() says what its files lack (its last lines are not the latest the proc wrote).
        (kept,) = [ln for ln in r.stdout.splitlines() if ln.startswith("KEPT ")]
        assert "rank 0's log file lacks" in kept and "No space left on device" in kept, kept
        warnings = [ln for ln in r.stderr.splitlines() if "cannot be written (No space left on device)" in ln]
        assert len(warnings) == 1, r.stderr[-3000:]
        logs = subprocess.run([PYTHON, "-m", "xmesh.cli", "logs", "fill", "--runtime-dir", str(small)],
                              capture_output=True, text=True, timeout=60)
        assert "rank 0's log file lacks" in logs.stderr and "No space left on device" in logs.stderr, logs
    finally:
        subprocess.run([PYTHON, "-m", "xmesh.cli", "shutdown", "--runtime-dir", str(small)], capture_output=True,
                       timeout=60)
        subprocess.run(["umount", "-l", str(small)], check=False)


LONG_LINE = """
import sys
import xmesh
from xmesh import Actor, endpoint

class Long(Actor):
    @endpoint
    def write(self, n):
        print("y" * n)  # exactly a multiple of the 64 KiB piece size
        print("after")
        return n

pm = xmesh.this_host().spawn_procs({"gpus": 1}, name="longline")
print("WROTE", pm.spawn("long", Long).write.call_one(4 * 65536).get(timeout=60), flush=True)
"""


def test_a_long_line_comes_in_pieces_without_an_empty_line_and_whole_from_xmesh_logs():
    """Issue 16, defect 10: a 100 MB line arrived as 1,600 pieces plus a spurious empty line."""
    from xmesh_testing import PYTHON, run_program

    try:
        r = run_program(LONG_LINE, timeout=110)
        assert r.returncode == 0, r.stderr
        lines = r.stdout.splitlines()
        texts = [ln.split("] ", 1)[-1] for ln in lines]  # after the "[longline 0] " prefix
        assert sum(len(t) for t in texts if t.startswith("y")) == 4 * 65536
        assert not [ln for ln in lines if not ln.split("]", 1)[-1].strip()], lines  # no empty line among them
        assert any(ln.endswith("after") for ln in lines)
        logs = subprocess.run([PYTHON, "-m", "xmesh.cli", "logs", "longline", "--json"], capture_output=True, text=True,
                              timeout=60)
        texts = [json.loads(ln)["text"] for ln in logs.stdout.splitlines()]
        assert texts == ["y" * (4 * 65536), "after"], [t[:20] for t in texts]
    finally:
        subprocess.run([PYTHON, "-m", "xmesh.cli", "stop", "longline"], capture_output=True, timeout=60)


def test_progress_bars_in_a_script_end_as_one_line_per_rank(fresh_rundir):
    """Piped output (a log file, CI) gets each rank's final bar once, never the redraws."""
    r = run_program(PRELUDE + "procs = this_host().spawn_procs({'gpus': 3})\n"
                    "p = procs.spawn('p', Printer)\n"
                    "p.bar.call(8, 0.02).get()\n",
                    env={"XMESH_RUNTIME_DIR": fresh_rundir})
    assert r.returncode == 0, r.stderr
    assert "\r" not in r.stdout + r.stderr
    lines = r.stdout.splitlines()
    for rank in range(3):
        assert lines.count(f"[{rank}] step 8/8") == 1, lines
        assert lines.index(f"[{rank}] step 8/8") < lines.index(f"[{rank}] trained {rank}"), lines
    assert not any("step" in ln and "8/8" not in ln for ln in lines), lines


def test_progress_bars_on_a_terminal_show_a_status_line(fresh_rundir):
    """On a terminal the running bars are one status line (erased before other output), and
    each rank's bar still ends as a line of its own."""
    import pexpect

    path = os.path.join(fresh_rundir, "bars.py")
    with open(path, "w") as f:
        f.write(PRELUDE + "procs = this_host().spawn_procs({'gpus': 2})\n"
                "p = procs.spawn('p', Printer)\n"
                "p.bar.call(10, 0.05).get()\nprint('END')\n")
    env = dict(os.environ, XMESH_RUNTIME_DIR=fresh_rundir)
    child = pexpect.spawn(PYTHON, [path], env=env, encoding="utf-8", timeout=60, dimensions=(24, 120))
    child.expect("END")
    out = child.before
    child.expect(pexpect.EOF)
    assert "\r\x1b[K[ranks 0-1] " in out  # the status line, with both ranks' bars
    lines = [ln.split("\x1b[K")[-1] for ln in out.replace("\r\n", "\n").split("\n")]
    assert "[0] step 10/10" in lines and "[1] step 10/10" in lines, lines


def test_log_records_show_their_time_readably(printers):
    procs, p = printers
    p.slice(gpus=0).lines.call_one(1, "stamp").get()
    rec = procs.logs(rank=0, grep="stamp")[-1]
    assert abs(rec.when.timestamp() - rec.time) < 1e-3
    assert f"time={rec.when.isoformat(sep=' ', timespec='milliseconds')}" in repr(rec)
    assert str(rec.time) not in repr(rec)
