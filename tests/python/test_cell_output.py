"""CellOutput (_logs.py): one queue per destination of remote output in a notebook. The kernel's
tests (tests/kernel) check the whole path through Jupyter messages; these pin the routing rules
with a recording sink in place of the kernel's publisher."""
import threading
import time

from xmesh._logs import CellOutput


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

    def open_slot(self, slot_id):
        self._add("open", slot_id)
        return True

    def update_slot(self, slot_id, text):
        self._add("update", slot_id, text)

    def publish_slot(self, slot_id, text, parent):
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
    sink = RecordingSink()
    out = CellOutput(sink)
    out.route([("old.3", 1, "late line\n")])
    assert sink.events == []
    out.begin_cell("k.2")
    assert [e[3] for e in sink.events] == ["[xmesh] output that arrived while no cell was running:\n", "late line\n"]


def test_a_finished_cell_gets_its_lines_in_its_slot():
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
