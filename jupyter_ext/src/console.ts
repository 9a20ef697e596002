// The panel's console on one stopped rank (`attach` in the debugger section): pdb's output as a
// terminal would show it, a command line, step / next / return / continue / up / down buttons,
// and the source of the frame the rank is in with its current line marked (pdb's `ll`, read
// again after every command). Each command is one POST /xmesh/api/pdb: the server types it at
// that rank through the controller's debugger (taking it over from the cell's input box as
// `xmesh debug` does, handing it back after), so it works while the cell waits on the call.
import { URLExt } from '@jupyterlab/coreutils';
import { ServerConnection } from '@jupyterlab/services';

import { element } from './render';

export interface ConsoleTarget {
  pid: number;
  actor: string;
  rank: number;
  coords: string;
  reason?: string; // why it stopped: "attached" (stopped only to look) runs on at detach
}

interface PdbReply {
  error?: string;
  output?: string;
  source?: string;
  stopped?: boolean;
  note?: string;
}

const BUTTONS: [string, string][] = [
  ['step', 's'],
  ['next', 'n'],
  ['return', 'r'],
  ['continue', 'c'],
  ['up', 'u'],
  ['down', 'd']
];
const MAX_TRANSCRIPT = 200_000; // characters kept of the output; the oldest go first

/** pdb's `ll` as lines, the current one ("->" after its number) marked. */
function renderSource(pre: HTMLElement, source: string): void {
  pre.replaceChildren();
  for (const line of source.replace(/\n$/, '').split('\n')) {
    const current = /^\s*\d+\s+->/.test(line);
    const row = element('div', current ? 'xmesh-console-line xmesh-console-current' : 'xmesh-console-line', line);
    pre.appendChild(row);
    if (current) {
      row.dataset.current = 'true';
    }
  }
  pre.querySelector('[data-current]')?.scrollIntoView({ block: 'center' });
}

export class ConsoleView {
  readonly node = element('div', 'xmesh-console');
  private readonly title = element('h3', 'xmesh-console-title');
  private readonly source = element('pre', 'xmesh-console-source');
  private readonly output = element('pre', 'xmesh-console-output');
  private readonly input = document.createElement('input');
  private readonly buttons: HTMLButtonElement[] = [];
  private target: ConsoleTarget | undefined;
  private busy = false;
  /** Called after each answer (the panel then closes the cell's input box the kernel left). */
  onAnswer: () => void = () => undefined;

  constructor(private readonly settings: ServerConnection.ISettings) {
    this.node.hidden = true;
    const close = document.createElement('button');
    close.className = 'jp-Button jp-mod-styled jp-mod-minimal xmesh-console-close';
    close.textContent = 'detach';
    close.addEventListener('click', () => void this.close());
    const bar = element('div', 'xmesh-console-buttons');
    for (const [label, cmd] of BUTTONS) {
      const b = document.createElement('button');
      b.className = 'jp-Button jp-mod-styled xmesh-console-button';
      b.textContent = label;
      b.dataset.command = cmd;
      b.addEventListener('click', () => void this.send(cmd));
      this.buttons.push(b);
      bar.appendChild(b);
    }
    this.input.className = 'xmesh-console-command';
    this.input.placeholder = '(Pdb) any pdb command: p x, pp vars(self), b 42, until...';
    this.input.addEventListener('keydown', e => {
      if (e.key === 'Enter' && this.input.value.trim()) {
        void this.send(this.input.value.trim());
        this.input.value = '';
      }
    });
    this.node.append(this.title, close, this.source, bar, this.output, this.input);
  }

  get attachedTo(): ConsoleTarget | undefined {
    return this.target;
  }

  /** Opens the console on a stopped rank: its source and where it is. */
  open(target: ConsoleTarget): void {
    this.target = target;
    this.title.textContent = `${target.actor} rank ${target.rank}${target.coords ? ` (${target.coords})` : ''}, pid ${target.pid}`;
    this.node.dataset.actor = target.actor;
    this.node.dataset.rank = String(target.rank);
    this.output.textContent = '';
    this.source.replaceChildren();
    this.node.hidden = false;
    this.setRunning(false);
    void this.send('');
  }

  /** Detaches, as `detach` does in the cell and in `xmesh debug`: a rank stopped only to look
   * (attached while it ran) runs on from where it was; one stopped by a breakpoint or an
   * exception stays stopped. The cell that waits gets its prompt back now, not after the
   * server's hold. */
  async close(): Promise<void> {
    const target = this.target;
    if (target && target.reason === 'attached' && this.node.dataset.state === 'stopped') {
      await this.send('c');
    }
    this.target = undefined;
    this.node.hidden = true;
    if (target) {
      const url = URLExt.join(this.settings.baseUrl, 'xmesh', 'api', 'release');
      void ServerConnection.makeRequest(url, { method: 'POST', body: JSON.stringify({ pid: target.pid }) }, this.settings);
    }
  }

  /** The panel saw this console's rank stopped in pdb: if it ran on, it stopped again. */
  stoppedAgain(): void {
    if (this.node.dataset.state === 'running' && !this.busy) {
      this.append('(stopped again)\n');
      void this.send('');
    }
  }

  private setRunning(running: boolean): void {
    this.node.classList.toggle('xmesh-console-running', running);
    this.node.dataset.state = running ? 'running' : 'stopped';
    for (const b of this.buttons) {
      b.disabled = running;
    }
    this.input.disabled = running;
  }

  private append(text: string): void {
    let all = (this.output.textContent ?? '') + text;
    if (all.length > MAX_TRANSCRIPT) {
      all = all.slice(all.length - MAX_TRANSCRIPT);
    }
    this.output.textContent = all;
    this.output.scrollTop = this.output.scrollHeight;
  }

  /** Types one pdb command ('' only reads the source) and shows what pdb answered. */
  async send(command: string): Promise<void> {
    const target = this.target;
    if (!target || this.busy) {
      return;
    }
    this.busy = true;
    this.node.classList.add('xmesh-busy');
    if (command) {
      this.append(`(Pdb) ${command}\n`);
    }
    try {
      const url = URLExt.join(this.settings.baseUrl, 'xmesh', 'api', 'pdb');
      const response = await ServerConnection.makeRequest(
        url,
        { method: 'POST', body: JSON.stringify({ pid: target.pid, actor: target.actor, rank: target.rank, command }) },
        this.settings
      );
      const reply = (await response.json()) as PdbReply;
      if (reply.error) {
        this.append(`error: ${reply.error}\n`);
      } else if (this.target === target) {
        this.append(reply.output ?? '');
        if (reply.stopped) {
          renderSource(this.source, reply.source ?? '');
        } else {
          this.append(`${reply.note ?? 'it runs on'}\n`);
          this.source.replaceChildren(element('div', 'xmesh-console-line', `${target.actor} rank ${target.rank} runs on`));
        }
        this.setRunning(!reply.stopped);
      }
    } catch (e) {
      this.append(`error: the server did not answer: ${e}\n`);
    } finally {
      this.busy = false;
      this.node.classList.remove('xmesh-busy');
      this.onAnswer();
    }
  }
}
