"""Mesh handles passed to actors are called from there, proc to proc; actors can spawn on
their own proc (this_proc)."""
import asyncio

import pytest
from actors_for_tests import Counter, Pinger, Ponger, Spawner

from xmesh import SupervisionError, this_host, this_proc


def test_ping_pong_between_meshes():
    pm = this_host().spawn_procs({"gpus": 2})
    pongers = pm.spawn("pongers", Ponger)
    pingers = pm.spawn("pingers", Pinger, pongers)
    vm = pingers.ping_all.call(7).get(timeout=30)
    assert list(vm.values()) == [["pong 7 from 0", "pong 7 from 1"]] * 2
    assert list(pingers.ping_one_async.call(3).get(timeout=30).values()) == ["pong 3 from 0", "pong 3 from 1"]
    pm.stop()


def test_this_proc_in_the_controller():
    local = this_proc().spawn("local", Counter, 5)
    assert local.incr.call_one(2).get(timeout=30) == 7

    async def main():
        return await local.aget.call_one()

    assert asyncio.run(main()) == 7


def test_a_controller_hosting_actors_answers_the_output_barrier():
    """Defect: the end-of-cell flush barrier to the controller's own node (this_proc() actors)
    went unanswered, so every such notebook cell waited out the barrier's 2 s at its end. A
    controller hosting actors answers every control message a proc answers.

    Invariant call.4 (docs/architecture/05-call-path.md).
    """
    from xmesh._runtime.process import Kind, get_runtime

    local = this_proc().spawn("barrier_local", Counter, 1)
    assert local.incr.call_one(1).get(timeout=30) == 2
    rt = get_runtime()
    for kind, body in ((Kind.FlushOutput, {}), (Kind.ProcInfo, {})):
        call = rt.node.call([(rt.node.addr, "")], int(kind), "", body, None, True)
        assert call.wait(30), f"the controller did not answer {kind.name}"
        (index, ok, body, _), = call.take()
        assert ok, body
        if kind == Kind.FlushOutput:
            assert body.get("m", 0) == 0  # no host agent reads its output: nothing to wait for
        else:
            assert "barrier_local" in [a["name"] for a in body["actors"]]
        rt.node.forget_call(call.id)


def test_a_control_message_nobody_handles_is_answered_with_an_error():
    """Invariant call.4 (docs/architecture/05-call-path.md)."""
    from xmesh._runtime.process import Kind, get_runtime

    pm = this_host().spawn_procs({"gpus": 1})
    pm.initialized.get(timeout=30)
    rt = get_runtime()
    addr = pm.allocation.procs[0].addr
    call = rt.node.call([(addr, "")], int(Kind.Status), "", {}, None, True)
    assert call.wait(30), "a proc left a request it does not serve unanswered"
    (_, ok, body, _), = call.take()
    assert not ok and body["kind"] == "unsupported" and "Status" in body["text"], body
    rt.node.forget_call(call.id)
    pm.stop()


def test_this_proc_inside_an_actor_spawns_on_the_same_proc():
    pm = this_host().spawn_procs({"gpus": 2})
    vm = pm.spawn("spawners", Spawner).spawn_child_and_call.call(41).get(timeout=30)
    for value, child_pid, parent_pid in vm.values():
        assert value == 42 and child_pid == parent_pid
    pm.stop()


def test_stopped_actor_mesh_fails_calls_clearly():
    pm = this_host().spawn_procs({"gpus": 1})
    c = pm.spawn("short_lived", Counter)
    assert c.incr.call_one().get(timeout=30) == 1
    c.stop().get(timeout=30)  # once stopped, calls say so (Monarch's words first)
    with pytest.raises(SupervisionError, match="Supervision event: actor Counter 'short_lived' rank 0 .*has status: "
                                               "stopped \\(its actor mesh was stopped"):
        c.get.call_one().get(timeout=30)
    # The proc lives on and hosts new actors.
    assert pm.spawn("next", Counter, 5).get.call_one().get(timeout=30) == 5
    pm.stop()
