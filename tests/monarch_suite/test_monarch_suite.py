"""The runner of Monarch's own tests and its adapter (README.md), on a small checkout written
here: Monarch's private paths resolve to xmesh's real objects or to placeholders that refuse,
the tests run in their own subprocesses with the adapter, and the counts are right."""
import os
import pathlib
import subprocess
import sys
import textwrap

RUNNER = pathlib.Path(__file__).resolve().parent / "run_monarch_suite.py"

TINY_TESTS = '''
import subprocess, sys
from monarch._src.actor.actor_mesh import ActorMesh, context
from monarch._rust_bindings.monarch_hyperactor.supervision import SupervisionError
from monarch._rust_bindings.monarch_hyperactor.pytokio import PythonTask
import monarch.actor
import xmesh


def test_aliases_are_xmeshs_objects():
    assert ActorMesh is xmesh.ActorMesh and context is xmesh.context
    assert SupervisionError is monarch.actor.SupervisionError and issubclass(SupervisionError, RuntimeError)


def test_a_placeholder_refuses_naming_the_internal():
    try:
        PythonTask.from_coroutine(None)
    except NotImplementedError as e:
        assert "monarch._rust_bindings.monarch_hyperactor.pytokio.PythonTask is Monarch's internal" in str(e)
    else:
        raise AssertionError("a placeholder did not refuse")


def test_a_subprocess_has_the_adapter_too():
    out = subprocess.run([sys.executable, "-c", "from monarch._src.actor.future import Future; print(Future)"],
                         capture_output=True, text=True, check=True).stdout
    assert "xmesh" in out


async def test_async_tests_run():
    assert True


def test_this_one_fails():
    assert False, "counted as failed"
'''


def _run(env_extra: dict, *args: str) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k != "MONARCH_SRC"}
    env.update(env_extra)
    return subprocess.run([sys.executable, str(RUNNER), *args], capture_output=True, text=True, env=env, timeout=100)


def test_without_a_checkout_it_says_it_skips():
    r = _run({})
    assert r.returncode == 0 and "monarch suite: skipped: MONARCH_SRC is not set" in r.stdout, r


def test_a_checkout_without_tests_is_refused(tmp_path):
    r = _run({"MONARCH_SRC": str(tmp_path)})
    assert r.returncode == 2 and "has no python/tests" in r.stderr, r


def test_runs_a_checkouts_tests_through_the_adapter(tmp_path):
    tests = tmp_path / "python" / "tests"
    tests.mkdir(parents=True)
    (tests / "test_tiny.py").write_text(textwrap.dedent(TINY_TESTS))
    r = _run({"MONARCH_SRC": str(tmp_path)}, "test_tiny.py")
    assert r.returncode == 0, (r.stdout, r.stderr)
    assert "test_tiny.py: 4 passed, 1 failed, 0 skipped, 0 errors (of 5)" in r.stdout, (r.stdout, r.stderr)
    assert "total: 4 of 5 pass on xmesh" in r.stdout
    report = (pathlib.Path(os.environ["XMESH_BUILD_DIR"]) / "monarch_suite" / "report.txt").read_text()
    assert "test_tiny.py::test_this_one_fails: failed: AssertionError: counted as failed" in report
