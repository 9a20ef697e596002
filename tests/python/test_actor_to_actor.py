"""Mesh handles passed to actors are called from there, proc to proc; actors can spawn on
their own proc (this_proc)."""
import asyncio

import pytest
from actors_for_tests import Counter, Pinger, Ponger, Spawner

from xmesh import this_host, this_proc


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
    c.stop()
    with pytest.raises(Exception, match="no actor named 'short_lived"):
        c.get.call_one().get(timeout=30)
    # The proc lives on and hosts new actors.
    assert pm.spawn("next", Counter, 5).get.call_one().get(timeout=30) == 5
    pm.stop()
