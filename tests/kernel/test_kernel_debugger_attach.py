"""The mesh-aware debugger in the notebook beyond the cell's prompt: a notebook run without stdin,
`xmesh debug` from a terminal taking over the cell's prompt (and picking a kernel by its
notebook), JupyterLab's visual debugger beside the mesh's, and the magic attaching to a running
rank after an interrupt."""
import re
import time
from queue import Empty

from cells import TRAINER


def test_a_notebook_run_without_stdin_shows_the_stops_and_finishes(kernel_rundir, tmp_path):
    import nbformat
    from nbclient import NotebookClient

    nb = nbformat.v4.new_notebook()
    nb.cells = [nbformat.v4.new_code_cell(TRAINER),
                nbformat.v4.new_code_cell("r = trainer.step.call(10).get()\nprint('RESULT', sorted(r.values()))")]
    import os
    env_rundir = os.environ.get("XMESH_RUNTIME_DIR")
    os.environ["XMESH_RUNTIME_DIR"] = kernel_rundir
    try:
        NotebookClient(nb, kernel_name="xmesh", timeout=90).execute()
    finally:
        if env_rundir is None:
            os.environ.pop("XMESH_RUNTIME_DIR", None)
        else:
            os.environ["XMESH_RUNTIME_DIR"] = env_rundir
    outputs = nb.cells[1].outputs
    text = "".join(o.get("text", "") or o.get("data", {}).get("text/plain", "") for o in outputs)
    assert "cannot take input" in text
    assert "| trainer    | 2    | gpus=2 |" in text
    # In a notebook the table is an HTML table, as every xmesh display (issue 17).
    html = [o["data"]["text/html"] for o in outputs if "text/html" in o.get("data", {})]
    assert len(html) == 1 and "3 actors stopped in pdb" in html[0] and "<td" in html[0], outputs
    assert "3 ranks (ranks 0,2-3) stopped in pdb (breakpoint):" in text
    assert "1 rank (rank 1) running:" in text
    assert "RESULT [20, 21, 22, 23]" in text


def test_xmesh_debug_from_a_terminal_takes_over_the_cells_prompt(kernel):
    import os
    import pexpect

    kernel.ok(TRAINER)
    conv = kernel.converse("r = trainer.step.call(10).get()\nprint('RESULT', sorted(r.values()))")
    prompt, out = conv.expect_prompt()
    assert prompt == "xmesh_dbg> "
    client = pexpect.spawn("/usr/bin/python3", ["-m", "xmesh.cli", "debug"], encoding="utf-8", timeout=30,
                           env=dict(os.environ, XMESH_RUNTIME_DIR=kernel.rundir))
    try:
        client.expect("xmesh_dbg> ")
        assert f"attached to the debugger of kernel pid {kernel.pid}" in client.before
        assert "| trainer    | 2    | gpus=2 |" in client.before
        client.sendline("attach trainer 3")
        client.expect(r"\[trainer 3\] \(Pdb\) ")
        client.sendline("p y")
        client.expect(r"\[trainer 3\] \(Pdb\) ")
        assert "23" in client.before
        client.sendline("detach")
        client.expect("xmesh_dbg> ")
        client.sendline("c")
        client.expect("continued 3 sessions")
        # the cell's input box gave way; the call completes and the cell ends with its result
        r = conv.finish()
        assert r.status == "ok", r.error_text
        assert f"`xmesh debug` (pid {client.pid}) took over the debugger" in r.stdout
        assert "RESULT [20, 21, 22, 23]" in r.stdout
        client.sendline("quit")
        client.expect(pexpect.EOF)
    finally:
        client.close(force=True)


def _debug_request(kernel, command, arguments, seq):
    msg = kernel.kc.session.msg("debug_request", {"type": "request", "seq": seq, "command": command,
                                                  "arguments": arguments})
    kernel.kc.control_channel.send(msg)
    while True:
        reply = kernel.kc.get_control_msg(timeout=30)
        if reply["parent_header"].get("msg_id") == msg["header"]["msg_id"]:
            return reply["content"]


