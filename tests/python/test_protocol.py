"""The protocol's one lists (runtime/kinds.def, runtime/errors.def) reach Python whole: the
message kinds through pybind11, the error kinds through the build's generated class; bodies
made on one side read on the other."""
import pytest

from xmesh import _core
from xmesh._protocol import ErrorKind, Kind, error, error_kind


def test_error_kinds_are_the_cpp_list():
    assert [(k.name, k.value) for k in ErrorKind] == _core.error_kinds()


def test_message_kinds_keep_their_numbers():
    assert (int(Kind.Hello), int(Kind.Refuse), int(Kind.Call), int(Kind.Reply)) == (1, 3, 10, 11)
    assert len(set(int(k) for k in Kind.__members__.values())) == len(Kind.__members__)


def test_error_bodies_round_trip():
    body = error(ErrorKind.NameTaken, "taken", shape={"gpus": 2})
    assert body == {"kind": "name_taken", "text": "taken", "shape": {"gpus": 2}}
    assert error_kind(body) is ErrorKind.NameTaken and ErrorKind.NameTaken == "name_taken"
    for strange in ({}, {"kind": 3}, {"kind": "no-such-kind"}, None, "supervision"):
        assert error_kind(strange) is None


@pytest.mark.parametrize("kind", list(ErrorKind))
def test_every_error_kind_reads_back(kind):
    assert error_kind(error(kind, "x")) is kind


def test_typed_bodies_cross_the_wire(tmp_path):
    """Built in Python from the C++ definitions, sent between two real nodes, read back typed;
    a body with a hole is refused with the field named."""
    from xmesh._protocol import Kind

    cookie = _core.random_hex(16)
    receiver = _core.Node("proc", f"ipc://{tmp_path}/r", cookie)
    sender = _core.Node("controller", f"ipc://{tmp_path}/s", cookie)
    for n in (receiver, sender):
        n.set_default_cookie(cookie)
        n.start()
    try:
        sent = [(Kind.Cancel, _core.CancelBody(corr=7, index=3)),
                (Kind.Configure, _core.ConfigureBody(post_mortem=True)),
                (Kind.Adopt, _core.AdoptBody(cookies=["c1", "c2"], refuse=["ipc://old"], refuse_text="taken")),
                (Kind.Reload, _core.ReloadBody(files=["/w/a.py", "/w/b.py"]))]
        for kind, body in sent:
            sender.send(receiver.addr, int(kind), body.to_dict())
        got = [receiver.control.pop(timeout=10) for _ in sent]
        cancel, configure, adopt, reload = got[0].cancel(), got[1].configure(), got[2].adopt(), got[3].reload()
        assert reload.files == ["/w/a.py", "/w/b.py"]
        assert (cancel.corr, cancel.index) == (7, 3)
        assert (configure.log_level, configure.post_mortem) == (None, True)
        assert (adopt.cookies, adopt.refuse, adopt.refuse_text) == (["c1", "c2"], ["ipc://old"], "taken")
        sender.send(receiver.addr, int(Kind.Cancel), {"corr": 7})
        with pytest.raises(ValueError, match="Cancel body without 'index'"):
            receiver.control.pop(timeout=10).cancel()
        sender.send(receiver.addr, int(Kind.Configure), {"log_level": "loud"})
        with pytest.raises(ValueError, match="'log_level' has the wrong type"):
            receiver.control.pop(timeout=10).configure()
    finally:
        sender.stop()
        receiver.stop()
