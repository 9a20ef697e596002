// The panel's debugger section: the stopped ranks (from the meshes reply) grouped by the kernel
// or program they belong to, buttons for `continue` and `where`, a line for any other command
// of the xmesh debugger (cast, attach...), and the transcript of what it answered. It talks
// through POST /xmesh/api/debug, which takes the debugger over as `xmesh debug` does and hands
// it back, so it works while the cell waits on the call (its input box waits meanwhile).
import { URLExt } from '@jupyterlab/coreutils';
import { ServerConnection } from '@jupyterlab/services';

import { MeshesReply, RankRow } from './render';

interface Stopped {
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

export class DebuggerSection {
  readonly node: HTMLElement;
  private readonly table: HTMLElement;
  private readonly title: HTMLElement;
  private readonly continueButton: HTMLButtonElement;
  private readonly output: HTMLPreElement;
  private readonly input: HTMLInputElement;
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
    this.continueButton = this.button('continue', 'continue', ['c']);
    buttons.append(this.continueButton, this.button('where', 'where', ['where']));
    this.input = document.createElement('input');
    this.input.className = 'xmesh-debug-command';
    this.input.placeholder = 'cast trainer ranks(0:2) p loss · attach trainer 3 · help';
    this.input.addEventListener('keydown', e => {
      if (e.key === 'Enter' && this.input.value.trim()) {
        void this.send([this.input.value.trim()]);
        this.input.value = '';
      }
    });
    this.output = document.createElement('pre');
    this.output.className = 'xmesh-debug-output';
    this.node.append(this.title, this.table, buttons, this.input, this.output);
  }

  private button(label: string, action: string, lines: string[]): HTMLButtonElement {
    const b = document.createElement('button');
    b.className = 'jp-Button jp-mod-styled xmesh-debug-button';
    b.textContent = label;
    b.dataset.action = action;
    b.addEventListener('click', () => void this.send(lines));
    return b;
  }

  /** The stopped ranks of the latest reply. The section shows while a kernel or program owns a
   * mesh (`where` is the tool for a hang), marked while ranks are stopped. */
  update(reply: MeshesReply): void {
    const stopped = stoppedRanks(reply);
    this.pid = controllerPid(reply, stopped);
    this.title.textContent = stopped.length ? `Stopped in pdb (${stopped.length})` : `Debugger (pid ${this.pid})`;
    this.node.classList.toggle('xmesh-has-stopped', stopped.length > 0);
    this.continueButton.disabled = !stopped.length;
    this.table.replaceChildren();
    for (const s of stopped) {
      const row = document.createElement('div');
      row.className = 'xmesh-stopped-row';
      row.dataset.rank = String(s.rank.rank);
      const coords = Object.entries(s.rank.coords ?? {})
        .map(([k, v]) => `${k}=${v}`)
        .join(', ');
      row.textContent = `${s.rank.actor ?? '?'} rank ${s.rank.rank} (${coords}) at ${s.rank.where ?? '?'} · ${s.mesh}, pid ${s.pid}`;
      this.table.appendChild(row);
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