def test_the_visual_debugger_is_quiet_and_explains_breakpoints_in_endpoints(kernel):
    """Issue 17, defect 9: JupyterLab's debugger put debugpy's frozen-modules warning into the
    user's cell, and accepted a gutter breakpoint inside an endpoint that could never fire."""
    kernel.ok(TRAINER)
    init = _debug_request(kernel, "initialize", {"clientID": "test", "adapterID": "python", "pathFormat": "path",
                                                 "linesStartAt1": True, "columnsStartAt1": True,
                                                 "supportsVariableType": True, "locale": "en"}, 1)
    assert init["success"], init
    attach = _debug_request(kernel, "attach", {"justMyCode": False}, 2)
    assert attach["success"], attach
    dumped = _debug_request(kernel, "dumpCell", {"code": TRAINER}, 3)
    path = dumped["body"]["sourcePath"]
    line = TRAINER.splitlines().index("        z = y + 1") + 1
    r = _debug_request(kernel, "setBreakpoints", {"source": {"path": path}, "breakpoints": [{"line": line}],
                                                  "sourceModified": False}, 4)
    assert r["success"], r
    _debug_request(kernel, "configurationDone", {}, 5)
    streams = []  # whichever cell a stray write lands in
    end = time.monotonic() + 2
    while time.monotonic() < end:
        try:
            m = kernel.kc.get_iopub_msg(timeout=0.1)
        except Empty:
            continue
        if m["msg_type"] == "stream":
            streams.append(m["content"]["text"])
    out = kernel.ok("print('after')")
    streams += [m["content"]["text"] for m in out.outputs if m["msg_type"] == "stream"]
    assert not any("frozen modules" in t for t in streams), streams
    said = out.stderr
    assert f"the debugger's breakpoint at Cell In [1], line {line} is in the endpoint Trainer.step" in said, said
    again = kernel.ok("print('again')")
    assert "breakpoint at" not in again.stderr  # said once
    _debug_request(kernel, "disconnect", {"restart": False, "terminateDebuggee": False}, 6)


SPINNER = '''
import os

from xmesh import Actor, endpoint, this_host

class Spinner(Actor):
    @endpoint
    def spin_until(self, path):
        looks = 0
        while not os.path.exists(path):
            looks += 1
        return looks

procs = this_host().spawn_procs({"gpus": 2})
spinner = procs.spawn("spinner", Spinner)
spinner.initialized.get()
'''


def test_after_interrupting_a_hanging_cell_the_magic_attaches_to_a_running_rank(kernel, tmp_path):
    """Issue 18 in the notebook: a cell hangs on ranks spinning in Python; the user interrupts it
    (the calls go on), opens %xmesh_debug with nothing stopped, `where`s, attaches to a running
    rank, looks at a local, detaches (it runs on) and leaves; the call then completes."""
    go = str(tmp_path / "go")
    kernel.ok(SPINNER)
    conv = kernel.converse(f"fut = spinner.spin_until.call({go!r})\nfut.get()")
    time.sleep(1.0)  # the cell hangs
    kernel.interrupt()
    r = conv.finish()
    assert r.status == "error" and r.error["ename"] == "KeyboardInterrupt", r.error_text

    conv = kernel.converse("%xmesh_debug")
    prompt, out = conv.expect_prompt()
    assert prompt == "xmesh_dbg> " and "no actors are stopped in pdb; `where` shows every rank" in out, out
    prompt, out = conv.say("where")
    # Both ranks running in spin_until: one group when their sampled stacks match, else one each
    # (a rank sampled inside os.path.exists has one frame more).
    both = re.search(r"2 ranks \(ranks 0-1\) running", out) or (
        re.search(r"1 rank \(rank 0\) running", out) and re.search(r"1 rank \(rank 1\) running", out))
    assert both and out.count("in spin_until") in (1, 2), out
    prompt, out = conv.say("attach spinner 1")
    assert prompt == "[spinner 1] (Pdb) " and "attached to spinner rank 1" in out, out
    assert "spin_until()" in out, out
    prompt, out = conv.say("p looks > 0")
    assert out.strip() == "True"
    prompt, out = conv.say("detach")
    assert prompt == "xmesh_dbg> " and "detached from spinner rank 1; it runs on" in out, out
    conv.answer("quit")
    r = conv.finish()
    assert r.status == "ok", r.error_text

    kernel.ok(f"open({go!r}, 'w').close()")
    assert kernel.value("all(v > 0 for v in fut.get(timeout=60).values())") == "True"


