"""The xmesh kernel speaks the Jupyter protocol as ipykernel and xeus-python do: jupyter_kernel_test's
whole suite (history included), the debugger's requests, comms, and one libxmesh.so shared by the
kernel module and xmesh._core."""
import os
import unittest

import jupyter_kernel_test as jkt
from jupyter_client.manager import start_new_kernel


class XmeshKernelTests(jkt.KernelTests):
    kernel_name = "xmesh"
    language_name = "python"
    file_extension = ".py"
    code_hello_world = "print('hello, world')"
    code_stderr = "import sys; print('test', file=sys.stderr)"
    completion_samples = [{"text": "zi", "matches": {"zip"}}]
    complete_code_samples = ["1", "print('hello, world')", "def f(x):\n  return x*2\n\n\n"]
    incomplete_code_samples = ["print('''hello", "def f(x):\n  x*2"]
    invalid_code_samples = ["import = 7q"]
    code_page_something = "zip?"
    code_generate_error = "raise ValueError('boom')"
    code_execute_result = [{"code": "1+2+3", "result": "6"},
                           {"code": "[n*n for n in range(4)]", "result": "[0, 1, 4, 9]"}]
    code_display_data = [{"code": "from IPython.display import HTML, display; display(HTML('<b>x</b>'))",
                          "mime": "text/html"}]
    code_history_pattern = "1?2*"
    supported_history_operations = ("tail", "range", "search")
    code_inspect_sample = "zip"
    code_clear_output = "from IPython.display import clear_output; clear_output()"

    def test_every_sample_is_configured(self):
        # Guard against a sample being emptied: an empty sample makes its test skip silently.
        for name in dir(self):
            if name.startswith(("code_", "completion_samples", "complete_code", "incomplete_code", "invalid_code",
                                "supported_history")):
                self.assertTrue(getattr(self, name), f"{name} is empty: its jupyter_kernel_test test would skip")


def test_jupyter_kernel_test_suite_passes_with_nothing_skipped():
    suite = unittest.defaultTestLoader.loadTestsFromTestCase(XmeshKernelTests)
    result = unittest.TestResult()
    suite.run(result)
    problems = [f"{t}: {tb}" for t, tb in result.failures + result.errors]
    assert not problems, "\n".join(problems)
    assert not result.skipped, result.skipped
    assert result.testsRun >= 13


def _control(kc, msg_type, content):
    msg = kc.session.msg(msg_type, content)
    kc.control_channel.send(msg)
    while True:
        reply = kc.get_control_msg(timeout=30)
        if reply["parent_header"].get("msg_id") == msg["header"]["msg_id"]:
            return reply


def test_kernel_info_names_xmesh_and_the_debugger(kernel_rundir):
    km, kc = start_new_kernel(kernel_name="xmesh", env=dict(os.environ, XMESH_RUNTIME_DIR=kernel_rundir))
    try:
        kc.kernel_info()
        info = kc.get_shell_msg(timeout=30)["content"]
        assert info["implementation"] == "xmesh"
        assert info["language_info"]["name"] == "python"
        assert info["debugger"] is True
        assert "xmesh" in info["banner"]

        init = _control(kc, "debug_request", {"type": "request", "seq": 1, "command": "initialize", "arguments": {
            "clientID": "test", "clientName": "test", "adapterID": "", "pathFormat": "path", "linesStartAt1": True,
            "columnsStartAt1": True, "supportsVariableType": True, "supportsVariablePaging": True,
            "supportsRunInTerminalRequest": True, "locale": "en"}})
        assert init["content"]["success"] is True, init["content"]
        attach = _control(kc, "debug_request", {"type": "request", "seq": 2, "command": "attach", "arguments": {}})
        assert attach["content"]["success"] is True, attach["content"]
        info = _control(kc, "debug_request", {"type": "request", "seq": 3, "command": "debugInfo", "arguments": {}})
        assert info["content"]["success"] is True and info["content"]["body"]["isStarted"] is True
    finally:
        kc.stop_channels()
        km.shutdown_kernel(now=False)


