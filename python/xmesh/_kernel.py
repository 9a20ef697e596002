"""The Python side of the xmesh Jupyter kernel. kernel/xmesh_interpreter.cpp calls `setup`
once the IPython shell exists, `begin_cell` / `end_cell` around each execution,
`on_idle_interrupt` for an interrupt while no cell runs, and `shutdown` on a shutdown or
restart request."""
import collections
import itertools
import json
import sys
import threading
import time

from ._debug_io import TerminalIO

_shell = None
_interrupted = []          # futures whose wait the last interrupt broke, ranks still running
_interrupted_lock = threading.Lock()


def in_kernel():
    return _shell is not None


def cancel_hint():
    return "interrupt again or fut.cancel() to cancel them"


def setup(shell):
    global _shell
    _shell = shell
    _keep_meshes_out_of_the_output_cache(shell)
    _name_errors_by_their_class(shell)
    _register_magics(shell)
    from . import _core, _debug_io, _runtime, _wait

    # Remote output goes to the cells (aggregated, within a display budget), and every call a
    # cell sends is noted (its flush barrier and its output slot).
    _runtime.set_output(True, route)
    _runtime.observe_calls(note_call)
    _debug_io.set_frontend(_KernelFrontend())
    _core.set_main_thread_call(drain_output)
    # The one wait shows the cell's remote output whenever it is woken for it, and remembers
    # an interrupted wait (a second interrupt cancels its calls).
    _wait.add_output_hook(drain_output)
    _wait.add_interrupt_hook(note_interrupted)
    _wait.set_cancel_hint(cancel_hint)


# -- cells and their output (DESIGN §6) ------------------------------------------------------
# Remote output is tagged with the cell whose call produced it (the causal context travels
# with every call). Output of the executing cell is written by the main thread, the only one
# that may publish on xeus's shell socket, so it is ordered before the cell's reply: while the
# cell waits on a future, between two bytecodes (a pending call), and at the end. Output of a
# cell that already finished goes into that cell's output slot, a display_data with a
# display_id made at its end when calls were still running, through update_display_data
# published from the runtime's thread (kernel/iopub_side_channel.hpp).

_cells_lock = threading.RLock()
_current = None            # the _Cell executing now
_recent = collections.OrderedDict()  # token -> finished _Cell with an output slot
_RECENT_MAX = 200
_main_queue = []           # (stream, text) for the executing cell, written by the main thread
_waiting = []              # output that arrived with no cell to show it in: shown by the next one
_token_prefix = None
_cell_numbers = itertools.count(1)
_SLOT_MAX_CHARS = 200_000
_SLOT_UPDATE_S = 0.1
_UPDATE = object()         # a _main_queue item: (_UPDATE, cell) updates that cell's slot
_stdin_allowed = False     # the executing request allows input_request (nbclient does not)


class _Cell:
    def __init__(self, token, header):
        self.token = token
        self.header = header
        self.targets = {}       # id(list) -> list of (addr, actor) the cell's calls went to
        self.calls = []         # the Calls expecting replies
        self.broadcasts = False
        self.slot_id = None
        self.late = []          # late output shown in the slot
        self.late_chars = 0
        self.dropped_chars = 0
        self.last_publish = 0.0
        self.dirty = False
        self.queued = False     # an update waits in _main_queue


def _new_token():
    global _token_prefix
    if _token_prefix is None:
        from . import _core

        _token_prefix = _core.random_hex(3)  # tells this kernel's cells from an earlier kernel's
    return f"{_token_prefix}.{next(_cell_numbers)}"


def begin_cell(header_json, allow_stdin=False):
    """Called by the kernel (C++) before a cell executes."""
    global _current, _stdin_allowed
    _stdin_allowed = bool(allow_stdin)
    from . import _context

    try:
        header = json.loads(header_json)
    except ValueError:
        header = {}
    cell = _Cell(_new_token(), header)
    with _cells_lock:
        _current = cell
        if _waiting:
            _main_queue.append((2, "[xmesh] output that arrived while no cell was running:\n"))
            _main_queue.extend(_waiting)
            _waiting.clear()
    _context.controller_cell = cell.token
    drain_output()


def note_call(targets, call):
    """A call or broadcast from the executing cell (call None for a broadcast)."""
    cell = _current
    if cell is None:
        return
    cell.targets[id(targets)] = targets
    if call is None:
        cell.broadcasts = True
    else:
        cell.calls.append(call)


