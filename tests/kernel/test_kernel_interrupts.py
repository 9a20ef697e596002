"""Interrupts in the kernel: an interrupt raises in the waiting cell and a second one cancels, a
cancel that cannot stop a C call says so, an idle interrupt is harmless, a kernel started with
SIGINT ignored is still interruptible, interrupting a top-level await is like interrupting
get(), and a call queued behind an interrupted one says so. A proc killed while idle is said
about the cell that last used its mesh."""
import json
import os
import time

from cells import COUNTER


def _interrupt_a_waiting_cell(kernel, call, wait="fut.get()"):
    """Spawns two counters, runs `fut = <call>` and then `wait` in one cell, interrupts that cell
    once it waits; the cell's result (and how long the interrupt took to end it)."""
    kernel.ok(COUNTER + 'procs = this_host().spawn_procs({"gpus": 2})\ncounters = procs.spawn("c", Counter)\n'
                        'counters.initialized.get()')
    return kernel.run_interrupted(f"fut = {call}\nprint('waiting', flush=True)\n{wait}", "waiting")


def test_interrupt_raises_in_the_cell_and_a_second_interrupt_cancels(kernel):
    r, took = _interrupt_a_waiting_cell(kernel, "counters.spin.call(60)")
    assert took < 10
    assert r.status == "error" and r.error["ename"] == "KeyboardInterrupt"
    assert "ranks still running: [0, 1]" in r.error["evalue"]
    assert "interrupt again" in r.error["evalue"]
    # The kernel lives; the ranks still spin.
    assert kernel.value("fut.done()") == "False"
    # A second interrupt (the kernel is idle now) cancels them; the next cell waits until it
    # did (a cell sent at once could start before the signal is handled, and get it instead).
    kernel.interrupt()
    kernel.iopub_until(lambda m: m["msg_type"] == "update_display_data" and
                       "cancelled spin.call() on ranks 0-1" in m["content"]["data"]["text/plain"], timeout=20)
    r = kernel.run("fut.get(timeout=20)")
    assert r.status == "error" and r.error["ename"] == "CancelledError", r.error_text
    assert kernel.literal("list(counters.incr.call().get(timeout=20).values())") == [1, 1]


def test_a_cancel_that_cannot_stop_a_c_call_says_so_and_the_next_call_says_it_waits(kernel):
    """Issue 46, point 4: "cancelled nap.call()" while the actors slept on in time.sleep, and the
    next call waited with no notice."""
    r, _ = _interrupt_a_waiting_cell(kernel, "counters.nap.call(6)")
    assert r.status == "error" and "call .cancel() on the call's Future" in r.error["evalue"]
    assert "fut.cancel()" not in r.error["evalue"]  # the user's variable may have another name
    kernel.interrupt()

    def said(text):
        return lambda m: m["msg_type"] in ("update_display_data", "stream") and text in json.dumps(m["content"])
    kernel.iopub_until(said("cancelled nap.call() on ranks 0-1"), timeout=20)
    kernel.iopub_until(said("ranks 0-1 are still running nap.call(): a cancel stops Python code"), timeout=20)
    r = kernel.run("print(sorted(counters.incr.call().get(timeout=30).values()))", timeout=40)
    assert r.status == "ok" and "[1, 1]" in r.stdout, r.error_text
    assert "have not started it, their actors still run nap.call() (cancelled, but still inside a C call" in r.stderr


def test_a_proc_killed_while_idle_is_said_about_the_cell_that_last_used_its_mesh(kernel):
    """Issue 46, point 6: the death of an idle proc was said in whichever cell ran next, as if
    that cell had caused it. A finished cell's output can only grow through a display it left
    (its slot, made when it left calls running): without one, the notice names the cell."""
    import signal

    used = kernel.send(COUNTER + 'procs = this_host().spawn_procs({"gpus": 2})\ncounters = procs.spawn("c", Counter)\n'
                                 'print(counters.incr.call().get())')
    r = kernel.collect(used)
    assert r.status == "ok"
    number = r.reply["execution_count"]
    pids = kernel.literal("procs.pids")
    other = kernel.send("import time\ntime.sleep(3)\nprint('an unrelated cell')")
    time.sleep(0.5)
    os.kill(pids[1], signal.SIGKILL)

    def says_it(m):
        return "killed by SIGKILL" in json.dumps(m["content"])

    msgs = kernel.iopub_until(lambda m: says_it(m) or (m["parent_header"].get("msg_id") == other and
                                                       m["content"].get("execution_state") == "idle"), timeout=30)
    if not any(says_it(m) for m in msgs):
        msgs += kernel.iopub_until(says_it, timeout=15)
    told = [m for m in msgs if says_it(m)]
    assert told, msgs
    assert all(f"[xmesh] about In [{number}]: proc rank 1 (pid {pids[1]}" in json.loads(json.dumps(m["content"]))["text"]
               for m in told), [m["content"] for m in told]
    # A cell that left a call running has its slot: the notice goes into it, not the running cell.
    left = kernel.send('procs2 = this_host().spawn_procs({"gpus": 1})\nfut = procs2.spawn("c2", Counter).spin.call(30)')
    r = kernel.collect(left)
    (slot,) = [m["content"]["transient"]["display_id"] for m in r.outputs if m["msg_type"] == "display_data"]
    (pid,) = kernel.literal("procs2.pids")
    other = kernel.send("import time\ntime.sleep(3)\nprint('another unrelated cell')")
    time.sleep(0.5)
    os.kill(pid, signal.SIGKILL)
    msgs = kernel.iopub_until(lambda m: says_it(m) and "proc rank 0" in json.dumps(m["content"]), timeout=30)
    assert msgs[-1]["msg_type"] == "update_display_data" and msgs[-1]["content"]["transient"]["display_id"] == slot


