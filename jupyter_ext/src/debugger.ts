// The panel's debugger section, aimed at one kernel or program at a time: by default the kernel
// of the notebook in front of the user, else one with stopped ranks; the user can choose another
// in its list (kept while that controller lives). It shows that controller's stopped ranks (two
// short lines each), `continue all` / `where`, `continue ticked` and a pdb command for the ticked
// rows, a line for any command of the xmesh debugger (cast, pause...), and the last answers. It
// talks through POST /xmesh/api/debug, which takes the debugger over as `xmesh debug` does and
// hands it back, so it works while the cell waits on the call. Collapsed while nothing is stopped.
import { URLExt } from '@jupyterlab/coreutils';
import { ServerConnection } from '@jupyterlab/services';

import { ConsoleView } from './console';
import { controllerName, controllerTitle, element, MeshesReply, Owner, RankRow } from './render';

export interface Stopped {
  pid: number;
  mesh: string;
  rank: RankRow;
}

/** A kernel or program the section can talk to: one that owns a mesh. */
export interface DebugTarget {
  pid: number;
  name: string; // the notebook's file name, or the program
  title: string; // the whole path or command line
  kernelId?: string;
  stopped: number;
}

function stoppedRanks(reply: MeshesReply): Stopped[] {
  const out: Stopped[] = [];
  for (const mesh of reply.meshes ?? []) {
    for (const rank of mesh.ranks) {
      if (rank.state === 'stopped' && mesh.owner) {
        out.push({ pid: mesh.owner.pid, mesh: mesh.name || mesh.id, rank });
      }
    }
  }
  return out;
}

/** The controllers that own meshes, by name (the notebook's), with how many ranks each has stopped. */
export function debugTargets(reply: MeshesReply): DebugTarget[] {
  const owners = new Map<number, Owner>();
  for (const mesh of reply.meshes ?? []) {
    if (mesh.owner) {
      owners.set(mesh.owner.pid, { ...mesh.owner, ...(reply.controllers ?? []).find(c => c.pid === mesh.owner?.pid) });
    }
  }
  const stopped = stoppedRanks(reply);
  return [...owners.values()]
    .map(o => ({
      pid: o.pid,
      name: controllerName(o),
      title: controllerTitle(o),
      kernelId: o.kernel_id,
      stopped: stopped.filter(s => s.pid === o.pid).length
    }))
    .sort((a, b) => a.name.localeCompare(b.name) || a.pid - b.pid);
}

/** Which controller the section talks to: the user's choice while it lives, else the kernel of
 * the notebook in front (activeKernel), else one with stopped ranks, else the first. */
export function chooseTarget(targets: DebugTarget[], chosen: number | undefined, activeKernel: string | undefined):
  number | undefined {
  if (chosen !== undefined && targets.some(t => t.pid === chosen)) {
    return chosen;
  }
  const active = targets.find(t => t.kernelId !== undefined && t.kernelId === activeKernel);
  return (active ?? targets.find(t => t.stopped > 0) ?? targets[0])?.pid;
}

/** `cast` lines for the selected ranks, one per actor mesh: "cast slow ranks(2, 6) c". */
export function castLines(selected: Stopped[], command: string): string[] {
  const byActor = new Map<string, number[]>();
  for (const s of selected) {
    const actor = s.rank.actor ?? '?';
    byActor.set(actor, [...(byActor.get(actor) ?? []), s.rank.rank]);
  }
  return [...byActor].map(([actor, ranks]) => `cast ${actor} ranks(${ranks.sort((a, b) => a - b).join(', ')}) ${command}`);
}

export function coordsText(rank: RankRow): string {
  return Object.entries(rank.coords ?? {})
    .map(([k, v]) => `${k}=${v}`)
    .join(', ');
}

const MAX_ANSWERS = 6; // the transcript keeps the last few commands and their answers

