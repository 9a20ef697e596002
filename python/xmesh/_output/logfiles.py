"""Reading the per-rank log files host agents keep (runtime/hostd/host_agent.cpp): what
`mesh.logs()` and `xmesh logs` show, for live and finished allocations alike.

The directory layout (a log directory per allocation with procs.json and rank<r>.log, rotated
by size into rank<r>.log.1 (newest) ... rank<r>.log.N) is runtime/base/layout.hpp's and the record
format runtime/output/log_record.hpp's; this module asks xmesh._core for both."""
import collections
import datetime
import json
import os
import re
import time

from .. import _core
from .._base.pids import pid_alive


class LogRecord(collections.namedtuple("LogRecord", "host pid rank coords actor stream time text")):
    """One line a proc wrote (host, pid, rank, coords, actor, stream, time, text). time: seconds
    since the epoch (sortable); `when` is the same as a local datetime, and the repr shows it
    readably."""

    __slots__ = ()

    @property
    def when(self) -> datetime.datetime:
        return datetime.datetime.fromtimestamp(self.time)

    def __repr__(self) -> str:
        fields = ", ".join(f"{k}={getattr(self, k)!r}" for k in self._fields if k != "time")
        return f"LogRecord({fields}, time={self.when.isoformat(sep=' ', timespec='milliseconds')})"


def logdir(runtime_dir, name, alloc_id):
    return _core.layout_log_dir(runtime_dir, name or "", alloc_id)


def read_meta(d):
    """The allocation a log directory belongs to (its procs.json), or None when unreadable."""
    try:
        with open(_core.layout_procs_meta_file(d)) as f:
            return _core.AllocationMeta.from_dict(json.load(f))
    except (OSError, ValueError):
        return None


def find_logdirs(runtime_dir, name_or_id):
    """The log directories of allocations named name_or_id (or with that id), oldest first."""
    root = _core.layout_logs_root(runtime_dir)
    try:
        entries = os.listdir(root)
    except OSError:
        return []

    def open_dir(e):
        d = os.path.join(root, e)
        return d, read_meta(d), os.path.getmtime(d)

    return _matching(entries, name_or_id, open_dir)


def find_agent_logdirs(host, log_reader, name_or_id):
    """find_logdirs on another host, through its agent: log_reader(dir) is its ReadLog function
    for a log directory ("" for the directory of them all); AgentLogDirs, oldest first."""
    entries = log_reader("")("", 0, 0)[1]

    def open_dir(e):
        d = AgentLogDir(e, host, log_reader(e))
        return d, _meta_of(d), 0.0

    return _matching(entries, name_or_id, open_dir)


def _matching(entries, name_or_id, open_dir):
    """The directories among entries (names) that hold allocation name_or_id, oldest first;
    open_dir(entry) -> (directory, its AllocationMeta or None, its mtime)."""
    found = []
    for e in entries:
        if e == name_or_id or re.fullmatch(re.escape(name_or_id) + r"-[0-9a-f]{1,16}", e):
            d, meta, mtime = open_dir(e)
            if e != name_or_id and meta is not None and meta.name != name_or_id:
                continue  # "a-b-1f" is allocation "a-b", not "a"
            found.append(((meta.created if meta is not None else 0.0) or mtime, d))
    return [d for _, d in sorted(found, key=lambda x: x[0])]


def rank_files(d):
    """{rank: [files oldest first]} in a log directory."""
    files = {}
    try:
        entries = os.listdir(d)
    except OSError:
        return {}
    for e in entries:
        found = _core.layout_rank_log_of(e)
        if found is not None:
            rank, rotation = found
            files.setdefault(rank, []).append((-rotation, os.path.join(d, e)))
    return {r: [p for _, p in sorted(v)] for r, v in files.items()}


def parse_record(line, rank, meta_rank, host):
    """A LogRecord from one line of a log file (bytes, newline included), None if malformed.
    meta_rank: the rank's RankMeta from procs.json (None when unknown)."""
    parsed = parse_record_flagged(line, rank, meta_rank, host)
    return parsed[0] if parsed is not None else None


