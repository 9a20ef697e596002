"""`xmesh` command line: inspect and control this user's host agent."""
import argparse
import json
import os
import signal
import sys
import time

from ._base.shape import format_coords


def _tcp_agents(args) -> list:
    """The locators (tcp://host:port) of the agents over TCP a command names with --host,
    connected with the cluster's key (--key-file, default $XMESH_KEY_FILE), through --gateway
    (default $XMESH_GATEWAY) when this machine reaches only that agent."""
    from ._api.proc_mesh import hosts

    if not args.host:
        return []
    hm = hosts(args.host, key_file=args.key_file, gateway=args.gateway)
    hm.initialized.get(timeout=30)
    return hm.runtime_dirs


def _local_dirs(args) -> list:
    """The runtime directories a command names (--runtime-dir), this user's own when it names
    neither them nor --host; only those whose agent runs."""
    dirs = args.runtime_dir if isinstance(args.runtime_dir, list) else [args.runtime_dir] if args.runtime_dir else []
    if not dirs and not args.host:
        dirs = [None]
    return [d for d in dirs if _agent_running(d)]


def _status(args):
    from ._runtime.agents import agent

    targets = _tcp_agents(args) + ([args.runtime_dir] if args.runtime_dir or not args.host else [])
    for i, target in enumerate(targets):
        if i:
            print()
        _print_status(agent(target).status(), args.json)
    return 0


def _print_status(st, as_json: bool) -> None:
    if as_json:
        print(json.dumps(st.to_dict(), indent=2))
        return
    print(f"host agent pid {st.pid} on {st.host} (xmesh {st.version}, protocol {st.protocol})")
    print(f"runtime directory {st.runtime_dir}")
    c = st.port
    if c.accepted:  # an agent over TCP: what its one port did
        print(f"its TCP port: {c.accepted} connections, relayed {c.relayed_to_agent} to the agent and "
              f"{c.relayed_to_procs} to procs, {c.lanes_handed_over} lanes handed to procs, {c.refused} refused, "
              f"{c.evicted} closed unauthenticated to make room")
        if c.back or c.relayed_to_remote:  # a controller outside: reached back, or through this agent as a gateway
            print(f"  {c.back} connections a controller reached back opened for this host, "
                  f"{c.relayed_to_remote} relayed to other agents as a gateway")
    if not st.allocations:
        print("no allocations")
    for a in st.allocations:
        alive = sum(p.alive for p in a.procs)
        name = a.name or "(unnamed)"
        age = time.time() - a.created
        shape = format_coords(dict(zip(a.shape.get("labels", []), a.shape.get("sizes", []))), " x ")
        print(f"  {a.alloc}  {name:<16} shape {shape or '-'}  {alive}/{len(a.procs)} procs alive  "
              f"age {age:.0f} s  controller {a.controller}")
        for p in a.procs:  # the procs that cannot answer, and why (from /proc)
            if p.alive and p.state:
                print(f"    rank {p.rank} (pid {p.pid}): {p.state}")


def _shutdown(args):
    from . import _core
    from ._base.pids import pid_alive, running_agent_pid

    rundir = os.path.abspath(args.runtime_dir or _core.runtime_dir())
    pid = running_agent_pid(rundir)
    if pid is None:
        print(f"no host agent runs for {rundir}")
        return 0
    try:
        os.kill(pid, signal.SIGTERM)
    except ProcessLookupError:
        print(f"no host agent runs for {rundir}")
        return 0
    for _ in range(100):
        if not pid_alive(pid):
            print(f"stopped host agent {pid}")
            return 0
        time.sleep(0.05)
    print(f"host agent {pid} did not stop within 5 s", file=sys.stderr)
    return 1


def _agent_running(runtime_dir):
    from . import _core
    from ._base.pids import running_agent_pid

    return running_agent_pid(os.path.abspath(runtime_dir or _core.runtime_dir())) is not None


def _format_age(seconds):
    if seconds < 120:
        return f"{seconds:.0f}s"
    if seconds < 7200:
        return f"{seconds / 60:.0f}m"
    return f"{seconds / 3600:.1f}h"


