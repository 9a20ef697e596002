"""The `xmesh_dbg>` prompt (DESIGN §7): Monarch's command grammar over a DebugController (list,
attach, cast, continue, where, help, quit), talking through an I/O object (_debug_io)."""
from .. import _core
from .io import TakenOver
from .._base.shape import ranks_text


HELP = """xmesh debugger commands:
  list (l)                          the table of stopped actors
  attach (a) <actor> <rank>         talk to that rank's pdb; `detach` comes back here (a running
                                    rank is stopped where it is first)
  pause <actor> ranks(...)          stop running ranks where they are (they join the table)
  cast <actor> ranks(...) <cmd>     one pdb command to several ranks, answers grouped
                                    ranks(3), ranks(1,4,6), ranks(2:8:2), ranks(gpus=0:4, hosts=(0,2))
  continue (c)                      clear breakpoints and continue every stopped actor
  where (w)                         stacks of every rank, stopped and running, merged into groups
  help (h)                          this text
  quit (q)                          leave with the actors still stopped (xmesh.debug() comes back)
"""


class DebugPrompt:
    """The `xmesh_dbg>` loop. io: write(text) and read(prompt) (raising EOFError or
    KeyboardInterrupt). Returns "resumed" when no session is stopped any more, "quit". owner:
    the `xmesh debug` client this prompt serves (None: this process's own prompt); the prompt
    raises TakenOver when another one drives."""

    def __init__(self, ctrl, io, owner=None):
        self.ctrl = ctrl
        self.io = io
        self.owner = owner

    def _read(self, prompt):
        if self.ctrl.driver is not self.owner:
            raise TakenOver()
        return self.io.read(prompt)

    def run(self, leave_when_resumed=True, greeting="", stay_open=False):
        """stay_open (the user opened the debugger with nothing stopped, to look at or attach to
        running ranks): the prompt stays until `quit` or `continue`."""
        if greeting:
            self.io.write(greeting)
        self._notes()
        stopped = self.ctrl.stopped()
        for s in stopped:
            s.shown = True
        if stopped:
            self.io.show_table(stopped)
        elif stay_open:
            self.io.write("[xmesh] no actors are stopped in pdb; `where` shows every rank, `attach` or `pause` "
                          "stops running ones, `quit` leaves\n")
            leave_when_resumed = False
        else:
            self.io.write("[xmesh] no actors are stopped in pdb\n")
        if not stopped and leave_when_resumed:
            return "resumed"
        while True:
            try:
                line = self._read("xmesh_dbg> ")
            except EOFError:
                return "quit"
            outcome = self.handle(line)
            if outcome == "quit":
                return "quit"
            if outcome == "continued" and stay_open:
                return "resumed"
            self._notes()
            if leave_when_resumed and not self.ctrl.stopped():
                self.io.write("[xmesh] no actor is stopped in pdb any more\n")
                return "resumed"

    def _notes(self):
        for n in self.ctrl.take_notes():
            self.io.write(f"[xmesh] {n}\n")

    def handle(self, line):
        line = line.strip()
        if not line:
            return None
        word, _, rest = line.partition(" ")
        rest = rest.strip()
        try:
            if word in ("list", "l"):
                self.io.show_table(self.ctrl.stopped())
            elif word in ("attach", "a"):
                self.attach(rest)
            elif word == "pause":
                self.pause(rest)
            elif word == "cast":
                self.cast(rest)
            elif word in ("continue", "c"):
                n = len(self.ctrl.continue_all())
                self.io.write(f"[xmesh] continued {n} session{'s' if n != 1 else ''}\n")
                return "continued"
            elif word in ("where", "w", "bt"):
                self.io.write(self.ctrl.format_stacks())
            elif word in ("help", "h", "?"):
                self.io.write(HELP)
            elif word in ("quit", "q", "exit"):
                return "quit"
            elif word == "detach":
                self.io.write("[xmesh] not attached to any rank\n")
            else:
                self.io.write(f"[xmesh] unknown command {word!r}; `help` lists the commands\n")
        except _CommandError as e:
            self.io.write(f"[xmesh] {e}\n")
        return None

    def _actor_and_rest(self, text, what):
        actors = self.ctrl.actors()
        parts = text.split(None, 1)
        if parts and parts[0] in actors:
            return parts[0], (parts[1] if len(parts) > 1 else "")
        if len(actors) == 1 and parts and not parts[0].isidentifier():
            return actors[0], text  # one actor mesh stopped: its name may be left out
        if not actors:
            raise _CommandError("no actors are stopped in pdb")
        raise _CommandError(f"{what}: name the actor first, one of: {', '.join(actors)}"
                            + (f" (got {parts[0]!r})" if parts else ""))

    def _running_actor_and_rest(self, text, usage):
        """<actor> <rest> where the actor may be running (not in the table): any name."""
        parts = text.split(None, 1)
        if parts and (parts[0] in self.ctrl.actors() or parts[0].isidentifier()):
            return parts[0], (parts[1] if len(parts) > 1 else "")
        return self._actor_and_rest(text, usage)

    def attach(self, text):
        actor, rest = self._running_actor_and_rest(text, "usage: attach <actor> <rank>")
        try:
            rank = int(rest.strip())
        except ValueError:
            raise _CommandError(f"usage: attach <actor> <rank>; {rest.strip()!r} is not a rank") from None
        s = self.ctrl.find(actor, rank)
        if s is None or s.state != "stopped":
            # A running rank: stopped where it is first (reason "attached").
            state = self.ctrl.pause(actor, [rank], idle_too=False)[rank]
            if state != "stopped":
                raise _CommandError(self._not_stopped(actor, [rank], state))
            s = self.ctrl.find(actor, rank)
        self.io.write(f"[xmesh] attached to {actor} rank {rank}; `detach` returns to xmesh_dbg>\n")
        prompt = self._show(s.take_output())
        while True:
            cmd = self._read(f"[{actor} {rank}] {prompt}")
            if cmd.strip() == "detach":
                if s.reason == "attached":  # stopped only to look: it runs on from where it was
                    self.ctrl.continue_all([s])
                    self.io.write(f"[xmesh] detached from {actor} rank {rank}; it runs on\n")
                else:
                    self.io.write(f"[xmesh] detached from {actor} rank {rank}\n")
                return
            answers = self.ctrl.send([s], cmd.rstrip("\n"))
            prompt = self._show(answers[s])
            if s.state != "stopped":
                self.io.write(f"[xmesh] {actor} rank {rank} is {'running' if s.state != 'ended' else 'done'}; "
                              f"detached\n")
                return

    def pause(self, text):
        actor, rest = self._running_actor_and_rest(text, "usage: pause <actor> ranks(...)")
        rest = rest.strip() or "ranks(:)"
        try:
            # The mesh need not be stopped anywhere yet: ranks are counted over this controller's procs.
            ranks = _core.select_ranks(rest, ["rank"], [max(1, self.ctrl.live_proc_count())])
        except ValueError as e:
            raise _CommandError(f"{e}; usage: pause <actor> ranks(...)") from None
        by_state = {}
        for rank, state in self.ctrl.pause(actor, ranks).items():
            by_state.setdefault(state, []).append(rank)
        if set(by_state) == {"unknown"}:
            raise _CommandError(self._not_stopped(actor, ranks, "unknown"))
        for state in ("idle", "native", "awaiting", "unknown"):
            if state in by_state:
                self.io.write(f"[xmesh] {self._not_stopped(actor, by_state[state], state)}\n")
        if "stopped" in by_state:
            self.io.show_table(self.ctrl.stopped())

    def _not_stopped(self, actor, ranks, state):
        """Why ranks a pause asked for are not in the table, with where they are if running."""
        if state == "unknown":
            return self.ctrl.why_not_paused(actor, ranks)
        text = _PAUSE_STATES[state].format(what=f"{actor} {ranks_text(ranks)}")
        if state in ("native", "awaiting"):
            text += ":\n" + self.ctrl.format_stacks(only=(actor, ranks)).rstrip("\n")
        return text

    def _show(self, text):
        """Writes pdb's output, returning its trailing prompt ("(Pdb) ") for the input box."""
        prompt = "(Pdb) "
        if text.endswith(prompt):
            text = text[: -len(prompt)]
        if text:
            self.io.write(text if text.endswith("\n") else text + "\n")
        return prompt

    def cast(self, text):
        actor, rest = self._actor_and_rest(text, "usage: cast <actor> ranks(...) <pdb command>")
        rest = rest.strip()
        try:
            end = _core.rank_selector_end(rest, 0)
        except ValueError as e:
            raise _CommandError(f"{e}; usage: cast <actor> ranks(...) <pdb command>") from None
        selector, cmd = rest[:end], rest[end:].strip()
        if not cmd:
            raise _CommandError("cast needs a pdb command after the ranks, e.g. cast trainer ranks(0:2) p loss")
        shape = self._shape_of(actor)
        try:
            ranks = _core.select_ranks(selector, *shape)
        except ValueError as e:
            raise _CommandError(str(e)) from None
        stopped = {s.rank: s for s in self.ctrl.stopped() if s.actor == actor}
        targets = [stopped[r] for r in ranks if r in stopped]
        missing = [r for r in ranks if r not in stopped]
        if not targets:
            raise _CommandError(f"none of {actor} {ranks_text(ranks)} is stopped in pdb")
        if missing:
            self.io.write(f"[xmesh] not stopped, skipped: {actor} {ranks_text(missing)}\n")
        answers = self.ctrl.send(targets, cmd)
        groups = {}
        for s, text in answers.items():
            if text.endswith("(Pdb) "):
                text = text[: -len("(Pdb) ")]
            groups.setdefault(text, []).append(s.rank)
        for text, rs in sorted(groups.items(), key=lambda kv: min(kv[1])):
            if text and not text.endswith("\n"):
                text += "\n"
            self.io.write(f"[{actor} {ranks_text(rs)}]\n{text}")

    def _shape_of(self, actor):
        """(labels, sizes) of an actor mesh, as its sessions reported them."""
        with self.ctrl.cond:
            sizes = next((s.sizes for s in self.ctrl.sessions.values() if s.actor == actor and s.sizes), {})
        return list(sizes), list(sizes.values())


_PAUSE_STATES = {
    "idle": "{what} is idle: it stops at the start of its next call (the table shows it then)",
    "idle-now": "{what} is not stopped in pdb and runs no call now (`pause` stops it at the start of its next)",
    "native": "{what} is inside a C call or a blocking system call: it stops as soon as it returns to "
              "Python (the table shows it then; `continue` withdraws the pause)",
    "awaiting": "{what} is in an async endpoint awaiting something: it stops when its coroutine runs again "
                "(the table shows it then; `continue` withdraws the pause)",
}


class _CommandError(Exception):
    pass
