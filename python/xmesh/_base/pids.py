"""Whether a process runs, for the pid files and logs that name host agents and procs."""

from .. import _core


def pid_alive(pid):
    """True while pid runs. A zombie is dead: where the container's init reaps late (or never),
    a SIGKILLed host agent stays a zombie and would otherwise look alive, and a controller would
    wait on its socket instead of starting a new one."""
    return _core.process_status(pid) is not None


UNUSUAL_STATES = {
    "stopped": "stopped (SIGSTOP, or held by a debugger): `kill -CONT {pid}` resumes it",
    "in the kernel": "blocked in the kernel (an uninterruptible wait: I/O, a driver)",
}


def unusual_state(pid: int) -> "str | None":
    """Why a process that runs here cannot answer, in words ("stopped (SIGSTOP...)"), or None
    when it runs normally; "gone" when it does not run at all."""
    st = _core.process_status(pid)
    if st is None:
        return "gone"
    return UNUSUAL_STATES[st[2]].format(pid=pid) if st[2] else None


def running_agent_pid(runtime_dir):
    """The pid of the host agent that runs for runtime_dir (its pid file), or None."""
    try:
        with open(_core.layout_hostd_pid_file(runtime_dir)) as f:
            text = f.read().strip()
    except OSError:
        return None
    return int(text) if text.isdigit() and pid_alive(int(text)) else None
