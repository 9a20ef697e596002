"""`python -m xmesh.kernel -f CONNECTION_FILE`: serve one kernel (what a kernelspec's argv runs)."""
import argparse
import os
import sys


def main(argv: list) -> int:
    p = argparse.ArgumentParser(prog="python -m xmesh.kernel",
                                description="The xmesh Jupyter kernel (started by Jupyter through a kernelspec; "
                                            "`python -m xmesh.kernel install --help` writes one).")
    p.add_argument("-f", dest="connection_file", required=True, help="the connection file Jupyter wrote")
    args = p.parse_args(argv)
    if not os.path.isfile(args.connection_file):
        print(f"xmesh.kernel: no connection file at {args.connection_file}", file=sys.stderr)
        return 2
    import signal

    # Python's KeyboardInterrupt handler, also where SIGINT was inherited ignored (`nohup`): the
    # kernel routes SIGINT to it while a cell runs (kernel/interrupts.hpp).
    signal.signal(signal.SIGINT, signal.default_int_handler)
    # debugpy (the visual debugger) warns about frozen modules on stderr, which is a cell's.
    os.environ.setdefault("PYDEVD_DISABLE_FILE_VALIDATION", "1")
    from .. import _kernel_ext
    from .._kernel import interpreter as _interpreter

    _interpreter.connection_file = args.connection_file  # its name carries the kernel id the server knows

    try:
        _kernel_ext.serve(args.connection_file, sys.executable)
    except ValueError as e:
        print(f"xmesh.kernel: {e}", file=sys.stderr)
        return 2
    return 0
