"""The xmesh side of the Jupyter kernel. kernel/xmesh_interpreter.cpp calls `setup` once the
IPython shell exists (_kernel.shell), `begin_cell` / `end_cell` around each execution,
`on_idle_interrupt` for an interrupt while no cell runs, and `shutdown` on a shutdown or
restart request; kernel/python_debugger.cpp calls `note_breakpoints`."""
import itertools
import json
import os
import re
import sys
import threading

from .._base.env import env_float
from .._debug.io import TerminalIO
from .._output.logs import summaries_html, write_std

_shell = None
_cells = None              # the CellOutput remote output goes through (_output/logs.py), made by setup
_interrupted = []          # futures whose wait the last interrupt broke, ranks still running
_interrupted_lock = threading.Lock()


def in_kernel():
    return _shell is not None


connection_file = ""  # set by `python -m xmesh.kernel -f FILE` before the kernel starts


def kernel_id(path: str) -> str:
    """The kernel id a Jupyter server gave this kernel: its connection file is kernel-ID.json."""
    m = re.fullmatch(r"kernel-([0-9A-Za-z-]+)\.json", os.path.basename(path or ""))
    return m.group(1) if m else ""


def cancel_hint():
    return "interrupt again while no cell runs to cancel them, or call .cancel() on the call's Future"


def setup(shell):
    global _shell
    _shell = shell
    _keep_meshes_out_of_the_output_cache(shell)
    _show_nothing_for_results_of_nothing(shell)
    _interrupt_awaits_like_waits(shell)
    _show_the_users_frames(shell)
    _register_magics(shell)
    from .. import _core
    from .._debug import io as _debug_io
    from .._output import logs as _logs
    from .._panel import view as _panel
    from .._runtime import process as _runtime
    from .._runtime import wait as _wait

    global _cells
    # Remote output goes to the cells (aggregated, within a display budget; one queue per
    # destination, _logs.CellOutput), and every call a cell sends is noted (its flush barrier
    # and whether the cell gets an output slot).
    _cells = _logs.CellOutput(_KernelCellSink())
    _runtime.set_output(True, _cells.route)
    _runtime.observe_calls(note_call)
    _debug_io.set_frontend(_KernelFrontend())
    _runtime.set_asker(_ask_in_the_cell)
    _panel.set_controller_kind("kernel", os.environ.get("JPY_SESSION_NAME", ""), kernel_id(connection_file))
    _core.set_main_thread_call(drain_output)
    # The one wait shows the cell's remote output whenever it is woken for it, and remembers
    # an interrupted wait (a second interrupt cancels its calls).
    _wait.add_output_hook(drain_output)
    _wait.add_interrupt_hook(note_interrupted)
    _wait.set_cancel_hint(cancel_hint)


# -- cells (DESIGN §6) -------------------------------------------------------------------------
# Each execution is a _Cell with a token that travels with its calls; its output reaches it
# through _cells (_logs.CellOutput), which this module feeds with the cells' beginnings and
# ends and which publishes through _KernelCellSink.

_cells_lock = threading.RLock()
_current = None            # the _Cell executing now
_token_prefix = None
_cell_numbers = itertools.count(1)
_stdin_allowed = False     # the executing request allows input_request (nbclient does not)


class _Cell:
    def __init__(self, token, header):
        self.token = token
        self.header = header
        self.targets = {}       # id(list) -> list of (addr, actor) the cell's calls went to
        self.calls = []         # the Calls expecting replies
        self.broadcasts = False


def _new_token():
    global _token_prefix
    if _token_prefix is None:
        from .. import _core

        _token_prefix = _core.random_hex(3)  # tells this kernel's cells from an earlier kernel's
    return f"{_token_prefix}.{next(_cell_numbers)}"


def begin_cell(header_json, allow_stdin=False):
    """Called by the kernel (C++) before a cell executes."""
    global _current, _stdin_allowed
    _stdin_allowed = bool(allow_stdin)
    from .._base import context as _context

    try:
        header = json.loads(header_json)
    except ValueError:
        header = {}
    cell = _Cell(_new_token(), header)
    with _cells_lock:
        _current = cell
    _context.controller_cell = cell.token
    if _cells is not None:
        count = getattr(_shell, "execution_count", None)
        _cells.begin_cell(cell.token, f"In [{count}]" if isinstance(count, int) else "")
    _explain_remote_breakpoints()


# -- breakpoints of the front end's debugger (kernel/python_debugger.cpp) -----------------------
_breakpoints = {}          # source path -> lines a front end's debugger set there
_breakpoints_explained = set()
_breakpoints_lock = threading.Lock()


