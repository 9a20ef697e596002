"""CellOutput (_output/logs.py): one queue per destination of remote output in a notebook. The kernel's
tests (tests/kernel) check the whole path through Jupyter messages; these pin the routing rules
with a recording sink in place of the kernel's publisher."""
import threading
import time

from xmesh._output.logs import CellOutput
from xmesh._output.progress import BarRow, ProgressBoard, StdStreams


class RecordingSink:
    def __init__(self):
        self.events = []
        self.cond = threading.Condition()

    def _add(self, *event):
        with self.cond:
            self.events.append(event)
            self.cond.notify_all()

    def write(self, stream, text):
        self._add("write", threading.current_thread() is threading.main_thread(), stream, text)

    def open_slot(self, slot_id, text="", html=""):
        self._add("open", slot_id, *([text] if text else []))
        return True

    def update_slot(self, slot_id, text, html=""):
        self._add("update", slot_id, text)

    def publish_slot(self, slot_id, text, parent, html=""):
        self._add("publish", slot_id, text, parent.get("msg_id"))

    def wait_for(self, kind, timeout=5.0):
        deadline = time.monotonic() + timeout
        with self.cond:
            while not any(e[0] == kind for e in self.events):
                left = deadline - time.monotonic()
                assert left > 0, f"no {kind} event in {self.events}"
                self.cond.wait(left)
            return [e for e in self.events if e[0] == kind]


def test_the_executing_cells_output_is_written_by_the_main_thread():
    """Invariant output.2 (docs/architecture/07-output.md)."""
    sink = RecordingSink()
    out = CellOutput(sink)
    out.begin_cell("k.1")
    out.route([("k.1", 1, "a\n"), ("", 2, "b\n")])  # untagged output belongs to the running cell
    assert sink.events == [("write", True, 1, "a\n"), ("write", True, 2, "b\n")]
    # From another thread it waits in the cell's queue for the main thread.
    t = threading.Thread(target=out.route, args=([("k.1", 1, "c\n")],))
    t.start()
    t.join()
    assert len(sink.events) == 2
    out.drain()
    assert sink.events[-1] == ("write", True, 1, "c\n")


def test_output_with_no_cell_waits_for_the_next_one():
    """Invariant output.2 (docs/architecture/07-output.md)."""
    sink = RecordingSink()
    out = CellOutput(sink)
    out.route([("old.3", 1, "late line\n")])
    assert sink.events == []
    out.begin_cell("k.2")
    assert [e[3] for e in sink.events] == ["[xmesh] output that arrived while no cell was running:\n", "late line\n"]


def test_a_finished_cell_gets_its_lines_in_its_slot():
    """Invariant output.2 (docs/architecture/07-output.md)."""
    sink = RecordingSink()
    out = CellOutput(sink)
    out.begin_cell("k.1")
    out.end_cell("k.1", True, {"msg_id": "m1"})
    assert ("open", "xmesh-output-k.1") in sink.events
    # While no cell runs: published from the runtime's thread with the cell's header as parent.
    out.route([("k.1", 1, "one\n")])
    assert sink.wait_for("publish")[-1] == ("publish", "xmesh-output-k.1", "one\n", "m1")
    # While another cell runs: its main thread updates the slot, with the whole text so far.
    out.begin_cell("k.2")
    out.route([("k.1", 1, "two\n"), ("k.2", 1, "mine\n")])
    assert ("update", "xmesh-output-k.1", "one\ntwo\n") in sink.events
    assert ("write", True, 1, "mine\n") in sink.events


def test_a_cell_without_running_calls_gets_no_slot_and_a_slot_keeps_its_newest_text():
    sink = RecordingSink()
    out = CellOutput(sink)
    out.SLOT_MAX_CHARS = 10
    out.begin_cell("k.1")
    out.end_cell("k.1", False, {})
    out.begin_cell("k.2")
    out.end_cell("k.2", True, {})
    assert [e for e in sink.events if e[0] == "open"] == [("open", "xmesh-output-k.2")]
    out.begin_cell("k.3")
    out.route([("k.1", 1, "to the running cell\n")])  # k.1 has no slot: the running cell shows it
    out.route([("k.2", 1, "123456\n"), ("k.2", 1, "abcdef\n")])
    out.drain()
    assert ("write", True, 1, "to the running cell\n") in sink.events
    text = [e for e in sink.events if e[0] == "update"][-1][2]
    assert text.startswith("[xmesh] 7 earlier characters are not shown here") and text.endswith("abcdef\n")


def board(board_id, *rows, label=""):
    return ProgressBoard(board_id, label, [BarRow(r, t, d) for r, t, d in rows])


def test_a_board_of_bars_is_a_display_of_its_own_updated_in_place():
    sink = RecordingSink()
    out = CellOutput(sink)
    out.begin_cell("k.1")
    out.route([("k.1", 2, "before\n"), ("k.1", 2, board("b1", (0, " 10%", False), (1, " 5%", False)))])
    assert sink.events[-2:] == [("write", True, 2, "before\n"), ("open", "b1", "[0]  10%\n[1]  5%")]
    # Two states before the main thread drains: one update with the newer.
    t = threading.Thread(target=out.route, args=([("k.1", 2, board("b1", (0, "100%", True), (1, " 50%", False)))],))
    t.start()
    t.join()
    out.route([("k.1", 2, board("b1", (0, "100%", True), (1, " 60%", False)))])
    assert [e for e in sink.events if e[0] == "update"] == [("update", "b1", "[0] 100%\n[1]  60%")]
    # After the cell: updated through the cell's header as parent, never as text.
    out.end_cell("k.1", True, {"msg_id": "m1"})
    out.route([("k.1", 2, board("b1", (0, "100%", True), (1, "100%", True)))])
    assert sink.wait_for("publish")[-1] == ("publish", "b1", "[0] 100%\n[1] 100%", "m1")
    assert not any(e[0] == "write" and "%" in e[3] for e in sink.events)


