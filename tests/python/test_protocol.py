"""The protocol's one lists (runtime/protocol/kinds.def, runtime/protocol/errors.def) reach Python whole: the
message kinds through pybind11, the error kinds through the build's generated class; bodies
made on one side read on the other."""
import pytest

from xmesh import _core
from xmesh._base.protocol import ErrorKind, Kind, error, error_kind


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
    from xmesh._base.protocol import Kind

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


# One sample of every typed body: what each side writes, with the fields it may carry.
_SAMPLES = [
    _core.ErrorBody(kind="actor", text="boom", type="ValueError", traceback="tb", rank=2, coords={"gpus": 2}),
    _core.ProcExitedBody(alloc="ab", rank=1, pid=9, addr="ipc://p", text="killed", signal="SIGKILL"),
    _core.LogBody(alloc="ab", rank=0, stream="stderr", mark=3, eof=True),
    _core.PeerDeadBody(addr="ipc://p", error={"kind": "supervision", "text": "gone"}, host_lost=True),
    _core.SpawnProcsBody(alloc="1f", name="job", argv=["python3"], env={"A": "1"}, cwd="/",
                         ranks=[_core.SpawnRank(rank=0, coords={"hosts": 0}, env={"B": "2"})],
                         shape={"labels": ["hosts"], "sizes": [1]}, controller_pid=5),
    _core.SpawnProcsReply(alloc="1f", host="h", procs=[_core.ProcEntry(rank=0, pid=10, addr="ipc://p")], logdir="/l"),
    _core.StopProcsBody(name="job", immediately=True),
    _core.StopProcsReply(alloc="1f", name="job"),
    _core.AttachBody(name="job", observe=True),
    _core.AttachReply(alloc="1f", name="job", created=1.5, job_cookie="c",
                      procs=[_core.ProcEntry(rank=0, pid=10, alive=False)],
                      previous=_core.PreviousOwner(addr="ipc://c", pid=3, attached=True)),
    _core.StatusReply(pid=1, host="h", protocol=7, allocations=[
        _core.AllocationStatus(alloc="1f", name="job", stopping=True, procs=[_core.ProcEntry(rank=0, pid=10)])]),
    _core.ProcInfoBody(async_stacks=True),
    _core.ProcInfoReply(pid=4, actors=[_core.ActorRecord(actor_id="a.1f", name="a", shape="{}", proc_ranks=[0])],
                        async_stacks={"a\t0": [["f.py", 3, "g"]]}),
    _core.FlushOutputReply(m=12),
    _core.DumpStacksReply(stacks="Thread 0x1 (most recent call first):\n", labels={"1": "trainers\t0"}, pid=7),
    _core.DebugEventBody(ev="prompt", sid="4.1", out="> ", stop=True, stack=[["f.py", 3, "g"]], rank=0, line=3),
    _core.DebugCommandBody(sid="4.1", cmd="p x"),
    _core.DebugCommandBody(sid="*", resume=True, sources={"<cell>": "x = 1\n"}),
    _core.SpawnActorBody(name="trainers", class_name="Trainer", shape="{}", proc_ranks=[0, 1]),
    _core.RefuseBody(reason="wrong cookie", addr="ipc://x"),
    _core.ReloadReply(reloaded=["m"], failed=[["n", "SyntaxError"]], classes=2),
    _core.SyncStepBody(op="data", sid="ab12", pieces=[[0, 0, 10, 10, 0], [1, 0, 600, 90, 1]]),
    _core.SyncStepBody(op="plan", sid="ab12", base="00ff", digest="11ee", part=2, last=False),
    _core.SyncReply(added=1, changed=0, deleted=0, unchanged=3, kept=[]),
    _core.AllocationMeta(alloc="1f", name="job", host="h", created=2.5,
                         ranks={"0": _core.RankMeta(pid=10, coords={"gpus": 0})}),
]


@pytest.mark.parametrize("body", _SAMPLES, ids=lambda b: type(b).__name__)
def test_every_body_reads_back_what_was_written(body):
    again = type(body).from_dict(body.to_dict())
    assert again == body and again.to_dict() == body.to_dict()


def test_bodies_name_what_is_wrong():
    """Invariant protocol.2 (docs/architecture/02-protocol.md)."""
    with pytest.raises(TypeError, match=r"StopProcsBody\(\) has no field 'nmae'"):
        _core.StopProcsBody(nmae="job")
    with pytest.raises(ValueError, match="StopProcs body: names neither 'alloc' nor 'name'"):
        _core.StopProcsBody()
    with pytest.raises(ValueError, match="SpawnProcs body: 'ranks': SpawnProcs rank body: 'rank' has the wrong type"):
        _core.SpawnProcsBody.from_dict({"alloc": "1f", "argv": ["x"], "env": {}, "ranks": [{"rank": "0"}]})
    with pytest.raises(ValueError, match="'alloc' must be 1-16 lowercase hex digits"):
        _core.SpawnProcsBody(alloc="NOT HEX", argv=["x"], env={}, ranks=[_core.SpawnRank(rank=0)])
    with pytest.raises(ValueError, match="DebugEvent body: 'ev' is paused"):
        _core.DebugEventBody(ev="paused", sid="1")
    with pytest.raises(ValueError, match="AttachReply|Attach reply body without 'procs'"):
        _core.AttachReply.from_dict({"alloc": "1f", "name": "job"})
    with pytest.raises(TypeError, match="ErrorBody\\(\\) has no field 'colour'"):
        error(ErrorKind.Actor, "x", colour="red")


def test_a_newer_peers_extra_fields_are_ignored_on_the_wire():
    body = _core.StopProcsReply.from_dict({"alloc": "1f", "name": "", "added_later": [1, 2]})
    assert body.alloc == "1f" and "added_later" not in body.to_dict()
