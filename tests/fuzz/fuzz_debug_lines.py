"""atheris (libFuzzer for Python) target: the JSON lines of `xmesh debug`'s socket, both ways.
The controller's side reads a client's lines (RemoteIO.read) and the client's side reads a
controller's (run_client); whatever bytes come, each must end with an answer, a refusal of the
line or the end of input, never an exception, a hang or unbounded memory.
Usage: fuzz_debug_lines.py --seed DIR | [libFuzzer options] CORPUS..."""
import io
import os
import socket
import sys
import threading

import atheris

with atheris.instrument_imports(include=["xmesh._debug.remote"]):
    from xmesh._debug import remote as _debug_remote

SEEDS = {
    "line": b'{"line": "attach stopper 2"}\n{"line": "continue"}\n',
    "long": b'{"line": "' + b"x" * 70000 + b'"}\n{"line": "where"}\n',
    "bad": b'{"line": 3}\n[1, 2]\nnot json\n{"other": 1}\n',
    "out": b'{"out": "[xmesh] attached\\n"}\n{"read": "xmesh_dbg> "}\n',
    "odd": b'{"out": 5}\n{"read": null}\n\xff\xfe\n',
}


def controller_side(data: bytes) -> None:
    """A client's bytes, read by the controller's prompt until the client leaves."""
    mine, theirs = socket.socketpair()
    theirs.sendall(data[:1 << 16])  # within one socket buffer: the test writes, then reads
    theirs.shutdown(socket.SHUT_WR)

    def drain() -> None:  # a client reads what the prompt says (else its sends wait SEND_TIMEOUT_S)
        while theirs.recv(1 << 16):
            pass

    reader = threading.Thread(target=drain)
    reader.start()
    io_ = _debug_remote.RemoteIO(mine, os.getpid())
    try:
        for _ in range(10000):
            line = io_.read("xmesh_dbg> ")
            assert isinstance(line, str)
    except EOFError:
        pass
    finally:
        io_.close()
        mine.close()
        reader.join()
        theirs.close()


def client_side(data: bytes) -> None:
    """A controller's bytes, read by `xmesh debug` (which answers prompts from stdin)."""
    path = f"/tmp/xmesh-fuzz-debug-{os.getpid()}.sock"
    if os.path.exists(path):
        os.unlink(path)
    server = socket.socket(socket.AF_UNIX)
    server.bind(path)
    server.listen(1)
    try:
        def serve() -> None:  # the controller: everything at once, then it leaves
            conn, _ = server.accept()
            conn.sendall(data[:1 << 16])
            conn.close()

        t = threading.Thread(target=serve)
        t.start()
        r, w = os.pipe()
        os.close(w)  # the user's input: at its end at once (a prompt is left)
        with os.fdopen(r) as stdin:
            rc = _debug_remote.run_client(path, stdin=stdin, stdout=io.StringIO())
        t.join()
        assert rc in (0, 1)
    finally:
        server.close()
        os.unlink(path)


def test_one_input(data: bytes) -> None:
    controller_side(data)
    client_side(data)


def main() -> None:
    if len(sys.argv) == 3 and sys.argv[1] == "--seed":
        os.makedirs(sys.argv[2], exist_ok=True)
        for name, data in SEEDS.items():
            with open(os.path.join(sys.argv[2], name), "wb") as f:
                f.write(data)
        return
    atheris.Setup(sys.argv, test_one_input)
    atheris.Fuzz()


if __name__ == "__main__":
    main()
