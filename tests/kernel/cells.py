"""Cell sources shared by the kernel tests: an actor class defined in the notebook itself, so
it travels to the procs by value (cloudpickle), as in real notebooks."""

COUNTER = '''
import os, random
from xmesh import Actor, endpoint, this_host, current_rank

class Counter(Actor):
    def __init__(self):
        self.value = 0
        self.token = random.random()

    @endpoint
    def incr(self):
        self.value += 1
        return self.value

    @endpoint
    def facts(self):
        return {"pid": os.getpid(), "id": id(self), "token": self.token, "value": self.value}

    @endpoint
    def fail(self):
        raise ValueError("bad value on rank %d" % current_rank().rank)

    @endpoint
    def die(self):
        os._exit(7)

    @endpoint
    def say(self, text):
        print(text, current_rank().rank, flush=True)
        return text

    @endpoint
    def spin(self, seconds):
        import time
        end = time.monotonic() + seconds
        while time.monotonic() < end:
            pass
        return "spun"
'''
