"""Monarch's supervision: an error the caller receives is an ActorError and the actor lives on;
a BaseException, or an error nobody can receive (a broadcast's), ends the actor: its later calls
raise SupervisionError (a RuntimeError) and its failure reaches unhandled_fault_hook; other
actors go on."""
import time

import monarch.actor
from monarch.actor import Actor, ActorError, endpoint, this_host

failures: list = []
monarch.actor.unhandled_fault_hook = failures.append


class Fatal(BaseException):
    pass


class Worker(Actor):
    @endpoint
    def ok(self) -> str:
        return "ok"

    @endpoint
    def app_error(self) -> None:
        raise ValueError("an error its caller receives")

    @endpoint
    def fatal(self) -> None:
        raise Fatal("a BaseException")

    @endpoint
    def unreceived(self) -> None:
        raise ValueError("nobody can receive this")


procs = this_host().spawn_procs(per_host={"gpus": 1})
alpha = procs.spawn("alpha", Worker)
beta = procs.spawn("beta", Worker)
gamma = procs.spawn("gamma", Worker)
try:
    alpha.app_error.call_one().get()
except ActorError as e:
    print("the caller gets an ActorError:", type(e).__name__, "Actor call alpha.app_error failed" in str(e))
print("the actor lives on:", alpha.ok.call_one().get())
try:
    alpha.fatal.call_one().get()
except RuntimeError as e:
    print("a BaseException ends it:", type(e).__name__, "and all its descendants have failed" in str(e))
try:
    alpha.ok.call_one().get()
except RuntimeError as e:
    print("its later calls fail:", type(e).__name__)
beta.unreceived.broadcast()
deadline = time.monotonic() + 60
while len(failures) < 2 and time.monotonic() < deadline:
    time.sleep(0.1)
try:
    beta.ok.call_one().get()
except RuntimeError as e:
    print("an unreceived error ended beta:", type(e).__name__)
heard = {f.mesh_name.split("-")[0]: f for f in failures}  # Monarch's mesh names carry a suffix: alpha-Xy1...
print("the hook heard of alpha and beta:", "alpha" in heard and "beta" in heard)
print("each says why:", all("and all its descendants have failed" in heard[n].report() for n in ("alpha", "beta")))
print("gamma goes on:", gamma.ok.call_one().get())