def parse_record_flagged(line, rank, meta_rank, host):
    """(LogRecord, partial) where partial: the text had no newline of its own (a piece of a long
    line, or a line the proc had not ended yet), continued by the stream's next record."""
    fields = _core.parse_log_record(line)
    if fields is None:
        return None
    t, stream, partial, actor, text = fields
    pid, coords = (meta_rank.pid, meta_rank.coords) if meta_rank is not None else (None, {})
    return LogRecord(host, pid, rank, coords, actor, stream, t, text), partial


def _whole_lines(lines, rank, meta_rank, host):
    """The records of one file's lines, the pieces of a line joined into one record per stream, as
    a terminal would show them."""
    pending = {}  # stream -> the record its next one continues
    for line in lines:
        parsed = parse_record_flagged(line, rank, meta_rank, host)
        if parsed is None:
            continue
        rec, partial = parsed
        before = pending.pop(rec.stream, None)
        if before is not None:
            rec = before._replace(text=before.text + rec.text)
        if partial:
            pending[rec.stream] = rec
        else:
            yield rec
    yield from pending.values()


def compile_grep(grep):
    if grep is None:
        return None
    try:
        return re.compile(grep)
    except re.error as e:
        raise ValueError(f"grep pattern {grep!r} is not a valid regular expression: {e}") from None


def last(records, tail):
    """The last `tail` records (all when tail is None); tail must be a whole number >= 0."""
    if tail is None:
        return records
    if isinstance(tail, bool) or not isinstance(tail, int) or tail < 0:
        raise ValueError(f"tail must be a whole number of records >= 0, got {tail!r}")
    return records[-tail:] if tail else []


def check_stream(stream: object) -> None:
    """ValueError naming a stream that is not 'stdout', 'stderr' or None (every stream)."""
    if stream not in (None, "stdout", "stderr"):
        raise ValueError(f"stream must be 'stdout', 'stderr' or None, got {stream!r}")


class AgentLogDir:
    """A log directory on another host, read through its agent (the files stay there): `read`
    is the agent's ReadLog request, injected, (file, offset, max_bytes) -> (size, bytes), with
    file "" returning the listing {name: size} instead of bytes."""

    PIECE = 8 << 20

    def __init__(self, name: str, host: str, read) -> None:
        self.name = name
        self.host = host
        self._read = read
        self._listing = None

    def __repr__(self) -> str:
        return f"{self.host}:logs/{self.name}"

    def listing(self) -> dict:
        if self._listing is None:
            self._listing = self._read("", 0, 0)[1]
        return self._listing

    def content(self, file: str) -> bytes:
        """The whole file as the agent has it now, read in pieces."""
        pieces, offset = [], 0
        while True:
            size, data = self._read(file, offset, self.PIECE)
            pieces.append(data)
            offset += len(data)
            if not data or offset >= size:
                return b"".join(pieces)


def _meta_of(d):
    if isinstance(d, AgentLogDir):
        if "procs.json" not in d.listing():
            return None
        try:
            return _core.AllocationMeta.from_dict(json.loads(d.content("procs.json")))
        except ValueError:
            return None
    return read_meta(d)


def _rank_files_of(d):
    """{rank: [files oldest first]}: paths of a local directory, names of an AgentLogDir's."""
    if not isinstance(d, AgentLogDir):
        return rank_files(d)
    files = {}
    for name in d.listing():
        found = _core.layout_rank_log_of(name)
        if found is not None:
            files.setdefault(found[0], []).append((-found[1], name))
    return {r: [n for _, n in sorted(v)] for r, v in files.items()}


def _file_lines(d, file):
    """The lines of one log file (bytes, newlines kept); none when it cannot be read. A local
    file is read as it is iterated."""
    if isinstance(d, AgentLogDir):
        yield from d.content(file).splitlines(keepends=True)
        return
    try:
        f = open(file, "rb")
    except OSError:
        return
    with f:
        yield from f


