"""xmesh's default for failures nobody waits for (no unhandled fault hook installed): each is
said on stderr, in the cell that caused it, but the failures of one mesh that come together (a
broadcast that failed on 64 ranks, a host lost under 8 procs) are said once: the first report
whole, then the other ranks grouped by how each ended. A hook, when installed, still gets every
failure (Monarch's hook is called once per rank)."""
from __future__ import annotations

import re
import threading
from typing import Callable, Dict, List, Tuple

from .. import _core
from .._base.errors import MeshFailure

BURST_S = 0.25  # failures of one mesh within this long of the first are said together

Say = Callable[[str, str], None]  # (text, cell)


def last_line(report: str) -> str:
    """How a rank ended, in one line: the last line of its report (the exception, the signal)."""
    lines = [line.strip() for line in report.strip().splitlines() if line.strip()]
    return lines[-1] if lines else "failed"


_PROC_HEAD = re.compile(r"^proc rank \d+ \(pid \d+ on [^)]*\) ")


def outcome(failure: MeshFailure) -> str:
    """How a rank ended without what names that rank ("was killed by SIGKILL" rather than "proc
    rank 3 (pid 42 on node-a) was killed by SIGKILL"): the same for ranks that ended alike."""
    return _PROC_HEAD.sub("", last_line(failure.report()))


def ranks_text(ranks: List[int]) -> str:
    text = _core.describe_ranks(ranks)
    return text if text.startswith("ranks") else f"rank {text}"


def summary(failures: List[MeshFailure]) -> str:
    """One text for the failures of one mesh: the first report, then the other ranks by outcome."""
    first = failures[0]
    if len(failures) == 1:
        return first.report()
    ranks = sorted({f.rank for f in failures if f.rank is not None})
    outcomes = {outcome(f) for f in failures}
    if len(outcomes) == 1 and first.kind == "proc" and len(ranks) == len(failures) \
            and all("\n" not in f.report().strip() for f in failures):
        # Every proc ended alike (stopped by the panel, killed by one signal): one line.
        return f"{first.mesh_name!r} ({ranks_text(ranks)}): each proc {outcomes.pop()}"
    head = (f"{len(failures)} failures of {first.mesh_name!r}"
            + (f" ({ranks_text(ranks)})" if ranks else "") + "; the first:\n" + first.report().rstrip())
    by_outcome: Dict[str, List[int]] = {}
    for f in failures[1:]:
        outcome_ranks = by_outcome.setdefault(outcome(f), [])
        if f.rank is not None:
            outcome_ranks.append(f.rank)
    lines = [f"  {ranks_text(sorted(rs)) if rs else 'others'}: {outcome}" for outcome, rs in by_outcome.items()]
    return head + "\nthe others:\n" + "\n".join(lines)


class FaultReports:
    """Collects the failures of each (mesh, kind, cell) for BURST_S, then says them once."""

    def __init__(self, say: Say) -> None:
        self._say = say
        self._lock = threading.Lock()
        self._pending: Dict[Tuple[str, str, str], List[MeshFailure]] = {}

    def add(self, failure: MeshFailure) -> None:
        key = (failure.mesh_name, failure.kind, failure.cell)
        with self._lock:
            group = self._pending.get(key)
            if group is not None:
                group.append(failure)
                return
            self._pending[key] = [failure]
        # Not a daemon: a program that ends within the burst still says its failures.
        threading.Timer(BURST_S, self._flush, (key,)).start()

    def _flush(self, key: Tuple[str, str, str]) -> None:
        with self._lock:
            failures = self._pending.pop(key, [])
        if failures:
            self._say(summary(failures), key[2])
