"""Mesh handles passed to actors are called from there, proc to proc; actors can spawn on
their own proc (this_proc)."""
import asyncio

from actors_for_tests import Counter, Pinger, Ponger

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