def test_kernels_are_named_by_their_notebook_and_xmesh_debug_picks_one_by_it(kernel_rundir, tmp_path):
    """Issue 46, point 2: `xmesh debug` listed kernels by their command line (a connection-file
    path) and counted the panel's sidecar as a program, so a bare `xmesh debug` refused."""
    import json
    import os
    import subprocess
    import uuid

    from kernel_session import KernelSession

    ids = {name: str(uuid.uuid4()) for name in ("prepare.ipynb", "train.ipynb")}
    kernels = {name: KernelSession(kernel_rundir, env={"JPY_SESSION_NAME": f"/work/nbs/{name}"},
                                   connection_file=str(tmp_path / f"kernel-{ids[name]}.json"))
               for name in ids}
    env = dict(os.environ, XMESH_RUNTIME_DIR=kernel_rundir)
    try:
        for k in kernels.values():
            k.ok('import xmesh\nprocs = xmesh.this_host().spawn_procs({"gpus": 1})\nprocs.initialized.get()')
        # The panel's sidecar reads them (and so starts a runtime of its own): it is no program.
        sidecar = subprocess.run(["/usr/bin/python3", "-m", "xmesh._panel.sidecar"], input='{"op": "meshes"}\n',
                                 capture_output=True, text=True, env=env, timeout=60)
        listed = json.loads(sidecar.stdout)
        assert sorted(c["notebook"] for c in listed["controllers"]) == ["/work/nbs/prepare.ipynb", "/work/nbs/train.ipynb"]
        owners = {m["owner"]["notebook"] for m in listed["meshes"]}
        assert owners == {"/work/nbs/prepare.ipynb", "/work/nbs/train.ipynb"}
        # Its connection file's name carries the id a Jupyter server's sessions know it by.
        assert sorted(c["kernel_id"] for c in listed["controllers"]) == sorted(ids.values())
        bare = subprocess.run(["/usr/bin/python3", "-m", "xmesh.cli", "debug"], capture_output=True, text=True,
                              env=env, timeout=60)
        assert bare.returncode != 0 and "2 xmesh programs or kernels run here" in bare.stderr, bare.stderr
        for name, k in kernels.items():
            assert f"notebook /work/nbs/{name} (kernel pid {k.pid})" in bare.stderr
        chosen = subprocess.run(["/usr/bin/python3", "-m", "xmesh.cli", "debug", "--notebook", "train.ipynb"],
                                input="quit\n", capture_output=True, text=True, env=env, timeout=60)
        assert f"attached to the debugger of kernel pid {kernels['train.ipynb'].pid}" in chosen.stdout, chosen
        missing = subprocess.run(["/usr/bin/python3", "-m", "xmesh.cli", "debug", "--notebook", "eval.ipynb"],
                                 capture_output=True, text=True, env=env, timeout=60)
        assert missing.returncode != 0 and "no kernel of yours runs a notebook 'eval.ipynb'" in missing.stderr
        assert "notebook /work/nbs/prepare.ipynb" in missing.stderr
    finally:
        for k in kernels.values():
            k.close()

