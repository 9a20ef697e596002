"""Whether a process runs, for the pid files and logs that name host agents and procs."""
import os

from . import _core


def pid_alive(pid):
    """True while pid runs. A zombie is dead: where the container's init reaps late (or never),
    a SIGKILLed host agent stays a zombie and would otherwise look alive, and a controller would
    wait on its socket instead of starting a new one."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # another user's process: it exists
    try:
        with open(f"/proc/{pid}/stat") as f:
            state = f.read().rsplit(")", 1)[1].split()[0]  # the name before ")" may hold spaces
    except (FileNotFoundError, ProcessLookupError):
        return False  # it ended between the two looks
    except (OSError, IndexError):
        return True
    return state not in ("Z", "X")


def running_agent_pid(runtime_dir):
    """The pid of the host agent that runs for runtime_dir (its pid file), or None."""
    try:
        with open(_core.layout_hostd_pid_file(runtime_dir)) as f:
            text = f.read().strip()
    except OSError:
        return None
    return int(text) if text.isdigit() and pid_alive(int(text)) else None
