from monarch.actor import Actor, endpoint, this_host
procs = this_host().spawn_procs({"gpus": 8})
class Example(Actor):
    @endpoint
    def say_hello(self, txt):
        return f"hello {txt}"
    @endpoint
    def say_bye(self, txt):
        raise Exception("saying bye is hard")
actors = procs.spawn("actors", Example)
hello_fut = actors.slice(gpus=slice(0, 4)).say_hello.call("world")
bye_fut = actors.slice(gpus=slice(4, 8)).say_bye.call("world")
print(hello_fut.get())          # a ValueMesh of 4 "hello world"
try:
    print(bye_fut.get())
except Exception:
    print("got an exception saying bye")