def _ls(args):
    from ._jobs.control import job_rows
    from ._api.named import allocations

    jobs = job_rows(args.state_dir)
    targets = _tcp_agents(args) + _local_dirs(args) + ([] if args.host else _job_agents(jobs, args.state_dir))
    rows = allocations(targets) if targets else []
    if args.json:
        print(json.dumps(rows + jobs, indent=2))
        return 0
    if jobs:
        _print_jobs(jobs)
    if not rows:
        print("no named allocations")
        return 0
    header = ("NAME", "SHAPE", "HOSTS", "AGE", "PROCS ALIVE", "CONTROLLER")
    table = [header]
    for a in rows:
        shape = format_coords(a["shape"], " x ") or "-"
        ctl = f"pid {a['controller_pid']} ({'attached' if a['attached'] else 'detached'})"
        table.append((a["name"], shape, str(len(a["hosts"])), _format_age(a["age_s"]),
                      f"{a['procs_alive']}/{a['procs']}", ctl))
    widths = [max(len(r[i]) for r in table) for i in range(len(header))]
    for r in table:
        print("  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip())
    return 0


def _job_agents(jobs: list, state_dir) -> list:
    """The agents of the saved jobs that run (their named allocations live on the job's nodes, not
    on this machine's agent), reached with the state directory's key; one that does not answer
    is said and left out."""
    from ._api.proc_mesh import hosts
    from ._jobs.records import default_state_dir, job_key_file

    from ._jobs.job import saved_job

    found: list = []
    for job in jobs:
        if job["state"] != "RUNNING" or not job["hosts"]:
            continue
        try:
            if job["scheduler"] == "kubernetes":  # its own key and way in (a port forward from outside)
                k8s = saved_job(job["name"], state_dir)
                k8s.progress = False
                hm = k8s.attach().host_mesh
            else:
                hm = hosts(list(job["hosts"]), key_file=job_key_file(default_state_dir(state_dir)))
                hm.initialized.get(timeout=30)
            found += hm.runtime_dirs
        except Exception as e:
            print(f"xmesh: the agents of job {job['name']} did not answer: {e}", file=sys.stderr)
    return found


def _print_jobs(jobs: list) -> None:
    table = [("JOB", "SCHEDULER", "NODES", "STATE", "TIME LEFT")]
    for j in jobs:
        left = "-" if j["seconds_left"] is None else _format_age(j["seconds_left"])
        nodes = f"{j['nodes']}" + (f" ({j['node_list']})" if j["node_list"] else "")
        state = j["state"].lower() + (f" ({j['reason']})" if j.get("reason") else "")
        table.append((j["name"], f"{j['scheduler']} {j['job_id']}", nodes, state, left))
    widths = [max(len(r[i]) for r in table) for i in range(len(table[0]))]
    for r in table:
        print("  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip())
    print()


def _stop(args):
    from ._jobs.control import stop_job
    from ._jobs.records import JobError
    from ._api.named import stop_named

    try:
        released = stop_job(args.name, args.state_dir)
    except JobError as e:
        print(f"xmesh: {e}", file=sys.stderr)
        return 1
    if released:
        print(released)
        return 0
    targets = _tcp_agents(args) + _local_dirs(args)
    if not targets or not stop_named(args.name, targets, by=f"`xmesh stop` (pid {os.getpid()})"):
        print(f"xmesh: no live allocation named {args.name!r}", file=sys.stderr)
        return 1
    print(f"stopping {args.name}")
    return 0


def _attach(args):
    """Connects to a saved job (never submitting one), says what runs there, and opens a Python
    prompt with `job`, `hosts` (its HostMesh) and `xmesh` (-c CODE runs CODE instead)."""
    import code

    import xmesh

    from ._jobs.control import job_rows
    from ._jobs.job import saved_job
    from ._api.named import allocations

    job = saved_job(args.name, args.state_dir).attach()
    hosts = job.host_mesh
    (row,) = [r for r in job_rows(args.state_dir) if r["name"] == args.name]
    _print_jobs([row])
    named = allocations(hosts.runtime_dirs)
    for a in named:
        print(f"named allocation {a['name']}: {format_coords(a['shape'], ' x ') or '-'}, "
              f"{a['procs_alive']}/{a['procs']} procs alive (xmesh.attach({a['name']!r}, hosts=hosts))")
    if not named:
        print("no named allocations on its hosts")
    namespace = {"job": job, "hosts": hosts, "xmesh": xmesh}
    if args.c is not None:
        exec(compile(args.c, "<xmesh attach -c>", "exec"), namespace)
        return 0
    code.interact(banner="job, hosts (its HostMesh) and xmesh are defined; Ctrl-D leaves (the job runs on)",
                  local=namespace, exitmsg="")
    return 0


def _own_runtime_dir(path: str) -> str:
    """path, absolute, once it is known to be a directory of this user: another user's runtime
    directory is named as such rather than looking empty or unreachable."""
    path = os.path.abspath(path)
    try:
        st = os.stat(path)
    except FileNotFoundError:
        raise FileNotFoundError(f"no runtime directory {path}") from None
    if st.st_uid != os.getuid():
        raise PermissionError(f"permission denied: the runtime directory {path} is owned by uid {st.st_uid} "
                              f"(you are uid {os.getuid()}); only its owner can read its logs or debug its programs")
    return path


def _log_losses(agent_of, logdir) -> list:
    """What the files of logdir lack, as the agent that wrote them counted it (a full disk);
    agent_of() is that agent, connected, or None when it no longer runs."""
    a = agent_of()
    return [] if a is None else a.log_losses(os.path.basename(str(logdir)).rsplit("-", 1)[-1])


def _log_sources(args) -> list:
    """(the newest log directory of args.name, its agent getter) on each host asked: runtime
    directories here, and hosts over TCP (--host, read through their agents)."""
    from . import _core
    from ._output import logfiles as _logfiles
    from ._runtime.agents import agent

    found = []
    for loc in _tcp_agents(args):
        a = agent(loc)
        dirs = _logfiles.find_agent_logdirs(a.host, a.log_reader, args.name)
        if dirs:
            found.append((dirs[-1], lambda a=a: a))
    if args.runtime_dir or not args.host:
        for d in [_own_runtime_dir(d) for d in (args.runtime_dir or [_core.runtime_dir()])]:
            dirs = _logfiles.find_logdirs(d, args.name)
            if dirs:
                found.append((dirs[-1], lambda d=d: agent(d) if _agent_running(d) else None))
    return found


def _logs(args):
    from ._output import logfiles as _logfiles

    found = _log_sources(args)
    if not found:
        where = ", ".join(args.host or []) or ", ".join(args.runtime_dir or []) or "this host"
        print(f"xmesh: no logs of an allocation named {args.name!r} on {where}", file=sys.stderr)
        return 1
    ranks = set(args.rank) if args.rank else None
    pattern = _logfiles.compile_grep(args.grep)
    _logfiles.last([], args.tail)  # a bad --tail is named before any file is read
    if args.follow and (len(found) > 1 or isinstance(found[0][0], _logfiles.AgentLogDir)):
        raise ValueError("--follow reads the logs of one host's runtime directory (not a host over TCP)")

    def emit(rec):
        line = json.dumps(rec._asdict()) if args.json else _logfiles.format_record(rec)
        sys.stdout.write(line + "\n")

    records = []
    for d, _ in found:
        records.extend(_logfiles.read_records(d, ranks=ranks, stream=args.stream, grep=args.grep))
    records.sort(key=lambda r: (r.time, r.rank))
    for rec in _logfiles.last(records, args.tail):
        emit(rec)
    sys.stdout.flush()
    for logdir, agent_of in found:
        for warning in _log_losses(agent_of, logdir):
            print(f"xmesh: {warning}", file=sys.stderr)
    if args.follow:
        try:
            _logfiles.follow(found[0][0], ranks, args.stream, pattern, lambda rec: (emit(rec), sys.stdout.flush()))
        except KeyboardInterrupt:
            pass
    return 0


def _debug(args):
    from . import _core
    from ._debug import remote as _debug_remote

    rundir = _own_runtime_dir(args.runtime_dir or _core.runtime_dir())
    live = _debug_remote.live_controllers(rundir)
    if args.pid is not None:
        pid = args.pid
        if pid not in live:
            raise RuntimeError(f"pid {pid} is no xmesh program or kernel with a debugger under {rundir}")
    elif args.name:
        from ._api.named import allocations

        # Its agents may be elsewhere (--host); its controller, whose debugger this reaches, runs here.
        targets = _tcp_agents(args) + ([rundir] if _agent_running(rundir) else [])
        named = {a["name"]: a for a in allocations(targets)} if targets else {}
        if args.name not in named:
            raise RuntimeError(f"no live allocation named {args.name!r} under {rundir}"
                               + (f" or on {', '.join(args.host)}" if args.host else "")
                               + (f" (live: {', '.join(sorted(named))})" if named else ""))
        pid = named[args.name]["controller_pid"]
        if pid not in live:
            raise RuntimeError(f"allocation {args.name!r} has no live controller (pid {pid} is gone): attach it from "
                               f"a new kernel or program with xmesh.attach({args.name!r}) first")
    elif args.notebook:
        pid = _kernel_of_notebook(rundir, live, args.notebook)
    elif len(live) == 1:
        pid = next(iter(live))
    elif not live:
        raise RuntimeError(f"no xmesh program or kernel of yours runs with this runtime directory ({rundir})")
    else:
        labels = _controller_labels(rundir, live)
        lines = "\n".join(f"  {labels[p]}" for p in sorted(live, key=lambda p: labels[p]))
        raise RuntimeError(f"{len(live)} xmesh programs or kernels run here; name one with --notebook NAME, --pid PID "
                           f"or an allocation NAME:\n{lines}")
    return _debug_remote.run_client(live[pid])


def _controller_labels(rundir: str, pids) -> dict:
    """{pid: "notebook train.ipynb (kernel pid 42)" or "program ... (pid 43)"}, asked of each
    controller's panel socket (what it says of itself)."""
    from ._panel import view as _view

    panels = _view.live_panels(rundir)
    snaps = {p: _view.decode(p, _view.query_raw(panels[p])) if p in panels else {"pid": p, "error": "no panel socket"}
             for p in pids}
    return {p: _view.controller_label(snap) for p, snap in snaps.items()}


def _kernel_of_notebook(rundir: str, live: dict, notebook: str) -> int:
    """The pid of the kernel running `notebook` (a path, or its end: a file name)."""
    from ._panel import view as _view

    panels = _view.live_panels(rundir)
    found = []
    for pid in live:
        snap = _view.decode(pid, _view.query_raw(panels[pid])) if pid in panels else {}
        path = snap.get("notebook", "")
        if path and (path == notebook or path.endswith("/" + notebook.lstrip("/"))):
            found.append((pid, path))
    if len(found) == 1:
        return found[0][0]
    if found:
        raise RuntimeError(f"{len(found)} kernels run a notebook {notebook!r}: "
                           + "; ".join(f"{path} (pid {pid})" for pid, path in found) + ": name one with --pid")
    labels = _controller_labels(rundir, live)
    running = "\n".join(f"  {labels[p]}" for p in sorted(live, key=lambda p: labels[p])) or "  none"
    raise RuntimeError(f"no kernel of yours runs a notebook {notebook!r}; running:\n{running}")


def _sync(args):
    from ._workspace import sync as _workspace
    from ._runtime.agents import agent
    from ._api.named import allocations
    from ._runtime.process import get_runtime

    targets = _tcp_agents(args) + _local_dirs(args)
    named = {a["name"]: a for a in allocations(targets)} if targets else {}
    if args.name not in named:
        raise RuntimeError(f"no live allocation named {args.name!r}"
                           + (f" (live: {', '.join(sorted(named))})" if named else ""))
    agents = [agent(d) for d in named[args.name]["runtime_dirs"]]

    def procs_of():
        # The procs of the allocation, reached with the cookie they accept; nobody is taken over.
        rt = get_runtime()
        out = []
        for a in agents:
            reply = a.attach(args.name, observe=True)
            for p in reply.procs:
                if p.alive:
                    rt.node.set_peer_cookie(p.addr, reply.job_cookie)
                    out.append((p.rank, p.addr, a, args.name))
        return out

    def once():
        report = _workspace.push(agents, args.path, dest=args.dest, exclude=args.exclude or (),
                                 max_file_size=args.max_file_size or None, space_for=args.name)
        if args.reload and not report.up_to_date:
            _workspace.reload_procs(report, procs_of())
        return report

    print(repr(once()), flush=True)
    if not args.watch:
        return 0
    watcher = _workspace.WorkspaceWatcher(
        once, [os.path.abspath(args.path)],
        on_report=lambda r, e: print(f"xmesh sync failed: {e}" if e else repr(r), flush=True))
    print(f"watching {os.path.abspath(args.path)} (Ctrl-C stops)", flush=True)
    try:
        while watcher.running:
            time.sleep(0.2)
    except KeyboardInterrupt:
        pass
    finally:
        watcher.stop()
    return 0


def _run(args):
    from ._kernel.run_notebook import run_notebook

    code, _ = run_notebook(args.notebook, args.output, timeout=args.timeout, kernel_name=args.kernel,
                           quiet=args.quiet)
    return code


def _keygen(args):
    from . import _core

    public = _core.write_new_key_file(args.file, args.force)
    print(f"wrote {args.file} (mode 0600; public key {public}). Whoever holds this file can run code on every "
          "host that accepts it: copy it only to the machines of this cluster, over a channel you trust.")
    return 0


def _host_arguments(p) -> None:
    p.add_argument("--host", action="append", help="HOST:PORT of a host agent over TCP (repeat for several)")
    p.add_argument("--key-file", help="the cluster's key file for --host (default $XMESH_KEY_FILE)")
    p.add_argument("--gateway", help="HOST:PORT of the one host agent this machine reaches (a port forward): "
                   "the --host agents are reached through it (default $XMESH_GATEWAY)")


def _workspace_default_limit():
    from ._workspace.sync import DEFAULT_MAX_FILE_SIZE

    return DEFAULT_MAX_FILE_SIZE


def main(argv=None):
    from . import _core

    parser = argparse.ArgumentParser(prog="xmesh", description="xmesh: meshes of processes and actors")
    parser.add_argument("--version", action="version",
                        version=f"xmesh {_core.version()} (protocol {_core.protocol_version()}, build {_core.build_id()})")
    sub = parser.add_subparsers(dest="command")
    p = sub.add_parser("status", help="show this user's host agent and its allocations")
    p.add_argument("--runtime-dir", help="runtime directory of the agent (default: this user's)")
    p.add_argument("--json", action="store_true", help="print the raw status as JSON")
    _host_arguments(p)
    p.set_defaults(func=_status)
    p = sub.add_parser("ls", help="list the jobs saved here (scheduler id, nodes, state, time left) and live named "
                                  "allocations (name, shape, hosts, age, procs, controller)")
    p.add_argument("--runtime-dir", action="append", help="an agent's runtime directory (repeat for several hosts)")
    p.add_argument("--json", action="store_true")
    p.add_argument("--state-dir", help="where jobs are saved (default ./.xmesh)")
    _host_arguments(p)
    p.set_defaults(func=_ls)
    p = sub.add_parser("stop", help="release a saved job (scancel) or stop a named allocation (its procs and actors)")
    p.add_argument("name")
    p.add_argument("--state-dir", help="where jobs are saved (default ./.xmesh)")
    p.add_argument("--runtime-dir", action="append", help="an agent's runtime directory (repeat for several hosts)")
    _host_arguments(p)
    p.set_defaults(func=_stop)
    p = sub.add_parser("attach", help="connect to a saved job (never submitting one), list its named allocations "
                                      "and open a Python prompt with job, hosts and xmesh")
    p.add_argument("name")
    p.add_argument("--state-dir", help="where jobs are saved (default ./.xmesh)")
    p.add_argument("-c", metavar="CODE", help="run CODE (job, hosts and xmesh defined) instead of the prompt")
    p.set_defaults(func=_attach)
    p = sub.add_parser("logs", help="print the output of an allocation's procs from the log files "
                                    "(live or finished, also after a kernel restart)")
    p.add_argument("name", help="the allocation's name (or id, for an unnamed one)")
    p.add_argument("--rank", type=int, action="append", help="only this rank (repeat for several)")
    p.add_argument("--tail", type=int, help="only the last N lines")
    p.add_argument("--follow", "-f", action="store_true", help="keep printing new lines until the procs end")
    p.add_argument("--grep", help="only lines matching this regular expression")
    p.add_argument("--stream", choices=("stdout", "stderr"), help="only this stream")
    p.add_argument("--json", action="store_true", help="one JSON record per line (host, pid, rank, coords, actor, "
                                                       "stream, time, text)")
    p.add_argument("--runtime-dir", action="append", help="an agent's runtime directory (repeat for several hosts)")
    _host_arguments(p)
    p.set_defaults(func=_logs)
    p = sub.add_parser("debug", help="drive the debugger of a running kernel or program from this terminal "
                                     "(list, attach, cast, continue, where...)")
    p.add_argument("name", nargs="?", help="the allocation whose controller to reach (default: the only one running)")
    p.add_argument("--pid", type=int, help="the controller's pid (see the list printed when several run)")
    p.add_argument("--notebook", help="the kernel running this notebook (its path, or its file name)")
    p.add_argument("--runtime-dir", help="runtime directory of the agent (default: this user's)")
    _host_arguments(p)
    p.set_defaults(func=_debug)
    p = sub.add_parser("sync", help="push a local directory to every host of a named allocation (only what "
                                    "changed travels); --watch keeps syncing on changes")
    p.add_argument("name", help="the allocation whose hosts receive the workspace")
    p.add_argument("path", nargs="?", default=".", help="the local directory (default: the current one)")
    p.add_argument("--dest", default="", help="where under each host's workspace root ($XMESH_WORKSPACE); "
                                              "default: the root itself")
    p.add_argument("--exclude", action="append", help="a gitignore-style pattern to leave out (repeat)")
    p.add_argument("--max-file-size", type=int, default=_workspace_default_limit(),
                   help="refuse files larger than this many bytes (default 100 MiB; 0: no limit)")
    p.add_argument("--reload", action="store_true", help="reload the changed modules in the allocation's live actors")
    p.add_argument("--watch", action="store_true", help="keep syncing on local changes (inotify) until Ctrl-C")
    p.add_argument("--runtime-dir", action="append", help="an agent's runtime directory (repeat for several hosts)")
    _host_arguments(p)
    p.set_defaults(func=_sync)
    p = sub.add_parser("run", help="execute a notebook headlessly on the xmesh kernel")
    p.add_argument("notebook")
    p.add_argument("-o", "--output", help="where to write the executed notebook (default: NAME.out.ipynb)")
    p.add_argument("--timeout", type=float, default=600, help="seconds one cell may run (default 600)")
    p.add_argument("--kernel", default="xmesh", help="kernelspec to run it on (default: xmesh)")
    p.add_argument("-q", "--quiet", action="store_true", help="print progress only, not the cells' outputs")
    p.set_defaults(func=_run)
    p = sub.add_parser("keygen", help="write a new key file (mode 0600) for hosts over TCP: the shared secret "
                                      "that authenticates and encrypts every link")
    p.add_argument("file")
    p.add_argument("--force", action="store_true", help="replace an existing file")
    p.set_defaults(func=_keygen)
    p = sub.add_parser("shutdown", help="stop this user's host agent and every proc it owns")
    p.add_argument("--runtime-dir")
    p.set_defaults(func=_shutdown)
    args = parser.parse_args(argv)
    if not getattr(args, "func", None):
        parser.print_help()
        return 2
    try:
        return args.func(args)
    except (RuntimeError, PermissionError, OSError, ValueError) as e:
        print(f"xmesh: {e}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())


def run_hostd(argv: "list[str] | None" = None) -> int:
    """The `xmesh-hostd` command of an installed wheel: the host agent inside the package, run
    with this environment's interpreter as the one its procs run (unless XMESH_PYTHON says)."""
    from ._runtime.agents import hostd_environment, hostd_executable

    exe = hostd_executable()
    for name, value in hostd_environment().items():
        os.environ.setdefault(name, value)
    os.execv(exe, [exe] + list(sys.argv[1:] if argv is None else argv))
    return 1  # not reached: execv replaces this process or raises OSError
