"""Monarch's manual bootstrap on one machine: worker processes started by hand with
run_worker_loop_forever(ipc://...), a host mesh of them from attach_to_workers, procs and actors
on it; and ProcessJob, which starts such workers for you."""
import os
import subprocess
import sys
import tempfile

from monarch.actor import Actor, attach_to_workers, endpoint
from monarch.job import ProcessJob


class Hello(Actor):
    @endpoint
    def hello(self) -> str:
        return "hello"


directory = tempfile.mkdtemp()
addresses = [f"ipc://{directory}/worker{i}" for i in range(2)]
code = ("import sys; from monarch.actor import run_worker_loop_forever; "
        "run_worker_loop_forever(address=sys.argv[1], ca='trust_all_connections')")
workers = [subprocess.Popen([sys.executable, "-c", code, a], env=dict(os.environ)) for a in addresses]
hosts = attach_to_workers(workers=addresses, ca="trust_all_connections")
answers = hosts.spawn_procs(per_host={"gpus": 2}).spawn("hello", Hello).hello.call().get()
print("4 procs on 2 workers:", sorted(answers.values()))
for w in workers:
    w.kill()
    w.wait()

job = ProcessJob({"trainers": 2})
state = job.state(cached_path=None)
answers = state.trainers.spawn_procs(per_host={"gpus": 1}).spawn("hello", Hello).hello.call().get()
print("ProcessJob's 2 hosts:", sorted(answers.values()))
job.kill()