def note_breakpoints(path, lines):
    """Control thread: a front end's debugger set these breakpoints in path (a cell's file)."""
    with _breakpoints_lock:
        _breakpoints[path] = set(lines)


def _explain_remote_breakpoints():
    """Main thread, around each cell: a breakpoint inside an endpoint would never fire (the
    endpoint runs on the procs); the user is told once per breakpoint, in the cell."""
    with _breakpoints_lock:
        wanted = {p: set(ls) for p, ls in _breakpoints.items() if ls}
    if not wanted:
        return
    from .._api.actor import endpoints_in_file

    for path, lines in wanted.items():
        for qualname, first, last in endpoints_in_file(path):
            for line in sorted(lines):
                if first <= line <= last and (path, line) not in _breakpoints_explained:
                    _breakpoints_explained.add((path, line))
                    cell = _shell.compile._filename_map.get(path) if _shell is not None else None
                    where = f"Cell In [{cell}], line {line}" if cell else f"{path}, line {line}"
                    write_std(2, f"[xmesh] the debugger's breakpoint at {where} is in the endpoint {qualname}, which "
                                 f"runs on the procs, not in this kernel: it will not stop there. Put breakpoint() "
                                 f"in the endpoint instead: xmesh's debugger stops every rank that reaches it.\n")


def note_call(targets, call, what=""):
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
    from .._base import context as _context
    from .._runtime.process import runtime_if_started

    cell = _current
    if cell is None:
        return
    _explain_remote_breakpoints()  # an actor class this cell defined
    rt = runtime_if_started()
    try:
        if rt is not None and rt.logs is not None:
            _flush_barrier(rt, cell)
    except KeyboardInterrupt:
        pass
    running = cell.broadcasts or any(not (c.done or c.fatal) for c in cell.calls)
    with _cells_lock:
        _current = None
        _context.controller_cell = ""
        cell.calls = []
        cell.targets = {}
    if _cells is not None:
        _cells.end_cell(cell.token, running, cell.header)


def _flush_barrier(rt, cell):
    """Every proc this cell called writes an output marker now; once those markers are through,
    everything the procs printed so far is shown (aggregation windows end early)."""
    from .. import _core
    from .._output.logs import barrier_timeout
    from .._runtime.process import Kind
    from .._runtime.wait import request

    addrs = {addr for targets in cell.targets.values() for addr, _ in targets}
    alive = sorted(a for a in addrs if rt.node.dead_reason(a) is None)
    marks = []
    if alive:
        # A proc holding its GIL does not answer: not forever.
        answers = request(rt.node, alive, Kind.FlushOutput, timeout=min(barrier_timeout(), 2.0),
                          description="the output barrier")
        answered = [(alive[i], _core.FlushOutputReply.from_dict(body).m) for i, (ok, body, _) in answers.items() if ok]
        marks = [(addr, m) for addr, m in answered if m]
    if len(alive) < len(addrs):
        rt.logs.router.sync(1.0)  # procs that died: their last lines came before the exit notice
    rt.logs.barrier(marks)
    drain_output()


def drain_output():
    """Writes the executing cell's queued remote output, on the main thread (elsewhere: no-op)."""
    if _cells is not None:
        _cells.drain()


class _KernelCellSink:
    """How output reaches a notebook (see _logs.CellSink): the executing cell's through its
    stdout/stderr and display publisher (main thread), a finished cell's slot through
    update_display_data on the kernel's side channel (kernel/iopub_side_channel.hpp)."""

    def write(self, stream, text):
        write_std(stream, text)

    def write_summaries(self, stream, lines):
        """A display between the cell's stream output: its text/plain the lines as a script
        prints them, its text/html with folds that open to each rank's line; its metadata names
        the stream it stands in ({"xmesh_output": "stdout"})."""
        sys.stdout.flush()
        sys.stderr.flush()  # the display goes after what was written before it
        try:
            _shell.display_pub.publish(data=self._data("".join(lines), summaries_html(lines, stream)),
                                       metadata={"xmesh_output": "stderr" if stream == 2 else "stdout"})
        except Exception:
            write_std(stream, "".join(lines))

    @staticmethod
    def _data(text, html):
        return {"text/plain": text, "text/html": html} if html else {"text/plain": text}

    def open_slot(self, slot_id, text="", html=""):
        try:
            _shell.display_pub.publish(data=self._data(text, html), metadata={}, transient={"display_id": slot_id})
            return True
        except Exception:
            return False

    def update_slot(self, slot_id, text, html=""):
        try:
            _shell.display_pub.publish(data=self._data(text, html), metadata={}, transient={"display_id": slot_id},
                                       update=True)
        except Exception:
            pass

    def publish_slot(self, slot_id, text, parent, html=""):
        content = {"data": self._data(text, html), "metadata": {}, "transient": {"display_id": slot_id}}
        try:
            from .. import _kernel_ext

            _kernel_ext.publish("update_display_data", json.dumps(content), json.dumps(parent))
        except Exception:
            pass


