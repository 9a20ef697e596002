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

    @endpoint
    def nap(self, seconds):
        import time
        time.sleep(seconds)  # one C call: a cancel cannot stop it
        return "rested"
'''

LOGGER = '''
import os, sys, time, traceback
from xmesh import Actor, endpoint, this_host, current_rank

class Logger(Actor):
    @endpoint
    def burst(self, n):
        r = current_rank().rank
        for i in range(n):
            print(f"burst r={r} i={i}")
        return n

    @endpoint
    def later(self, delay, text):
        time.sleep(delay)
        print(text, current_rank().rank, flush=True)
        return text

    @endpoint
    def report(self):
        print("epoch 3 done")
        print(f"loss=0.1{current_rank().rank}")

    @endpoint
    def fail_loudly(self, hold):
        print("before the traceback", flush=True)
        try:
            raise ValueError("boom")
        except ValueError:
            traceback.print_exc()
        time.sleep(hold)

    @endpoint
    def flood(self, n):
        r = current_rank().rank
        write = sys.stdout.write
        for i in range(n):
            write(f"r={r} seq={i}\\n")
        return n

    @endpoint
    def bars(self, steps, delay):
        from tqdm import tqdm
        r = current_rank().rank
        for i in tqdm(range(steps), mininterval=0, desc="train", ncols=70):  # on stderr
            time.sleep(delay * (1 + r))
            if i == steps // 2 and r == 0:
                tqdm.write("halfway on rank 0", file=sys.stderr)
        for p in range(0, 101, 20):
            print(f"\\rmanual {p}%", end="", flush=True)
            time.sleep(delay)
        print()
        print(f"after the bars {r}")
        return r
'''

# A mesh of four trainers whose step stops ranks 0, 2 and 3 in pdb (rank 1 sleeps, then returns):
# the debugger tests' cell.
TRAINER = '''
import time
from xmesh import Actor, endpoint, this_host, current_rank

class Trainer(Actor):
    @endpoint
    def step(self, x):
        y = x * 2 + current_rank().rank
        z = y + 1
        if current_rank().rank != 1:
            breakpoint()
        else:
            time.sleep(2)
        return y

procs = this_host().spawn_procs({"gpus": 4})
trainer = procs.spawn("trainer", Trainer)
trainer.initialized.get()
'''


def table_rows(text):
    """The rows of the debugger's table of stopped ranks, as lists of cell texts."""
    return [[c.strip() for c in line.strip("|").split("|")] for line in text.splitlines()
            if line.startswith("|") and "Actor Name" not in line]
