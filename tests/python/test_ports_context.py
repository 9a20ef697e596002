"""Monarch's messaging and context on xmesh (issue 19), from `monarch.actor`: Channel / Port /
PortReceiver across procs and in actors, endpoints with an explicit response port, send() with
a port and a selection, context() (the actor, its rank, mesh, procs and creator, the message's
point and sender), get_or_spawn_controller (one actor per name, from the controller and its
actors), as_endpoint (a plain method called as an endpoint) and concurrent_endpoint."""
import asyncio
import os
import threading
import time

import pytest

import xmesh
import monarch.actor
from monarch.actor import (
    Actor, ActorError, Channel, Port, PortReceiver, SupervisionError, as_endpoint, concurrent_endpoint, context,
    current_actor_name, current_rank, endpoint, get_or_spawn_controller, send, this_host, this_proc,
)
from xmesh._runtime.process import report_fault

# The shim's default hook stops a script on a failure no owner handled, as Monarch's does; this
# test process says such failures and lives on (its tests end actors on purpose).
monarch.actor.unhandled_fault_hook = report_fault


class Worker(xmesh.Actor):
    """xmesh's Actor: sync and async endpoints mixed (monarch.actor.Actor refuses that, as Monarch)."""

    def __init__(self) -> None:
        self.held: "list[Port]" = []

    @endpoint
    def value(self, x: int) -> int:
        return x * 100 + context().actor_instance.rank.rank

    @endpoint
    def push(self, port: Port, n: int) -> None:
        """Streams n values to a port it was given."""
        me = context().actor_instance.rank.rank
        for i in range(n):
            port.send((me, i))

    @endpoint(explicit_response_port=True)
    def hold(self, port: Port, x: int) -> None:
        """Answers later: keeps the port until release() comes."""
        self.held.append((port, x))

    @endpoint
    def release(self) -> int:
        for port, x in self.held:
            port.send(x + 1)
        n, self.held = len(self.held), []
        return n

    @endpoint(explicit_response_port=True)
    async def twice(self, port: Port, x: int) -> None:
        await asyncio.sleep(0)
        port.send(x)
        try:
            port.send(x)
        except RuntimeError as e:
            print("second send refused:", e)

    @endpoint(explicit_response_port=True)
    def fails_before_answering(self, port: Port) -> None:
        raise KeyError("no answer")

    @endpoint
    def boom(self, x: int) -> int:
        raise ValueError(f"boom {x}")

    @endpoint
    def send_error(self, port: Port) -> None:
        port.exception(ZeroDivisionError("sent as an error"))

    @endpoint
    def send_unpicklable(self, port: Port) -> str:
        port.send("sent before")
        try:
            port.send(threading.Lock())  # does not pickle
        except TypeError as e:
            return str(e)
        return "sent"

    @endpoint
    async def gather_from_peers(self) -> list:
        """Opens a channel in the actor, asks the peers on the other host (through its own mesh)
        to push to it, awaits their values. (Not itself: it handles one message at a time.)"""
        port, receiver = Channel.open()
        peers = context().actor_instance.actor_mesh.slice(hosts=1)
        peers.push.broadcast(port, 2)
        return sorted([await receiver.recv() for _ in range(2 * len(peers))])

    @endpoint
    def about(self) -> dict:
        c = context()
        ins = c.actor_instance
        sender = c.message_sender
        return {"actor_id": ins.actor_id, "name": ins.name, "class_name": ins.class_name, "rank": dict(ins.rank),
                "message_rank": c.message_rank.rank, "proc_pids": ins.proc.initialized is None,
                "proc_mesh_sizes": ins.proc_mesh.sizes, "proc_sizes": ins.proc.sizes, "creator": repr(ins.creator),
                "current_actor_name": current_actor_name(), "sender_is_client": sender.is_client,
                "sender_pid": sender.pid}

    @endpoint
    def spawn_child(self) -> dict:
        child = this_proc().spawn("child", Child)
        return child.about.call_one().get(timeout=30)

    @endpoint
    def stop_me(self) -> str:
        context().actor_instance.stop()
        return "stopping"


