"""The `xmesh_dbg>` prompt (DESIGN §7): Monarch's command grammar over a DebugController (list,
attach, cast, continue, where, help, quit), talking through an I/O object (_debug_io)."""
from . import _core
from ._debug_io import TakenOver
from ._shape import ranks_text


HELP = """xmesh debugger commands:
  list (l)                          the table of stopped actors
  attach (a) <actor> <rank>         talk to that rank's pdb; `detach` comes back here
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

    def run(self, leave_when_resumed=True, greeting=""):
        if greeting:
            self.io.write(greeting)
        self._notes()
        stopped = self.ctrl.stopped()
        for s in stopped:
            s.shown = True
        if stopped:
            self.io.show_table(stopped)
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
            elif word == "cast":
                self.cast(rest)
            elif word in ("continue", "c"):
                n = len(self.ctrl.continue_all())
                self.io.write(f"[xmesh] continued {n} session{'s' if n != 1 else ''}\n")
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

    def attach(self, text):
        actor, rest = self._actor_and_rest(text, "usage: attach <actor> <rank>")
        try:
            rank = int(rest.strip())
        except ValueError:
            raise _CommandError(f"usage: attach <actor> <rank>; {rest.strip()!r} is not a rank") from None
        s = self.ctrl.find(actor, rank)
        if s is None or s.state != "stopped":
            ranks = [x.rank for x in self.ctrl.stopped() if x.actor == actor]
            raise _CommandError(f"{actor} rank {rank} is not stopped in pdb (stopped ranks of {actor}: "
                                f"{_core.describe_ranks(ranks) if ranks else 'none'})")
        self.io.write(f"[xmesh] attached to {actor} rank {rank}; `detach` returns to xmesh_dbg>\n")
        prompt = self._show(s.take_output())
        while True:
            cmd = self._read(f"[{actor} {rank}] {prompt}")
            if cmd.strip() == "detach":
                self.io.write(f"[xmesh] detached from {actor} rank {rank}\n")
                return
            answers = self.ctrl.send([s], cmd.rstrip("\n"))
            prompt = self._show(answers[s])
            if s.state != "stopped":
                self.io.write(f"[xmesh] {actor} rank {rank} is {'running' if s.state != 'ended' else 'done'}; "
                              f"detached\n")
                return

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


class _CommandError(Exception):
    pass