def end_cell():
    """Called by the kernel (C++) after a cell executed, before its reply: the flush barrier,
    then an output slot if the cell left calls running."""
    global _current
    from . import _context
    from ._runtime import runtime_if_started

    cell = _current
    if cell is None:
        return
    rt = runtime_if_started()
    try:
        if rt is not None and rt.logs is not None:
            _flush_barrier(rt, cell)
    except KeyboardInterrupt:
        pass
    if cell.broadcasts or any(not (c.done or c.fatal) for c in cell.calls):
        cell.slot_id = f"xmesh-output-{cell.token}"
        _publish_slot(cell)
    with _cells_lock:
        _current = None
        _context.controller_cell = ""
        cell.calls = []
        cell.targets = {}
        if cell.slot_id:
            _recent[cell.token] = cell
            while len(_recent) > _RECENT_MAX:
                _recent.popitem(last=False)
    drain_output()


def _flush_barrier(rt, cell):
    """Every proc this cell called writes an output marker now; once those markers are through,
    everything the procs printed so far is shown (aggregation windows end early)."""
    from ._logs import BARRIER_TIMEOUT
    from ._runtime import Kind
    from ._wait import request

    addrs = {addr for targets in cell.targets.values() for addr, _ in targets}
    alive = sorted(a for a in addrs if rt.node.dead_reason(a) is None)
    marks = []
    if alive:
        # A proc holding its GIL does not answer: not forever.
        answers = request(rt.node, alive, Kind.FlushOutput, timeout=min(BARRIER_TIMEOUT, 2.0),
                          description="the output barrier")
        marks = [(alive[i], body["m"]) for i, (ok, body, _) in answers.items() if ok and body.get("m")]
    if len(alive) < len(addrs):
        rt.logs.router.sync(1.0)  # procs that died: their last lines came before the exit notice
    rt.logs.barrier(marks)
    drain_output()


def _publish_slot(cell):
    """The display that later output of this cell goes into (main thread, inside the cell)."""
    try:
        _shell.display_pub.publish(data={"text/plain": ""}, metadata={}, transient={"display_id": cell.slot_id})
    except Exception:
        cell.slot_id = None


def route(chunks):
    """The kernel's log sink (see _logs.LogOutput): each chunk (cell, stream, text) goes to the
    cell it belongs to."""
    from . import _core

    publish = []
    with _cells_lock:
        cur = _current
        for cell, stream, text in chunks:
            if cur is not None and (cell == cur.token or not cell):
                _main_queue.append((stream, text))
                continue
            late = _recent.get(cell)
            if late is not None:
                _add_late(late, text)
                if cur is not None:  # the running cell's main thread publishes it, ordered
                    if not late.queued:
                        late.queued = True
                        _main_queue.append((_UPDATE, late))
                elif late not in publish:
                    publish.append(late)
            elif cur is not None:  # a cell with no slot, or another kernel's: the running cell shows it
                _main_queue.append((stream, text))
            else:
                _waiting.append((stream, text))
        queued = bool(_main_queue)
    if queued:
        if threading.current_thread() is threading.main_thread():
            drain_output()
        else:
            _core.call_on_main_thread()
    for late in publish:
        _publish_late(late)


def _add_late(cell, text):
    cell.late.append(text)
    cell.late_chars += len(text)
    while cell.late_chars > _SLOT_MAX_CHARS and len(cell.late) > 1:
        dropped = cell.late.pop(0)
        cell.late_chars -= len(dropped)
        cell.dropped_chars += len(dropped)
    cell.dirty = True


def _slot_text(cell):
    text = "".join(cell.late)
    if cell.dropped_chars:
        text = (f"[xmesh] {cell.dropped_chars} earlier characters are not shown here: mesh.logs() or "
                f"`xmesh logs NAME` have every line\n") + text
    return text


def _update_slot_here(cell):
    """While a cell runs: the update goes out on the main thread, like the cell's own output, so
    it is ordered before the cell's reply (nbclient applies updates only until then)."""
    with _cells_lock:
        cell.queued = False
        cell.dirty = False
        text = _slot_text(cell)
    try:
        _shell.display_pub.publish(data={"text/plain": text}, metadata={}, transient={"display_id": cell.slot_id},
                                   update=True)
    except Exception:
        pass


