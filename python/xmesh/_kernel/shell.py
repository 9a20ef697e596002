"""The IPython shell the xmesh kernel runs cells in (kernel/xmesh_interpreter.cpp calls `start`
once, then the shell's `*_for_kernel` methods per request). IPython's InteractiveShell with
xeus-python-shell's display publisher, display hook and caching compiler, wired to the kernel
module (`xmesh._kernel_ext`): display and results go out through xeus, sys.stdout / sys.stderr
become stream messages, input() and getpass() ask through the stdin channel, comms reach xeus's
comm manager (_kernel.comms), and cells compile to the files the visual debugger expects."""
import builtins
import contextlib
import getpass
import html
import importlib.util
import io
import os
import re
import sys
from typing import Any, Iterator

from IPython.core import page, payloadpage
from IPython.core.application import BaseIPythonApplication
from IPython.core.completer import provisionalcompleter, rectify_completions
from IPython.core.error import StdinNotImplementedError
from IPython.core.interactiveshell import InteractiveShell
from IPython.core.shellapp import InteractiveShellApp
from IPython.utils.tokenutil import token_at_cursor
from xeus_python_shell.compiler import XCachingCompiler
from xeus_python_shell.display import XDisplayHook, XDisplayPublisher

from .. import _kernel_ext
from . import comms


class KernelStream(io.TextIOBase):
    """sys.stdout or sys.stderr in the kernel: each write a stream message, under the request
    that runs (the main thread's output, through xeus, in order with the cell's other messages)
    or the latest one (other threads', through the kernel's thread-safe channel). Once no kernel
    is served, writes go to the process's own stream."""

    def __init__(self, name: str, fallback: Any) -> None:
        super().__init__()
        self.name = name
        self._fallback = fallback

    @property
    def encoding(self) -> str:  # type: ignore[override]
        return "utf-8"

    def writable(self) -> bool:
        return True

    def isatty(self) -> bool:
        return False

    def fileno(self) -> int:
        # The process's own descriptor, for code that writes below Python (faulthandler).
        return self._fallback.fileno()

    def write(self, text: str) -> int:
        if not isinstance(text, str):
            raise TypeError(f"write() argument must be str, not {type(text).__name__}")
        if text and not _kernel_ext.publish_stream(self.name, text) and self._fallback is not None:
            self._fallback.write(text)
        return len(text)

    def flush(self) -> None:
        pass


class XmeshShell(InteractiveShell):
    """IPython's shell with the kernel's answers; `last_error` is [ename, evalue, traceback
    lines] of the last cell that failed (None otherwise), which the kernel sends."""

    last_error: Any = None

    def init_hooks(self) -> None:
        super().init_hooks()
        self.set_hook("show_in_pager", page.as_hook(payloadpage.page), 99)

    def enable_gui(self, gui: Any = None) -> None:
        """A kernel has no GUI event loop to integrate."""

    def _showtraceback(self, etype: Any, evalue: Any, stb: Any) -> None:
        self.last_error = [getattr(etype, "__name__", str(etype)), str(evalue), stb]

    def run_cell_for_kernel(self, code: str, store_history: bool, silent: bool, allow_stdin: bool) -> None:
        with _input_through_the_kernel(allow_stdin):
            self.run_cell(code, store_history=store_history, silent=silent)

    def complete_for_kernel(self, code: str, cursor_pos: int) -> dict:
        with provisionalcompleter():
            completions = list(rectify_completions(code, self.Completer.completions(code, cursor_pos)))
        start, end = (completions[0].start, completions[0].end) if completions else (cursor_pos, cursor_pos)
        types = [{"start": c.start, "end": c.end, "text": c.text, "type": c.type, "signature": c.signature}
                 for c in completions]
        return {"matches": [c.text for c in completions], "cursor_start": start, "cursor_end": end,
                "metadata": {"_jupyter_types_experimental": types}}

    def inspect_for_kernel(self, code: str, cursor_pos: int, detail_level: int) -> dict:
        name = token_at_cursor(code, cursor_pos)
        try:
            data = self.object_inspect_mime(name, detail_level=detail_level)
        except KeyError:  # no such name
            return {"data": {}, "metadata": {}, "found": False}
        if isinstance(data.get("text/html"), str):
            data["text/html"] = _escaped_pre_blocks(data["text/html"])
        return {"data": data, "metadata": {}, "found": True}

    def is_complete_for_kernel(self, code: str) -> dict:
        status, indent = self.input_transformer_manager.check_complete(code)
        reply = {"status": status}
        if status == "incomplete":
            reply["indent"] = " " * (indent or 0)
        return reply