export class DebuggerSection {
  readonly node: HTMLDetailsElement;
  readonly console: ConsoleView;
  private readonly summary: HTMLElement;
  private readonly title: HTMLElement;
  private readonly picker: HTMLSelectElement;
  private readonly elsewhere: HTMLElement;
  private readonly table: HTMLElement;
  private readonly continueButton: HTMLButtonElement;
  private readonly selectedBar: HTMLElement;
  private readonly castInput: HTMLInputElement;
  private readonly output: HTMLElement;
  private readonly input: HTMLInputElement;
  private readonly selected = new Set<string>(); // "actor/rank" of the rows ticked
  private readonly answers: HTMLElement[] = [];
  private stopped: Stopped[] = [];
  private targets: DebugTarget[] = [];
  private chosen: number | undefined; // the user's pick in the list
  private pid: number | undefined;
  private hadStops = false;
  private busy = false;
  /** Called after each answer (the panel then closes the cell's input box the kernel left). */
  onAnswer: () => void = () => undefined;

  /** activeKernel: the id of the kernel of the notebook in front of the user, if any. */
  constructor(private readonly settings: ServerConnection.ISettings,
              private readonly activeKernel: () => string | undefined = () => undefined) {
    this.node = document.createElement('details');
    this.node.className = 'xmesh-debugger';
    this.node.hidden = true;
    this.summary = element('summary', 'xmesh-debugger-summary');
    this.title = element('span', 'xmesh-debugger-title');
    this.picker = document.createElement('select');
    this.picker.className = 'xmesh-debug-target';
    this.picker.title = 'the kernel or program the debugger talks to';
    this.picker.addEventListener('change', () => {
      this.chosen = Number(this.picker.value);
      this.clearAnswers();
      this.render();
    });
    this.elsewhere = element('div', 'xmesh-debug-elsewhere');
    this.table = element('div', 'xmesh-stopped');
    const buttons = element('div', 'xmesh-debug-buttons');
    this.continueButton = this.button('continue all', 'continue', () => ['c']);
    const clear = this.button('clear', 'clear', () => []);
    clear.addEventListener('click', () => this.clearAnswers());
    buttons.append(this.continueButton, this.button('where', 'where', () => ['where']), clear);
    // What acts on the ticked rows only: continue them, or cast one pdb command to them.
    this.selectedBar = element('div', 'xmesh-debug-selected');
    this.castInput = this.commandLine('xmesh-debug-cast', 'pdb command for the ticked ranks: p loss',
      text => castLines(this.ticked(), text));
    this.selectedBar.append(this.button('continue ticked', 'continue-selected', () => castLines(this.ticked(), 'c')),
      this.castInput);
    this.input = this.commandLine('xmesh-debug-command', 'cast trainer ranks(0:2) p loss · pause trainer ranks(3) · help',
      text => [text]);
    this.output = element('div', 'xmesh-debug-output');
    this.console = new ConsoleView(settings);
    this.console.onAnswer = () => this.onAnswer();
    // The stops elsewhere show in the summary: seen while the section is folded.
    this.summary.append(this.title, this.elsewhere);
    this.node.append(this.summary, this.picker, this.table, buttons, this.selectedBar, this.input,
      this.output, this.console.node);
  }

  private commandLine(className: string, placeholder: string, lines: (text: string) => string[]): HTMLInputElement {
    const input = document.createElement('input');
    input.className = className;
    input.placeholder = placeholder;
    input.addEventListener('keydown', e => {
      if (e.key === 'Enter' && input.value.trim()) {
        void this.send(lines(input.value.trim()));
        input.value = '';
      }
    });
    return input;
  }

  private button(label: string, action: string, lines: () => string[]): HTMLButtonElement {
    const b = document.createElement('button');
    b.className = 'jp-Button jp-mod-styled xmesh-debug-button';
    b.textContent = label;
    b.dataset.action = action;
    b.addEventListener('click', () => {
      const typed = lines();
      if (typed.length) {
        void this.send(typed);
      }
    });
    return b;
  }

