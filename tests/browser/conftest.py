"""Fixtures of the browser tests: a Jupyter server per test module, Chromium per module, a fresh
page per test; a failed test leaves a screenshot of its page in the test log folder."""
import os
import shutil
import subprocess
import sys
import tempfile

import pytest
from playwright.sync_api import sync_playwright

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from jupyter_ui import BUILD, CHROMIUM, CHROMIUM_ARGS, JupyterServer  # noqa: E402

LOG_DIR = os.environ.get("XMESH_TEST_LOG_DIR", os.path.join(BUILD, "test-logs"))


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    report = outcome.get_result()
    setattr(item, f"rep_{report.when}", report)


@pytest.fixture(scope="module")
def workdir():
    d = tempfile.mkdtemp(prefix="xmbr-")
    os.makedirs(os.path.join(d, "nb"))
    os.makedirs(os.path.join(d, "run"))
    yield d
    shutil.rmtree(d, ignore_errors=True)


def start_server(workdir, name, **kwargs):
    os.makedirs(os.path.join(LOG_DIR, "browser"), exist_ok=True)
    return JupyterServer(os.path.join(workdir, "nb"), os.path.join(workdir, "run"),
                         os.path.join(LOG_DIR, "browser", f"{name}-server.log"), **kwargs)


def shutdown_agent(workdir):
    """The module's host agent and every proc it still owns (named allocations outlive their
    kernels by design) stop with the module."""
    subprocess.run(["/usr/bin/python3", "-m", "xmesh.cli", "shutdown", "--runtime-dir", os.path.join(workdir, "run")],
                   capture_output=True, timeout=60)


@pytest.fixture(scope="module")
def server(request, workdir):
    s = start_server(workdir, request.module.__name__)
    yield s
    s.stop()
    shutdown_agent(workdir)


@pytest.fixture(scope="module")
def browser():
    with sync_playwright() as p:
        b = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        yield b
        b.close()


@pytest.fixture
def page(request, browser):
    context = browser.new_context(viewport={"width": 1400, "height": 1000})
    pg = context.new_page()
    yield pg
    rep = getattr(request.node, "rep_call", None)
    if rep is not None and rep.failed:
        path = os.path.join(LOG_DIR, "browser", f"{request.node.name}.png")
        os.makedirs(os.path.dirname(path), exist_ok=True)
        try:
            pg.screenshot(path=path, full_page=True)
            print(f"screenshot of the failed page: {path}")
        except Exception as e:  # the page may be gone with the failure
            print(f"no screenshot: {e}")
    context.close()
