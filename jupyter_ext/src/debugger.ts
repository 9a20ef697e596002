// The panel's debugger section: the stopped ranks (from the meshes reply) grouped by the kernel
// or program they belong to, buttons for `continue` and `where`, a line for any other command
// of the xmesh debugger (cast, attach...), and the transcript of what it answered. It talks
// through POST /xmesh/api/debug, which takes the debugger over as `xmesh debug` does and hands
// it back, so it works while the cell waits on the call (its input box waits meanwhile).
import { URLExt } from '@jupyterlab/coreutils';
import { ServerConnection } from '@jupyterlab/services';

import { ConsoleView } from './console';
import { MeshesReply, RankRow } from './render';

export interface Stopped {
  pid: number;
  mesh: string;
  rank: RankRow;
}

/** The kernel (or program) the debugger section talks to: one with stopped ranks first, else the
 * owner of the first mesh that has one (for `where` on a hang). */
function controllerPid(reply: MeshesReply, stopped: Stopped[]): number | undefined {
  if (stopped.length) {
    return stopped[0].pid;
  }
  return (reply.meshes ?? []).find(m => m.owner)?.owner?.pid;
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

/** `cast` lines for the selected ranks, one per actor mesh: "cast slow ranks(2, 6) c". */
export function castLines(selected: Stopped[], command: string): string[] {
  const byActor = new Map<string, number[]>();
  for (const s of selected) {
    const actor = s.rank.actor ?? '?';
    byActor.set(actor, [...(byActor.get(actor) ?? []), s.rank.rank]);
  }
  return [...byActor].map(([actor, ranks]) => `cast ${actor} ranks(${ranks.sort((a, b) => a - b).join(', ')}) ${command}`);
}

function coordsText(rank: RankRow): string {
  return Object.entries(rank.coords ?? {})
    .map(([k, v]) => `${k}=${v}`)
    .join(', ');
}

export class DebuggerSection {
  readonly node: HTMLElement;
  readonly console: ConsoleView;
  private readonly table: HTMLElement;
  private readonly title: HTMLElement;
  private readonly continueButton: HTMLButtonElement;
  private readonly selectedBar: HTMLElement;
  private readonly castInput: HTMLInputElement;
  private readonly output: HTMLPreElement;
  private readonly input: HTMLInputElement;
  private readonly selected = new Set<string>(); // "actor/rank" of the rows ticked
  private stopped: Stopped[] = [];
  private pid: number | undefined;
  private busy = false;

  constructor(private readonly settings: ServerConnection.ISettings) {
    this.node = document.createElement('div');
    this.node.className = 'xmesh-debugger';
    this.node.hidden = true;
    this.title = document.createElement('h3');
    this.table = document.createElement('div');
    this.table.className = 'xmesh-stopped';
    const buttons = document.createElement('div');
    buttons.className = 'xmesh-debug-buttons';
    this.continueButton = this.button('continue all', 'continue', () => ['c']);
    buttons.append(this.continueButton, this.button('where', 'where', () => ['where']));
    // What acts on the ticked rows only: continue them, or cast one pdb command to them.
    this.selectedBar = document.createElement('div');
    this.selectedBar.className = 'xmesh-debug-selected';
    this.castInput = document.createElement('input');
    this.castInput.className = 'xmesh-debug-cast';
    this.castInput.placeholder = 'pdb command for the ticked ranks: p loss';
    this.castInput.addEventListener('keydown', e => {
      if (e.key === 'Enter' && this.castInput.value.trim()) {
        void this.send(castLines(this.ticked(), this.castInput.value.trim()));
        this.castInput.value = '';
      }
    });
    this.selectedBar.append(this.button('continue ticked', 'continue-selected', () => castLines(this.ticked(), 'c')),
      this.castInput);
    this.input = document.createElement('input');
    this.input.className = 'xmesh-debug-command';
    this.input.placeholder = 'cast trainer ranks(0:2) p loss · pause trainer ranks(3) · help';
    this.input.addEventListener('keydown', e => {
      if (e.key === 'Enter' && this.input.value.trim()) {
        void this.send([this.input.value.trim()]);
        this.input.value = '';
      }
    });
    this.output = document.createElement('pre');
    this.output.className = 'xmesh-debug-output';
    this.console = new ConsoleView(settings);
    this.node.append(this.title, this.table, buttons, this.selectedBar, this.input, this.output, this.console.node);
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

  private row(s: Stopped): HTMLElement {
    const key = `${s.rank.actor}/${s.rank.rank}`;
    const row = document.createElement('div');
    row.className = 'xmesh-stopped-row';
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
    const text = document.createElement('span');
    text.className = 'xmesh-stopped-text';
    // The columns of the xmesh_dbg> table: actor, rank, coordinates, host, function and line, reason.
    text.textContent =
      `${s.rank.actor ?? '?'} rank ${s.rank.rank} (${coordsText(s.rank)}) on ${s.rank.host ?? '?'} at ` +
      `${s.rank.where ?? '?'}${s.rank.reason ? ` (${s.rank.reason})` : ''} · ${s.mesh}, pid ${s.pid}`;
    const attach = document.createElement('button');
    attach.className = 'jp-Button jp-mod-styled jp-mod-minimal xmesh-stopped-attach';
    attach.textContent = 'attach';
    attach.addEventListener('click', () =>
      this.console.open({ pid: s.pid, actor: s.rank.actor ?? '?', rank: s.rank.rank, coords: coordsText(s.rank) }));
    row.append(tick, text, attach);
    return row;
  }

  /** The stopped ranks of the latest reply. The section shows while a kernel or program owns a
   * mesh (`where` is the tool for a hang), marked while ranks are stopped. */
  update(reply: MeshesReply): void {
    const stopped = stoppedRanks(reply);
    this.pid = controllerPid(reply, stopped);
    this.title.textContent = stopped.length ? `Stopped in pdb (${stopped.length})` : `Debugger (pid ${this.pid})`;
    this.node.classList.toggle('xmesh-has-stopped', stopped.length > 0);
    this.continueButton.disabled = !stopped.length;
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
    const target = this.console.attachedTo;
    if (target && stopped.some(s => s.pid === target.pid && s.rank.actor === target.actor && s.rank.rank === target.rank)) {
      this.console.stoppedAgain();
    }
    this.node.hidden = this.pid === undefined;
  }

  async send(lines: string[]): Promise<void> {
    if (this.busy || this.pid === undefined) {
      return;
    }
    this.busy = true;
    this.node.classList.add('xmesh-busy');
    try {
      const url = URLExt.join(this.settings.baseUrl, 'xmesh', 'api', 'debug');
      const response = await ServerConnection.makeRequest(
        url,
        { method: 'POST', body: JSON.stringify({ pid: this.pid, lines }) },
        this.settings
      );
      const reply = await response.json();
      this.output.textContent = reply.error ? `error: ${reply.error}` : reply.transcript;
    } catch (e) {
      this.output.textContent = `error: the server did not answer: ${e}`;
    } finally {
      this.busy = false;
      this.node.classList.remove('xmesh-busy');
    }
  }
}