def test_a_board_first_seen_after_its_cell_is_shown_in_the_cells_slot():
    sink = RecordingSink()
    out = CellOutput(sink)
    out.begin_cell("k.1")
    out.end_cell("k.1", True, {"msg_id": "m1"})
    out.route([("k.1", 1, "line\n"), ("k.1", 1, board("b2", (3, " 1/9", False), label="trainers"))])
    sink.wait_for("publish")
    out.route([("k.1", 1, board("b2", (3, " 9/9", True), label="trainers"))])
    time.sleep(2 * CellOutput.SLOT_UPDATE_S)
    last = [e for e in sink.events if e[0] == "publish"][-1]
    assert last[1:3] == ("xmesh-output-k.1", "line\n[trainers 3]  9/9\n")


def test_many_ranks_bars_are_summarised_and_scripts_print_each_final_bar_once():
    rows = [(r, f"{r:3d}%|", False) for r in range(40)]
    rows[5] = (5, "100%|", True)
    text = board("b", *rows).render()
    assert text.splitlines() == ["[ranks 0-39] 40 bars: 1 done, 39 running (0%-39%)",
                                 "[0]   0%|  (slowest)", "[39]  39%|  (fastest)"]
    done = board("b", *[(r, "100%|", True) for r in range(40)]).render()
    assert done.splitlines() == ["[ranks 0-39] 40 bars: all done", "[0] 100%|"]
    import io

    o, e = io.StringIO(), io.StringIO()
    script = StdStreams(o, e, live=False)
    script([("c", 2, board("x", (0, " 50%", False), (1, "100%", True)))])
    script([("c", 2, board("x", (0, "100%", True), (1, "100%", True))), ("c", 1, "after\n")])
    assert e.getvalue() == "[1] 100%\n[0] 100%\n" and o.getvalue() == "after\n"
    script([("c", 2, board("y", (0, " 7%", False)))])
    script.close()  # a bar that never ended is printed as last drawn
    assert e.getvalue().endswith("[0]  7%\n")


def test_summaries_in_a_row_are_one_fold_display_and_a_slot_unfolds_them_too():
    """A summary of lines alike (SummaryLine) reaches the executing cell through write_summaries
    with the stream's text in a row after it; in a finished cell's slot the text/html has the fold."""
    from xmesh._output.logs import SummaryLine, summaries_html

    class FoldSink(RecordingSink):
        def write_summaries(self, stream, lines):
            self._add("summaries", stream, [(str(x), tuple(getattr(x, "members", ()))) for x in lines])

        def publish_slot(self, slot_id, text, parent, html=""):
            self._add("publish", slot_id, text, html)

    sink = FoldSink()
    out = CellOutput(sink)
    loss = SummaryLine("[0] loss 0.5  [similar on ranks 1-2]\n", ["[0] loss 0.5", "[1] loss 0.7", "[2] loss 0.9"])
    acc = SummaryLine("[0] acc 90  [similar on rank 1]\n", ["[0] acc 90", "[1] acc 91"])
    out.begin_cell("k.1")
    out.route([("k.1", 1, "[ranks 0-2] start\n"), ("k.1", 1, loss), ("k.1", 1, acc), ("k.1", 1, "[ranks 0-2] end\n"),
               ("k.1", 2, "[1] oops\n")])
    assert sink.events == [
        ("write", True, 1, "[ranks 0-2] start\n"),
        ("summaries", 1, [(str(loss), tuple(loss.members)), (str(acc), tuple(acc.members)),
                          ("[ranks 0-2] end\n", ())]),  # from a summary on, the stream's text in a row
        ("write", True, 2, "[1] oops\n"),
    ]
    out.end_cell("k.1", True, {"msg_id": "m1"})
    late = SummaryLine("[0] x <1>  [similar on rank 1]\n", ["[0] x <1>", "[1] x <2>"])
    out.route([("k.1", 1, "[0] before\n"), ("k.1", 1, late)])
    (_, slot_id, text, html), = sink.wait_for("publish")
    assert text == "[0] before\n[0] x <1>  [similar on rank 1]\n"  # text/plain: as a script prints it
    assert html == summaries_html(["[0] before\n", late])
    assert "<summary" in html and "[1] x &lt;2&gt;" in html and "[0] before" in html  # escaped, folded


def test_summaries_html_folds_each_summary_and_counts_the_ranks_left_out():
    from xmesh._output.logs import SummaryLine, summaries_html

    big = SummaryLine("[0] step 0  [similar on ranks 1-299]\n", [f"[{r}] step {r}" for r in range(256)], 44)
    page = summaries_html(["a\n", "b\n", big], 2)
    assert page.count("<details") == 1 and page.count("<div") == 3  # the frame, a and b together, the members
    assert "a\nb</div>" in page and "[255] step 255" in page
    assert "(and 44 more ranks: mesh.logs()" in page
    assert "error-background" in page  # stderr keeps its colour
    assert "error-background" not in summaries_html([big], 1)
