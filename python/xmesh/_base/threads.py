"""Threads of xmesh's own Python side that run no user code (the control server, the log pump,
the debug servers, the workspace watcher...). Each starts with SIGINT blocked (so do the
runtime's C++ threads: runtime/base/util.hpp, runtime_thread), so the kernel delivers a
process-directed SIGINT to the main thread, where Python raises KeyboardInterrupt: one given to
another thread does not cut short a main thread blocked in input() (the debugger's prompt). Threads that run user code (actors, their asyncio loop) and those that start
processes keep it: a child inherits its parent thread's mask, and Python's subprocess does not
reset it."""
import signal
import threading

# Actors named with this prefix are xmesh's own (the controller's registry): their threads run no
# user code, so they start as xmesh's other threads do.
OWN_ACTOR_PREFIX = "xmesh-"


def start_thread(thread: threading.Thread) -> threading.Thread:
    """Starts `thread` with SIGINT blocked in it (it inherits the mask of the thread that starts
    it, whose own mask is back as it was once it has started); returns it."""
    return _start(thread, signal.SIG_BLOCK)


def start_user_thread(thread: threading.Thread) -> threading.Thread:
    """Starts a thread that runs user code with SIGINT not blocked, whichever thread starts it
    (an actor's thread is started from xmesh's own event thread). The new thread unblocks it
    itself, first thing: the starting thread's own mask never opens, not even while the new one
    runs before the starter is scheduled again."""
    run = thread.run

    def run_with_sigint() -> None:
        signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT})
        run()

    setattr(thread, "run", run_with_sigint)  # this thread only: its class's run() stays as it is
    thread.start()
    return thread


def _start(thread: threading.Thread, how: int) -> threading.Thread:
    old = signal.pthread_sigmask(how, {signal.SIGINT})
    try:
        thread.start()
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, old)
    return thread
