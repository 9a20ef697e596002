"""Runs Monarch's own Python tests against xmesh's `monarch` shim and says how many pass.

    MONARCH_SRC=~/src/monarch python3 tests/monarch_suite/run_monarch_suite.py [FILE...] [-k EXPR]

MONARCH_SRC is a checkout of Monarch's repository (its `python/tests` is what runs; its own
`python/monarch` is never imported: `monarch` is xmesh's). Without it the runner says it skips
and exits 0 (CI has no checkout). The tests run in a venv over Debian's Python
(build/monarch_suite/venv, made once: pytest-asyncio, which Monarch's tests need) with the build
tree's xmesh first on the path and the adapter (adapter/xmesh_monarch_adapter.py) in every process,
each test under a 120 s guard; tests Monarch marks `oss_skip` are left out, as in its open-source
CI. Prints per file passed / failed / skipped / errors and writes each failure's first line to
build/monarch_suite/report.txt."""
import argparse
import os
import pathlib
import subprocess
import sys
import xml.etree.ElementTree as ET
from typing import Dict, List, Tuple

HERE = pathlib.Path(__file__).resolve().parent
SOURCE = HERE.parent.parent
DEFAULT_FILES = ["test_python_actors.py", "test_concurrent_endpoints.py", "test_actor_error.py"]
PACKAGES = ["pytest-asyncio>=0.21,<0.24", "pytest-timeout", "typing_extensions"]


def build_dir() -> pathlib.Path:
    return pathlib.Path(os.environ.get("XMESH_BUILD_DIR", SOURCE / "build"))


def venv_python() -> pathlib.Path:
    """The suite's venv (Debian's Python, its site packages visible: torch, numpy, cloudpickle).
    A .pth file loads the adapter in every process of it: the tests' own subprocesses
    (isolate_in_subprocess) and xmesh's procs unpickle test classes that import private paths."""
    venv = build_dir() / "monarch_suite" / "venv"
    python = venv / "bin" / "python"
    if not (venv / ".ready").exists():
        subprocess.run(["/usr/bin/python3", "-m", "venv", "--system-site-packages", str(venv)], check=True)
        subprocess.run([str(python), "-m", "pip", "install", "-q", *PACKAGES], check=True)
        (venv / ".ready").write_text("")
    site = subprocess.run([str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                          check=True, capture_output=True, text=True).stdout.strip()
    (pathlib.Path(site) / "xmesh_monarch_adapter.pth").write_text(f"{HERE / 'adapter'}\nimport xmesh_monarch_adapter\n")
    return python


def run_pytest(tests_dir: pathlib.Path, files: List[str], extra: List[str], xml: pathlib.Path) -> int:
    env = dict(os.environ)
    env["PYTHONPATH"] = str(build_dir() / "python")
    env.setdefault("XMESH_HOSTD", str(build_dir() / "runtime" / "xmesh-hostd"))
    cmd = [str(venv_python()), "-m", "pytest", "-p", "no:cacheprovider",
           "-o", "asyncio_mode=auto", "-o", "markers=oss_skip: skipped in Monarch's open-source CI",
           "-m", "not oss_skip", "--continue-on-collection-errors", "--timeout=120", "-q", f"--junitxml={xml}",
           *extra, *files]
    return subprocess.run(cmd, cwd=tests_dir, env=env).returncode


def outcomes(xml: pathlib.Path) -> Dict[str, List[Tuple[str, str, str]]]:
    """{file: [(test, outcome, first line of its failure)]} from pytest's junit XML."""
    by_file: Dict[str, List[Tuple[str, str, str]]] = {}
    for case in ET.parse(xml).iter("testcase"):
        file = case.get("classname", "").split(".")[0] + ".py"
        outcome, why = "passed", ""
        for tag in ("failure", "error", "skipped"):
            node = case.find(tag)
            if node is not None:
                outcome = {"failure": "failed", "error": "error", "skipped": "skipped"}[tag]
                why = (node.get("message") or "").strip().splitlines()[0:1]
                why = why[0][:300] if why else ""
                break
        by_file.setdefault(file, []).append((case.get("name", "?"), outcome, why))
    return by_file


def summarize(by_file: Dict[str, List[Tuple[str, str, str]]], report: pathlib.Path) -> str:
    lines, failures = [], []
    totals = {"passed": 0, "failed": 0, "skipped": 0, "error": 0}
    for file, cases in sorted(by_file.items()):
        counts = {k: sum(1 for _, o, _ in cases if o == k) for k in totals}
        for k in totals:
            totals[k] += counts[k]
        lines.append(f"{file}: {counts['passed']} passed, {counts['failed']} failed, "
                     f"{counts['skipped']} skipped, {counts['error']} errors (of {len(cases)})")
        failures += [f"{file}::{name}: {outcome}: {why}" for name, outcome, why in cases
                     if outcome in ("failed", "error")]
    ran = totals["passed"] + totals["failed"] + totals["error"]
    lines.append(f"total: {totals['passed']} of {ran} pass on xmesh ({totals['skipped']} skipped)")
    report.write_text("\n".join(lines + [""] + failures) + "\n")
    return "\n".join(lines)


def main(argv: List[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("files", nargs="*", help=f"files of Monarch's python/tests (default: {DEFAULT_FILES})")
    parser.add_argument("-k", help="pytest's -k expression")
    args = parser.parse_args(argv)
    src = os.environ.get("MONARCH_SRC")
    if not src:
        print("monarch suite: skipped: MONARCH_SRC is not set (a checkout of Monarch's repository runs its "
              "python/tests against xmesh's shim)")
        return 0
    tests_dir = pathlib.Path(src).expanduser() / "python" / "tests"
    if not tests_dir.is_dir():
        print(f"monarch suite: MONARCH_SRC={src} has no python/tests: is it a checkout of Monarch's repository?",
              file=sys.stderr)
        return 2
    files = args.files or DEFAULT_FILES
    missing = [f for f in files if not (tests_dir / f).is_file()]
    if missing:
        print(f"monarch suite: {tests_dir} has no {', '.join(missing)}", file=sys.stderr)
        return 2
    out = build_dir() / "monarch_suite"
    out.mkdir(parents=True, exist_ok=True)
    xml = out / "results.xml"
    xml.unlink(missing_ok=True)
    run_pytest(tests_dir, files, ["-k", args.k] if args.k else [], xml)
    if not xml.exists():
        print("monarch suite: pytest wrote no results (see its output above)", file=sys.stderr)
        return 2
    print(summarize(outcomes(xml), out / "report.txt"))
    print(f"failures: {out / 'report.txt'}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
