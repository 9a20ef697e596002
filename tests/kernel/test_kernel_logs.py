"""Remote output in the kernel (DESIGN §6): each line in the cell whose call produced it, also
after that cell ended (display updates, through jupyter_client and through nbclient); the
flush barrier at the end of a cell; aggregation; tracebacks never delayed; a flood held back
with every line accounted for."""
import json
import re

import nbformat
from cells import LOGGER
from kernel_session import KernelSession
from nbclient import NotebookClient

import xmesh._output.logfiles as logfiles

SPAWN = LOGGER + 'procs = this_host().spawn_procs({"gpus": 2})\nlogger = procs.spawn("log", Logger)\n' \
                 'logger.initialized.get()\n'


class Notebook:
    """What a front end shows: each cell's outputs, with update_display_data applied to the
    output carrying that display_id, in whichever cell it is."""

    def __init__(self):
        self.cells = {}  # msg_id -> list of [kind, text, display_id]

    def add(self, msg_id, msgs):
        outs = self.cells.setdefault(msg_id, [])
        for m in msgs:
            t, c = m["msg_type"], m["content"]
            if t == "stream":
                outs.append(["stream", c["text"], None])
            elif t == "display_data" and c.get("metadata", {}).get("xmesh_output"):  # lines with folds
                outs.append(["stream", c["data"]["text/plain"], None])
            elif t == "display_data":
                outs.append(["display", c["data"].get("text/plain", ""), c.get("transient", {}).get("display_id")])
            elif t == "update_display_data":
                for cell in self.cells.values():
                    for o in cell:
                        if o[2] and o[2] == c["transient"]["display_id"]:
                            o[1] = c["data"].get("text/plain", "")

    def text(self, msg_id):
        return "".join(o[1] for o in self.cells[msg_id])


def test_late_output_lands_in_the_cell_that_made_the_call(kernel):
    kernel.ok(SPAWN + "procs.logging_option(aggregate_window_sec=None)")
    nb = Notebook()
    c1 = kernel.send("fut = logger.later.call(1.5, 'late line')\nprint('cell one')")
    r1 = kernel.collect(c1)
    nb.add(c1, r1.outputs)
    assert any(m["msg_type"] == "display_data" for m in r1.outputs)  # the slot for what comes later
    # Cell two waits for the call: its output was printed before the reply, so by the time
    # get() returns it is in cell one's slot (the update goes out while cell two runs).
    c2 = kernel.send("values = fut.get()\nprint('cell two')")
    nb.add(c2, kernel.collect(c2).outputs)
    assert "[0] late line 0" in nb.text(c1) and "[1] late line 1" in nb.text(c1)
    assert "late line" not in nb.text(c2) and "cell two" in nb.text(c2)
    assert kernel.value("list(values.values())") == "['late line', 'late line']"
    # While no cell runs, the update still comes, addressed to the cell that made the call.
    c3 = kernel.send("fut2 = logger.later.call(1.0, 'idle line')")
    nb.add(c3, kernel.collect(c3).outputs)
    # (the two ranks print at the same moment, in either order: wait for the slot to hold both)
    late = kernel.iopub_until(lambda m: m["msg_type"] == "update_display_data" and
                              "idle line 0" in m["content"]["data"]["text/plain"] and
                              "idle line 1" in m["content"]["data"]["text/plain"], timeout=30)
    assert late[-1]["parent_header"]["msg_id"] == c3
    nb.add(c3, late)
    assert "[0] idle line 0" in nb.text(c3)


def test_the_flush_barrier_shows_every_line_before_the_cell_ends(kernel):
    """Invariant output.1 (docs/architecture/07-output.md)."""
    kernel.ok(SPAWN)
    out = kernel.ok("logger.burst.call(1000).get()").stdout
    for i in (0, 1, 500, 999):
        assert f"[0] burst r=0 i={i}  [similar on rank 1]\n" in out
    assert len(re.findall(r"^\[0\] burst", out, re.M)) == 1000
    # A call the cell never waited for: its output is in by the end of the cell all the same.
    out = kernel.ok("f = logger.burst.call(1000)\nwhile not f.done(): pass").stdout
    assert len(re.findall(r"^\[0\] burst", out, re.M)) == 1000


def test_aggregation_and_tracebacks_are_never_delayed(kernel):
    kernel.ok(LOGGER + 'procs = this_host().spawn_procs({"gpus": 4})\nlogger = procs.spawn("log", Logger)')
    r = kernel.ok("logger.report.call().get()")
    assert "[ranks 0-3] epoch 3 done\n" in r.stdout and "[0] loss=0.10  [similar on ranks 1-3]\n" in r.stdout
    # The summary is a fold in the notebook that opens to each rank's own line.
    fold, = r.folds
    summary = fold.index("<summary")
    assert "[0] loss=0.10  [similar on ranks 1-3]</summary>" in fold[summary:]
    assert "[0] loss=0.10\n[1] loss=0.11\n[2] loss=0.12\n[3] loss=0.13" in fold[summary:]
    # A window of a minute: ordinary lines wait for it (or the end of the cell); the traceback
    # shows while the cell still runs.
    kernel.ok("procs.logging_option(aggregate_window_sec=60)")
    msg_id = kernel.send("logger.fail_loudly.call(5).get()")
    seen = kernel.wait_for_output(msg_id, lambda t: t.count("ValueError: boom") == 4, timeout=30)
    assert "before the traceback" not in seen
    assert "[2] Traceback (most recent call last):" in seen
    r = kernel.collect(msg_id)
    assert "[ranks 0-3] before the traceback" in r.stdout


