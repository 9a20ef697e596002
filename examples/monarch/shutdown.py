"""shutdown_context() ends the client's runtime once the work is done."""
from monarch.actor import Actor, endpoint, shutdown_context, this_host


class Echo(Actor):
    @endpoint
    def echo(self, text: str) -> str:
        return text.upper()


procs = this_host().spawn_procs(per_host={"gpus": 2})
echoes = procs.spawn("echoes", Echo)
print(echoes.echo.call("bye").get().values())
shutdown_context().get()
print("shut down")
