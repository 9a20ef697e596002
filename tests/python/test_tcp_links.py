"""TCP links between nodes (issue 20): with the cluster's key file every byte on the wire is
encrypted (a marker passed as an argument never appears in what a relay in the middle sees, while
the call still arrives); without one, on loopback, it would. The nodes are the runtime's own
(`_core.Node`); the relay is a plain TCP forwarder that records both directions."""
import socket
import threading

from xmesh import _core
from xmesh._base import pickling as _pickling
from xmesh._runtime.process import Kind

MARKER = b"xmesh-marker-7f3a9c-must-not-leak"


class Relay:
    """Forwards TCP connections on a loopback port of its own (port, 0: any) to target (host,
    port), keeping every byte; also `ssh -L port:host:target_port` in a namespace's program."""

    def __init__(self, target_port: int, target_host: str = "127.0.0.1", port: int = 0) -> None:
        self.seen = bytearray()
        self._lock = threading.Lock()
        self._server = socket.create_server(("127.0.0.1", port))
        self.port = self._server.getsockname()[1]
        self._target = (target_host, target_port)
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self._server.accept()
            except OSError:
                return
            upstream = socket.create_connection(self._target)
            for a, b in ((client, upstream), (upstream, client)):
                threading.Thread(target=self._pump, args=(a, b), daemon=True).start()

    def _pump(self, src: socket.socket, dst: socket.socket) -> None:
        try:
            while data := src.recv(65536):
                with self._lock:
                    self.seen += data
                dst.sendall(data)
        except OSError:
            pass
        finally:
            for s in (src, dst):
                try:
                    s.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass

    def close(self) -> None:
        self._server.close()


def call_through_relay(key_file: str) -> "tuple[bytes, dict]":
    """A call carrying MARKER from one node to another through a relay; (bytes the relay saw,
    the answer's body). The target has no such actor: it answers 'no actor', which is enough to
    know the message arrived and was read."""
    a = _core.Node("controller", "tcp://127.0.0.1:*", "cookie", key_file)
    b = _core.Node("proc", "tcp://127.0.0.1:*", "cookie", key_file)
    for n in (a, b):
        n.set_default_cookie("cookie")
        n.start()
    relay = Relay(int(b.addr.rsplit(":", 1)[1]))
    try:
        call = a.call([(f"tcp://127.0.0.1:{relay.port}", "nobody")], int(Kind.Call), "method", None,
                      _pickling.dumps((MARKER,)), True)
        assert call.wait(10), "the call through the relay was not answered"
        [(index, ok, body, frames)] = call.take()
        assert not ok
        return bytes(relay.seen), body
    finally:
        relay.close()
        a.stop()
        b.stop()


def test_a_key_file_encrypts_what_travels_and_plaintext_would_show_it(tmp_path, monkeypatch):
    monkeypatch.setenv("XMESH_ACTOR_WAIT_MS", "200")  # 'no actor' comes after this wait for a spawn
    key = str(tmp_path / "cluster.key")
    _core.write_new_key_file(key)
    seen, body = call_through_relay(key)
    assert "no actor named 'nobody'" in body["text"]  # it arrived and was read
    assert len(seen) > 100 and MARKER not in seen and b"cookie" not in seen
    # The same on loopback without a key (a cookie only): the relay reads it all.
    seen_plain, body_plain = call_through_relay("")
    assert "no actor named 'nobody'" in body_plain["text"]
    assert MARKER in seen_plain


def test_a_link_that_gets_no_answer_says_how_far_it_got(tmp_path, monkeypatch):
    """A peer that does not answer is described by what its link did (the message a controller
    gives when a host agent does not answer): nothing opened, a TCP connection whose CURVE
    handshake got no answer (a port that accepts and stays silent), a handshake done."""
    monkeypatch.setenv("XMESH_ACTOR_WAIT_MS", "100")  # "no such actor" at once, not after 10 s
    key = str(tmp_path / "cluster.key")
    _core.write_new_key_file(key)
    silent = socket.create_server(("127.0.0.1", 0))
    held = []
    threading.Thread(target=lambda: held.append(silent.accept()), daemon=True).start()
    a = _core.Node("controller", "tcp://127.0.0.1:*", "cookie", key)
    b = _core.Node("proc", "tcp://127.0.0.1:*", "cookie", key)
    for n in (a, b):
        n.set_default_cookie("cookie")
        n.start()
    try:
        quiet = f"tcp://127.0.0.1:{silent.getsockname()[1]}"
        assert a.link_report(quiet) == "no link to it is open"
        a.expect_listening(quiet)
        call = a.call([(quiet, "nobody")], int(Kind.Call), "method", None, _pickling.dumps(()), True)
        assert not call.wait(1.5)
        report = a.link_report(quiet)
        assert report.startswith("a TCP connection to it was made but the handshake did not finish"), report
        assert "messages sent to it not acknowledged" in report, report  # its Hello and the call
        answered = a.call([(b.addr, "nobody")], int(Kind.Call), "method", None, _pickling.dumps(()), True)
        assert answered.wait(10)
        assert a.link_report(b.addr).startswith("its handshake succeeded"), a.link_report(b.addr)
    finally:
        a.stop()
        b.stop()
        silent.close()