class Child(Actor):
    @endpoint
    def about(self) -> dict:
        c = context()
        creator = c.actor_instance.creator
        return {"creator_name": creator.name, "creator_class": creator.class_name, "creator_rank": dict(creator.rank),
                "creator_creator": creator.creator, "sender_is_client": c.message_sender.is_client,
                "sender_pid": c.message_sender.pid, "pid": os.getpid(), "repr": repr(c.actor_instance)}


@pytest.fixture(scope="module")
def workers():
    procs = this_host().spawn_procs(per_host={"hosts": 2, "gpus": 2})
    mesh = procs.spawn("workers", Worker)
    mesh.initialized.get(timeout=60)
    yield mesh
    procs.stop()


def test_a_port_passed_to_actors_streams_their_values_in_order(workers):
    port, receiver = Channel.open()
    workers.push.broadcast(port, 3)
    got = [receiver.recv().get(timeout=30) for _ in range(12)]
    assert sorted(got) == [(r, i) for r in range(4) for i in range(3)]
    for r in range(4):  # one sender's values arrive in its order
        assert [i for rank, i in got if rank == r] == [0, 1, 2]
    # Nothing more came: a recv() times out, and the value sent after still arrives.
    later = receiver.recv()
    with pytest.raises(TimeoutError, match="nothing came within"):
        later.get(timeout=0.2)
    workers.slice(hosts=1, gpus=1).push.broadcast(port, 1)
    assert later.get(timeout=30) == (3, 0)


def test_await_recv_and_a_once_channel(workers):
    async def main():
        port, receiver = Channel.open(once=True)
        workers.slice(hosts=0, gpus=1).push.broadcast(port, 5)
        first = await receiver.recv()
        return first, receiver
    first, receiver = asyncio.run(main())
    assert first == (1, 0)
    with pytest.raises(RuntimeError, match="once=True and its one value was taken"):
        receiver.recv().get(timeout=0.3)  # a once port takes one value; the other four were dropped


def test_explicit_response_port_answers_a_call_later(workers):
    one = workers.slice(hosts=0, gpus=0)
    pending = one.hold.call_one(41)
    with pytest.raises(TimeoutError):
        pending.get(timeout=0.3)  # hold() returned without answering
    assert one.release.call_one().get(timeout=30) == 1
    assert pending.get(timeout=30) == 42
    # call() on several: each rank's port answers its own rank of the ValueMesh.
    pending = workers.hold.call(7)
    assert workers.release.call().get(timeout=30).values() == [1, 1, 1, 1]
    assert pending.get(timeout=30).values() == [8, 8, 8, 8]


def test_explicit_port_async_answers_once_and_an_error_ends_the_actor(workers):
    assert workers.twice.call(3).get(timeout=30).values() == [3, 3, 3, 3]
    # What a port's answer printed may come after the answer (no flush barrier): wait for it.
    deadline = time.monotonic() + 30
    while len(logs := workers.logs(grep="second send refused")) < 4 and time.monotonic() < deadline:
        time.sleep(0.05)
    assert len(logs) == 4 and "answers one call and already did" in logs[0].text
    # Raising instead of answering ends the actor, as in Monarch (nobody could receive the
    # error): its caller hears why, as a SupervisionError (a mesh of its own: the others live).
    procs = this_host().spawn_procs(per_host={"gpus": 1})
    lone = procs.spawn("lone", Worker)
    with pytest.raises(SupervisionError, match="KeyError: 'no answer'"):
        lone.fails_before_answering.call_one().get(timeout=30)
    with pytest.raises(SupervisionError, match="nobody could receive the error"):
        lone.value.call_one(1).get(timeout=30)
    procs.stop()


def test_send_answers_to_a_port_with_message_ranks(workers):
    port, receiver = Channel.open_ranked()
    send(workers.slice(gpus=1).value, (5,), {}, port=port)
    got = sorted(receiver.recv().get(timeout=30) for _ in range(2))
    assert got == [(0, 501), (1, 503)]  # the rank is the message's, in the slice it was sent to
    port, receiver = Channel.open()
    send(workers.value, (2,), port=port, selection="choose")
    assert receiver.recv().get(timeout=30) in {200, 201, 202, 203}
    with pytest.raises(TimeoutError):
        receiver.recv().get(timeout=0.3)  # choose: one answer only


