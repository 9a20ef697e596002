"""concurrent_endpoint: an actor takes its next message while earlier calls still await."""
import asyncio

from monarch.actor import Actor, concurrent_endpoint, this_host


class Gate(Actor):
    def __init__(self) -> None:
        self.waiting = 0
        self.event = None

    def _event(self) -> asyncio.Event:
        if self.event is None:
            self.event = asyncio.Event()
        return self.event

    @concurrent_endpoint
    async def wait(self, tag: str) -> str:
        self.waiting += 1
        await self._event().wait()
        return f"{tag} passed"

    @concurrent_endpoint
    async def open_when_all_wait(self, expected: int) -> int:
        # Only possible if the actor took this call while the others were still waiting.
        while self.waiting < expected:
            await asyncio.sleep(0.01)
        self._event().set()
        return self.waiting


procs = this_host().spawn_procs(per_host={"gpus": 1})
gate = procs.spawn("gate", Gate)
calls = [gate.wait.call_one(tag) for tag in ("first", "second", "third")]
print("waiting when opened:", gate.open_when_all_wait.call_one(3).get())
print("answers:", [c.get() for c in calls])
procs.stop().get()