def test_an_idle_interrupt_is_harmless(kernel):
    kernel.ok(COUNTER + 'procs = this_host().spawn_procs({"gpus": 1})\ncounters = procs.spawn("c", Counter)')
    for _ in range(3):
        kernel.interrupt()
        time.sleep(0.2)
    assert kernel.value("counters.incr.call_one().get()") == "1"
    assert kernel.value("1 + 1") == "2"


def test_a_kernel_started_with_sigint_ignored_is_still_interruptible(kernel_rundir):
    """Issue 17, defect 1: a server started with `nohup ... &` passes SIGINT to its kernels as
    ignored; the Stop button then did nothing, silently."""
    import signal

    from kernel_session import KernelSession

    old = signal.signal(signal.SIGINT, signal.SIG_IGN)  # inherited by the kernel, as from such a server
    try:
        k = KernelSession(kernel_rundir)
    finally:
        signal.signal(signal.SIGINT, old)
    try:
        r, _ = k.run_interrupted("import time\nprint('sleeping', flush=True)\ntime.sleep(60)", "sleeping")
        assert r.status == "error" and r.error["ename"] == "KeyboardInterrupt", r
        assert k.value("1 + 1") == "2"
    finally:
        k.close()


def _execution_count_is_consistent(kernel):
    """The reply's execution_count and IPython's own counter (Out, history) agree."""
    r = kernel.run("n = get_ipython().execution_count\nraise ValueError(n)")
    assert r.status == "error"
    count = r.reply["execution_count"]
    assert r.error["evalue"] == str(count), (r.error, count)
    r = kernel.run("'out'")
    assert r.reply["execution_count"] == count + 1 and kernel.value(f"Out[{count + 1}]") == "'out'"


def test_interrupting_a_top_level_await_is_like_interrupting_get(kernel):
    """Issue 17, defect 3: an interrupted `await` gave asyncio's internals instead of the ranks
    still running, left the cell's coroutine pending (resumed by a later cell) and the
    execution counter off by one."""
    r, _ = _interrupt_a_waiting_cell(kernel, "counters.spin.call(60)", wait="await fut")
    assert r.status == "error" and r.error["ename"] == "KeyboardInterrupt", r
    assert "ranks still running: [0, 1]" in r.error["evalue"] and "interrupt again" in r.error["evalue"]
    assert "asyncio" not in r.error_text and "base_events" not in r.error_text, r.error_text
    assert kernel.value("fut.done()") == "False"
    _execution_count_is_consistent(kernel)
    kernel.interrupt()  # idle: cancels what the interrupted await left running
    r = kernel.run("await fut")
    assert r.status == "error" and r.error["ename"] == "CancelledError", r.error_text
    _execution_count_is_consistent(kernel)
    # A plain asyncio await: interrupted as a KeyboardInterrupt, nothing resumes later.
    r, _ = kernel.run_interrupted("import asyncio\nprint('sleeping', flush=True)\nawait asyncio.sleep(30)\nresumed = True",
                                  "sleeping")
    assert r.status == "error" and r.error["ename"] == "KeyboardInterrupt", r
    assert "base_events" not in r.error_text, r.error_text
    kernel.ok("await asyncio.sleep(0.2)")
    assert kernel.value("'resumed' in globals()") == "False"
    _execution_count_is_consistent(kernel)


def test_a_call_queued_behind_an_interrupted_one_says_so(kernel):
    """Issue 17, defect 4: after an interrupted get(), the next call to the same actors waited
    without a word, and its own interrupt named ranks that had never started it."""
    kernel.ok(COUNTER + 'procs = this_host().spawn_procs({"gpus": 2})\ncounters = procs.spawn("c", Counter)\n'
                        'counters.initialized.get()')
    first = kernel.send("fut = counters.spin.call(60)\nfut.get()")
    time.sleep(1.0)
    kernel.interrupt()
    r = kernel.collect(first, timeout=30)
    assert "ranks still running: [0, 1]" in r.error["evalue"], r.error
    second = kernel.send("print('sent', flush=True)\ncounters.incr.call().get()")
    said = kernel.wait_for_output(second, lambda t: "have not started it" in t, timeout=20)
    assert ("[xmesh] incr.call() waits: ranks 0-1 have not started it, their actors still run "
            "spin.call()") in said, said
    kernel.interrupt()
    r = kernel.collect(second, timeout=30)
    assert r.error["ename"] == "KeyboardInterrupt"
    evalue = r.error["evalue"]
    assert "ranks 0-1 not started, queued behind spin.call()" in evalue, evalue
    assert "still running" not in evalue, evalue
    # The idle interrupt cancels both, and says so in the cells that made the calls.
    kernel.interrupt()
    said = kernel.iopub_until(lambda m: m["msg_type"] == "update_display_data" and
                              "cancelled spin.call() on ranks 0-1" in m["content"]["data"]["text/plain"],
                              timeout=20)
    assert said[-1]["parent_header"]["msg_id"] == first
    assert kernel.value("fut.done()") == "True"
    assert kernel.literal("list(counters.incr.call().get(timeout=20).values())") == [1, 1]