def test_send_errors_and_bad_arguments(workers):
    port, receiver = Channel.open()
    send(workers.slice(hosts=0, gpus=1).boom, (9,), {}, port=port)
    with pytest.raises(ActorError, match="boom 9") as raised:
        receiver.recv().get(timeout=30)
    assert isinstance(raised.value.exception, ValueError) and raised.value.rank == 1
    workers.slice(hosts=0, gpus=0).send_error.broadcast(port)
    with pytest.raises(ActorError, match="sent as an error") as raised:
        receiver.recv().get(timeout=30)
    assert isinstance(raised.value.exception, ZeroDivisionError)
    assert "cannot be sent" in workers.slice(hosts=0, gpus=0).send_unpicklable.call_one(port).get(timeout=30)
    assert receiver.recv().get(timeout=30) == "sent before"
    with pytest.raises(ValueError, match="selection is 'all' or 'choose'"):
        send(workers.value, (1,), {}, port=port, selection="some")
    with pytest.raises(TypeError, match="needs an endpoint"):
        send(lambda: 0, ())
    with pytest.raises(TypeError, match="port is a Port"):
        send(workers.value, (1,), {}, port="not a port")
    with pytest.raises(TypeError, match="args is a tuple"):
        send(workers.value, [1])
    with pytest.raises(TypeError, match="takes an exception"):
        port.exception("text")
    with pytest.raises(TypeError, match="cannot be sent"):
        port.send(threading.Lock())
    assert isinstance(receiver, PortReceiver)


def test_a_channel_opened_in_an_actor_receives_from_its_peers(workers):
    got = workers.slice(hosts=0, gpus=0).gather_from_peers.call_one().get(timeout=30)
    assert got == [(2, 0), (2, 1), (3, 0), (3, 1)]


def test_context_names_the_actor_its_procs_and_the_message(workers):
    about = workers.slice(hosts=1).about.call().get(timeout=30).values()
    first = about[0]
    assert first["actor_id"].startswith("workers.") and first["actor_id"].endswith("[2]")
    assert first["current_actor_name"] == first["actor_id"]
    assert first["name"] == "workers" and first["class_name"].endswith(".Worker")
    assert [a["rank"] for a in about] == [{"hosts": 1, "gpus": 0}, {"hosts": 1, "gpus": 1}]
    assert [a["message_rank"] for a in about] == [0, 1]
    assert first["proc_mesh_sizes"] == {"hosts": 2, "gpus": 2} and first["proc_sizes"] == {}
    assert first["creator"] == "<root>"  # the program spawned it (Monarch's root)
    assert first["sender_is_client"] and first["sender_pid"] == os.getpid()
    client = context()
    assert client.actor_instance.actor_id == "root" == current_actor_name() and repr(client.actor_instance) == "<root>"
    assert client.message_rank.rank == 0 and len(client.message_rank) == 0 and client.message_sender is None
    assert current_rank().rank == 0


def test_an_actor_spawned_by_an_actor_knows_its_creator_and_sender(workers):
    about = workers.slice(hosts=0, gpus=1).spawn_child.call_one().get(timeout=60)
    assert about["creator_name"] == "workers" and about["creator_class"].endswith(".Worker")
    assert about["creator_rank"] == {"hosts": 0, "gpus": 1} and repr(about["creator_creator"]) == "<root>"
    assert not about["sender_is_client"] and about["sender_pid"] == about["pid"]  # its creator's proc called it
    assert about["repr"].startswith("<root>.<") and ".Worker workers{'hosts': 0/2, 'gpus': 1/2}>.<" in about["repr"]


def test_an_actor_stops_itself_and_its_peers_go_on():
    procs = this_host().spawn_procs(per_host={"gpus": 2})
    try:
        mesh = procs.spawn("stoppers", Worker)
        assert mesh.slice(gpus=0).stop_me.call_one().get(timeout=30) == "stopping"
        with pytest.raises(ActorError, match="stopped|no actor"):
            mesh.slice(gpus=0).value.call_one(1).get(timeout=30)
        assert mesh.slice(gpus=1).value.call_one(1).get(timeout=30) == 101
        with pytest.raises(RuntimeError, match="client is not an actor"):
            context().actor_instance.stop()
    finally:
        procs.stop()