def _mapped(pid, fragment):
    with open(f"/proc/{pid}/maps") as f:
        return {line.split()[-1] for line in f if fragment in line}


def test_kernel_and_core_module_map_one_libxmesh(kernel):
    core = kernel.value("import xmesh._core; xmesh._core.__file__").strip("'")
    # _core is loaded into the kernel process, and the kernel still maps one libxmesh.so only:
    # the module resolved its dependency to the very file the kernel linked.
    assert _mapped(kernel.pid, os.path.basename(core)) == {os.path.realpath(core)}
    mapped = _mapped(kernel.pid, "libxmesh.so")
    assert len(mapped) == 1, mapped
    assert os.path.exists(mapped.pop())


def test_the_installed_kernelspec_runs_the_installed_kernel(kernel_rundir, monkeypatch):
    """After scripts/setup.sh (which installs), `jupyter kernelspec list` shows the xmesh kernel
    and it runs the installed package."""
    import json
    import subprocess

    # Kernelspecs are looked up in this process: hide the build tree's.
    monkeypatch.delenv("JUPYTER_PATH", raising=False)
    monkeypatch.delenv("PYTHONPATH", raising=False)
    env = dict(os.environ)
    listed = subprocess.run(["jupyter", "kernelspec", "list", "--json"], env=env, capture_output=True, text=True,
                            timeout=60)
    assert listed.returncode == 0, listed.stderr
    specs = json.loads(listed.stdout)["kernelspecs"]
    assert "xmesh" in specs, "the xmesh kernelspec is not installed: run scripts/setup.sh as root"
    spec = specs["xmesh"]["spec"]
    assert spec["display_name"] == "Python 3 (xmesh)" and spec["language"] == "python"
    # The installed package's own installer wrote it: Debian's Python running the kernel module.
    assert spec["argv"] == ["/usr/bin/python3", "-m", "xmesh.kernel", "-f", "{connection_file}"], spec["argv"]
    env["XMESH_RUNTIME_DIR"] = kernel_rundir
    km, kc = start_new_kernel(kernel_name="xmesh", env=env)
    out = []
    try:
        kc.execute_interactive("import xmesh; print(xmesh.__file__)", timeout=60, output_hook=out.append)
    finally:
        kc.stop_channels()
        km.shutdown_kernel(now=False)
    text = "".join(m["content"].get("text", "") for m in out if m["msg_type"] == "stream")
    assert text.startswith("/usr/local/lib/python3"), text  # the installed package, not the build tree's


def test_comms_are_answered(kernel):
    kc = kernel.kc
    msg = kc.session.msg("comm_info_request", {})
    kc.shell_channel.send(msg)
    while True:
        reply = kc.get_shell_msg(timeout=30)
        if reply["parent_header"].get("msg_id") == msg["header"]["msg_id"]:
            break
    assert reply["msg_type"] == "comm_info_reply" and reply["content"]["status"] == "ok"
    # A comm target registered in a cell receives a front end's comm_open.
    kernel.ok("opened = []\nget_ipython().kernel.comm_manager.register_target("
              "'xmesh-test', lambda comm, msg: opened.append(msg['content']['data']))")
    kc.shell_channel.send(kc.session.msg("comm_open", {"comm_id": "c1", "target_name": "xmesh-test",
                                                       "data": {"hello": 1}}))
    for _ in range(50):
        if kernel.value("opened") == "[{'hello': 1}]":
            break
    assert kernel.value("opened") == "[{'hello': 1}]"


def test_the_kernelspec_has_a_logo():
    """Issue 17, defect 10: launchers showed a letter for want of a logo."""
    import struct

    from jupyter_client.kernelspec import KernelSpecManager

    spec_dir = KernelSpecManager().get_kernel_spec("xmesh").resource_dir
    for size in (32, 64):
        with open(os.path.join(spec_dir, f"logo-{size}x{size}.png"), "rb") as f:
            head = f.read(24)
        assert head[:8] == b"\x89PNG\r\n\x1a\n" and struct.unpack(">II", head[16:24]) == (size, size)
    with open(os.path.join(spec_dir, "logo-svg.svg")) as f:
        assert f.read().startswith("<svg")