def test_a_flood_is_held_back_and_every_line_is_accounted_for(kernel_rundir):
    n = 1_000_000
    k = KernelSession(kernel_rundir, env={"XMESH_LOG_BARRIER_S": "60", "XMESH_LOG_MAX_BYTES": str(1 << 30)})
    try:
        k.ok(LOGGER + 'procs = this_host().spawn_procs({"gpus": 1}, name="flood")\n'
                      'logger = procs.spawn("log", Logger)\nprocs.logging_option(aggregate_window_sec=None)')
        r = k.ok(f"logger.flood.call({n}).get()", timeout=100)
    finally:
        k.close()
    shown = re.findall(r"^\[flood 0\] r=0 seq=(\d+)$", r.stdout, re.M)
    held = sum(int(x.replace(",", "")) for x in re.findall(r"held back [\d,]+ lines \(display limit \d+ lines/s\): "
                                                           r"rank 0: ([\d,]+);", r.stderr))
    assert len(shown) == len(set(shown))  # each shown once
    assert len(shown) + held == n         # and the rest counted, exactly
    assert 0 < len(shown) < n
    d = logfiles.find_logdirs(kernel_rundir, "flood")[-1]
    seqs = [int(rec.text.split("seq=")[1]) for rec in logfiles.read_records(d, ranks=[0]) if rec.text.startswith("r=0")]
    assert seqs == list(range(n))         # the log file has every line, in order


def test_late_output_through_nbclient(kernel_rundir, monkeypatch):
    nb = nbformat.v4.new_notebook()
    nb.cells = [nbformat.v4.new_code_cell(SPAWN + "procs.logging_option(aggregate_window_sec=None)"),
                nbformat.v4.new_code_cell("fut = logger.later.call(1.5, 'late line')"),
                nbformat.v4.new_code_cell("fut.get()\nprint('cell three')")]
    monkeypatch.setenv("XMESH_RUNTIME_DIR", kernel_rundir)
    NotebookClient(nb, kernel_name="xmesh", timeout=60).execute()

    def text(cell):
        return "".join(o.get("text", "") or o.get("data", {}).get("text/plain", "") for o in cell.outputs)

    assert "[0] late line 0" in text(nb.cells[1]) and "[1] late line 1" in text(nb.cells[1])
    assert "late line" not in text(nb.cells[2]) and "cell three" in text(nb.cells[2])
    json.dumps(nb)  # the executed notebook stays valid


BARS = LOGGER + 'procs = this_host().spawn_procs({"gpus": 4})\nlogger = procs.spawn("log", Logger)\n' \
                'logger.initialized.get()\n'


def _bar_rows(text, kind):
    return {int(m.group(1)): m.group(2) for m in re.finditer(rf"^\[(\d)\] ({kind}.*)$", text, re.M)}


def test_progress_bars_of_several_ranks_keep_a_line_each(kernel):
    """tqdm (stderr) and a hand-written '\\r' bar (stdout) on 4 ranks at different speeds: each
    bar is a display of its own with one row per rank, updated in place, ending as every rank's
    final bar; nothing of a bar reaches the cell's text, no empty line is left behind."""
    kernel.ok(BARS)
    nb = Notebook()
    c = kernel.send("logger.bars.call(12, 0.02).get()")
    r = kernel.collect(c)
    assert r.status == "ok", r
    nb.add(c, r.outputs)
    streams = r.stdout + r.stderr
    assert "\r" not in streams and "%|" not in streams and "manual" not in streams
    assert not re.search(r"^\[(ranks )?[\d,-]+\] $", streams, re.M), streams  # no empty prefixed line
    assert "[0] halfway on rank 0" in streams
    assert "after the bars" in streams
    boards = [o for o in nb.cells[c] if o[0] == "display"]
    assert len(boards) == 2, boards  # the tqdm bars and the hand-written ones
    tq = _bar_rows(boards[0][1], "train")
    manual = _bar_rows(boards[1][1], "manual")
    assert sorted(tq) == [0, 1, 2, 3] and sorted(manual) == [0, 1, 2, 3], boards
    assert all("100%" in t and "12/12" in t for t in tq.values()), tq
    assert all(t == "manual 100%" for t in manual.values()), manual
    # Updated in place while they ran: the bars' displays were updated, and each board made once.
    updates = [m for m in r.outputs if m["msg_type"] == "update_display_data"]
    assert {u["content"]["transient"]["display_id"] for u in updates} <= {b[2] for b in boards}
    assert len(updates) >= 2


def test_bars_of_a_call_left_running_go_on_updating_after_the_cell(kernel):
    kernel.ok(BARS)
    nb = Notebook()
    c = kernel.send("fut = logger.bars.call(20, 0.05)")
    nb.add(c, kernel.collect(c).outputs)
    late = kernel.iopub_until(lambda m: m["msg_type"] == "update_display_data" and
                              m["content"]["data"]["text/plain"].count("manual 100%") == 4, timeout=60)
    nb.add(c, late)
    assert kernel.value("sorted(fut.get().values())") == "[0, 1, 2, 3]"
    text = "\n".join(o[1] for o in nb.cells[c])  # each board is an output of its own
    assert len(_bar_rows(text, "train")) == 4 and all("20/20" in t for t in _bar_rows(text, "train").values()), text
    assert len(_bar_rows(text, "manual")) == 4, text
    assert "\r" not in text