  private ticked(): Stopped[] {
    return this.stopped.filter(s => this.selected.has(`${s.rank.actor}/${s.rank.rank}`));
  }

  /** The controller talked to now (undefined: none owns a mesh). */
  get target(): DebugTarget | undefined {
    return this.targets.find(t => t.pid === this.pid);
  }

  /** Aims the section at controller pid (a click on a rank of its mesh, say). */
  aimAt(pid: number): void {
    if (this.targets.some(t => t.pid === pid) && this.pid !== pid) {
      this.chosen = pid;
      this.clearAnswers();
      this.render();
    }
  }

  /** Opens the console on a stopped rank of the controller talked to. */
  attach(s: Stopped): void {
    this.aimAt(s.pid);
    this.node.open = true;
    this.console.open({ pid: s.pid, actor: s.rank.actor ?? '?', rank: s.rank.rank, coords: coordsText(s.rank),
      reason: s.rank.reason });
  }

  private row(s: Stopped): HTMLElement {
    const key = `${s.rank.actor}/${s.rank.rank}`;
    const row = element('div', 'xmesh-stopped-row');
    row.dataset.rank = String(s.rank.rank);
    const tick = document.createElement('input');
    tick.type = 'checkbox';
    tick.className = 'xmesh-stopped-tick';
    tick.checked = this.selected.has(key);
    tick.addEventListener('change', () => {
      if (tick.checked) {
        this.selected.add(key);
      } else {
        this.selected.delete(key);
      }
      this.selectedBar.classList.toggle('xmesh-has-selection', this.selected.size > 0);
    });
    // Two short lines (the sidebar is narrow): who, then where and why; all of it on hover.
    const coords = coordsText(s.rank);
    const who = element('div', 'xmesh-stopped-who', `${s.rank.actor ?? '?'} rank ${s.rank.rank}${coords ? ` (${coords})` : ''}`);
    const where = element('div', 'xmesh-stopped-where',
      `at ${s.rank.where ?? '?'}${s.rank.reason ? ` (${s.rank.reason})` : ''} on ${s.rank.host ?? '?'} · ${s.mesh}`);
    const text = element('div', 'xmesh-stopped-text');
    text.append(who, where);
    row.title = `${who.textContent} ${where.textContent}, pid ${s.rank.pid ?? '?'}`;
    const attach = document.createElement('button');
    attach.className = 'jp-Button jp-mod-styled jp-mod-minimal xmesh-stopped-attach';
    attach.textContent = 'attach';
    attach.addEventListener('click', () => this.attach(s));
    row.append(tick, text, attach);
    return row;
  }

  /** The latest reply: the targets, the one talked to, its stopped ranks. */
  update(reply: MeshesReply): void {
    this.targets = debugTargets(reply);
    this.allStopped = stoppedRanks(reply);
    this.render();
  }

  private allStopped: Stopped[] = [];