class _KernelIO(TerminalIO):
    """The prompt's I/O in a cell: output through the cell's stdout, lines from the input box."""

    def _wait_for_line(self, prompt):
        return input_request(prompt)

    def show_table(self, sessions):
        """An HTML table, like every xmesh display (text/plain: the terminal's table)."""
        from .._debug.io import format_table, html_stop_table

        sys.stdout.flush()  # the table goes after what the prompt wrote before it
        _shell.display_pub.publish(data={"text/plain": format_table(sessions), "text/html": html_stop_table(sessions)},
                                   metadata={})


class _KernelFrontend:
    """The debugger prompt in a notebook cell: output in the cell, input through the Jupyter
    stdin channel (see _debug.TerminalFrontend)."""

    where = "this cell"
    # jupyter_ext/src/prompts.ts looks for "input box is no longer read" (its LEFTOVER_MARK) to close
    # the box; tests/python/test_panel.py holds the two together.
    leftover_input_note = ("[xmesh] this cell's debugger input box is no longer read (the xmesh panel closes it; "
                           "elsewhere press Enter in it)\n")

    def io(self):
        return _KernelIO()

    def input_possible(self):
        return stdin_allowed()

    def show_pending_output(self):
        drain_output()


def _ask_in_the_cell(question):
    """A question (a job to replace...) in the executing cell's input box; None where the
    request allows no input (nbclient, `xmesh run`) or no cell runs: the caller refuses then."""
    if not stdin_allowed() or threading.current_thread() is not threading.main_thread():
        return None
    return input_request(question)


def stdin_allowed():
    return _stdin_allowed and _current is not None


def input_request(prompt):
    """A line from the Jupyter front end's input box (stdin channel), waited for without the
    GIL; an interrupt raises KeyboardInterrupt."""
    from .. import _kernel_ext

    sys.stdout.flush()
    sys.stderr.flush()
    return _kernel_ext.input_request(prompt)


def _register_magics(shell):
    """%xmesh_debug opens the debugger prompt (xmesh.debug()); `%xmesh_debug post_mortem on|off`
    switches post-mortem stops for unhandled endpoint exceptions. %xmesh shows this kernel's
    meshes with their ranks by state (the panel's view, as a table)."""

    def xmesh(line):
        from .._panel.view import status

        if line.strip():
            raise ValueError(f"%xmesh takes no argument, got {line!r}")
        return status()

    def xmesh_debug(line):
        from .._debug.controller import debug

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
        shell.register_magic_function(xmesh, "line", "xmesh")
    except Exception:
        pass


def _interrupt_awaits_like_waits(shell):
    """A cell with a top-level `await` runs on IPython's asyncio loop. Ctrl-C lands in the loop's
    select(), not where the cell waits: IPython's runner then abandoned the cell's coroutine
    mid-way (a later cell resumed it; the execution counter slipped) and showed asyncio's
    internals. This runner delivers the interrupt into the cell's task instead (_wait.interrupt_task):
    an xmesh future's await raises what get() raises, any other await a KeyboardInterrupt, and
    the cell ends as a cell interrupted in get() does."""
    import asyncio

    from IPython.core.async_helpers import get_asyncio_loop

    from .._runtime import wait as _wait

    def run_cell_coroutine(coro):
        loop = get_asyncio_loop()
        task = loop.create_task(coro)
        while True:
            try:
                return loop.run_until_complete(task)
            except KeyboardInterrupt:
                if task.done():
                    raise
                _wait.interrupt_task(task)

    def show_interrupted_await(shell, etype, value, tb, tb_offset=None):
        exc = (KeyboardInterrupt, _wait.as_interrupt(value), tb) if _wait.is_interrupt(value) else (etype, value, tb)
        shell.showtraceback(exc, tb_offset=tb_offset)

    shell.loop_runner = run_cell_coroutine
    shell.set_custom_exc((asyncio.CancelledError,), show_interrupted_await)