class Tally(Actor):
    def __init__(self, start: int = 0) -> None:
        self.n = start

    @endpoint
    def add(self, k: int) -> "tuple[int, int]":
        self.n += k
        return self.n, os.getpid()


class Other(Actor):
    pass


class Client(Actor):
    @endpoint
    def add_to_tally(self, k: int) -> int:
        return get_or_spawn_controller("tally", Tally).get(timeout=30).add.call_one(k).get(timeout=30)[0]


def test_get_or_spawn_controller_is_one_actor_per_name_for_the_controller_and_its_actors(workers):
    tally = get_or_spawn_controller("tally", Tally, 100).get(timeout=30)
    assert tally.add.call_one(1).get(timeout=30) == (101, os.getpid())  # it lives in the controller
    procs = this_host().spawn_procs(per_host={"gpus": 3})
    try:
        clients = procs.spawn("clients", Client)
        assert sorted(clients.add_to_tally.call(1).get(timeout=60).values()) == [102, 103, 104]
    finally:
        procs.stop()
    again = get_or_spawn_controller("tally", Tally, 0).get(timeout=30)  # the arguments of the first spawn hold
    assert again.add.call_one(0).get(timeout=30)[0] == 104
    with pytest.raises(ActorError, match="is a Tally already") as raised:
        get_or_spawn_controller("tally", Other).get(timeout=30)
    assert isinstance(raised.value.exception, TypeError)
    with pytest.raises(TypeError, match="subclass of Actor"):
        get_or_spawn_controller("x", int)
    with pytest.raises(TypeError, match="needs a name"):
        get_or_spawn_controller("", Tally)


class Plain(Actor):
    def __init__(self) -> None:
        self.n = 0

    def bump(self, k: int) -> int:  # not an endpoint
        self.n += k
        return self.n

    async def abump(self, k: int) -> int:
        await asyncio.sleep(0)
        return self.bump(k)

    def answer_later(self, port: Port, x: int) -> None:
        port.send(x * 2)

    @endpoint
    def value(self) -> int:
        return self.n


def test_as_endpoint_calls_a_plain_method_and_a_plain_method_says_how():
    procs = this_host().spawn_procs(per_host={"gpus": 2})
    try:
        mesh = procs.spawn("plain", Plain)
        with pytest.raises(AttributeError, match="Plain.bump is not an endpoint: decorate it with @endpoint, or "
                                                 "call it as one with as_endpoint"):
            mesh.bump.call(1)
        with pytest.raises(RuntimeError, match="not an endpoint"):
            mesh.bump(1)
        assert as_endpoint(mesh.bump).call(3).get(timeout=30).values() == [3, 3]
        assert as_endpoint(mesh.slice(gpus=1).abump).call_one(2).get(timeout=30) == 5
        assert mesh.value.call().get(timeout=30).values() == [3, 5]
        assert as_endpoint(mesh.answer_later, explicit_response_port=True).call(21).get(timeout=30).values() == [42, 42]
        port, receiver = Channel.open()
        send(as_endpoint(mesh.slice(gpus=0).bump), (10,), {}, port=port)
        assert receiver.recv().get(timeout=30) == 13
        with pytest.raises(ValueError, match="expects a method of a spawned actor"):
            as_endpoint(mesh.value)
        with pytest.raises(AttributeError, match="has no endpoint 'nothing'"):
            mesh.nothing
    finally:
        procs.stop()


