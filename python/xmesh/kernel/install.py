"""`python -m xmesh.kernel install`: the kernelspec of this Python's kernel, written where
ipykernel's flags say (--user, --sys-prefix, --prefix P; none: the system's)."""
import argparse
import json
import os
import shutil
import sys
import tempfile
from typing import Optional


DEFAULT_NAME = "xmesh"
DEFAULT_DISPLAY_NAME = "Python 3 (xmesh)"


def user_data_dir() -> str:
    """Jupyter's per-user data directory (JUPYTER_DATA_DIR, else XDG's)."""
    if os.environ.get("JUPYTER_DATA_DIR"):
        return os.environ["JUPYTER_DATA_DIR"]
    base = os.environ.get("XDG_DATA_HOME") or os.path.join(os.path.expanduser("~"), ".local", "share")
    return os.path.join(base, "jupyter")


def kernels_dir(user: bool = False, prefix: Optional[str] = None) -> str:
    """Where a kernelspec goes: the user's data directory, a prefix's share/jupyter, or the
    system's (/usr/local/share/jupyter), as jupyter_client's KernelSpecManager places them."""
    if user:
        return os.path.join(user_data_dir(), "kernels")
    return os.path.join(prefix or "/usr/local", "share", "jupyter", "kernels")


def kernel_spec(display_name: str, python: str, env: dict) -> dict:
    return {"argv": [python, "-m", "xmesh.kernel", "-f", "{connection_file}"],
            "display_name": display_name, "language": "python", "interrupt_mode": "signal",
            "env": env, "metadata": {"debugger": True}}


def install(user: bool = False, prefix: Optional[str] = None, name: str = DEFAULT_NAME,
            display_name: str = DEFAULT_DISPLAY_NAME, env: Optional[dict] = None,
            python: Optional[str] = None) -> str:
    """Writes the kernelspec (kernel.json and the logos) and returns its directory; raises
    PermissionError naming the directory it cannot write."""
    from .logo import write_logos

    if not name or any(c in name for c in "/\\") or name.startswith("."):
        raise ValueError(f"a kernel's name is a plain directory name, not {name!r}")
    target = os.path.join(kernels_dir(user, prefix), name.lower())
    spec = kernel_spec(display_name, python or sys.executable, dict(env or {}))
    staging = None
    try:
        os.makedirs(os.path.dirname(target), exist_ok=True)
        staging = tempfile.mkdtemp(prefix=f".{name}-", dir=os.path.dirname(target))
        with open(os.path.join(staging, "kernel.json"), "w") as f:
            json.dump(spec, f, indent=1)
        write_logos(staging)
        os.chmod(staging, 0o755)
        if os.path.isdir(target):
            shutil.rmtree(target)
        os.replace(staging, target)
        staging = None
    except PermissionError as e:
        where = e.filename or os.path.dirname(target)
        raise PermissionError(f"cannot write the kernelspec in {where}: permission denied (install it for this user "
                              f"with --user, or into this environment with --sys-prefix)") from None
    finally:
        if staging:
            shutil.rmtree(staging, ignore_errors=True)
    return target


def main(argv: list) -> int:
    p = argparse.ArgumentParser(prog="python -m xmesh.kernel install",
                                description="Install the xmesh kernel's kernelspec for this Python.")
    where = p.add_mutually_exclusive_group()
    where.add_argument("--user", action="store_true", help="for the current user only (Jupyter's data directory)")
    where.add_argument("--sys-prefix", action="store_true", help=f"into this environment ({sys.prefix})")
    where.add_argument("--prefix", help="into PREFIX/share/jupyter/kernels")
    p.add_argument("--name", default=DEFAULT_NAME, help=f"the kernelspec's name (default {DEFAULT_NAME})")
    p.add_argument("--display-name", default=DEFAULT_DISPLAY_NAME,
                   help=f"the name front ends show (default {DEFAULT_DISPLAY_NAME!r})")
    p.add_argument("--env", nargs=2, action="append", default=[], metavar=("NAME", "VALUE"),
                   help="an environment variable the kernel is started with (repeatable)")
    args = p.parse_args(argv)
    prefix = sys.prefix if args.sys_prefix else args.prefix
    try:
        path = install(args.user, prefix, args.name, args.display_name, dict(args.env))
    except (PermissionError, ValueError, OSError) as e:
        print(f"xmesh.kernel install: {e}", file=sys.stderr)
        return 1
    print(f"Installed kernelspec {args.name.lower()} in {path}")
    return 0