def read_records(d, ranks=None, stream=None, grep=None, actor=None):
    """Every record of the log directory d (a path, or an AgentLogDir on another host),
    filtered, per rank in file order; the pieces of a long line (or of one written in several
    goes) come joined, as one record."""
    check_stream(stream)
    pattern = compile_grep(grep)
    meta = _meta_of(d)
    host = meta.host if meta is not None else None
    ranks_meta = meta.ranks if meta is not None else {}
    out = []
    for rank, files in sorted(_rank_files_of(d).items()):
        if ranks is not None and rank not in ranks:
            continue
        meta_rank = ranks_meta.get(str(rank))
        for file in files:
            for rec in _whole_lines(_file_lines(d, file), rank, meta_rank, host):
                if (stream and rec.stream != stream) or (actor and rec.actor != actor):
                    continue
                if pattern is not None and not pattern.search(rec.text):
                    continue
                out.append(rec)
    return out


class Follower:
    """Reads what is appended to a log directory's rank files, across rotations."""

    def __init__(self, d, ranks=None):
        self.d = d
        self.ranks = ranks
        self.open = {}  # rank -> (file, inode, pending partial bytes)
        meta = read_meta(d)
        self.host = meta.host if meta is not None else None
        self.meta_ranks = meta.ranks if meta is not None else {}

    def start_at_end(self):
        for rank, files in rank_files(self.d).items():
            if self.ranks is None or rank in self.ranks:
                self._open(rank, files[-1], at_end=True)

    def _open(self, rank, path, at_end=False):
        try:
            f = open(path, "rb")
        except OSError:
            return
        if at_end:
            f.seek(0, os.SEEK_END)
        self.open[rank] = (f, os.fstat(f.fileno()).st_ino, b"")

    def poll(self):
        """New records since the last poll, in time order."""
        records = []
        for rank, files in rank_files(self.d).items():
            if self.ranks is not None and rank not in self.ranks:
                continue
            current = files[-1]
            if rank not in self.open:
                self._open(rank, current)
            if rank not in self.open:
                continue
            f, ino, partial = self.open[rank]
            try:  # before reading: once renamed aside, the old file gets no more writes
                rotated = os.stat(current).st_ino != ino
            except OSError:
                rotated = False
            data = partial + f.read()
            lines = data.split(b"\n")
            partial = lines.pop()
            meta_rank = self.meta_ranks.get(str(rank))
            for line in lines:
                rec = parse_record(line, rank, meta_rank, self.host)
                if rec is not None:
                    records.append(rec)
            if rotated:  # the file we read was renamed aside; its end is read, go on with the new one
                f.close()
                del self.open[rank]
                self._open(rank, current)
            else:
                self.open[rank] = (f, ino, partial)
        records.sort(key=lambda r: (r.time, r.rank))
        return records

    def close(self):
        for f, _, _ in self.open.values():
            f.close()
        self.open.clear()


def procs_alive(d):
    """Whether any proc of the allocation logging into d still runs (pids from procs.json)."""
    meta = read_meta(d)
    for info in (meta.ranks.values() if meta is not None else []):
        pid = info.pid
        if not pid:
            continue
        if pid_alive(pid):
            return True
    return False


def format_record(rec):
    tag = f"{rec.rank}" if rec.stream == "stdout" else f"{rec.rank} stderr"
    return f"[{tag}] {rec.text}"


def follow(d, ranks, stream, pattern, emit, poll_s=0.2, stop_after_idle_s=1.0):
    """Emits new records as they are written, until the allocation's procs are gone and
    nothing new came for stop_after_idle_s (or forever while they run)."""
    fol = Follower(d, ranks)
    fol.start_at_end()
    idle_since = None
    try:
        while True:
            new = fol.poll()
            for rec in new:
                if (stream and rec.stream != stream) or (pattern is not None and not pattern.search(rec.text)):
                    continue
                emit(rec)
            if new:
                idle_since = None
            elif not procs_alive(d):
                idle_since = idle_since or time.monotonic()
                if time.monotonic() - idle_since >= stop_after_idle_s:
                    return
            time.sleep(poll_s)
    finally:
        fol.close()