def _publish_late(cell, force=False):
    """While no cell runs: update_display_data of the cell's slot from this (runtime) thread
    through the kernel's side channel, at most every _SLOT_UPDATE_S (a timer sends the last)."""
    now = time.monotonic()
    with _cells_lock:
        if not cell.dirty:
            return
        if not force and now - cell.last_publish < _SLOT_UPDATE_S:
            t = threading.Timer(_SLOT_UPDATE_S, _publish_late, (cell, True))
            t.daemon = True
            t.start()
            return
        if _current is not None:  # a cell started meanwhile: its main thread sends it
            if not cell.queued:
                cell.queued = True
                _main_queue.append((_UPDATE, cell))
                from . import _core

                _core.call_on_main_thread()
            return
        cell.dirty = False
        cell.last_publish = now
        text = _slot_text(cell)
        parent = cell.header
    content = {"data": {"text/plain": text}, "metadata": {}, "transient": {"display_id": cell.slot_id}}
    try:
        import xmesh_kernel_iopub

        xmesh_kernel_iopub.publish("update_display_data", json.dumps(content), json.dumps(parent))
    except Exception:
        pass


def drain_output():
    """Writes the executing cell's queued remote output, on the main thread (elsewhere: no-op).
    Items are taken one at a time, so a drain that starts inside another (a pending call
    between two bytecodes) just carries on with the next item: nothing waits for a wake-up
    that was spent."""
    from ._logs import write_std

    if threading.current_thread() is not threading.main_thread():
        return
    while True:
        with _cells_lock:
            if not _main_queue:
                return
            stream, text = _main_queue.pop(0)
        if stream is _UPDATE:
            _update_slot_here(text)
            continue
        write_std(stream, text)


class _KernelIO(TerminalIO):
    """The prompt's I/O in a cell: output through the cell's stdout, lines from the input box."""

    def _wait_for_line(self, prompt):
        return input_request(prompt)


class _KernelFrontend:
    """The debugger prompt in a notebook cell: output in the cell, input through the Jupyter
    stdin channel (see _debug.TerminalFrontend)."""

    where = "this cell"
    leftover_input_note = "[xmesh] the input box above is no longer read: press Enter in it to close it\n"

    def io(self):
        return _KernelIO()

    def input_possible(self):
        return stdin_allowed()

    def show_pending_output(self):
        drain_output()


def stdin_allowed():
    return _stdin_allowed and _current is not None


def input_request(prompt):
    """A line from the Jupyter front end's input box (stdin channel), waited for without the
    GIL; an interrupt raises KeyboardInterrupt."""
    import xmesh_kernel_stdin

    sys.stdout.flush()
    sys.stderr.flush()
    return xmesh_kernel_stdin.input_request(prompt)


def _register_magics(shell):
    """%xmesh_debug opens the debugger prompt (xmesh.debug()); `%xmesh_debug post_mortem on|off`
    switches post-mortem stops for unhandled endpoint exceptions."""

    def xmesh_debug(line):
        from ._debug import debug

        words = line.split()
        if not words:
            return debug()
        if words[0] == "post_mortem" and len(words) == 2 and words[1] in ("on", "off"):
            debug.post_mortem(words[1] == "on")
            print(f"[xmesh] post-mortem debugging {words[1]}")
            return None
        raise ValueError(f"%xmesh_debug takes no argument or `post_mortem on|off`, got {line!r}")

    try:
        shell.register_magic_function(xmesh_debug, "line", "xmesh_debug")
    except Exception:
        pass


def _name_errors_by_their_class(shell):
    """An error's ename is its class name ("ActorError"), as ipykernel sends it; xeus-python
    0.14 sends str(type) ("<class 'xmesh._errors.ActorError'>")."""

    def _showtraceback(etype, evalue, stb):
        shell.last_error = [getattr(etype, "__name__", str(etype)), str(evalue), stb]

    shell._showtraceback = _showtraceback


def _keep_meshes_out_of_the_output_cache(shell):
    """A mesh shown as a cell's result is displayed but not stored in Out / _ : the output
    cache would otherwise keep every re-run's procs alive (unnamed allocations stop when their
    last handle goes)."""
    from ._actor import ActorMesh
    from ._proc_mesh import ProcMesh

    hook = shell.displayhook
    store = hook.update_user_ns

    def update_user_ns(result):
        if not isinstance(result, (ProcMesh, ActorMesh)):
            store(result)

    hook.update_user_ns = update_user_ns


def note_interrupted(future):
    """A wait on `future` was interrupted: a second interrupt while idle cancels it."""
    with _interrupted_lock:
        _interrupted.append(future)


def on_idle_interrupt():
    """An interrupt while no cell runs (the "second interrupt"): cancel the calls that the
    last interrupted wait left running."""
    with _interrupted_lock:
        pending = list(_interrupted)
        _interrupted.clear()
    for fut in pending:
        try:
            fut.cancel()
        except Exception:
            pass


def shutdown():
    """Shutdown or restart: unnamed meshes stop, named allocations stay for the next kernel."""
    from ._runtime import runtime_if_started

    rt = runtime_if_started()
    if rt is not None:
        rt.shutdown()