def test_a_call_whose_body_does_not_read_is_answered_with_the_reason(workers):
    """A Call body that does not read (a peer of another version, or hostile) is answered with
    the reason, never run with holes in it; the actor goes on."""
    from xmesh._base import pickling as _pickling
    from xmesh._runtime.process import Kind, get_runtime
    from xmesh._runtime.wait import wait_call

    targets, _ = workers.slice(hosts=0, gpus=0)._targets()
    node = get_runtime().node
    for bad, why in (({"labels": ["gpus"]}, "labels and sizes come together"),
                     ({"labels": ["gpus"], "sizes": [2], "rank": 5}, "rank is outside the extent"),
                     ({"reply_addr": "ipc:///nowhere"}, "reply_addr and reply_corr come together")):
        call = node.call(targets, int(Kind.Call), "value", bad, _pickling.dumps(((1,), {})), True)
        assert wait_call(call, 30, "a malformed call")
        [(index, ok, body, frames)] = call.take()
        assert not ok and "could not be read" in body["text"] and why in body["text"]
    assert workers.slice(hosts=0, gpus=0).value.call_one(1).get(timeout=30) == 100


class Overlapping(Actor):
    def __init__(self) -> None:
        self.running = 0
        self.most = 0
        self.gate: "asyncio.Event | None" = None  # made on the proc's loop, where the endpoints run

    def _gate(self) -> asyncio.Event:
        if self.gate is None:
            self.gate = asyncio.Event()
        return self.gate

    @concurrent_endpoint
    async def wait_for_gate(self, tag: str) -> str:
        self.running += 1
        self.most = max(self.most, self.running)
        try:
            await self._gate().wait()
        finally:
            self.running -= 1
        return f"{tag} through"

    @endpoint
    async def open_gate(self) -> int:
        self._gate().set()
        return self.running

    @endpoint
    async def most_at_once(self) -> int:
        return self.most

    @concurrent_endpoint
    async def fails(self) -> None:
        await asyncio.sleep(0)
        raise OSError("concurrent failure")

    @concurrent_endpoint(explicit_response_port=True)
    async def answers(self, port: Port, x: int) -> None:
        await asyncio.sleep(0)
        port.send(x + 1)

    @concurrent_endpoint
    async def forever(self) -> None:
        await asyncio.sleep(3600)


def test_concurrent_endpoints_run_several_calls_of_one_actor_at_once():
    procs = this_host().spawn_procs(per_host={"gpus": 1})
    try:
        mesh = procs.spawn("overlap", Overlapping)
        pending = [mesh.wait_for_gate.call_one(t) for t in ("a", "b", "c")]
        # The actor took open_gate while the three calls were still waiting at the gate.
        assert mesh.open_gate.call_one().get(timeout=30) == 3
        assert [p.get(timeout=30) for p in pending] == ["a through", "b through", "c through"]
        assert mesh.most_at_once.call_one().get(timeout=30) == 3
        with pytest.raises(ActorError, match="concurrent failure") as raised:
            mesh.fails.call_one().get(timeout=30)
        assert isinstance(raised.value.exception, OSError)
        assert mesh.answers.call_one(41).get(timeout=30) == 42
        stuck = mesh.forever.call_one()
        assert stuck.cancel()
        with pytest.raises(asyncio.CancelledError):
            stuck.get(timeout=30)
        assert mesh.most_at_once.call_one().get(timeout=30) == 3  # the actor goes on
    finally:
        procs.stop()


def test_concurrent_endpoint_refuses_what_it_cannot_run():
    with pytest.raises(ValueError, match="only wrap async endpoints"):
        concurrent_endpoint(lambda self: 0)
    with pytest.raises(ValueError, match="does not wrap @endpoint"):
        concurrent_endpoint(endpoint(lambda self: 0))


def test_an_explicit_port_endpoint_shows_the_parameters_callers_pass(workers):
    assert "Worker.hold(x: int) -> None" in repr(workers.hold)
    assert "Worker.value(x: int) -> int" in repr(workers.value)


def test_a_closed_receiver_says_so_and_a_ranked_view_shares_its_queue(workers):
    port, receiver = Channel.open()
    ranked = receiver.ranked()
    send(workers.slice(hosts=0, gpus=1).value, (3,), {}, port=port)
    # The plain port carries no rank: a send() answer through it is the message's rank (0 here).
    assert ranked.recv().get(timeout=30) == (0, 301)
    receiver.close()
    with pytest.raises(RuntimeError, match="this receiver was closed"):
        receiver.recv().get(timeout=1)
    with pytest.raises(RuntimeError, match="this receiver was closed"):
        ranked.recv().get(timeout=1)
