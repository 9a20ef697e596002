"""Threads of xmesh's own Python side. Each starts with the signals a program handles itself
blocked (so do the runtime's C++ threads: runtime/util.hpp, runtime_thread), so the kernel
delivers a process-directed one to the main thread, where Python runs its handlers: a SIGINT
given to another thread did not cut short a main thread blocked in input() (the debugger's
prompt missed a Ctrl-C now and then)."""
import signal
import threading

HANDLED_BY_THE_PROGRAM = {signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGQUIT, signal.SIGUSR1,
                          signal.SIGUSR2, signal.SIGALRM}


def start_thread(thread: threading.Thread) -> threading.Thread:
    """Starts `thread` with those signals blocked in it (it inherits the mask of the thread that
    starts it, whose own mask is back as it was once it has started); returns it."""
    old = signal.pthread_sigmask(signal.SIG_BLOCK, HANDLED_BY_THE_PROGRAM)
    try:
        thread.start()
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, old)
    return thread