_PRE_BLOCK = re.compile(r"<pre>(.*?)</pre>", re.DOTALL)


def _escaped_pre_blocks(html_text: str) -> str:
    """IPython 8.5's inspection HTML puts reprs and docstrings in <pre> unescaped, so a front end
    renders `<Endpoint ...>` as a tag and shows what is left; escaped here (once: an IPython that
    escapes them already is left as it is)."""
    return _PRE_BLOCK.sub(lambda m: "<pre>" + html.escape(html.unescape(m.group(1)), quote=False) + "</pre>",
                          html_text)


@contextlib.contextmanager
def _input_through_the_kernel(allowed: bool) -> Iterator[None]:
    """input() and getpass() ask in the front end's input box while a cell runs (or refuse as
    ipykernel does when the request allows no input)."""

    def ask(prompt: Any, password: bool) -> str:
        if not allowed:
            raise StdinNotImplementedError("input() was called, but this front end does not support input requests")
        sys.stdout.flush()
        sys.stderr.flush()
        return _kernel_ext.input_request(str(prompt), password)

    saved = builtins.input, getpass.getpass
    builtins.input = lambda prompt="": ask(prompt, False)
    getpass.getpass = lambda prompt="Password: ", stream=None: ask(prompt, True)
    try:
        yield
    finally:
        builtins.input, getpass.getpass = saved


class _Kernel:
    """What code written for ipykernel finds as get_ipython().kernel: the comm manager and the
    request's header."""

    def __init__(self) -> None:
        self.comm_manager = comms.manager()

    def get_parent(self, channel: str = "shell") -> dict:
        return _kernel_ext.parent_header()


class _ShellApp(BaseIPythonApplication, InteractiveShellApp):
    """IPython's application around the shell, as ipykernel's: the profile and its config, the
    current directory on sys.path, extensions, exec_lines and startup files."""

    def initialize(self, argv: Any = None) -> None:
        super().initialize([])  # never the kernel's own argv (`-f CONNECTION_FILE`)
        self.init_path()
        self.shell = XmeshShell.instance(parent=self, profile_dir=self.profile_dir, ipython_dir=self.ipython_dir,
                                         user_ns={}, display_pub_class=XDisplayPublisher,
                                         displayhook_class=XDisplayHook, compiler_class=XCachingCompiler)
        _wire(self.shell)  # before startup code runs: what it displays goes out
        self.init_gui_pylab()
        self.init_extensions()
        self.init_code()

    def exit(self, exit_status: int = 0) -> None:
        """Exiting is the kernel protocol's (a shutdown request), not the application's."""


def start() -> XmeshShell:
    """The kernel's shell, its output wired to the kernel."""
    if os.environ.get("MPLBACKEND") is None and importlib.util.find_spec("matplotlib_inline") is not None:
        os.environ["MPLBACKEND"] = "module://matplotlib_inline.backend_inline"  # figures inline, as ipykernel
    sys.stdout = KernelStream("stdout", sys.__stdout__)
    sys.stderr = KernelStream("stderr", sys.__stderr__)
    comms.install()
    app = _ShellApp.instance()
    app.initialize()
    return app.shell


def _wire(shell: XmeshShell) -> None:
    """The shell's display, results and cell files through the kernel; its `kernel` attribute."""
    shell.display_pub.publish_display_data = (
        lambda data, metadata=None, transient=None, update=False: _kernel_ext.display(data, metadata, transient, update))
    shell.display_pub.clear_output = lambda wait=False: _kernel_ext.clear_output(wait)
    shell.displayhook.publish_execution_result = _kernel_ext.publish_execution_result
    shell.compile.get_filename = _kernel_ext.cell_file
    shell.kernel = _Kernel()
