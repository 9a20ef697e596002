"""Environment knobs (XMESH_*): read one way everywhere. A malformed value falls back to the
default, as the C++ side's env_int does, so a typo never crashes a program or a proc."""
import os


def env_float(name: str, default: float) -> float:
    try:
        return float(os.environ.get(name, default))
    except ValueError:
        return float(default)


def env_seconds_from_ms(name: str, default_ms: float) -> float:
    """A knob given in milliseconds, in seconds."""
    return env_float(name, default_ms) / 1000.0