  private render(): void {
    const pid = chooseTarget(this.targets, this.chosen, this.activeKernel());
    const switched = pid !== this.pid;
    if (switched) {
      this.clearAnswers();
    }
    this.pid = pid;
    this.chosen = this.chosen !== undefined && this.chosen === pid ? this.chosen : undefined;
    this.renderPicker();
    const stopped = this.allStopped.filter(s => s.pid === pid);
    const target = this.target;
    this.title.textContent = stopped.length
      ? `Stopped in pdb (${stopped.length}) · ${target?.name ?? ''}`
      : `Debugger · ${target?.name ?? ''}`;
    this.node.classList.toggle('xmesh-has-stopped', stopped.length > 0);
    // Opens when ranks stop (or the user turns to a controller with stops), folds when they all
    // ran on; turning to one with none leaves it as the user had it.
    if (switched ? stopped.length > 0 : stopped.length > 0 !== this.hadStops) {
      this.node.open = stopped.length > 0;
    }
    this.hadStops = stopped.length > 0;
    this.continueButton.disabled = !stopped.length;
    const others = this.targets.filter(t => t.pid !== pid && t.stopped > 0);
    this.elsewhere.replaceChildren(...others.map(t => {
      const b = element('button', 'jp-Button jp-mod-styled jp-mod-minimal xmesh-debug-other',
        `${t.stopped} rank${t.stopped === 1 ? '' : 's'} stopped in ${t.name}: show`);
      b.addEventListener('click', e => {
        e.preventDefault(); // a click in the summary would fold or open the section
        this.aimAt(t.pid);
      });
      return b;
    }));
    const keys = new Set(stopped.map(s => `${s.rank.actor}/${s.rank.rank}`));
    for (const key of [...this.selected]) {
      if (!keys.has(key)) {
        this.selected.delete(key); // a rank that runs on is no longer ticked
      }
    }
    this.selectedBar.classList.toggle('xmesh-has-selection', this.selected.size > 0);
    const shown = JSON.stringify(this.stopped.map(s => [s.pid, s.rank.actor, s.rank.rank, s.rank.where]));
    this.stopped = stopped;
    if (shown !== JSON.stringify(stopped.map(s => [s.pid, s.rank.actor, s.rank.rank, s.rank.where]))) {
      this.table.replaceChildren(...stopped.map(s => this.row(s))); // rebuilt on change only: ticks stay
    }
    // A console whose rank ran on and stopped again shows where it is now.
    const on = this.console.attachedTo;
    if (on && stopped.some(s => s.pid === on.pid && s.rank.actor === on.actor && s.rank.rank === on.rank)) {
      this.console.stoppedAgain();
    }
    this.node.hidden = pid === undefined;
    this.node.dataset.pid = pid === undefined ? '' : String(pid);
  }

  private renderPicker(): void {
    const options = this.targets.map(t => `${t.pid}:${t.name}:${t.stopped}`).join('|');
    if (this.picker.dataset.options !== options) {
      this.picker.dataset.options = options;
      this.picker.replaceChildren(...this.targets.map(t => {
        const o = document.createElement('option');
        o.value = String(t.pid);
        o.textContent = `${t.name}${t.stopped ? ` · ${t.stopped} stopped` : ''}`;
        o.title = t.title;
        return o;
      }));
    }
    if (this.pid !== undefined) {
      this.picker.value = String(this.pid);
    }
    this.picker.hidden = this.targets.length < 2; // nothing to choose from
  }

  private clearAnswers(): void {
    this.answers.length = 0;
    this.output.replaceChildren();
  }

  /** One exchange at the bottom of the transcript (prompts and commands as a terminal shows
   * them, without the prompt waiting at its end); the oldest go past MAX_ANSWERS. */
  private showAnswer(text: string): void {
    const entry = element('pre', 'xmesh-debug-answer', text.replace(/\n?xmesh_dbg> $/, '\n'));
    this.answers.push(entry);
    while (this.answers.length > MAX_ANSWERS) {
      this.answers.shift()?.remove();
    }
    this.output.appendChild(entry);
    this.output.scrollTop = this.output.scrollHeight;
  }

  async send(lines: string[]): Promise<void> {
    const pid = this.pid;
    if (this.busy || pid === undefined) {
      return;
    }
    this.busy = true;
    this.node.classList.add('xmesh-busy');
    try {
      const url = URLExt.join(this.settings.baseUrl, 'xmesh', 'api', 'debug');
      const response = await ServerConnection.makeRequest(
        url,
        { method: 'POST', body: JSON.stringify({ pid, lines }) },
        this.settings
      );
      const reply = await response.json();
      if (this.pid === pid) {
        this.showAnswer(reply.error ? `${lines.join('\n')}\nerror: ${reply.error}` : reply.transcript);
      }
    } catch (e) {
      this.showAnswer(`${lines.join('\n')}\nerror: the server did not answer: ${e}`);
    } finally {
      this.busy = false;
      this.node.classList.remove('xmesh-busy');
      this.onAnswer();
    }
  }
}
