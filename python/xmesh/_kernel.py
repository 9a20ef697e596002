"""The Python side of the xmesh Jupyter kernel. kernel/xmesh_interpreter.cpp calls `setup`
once the IPython shell exists, `on_idle_interrupt` for an interrupt while no cell runs, and
`shutdown` on a shutdown or restart request."""
import queue
import sys
import threading

_shell = None
_interrupted = []          # futures whose wait the last interrupt broke, ranks still running
_interrupted_lock = threading.Lock()


def in_kernel():
    return _shell is not None


def cancel_hint():
    if in_kernel():
        return "interrupt again or fut.cancel() to cancel them"
    return "fut.cancel() cancels them"


def setup(shell):
    global _shell
    _shell = shell
    _keep_meshes_out_of_the_output_cache(shell)
    _name_errors_by_their_class(shell)
    from . import _runtime

    _runtime.main_thread_output = queue.SimpleQueue()
    shell.events.register("post_run_cell", lambda *_: drain_output())


def drain_output():
    """Prints the remote output queued by runtime threads, on the calling (main) thread: while
    a cell waits on a future and when a cell ends. Output that arrives while no cell runs shows
    at the end of the next one (routing it into the cell that caused it is the logs issue)."""
    from . import _runtime

    q = _runtime.main_thread_output
    if q is None or threading.current_thread() is not threading.main_thread():
        return
    while True:
        try:
            stream, text = q.get_nowait()
        except queue.Empty:
            return
        out = sys.stderr if stream == "stderr" else sys.stdout
        try:
            out.write(text)
            out.flush()
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