def _show_the_users_frames(shell):
    """Tracebacks in a cell show the user's frames: xmesh's own are left out (the frames of
    get(), the wait, the debugger's prompt), and an endpoint's frames from a notebook cell read
    "Cell In [n], line L" with their source, as IPython shows local ones."""
    import linecache
    import re

    from .._base.errors import hide_internal_frames, set_remote_traceback_filter

    get_exc_info = shell._get_exc_info

    def _get_exc_info(exc_tuple=None):
        etype, value, tb = get_exc_info(exc_tuple)
        if isinstance(value, BaseException):
            value.__traceback__ = tb
            tb = hide_internal_frames(value)
        return etype, value, tb

    frame_line = re.compile(r'^(\s*)File "([^"]+)", line (\d+), in (.*)$')

    def cells_in(text):
        out = []
        lines = text.splitlines(keepends=True)
        for i, line in enumerate(lines):
            m = frame_line.match(line.rstrip("\n"))
            cell = m and shell.compile._filename_map.get(m.group(2))
            if not cell:
                out.append(line)
                continue
            indent, filename, lineno = m.group(1), m.group(2), int(m.group(3))
            out.append(f"{indent}Cell In [{cell}], line {lineno}, in {m.group(4)}\n")
            source = linecache.getline(filename, lineno).strip()
            has_source = i + 1 < len(lines) and lines[i + 1].startswith(indent + "    ")
            if source and not has_source:
                out.append(f"{indent}  {source}\n")
        return "".join(out)

    shell._get_exc_info = _get_exc_info
    set_remote_traceback_filter(cells_in)


def _show_nothing_for_results_of_nothing(shell):
    """`actors.step.call().get()` of endpoints that return nothing is a ValueMesh of None: as a
    cell's last expression it shows nothing, as IPython shows nothing for None."""
    from .._base.value_mesh import ValueMesh

    hook = shell.displayhook

    class DisplayHook(type(hook)):
        def __call__(self, result=None):
            if isinstance(result, ValueMesh) and all(v is None for v in result.values()):
                return
            super().__call__(result)

    hook.__class__ = DisplayHook  # the hook IPython installs during each cell, now with the rule


def _keep_meshes_out_of_the_output_cache(shell):
    """A mesh shown as a cell's result is displayed but not stored in Out / _ : the output
    cache would otherwise keep every re-run's procs alive (unnamed allocations stop when their
    last handle goes)."""
    from .._api.actor import ActorMesh
    from .._api.proc_mesh import ProcMesh

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
    from .._runtime.process import runtime_if_started
    from .._base.shape import ranks_text

    with _interrupted_lock:
        pending = list(_interrupted)
        _interrupted.clear()
    rt = runtime_if_started()
    # Newest first: a call queued behind a running one must be marked cancelled on its procs
    # before the running call's cancel frees the actor to start it (one sender's messages keep
    # their order, and the procs handle Cancel in that order).
    cancelled = []
    for fut in reversed(pending):
        try:
            ranks = fut.pending_ranks()
            if fut.cancel() and rt is not None:  # said in the cell that made the call
                rt.diag(f"interrupt: cancelled {fut.description} on {ranks_text(ranks)}", cell=fut.cell)
                cancelled.append(fut)
        except Exception:
            pass
    if cancelled:
        timer = threading.Timer(env_float("XMESH_CANCEL_CHECK_S", 1.0), _say_still_running, (rt, cancelled))
        timer.daemon = True
        timer.start()


def _say_still_running(rt, futures):
    """A moment after a cancel: the ranks that have not ended the call (a sync endpoint inside a
    C call cannot be interrupted) are said where the call was made, with what it means for the
    calls after it."""
    from .._base.shape import ranks_text

    for fut in futures:
        ranks = fut.lingering_ranks()
        if ranks:
            one = len(ranks) == 1
            rt.diag(f"{ranks_text(ranks)} {'is' if one else 'are'} still running {fut.description}: a cancel stops "
                    f"Python code at its next line, but {'it is' if one else 'they are'} inside a C call (time.sleep, "
                    f"a blocking read, a GPU wait) that runs on until it returns; calls sent to "
                    f"{'that actor' if one else 'those actors'} meanwhile wait behind it", cell=fut.cell)


def shutdown():
    """Shutdown or restart: unnamed meshes stop, named allocations stay for the next kernel."""
    from .._runtime.process import runtime_if_started

    rt = runtime_if_started()
    if rt is not None:
        rt.shutdown()
