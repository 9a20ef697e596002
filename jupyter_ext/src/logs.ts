// The panel's logs view: one allocation's per-rank log files (GET /xmesh/api/logs), filtered by
// rank, stream and a search (a regular expression, as `xmesh logs --grep`), newest at the
// bottom; in follow mode it reads them again on every poll of the panel.
import { URLExt } from '@jupyterlab/coreutils';
import { ServerConnection } from '@jupyterlab/services';

import { HeldBack, MeshesReply } from './render';

interface LogRecord {
  rank: number;
  stream: string;
  time: number;
  text: string;
}

interface Target {
  id: string;
  name: string;
}

function clock(seconds: number): string {
  const d = new Date(seconds * 1000);
  const pad = (n: number, w = 2) => String(n).padStart(w, '0');
  return `${pad(d.getHours())}:${pad(d.getMinutes())}:${pad(d.getSeconds())}.${pad(d.getMilliseconds(), 3)}`;
}

export function formatRecord(r: LogRecord): string {
  return `${clock(r.time)} [${r.rank}]${r.stream === 'stderr' ? ' (stderr)' : ''} ${r.text}`;
}

/** One line of the view: stderr's in the error colour (a class, for the theme). */
function recordLine(r: LogRecord): HTMLElement {
  const line = document.createElement('span');
  line.className = r.stream === 'stderr' ? 'xmesh-log-line xmesh-log-stderr' : 'xmesh-log-line';
  line.textContent = formatRecord(r) + '\n';
  return line;
}

export class LogsView {
  readonly node: HTMLElement;
  private readonly title: HTMLElement;
  private readonly rank: HTMLInputElement;
  private readonly stream: HTMLSelectElement;
  private readonly search: HTMLInputElement;
  private readonly follow: HTMLInputElement;
  private readonly note: HTMLElement;
  private readonly held: HTMLElement;
  private readonly output: HTMLPreElement;
  private target: Target | undefined;
  private reading = false;
  private shown = ''; // what the output shows (its records), so a poll that read the same changes nothing
  private firstRead = false; // the first lines after opening show their end

  constructor(private readonly settings: ServerConnection.ISettings) {
    this.node = document.createElement('div');
    this.node.className = 'xmesh-logs';
    this.node.hidden = true;
    this.title = document.createElement('h3');
    const close = document.createElement('button');
    close.className = 'jp-Button jp-mod-styled jp-mod-minimal xmesh-logs-close';
    close.textContent = 'close';
    close.addEventListener('click', () => this.close());
    this.rank = this.input('text', 'xmesh-logs-rank', 'ranks: all, 3, 0-3, 1,4');
    this.rank.title = 'ranks to show: one (3), a range (0-3), a list (1,4,6-7); empty: all';
    this.stream = document.createElement('select');
    this.stream.className = 'xmesh-logs-stream';
    for (const [value, label] of [['', 'both streams'], ['stdout', 'stdout'], ['stderr', 'stderr']]) {
      const o = document.createElement('option');
      o.value = value;
      o.textContent = label;
      this.stream.appendChild(o);
    }
    this.search = this.input('text', 'xmesh-logs-search', 'search (regular expression)');
    const followLabel = document.createElement('label');
    this.follow = document.createElement('input');
    this.follow.type = 'checkbox';
    this.follow.checked = true;
    this.follow.className = 'xmesh-logs-follow';
    followLabel.append(this.follow, ' follow');
    for (const e of [this.rank, this.stream, this.search, this.follow]) {
      e.addEventListener('change', () => void this.refresh());
    }
    this.search.addEventListener('keydown', e => e.key === 'Enter' && void this.refresh());
    const filters = document.createElement('div');
    filters.className = 'xmesh-logs-filters';
    filters.append(this.rank, this.stream, this.search, followLabel);
    this.note = document.createElement('div');
    this.note.className = 'xmesh-logs-note';
    this.held = document.createElement('div');
    this.held.className = 'xmesh-logs-held';
    this.held.hidden = true;
    this.output = document.createElement('pre');
    this.output.className = 'xmesh-logs-output';
    this.node.append(this.title, close, filters, this.held, this.note, this.output);
  }

  private input(type: string, className: string, placeholder: string): HTMLInputElement {
    const e = document.createElement('input');
    e.type = type;
    e.className = className;
    e.placeholder = placeholder;
    return e;
  }

  open(target: Target, held?: HeldBack | null, rank?: number): void {
    this.target = target;
    this.rank.value = rank === undefined ? '' : String(rank);
    this.showHeld(held ?? undefined);
    this.title.textContent = `Logs of ${target.name || target.id}`;
    this.node.dataset.mesh = target.name || target.id;
    this.node.hidden = false;
    this.firstRead = true;
    void this.refresh();
  }

  close(): void {
    this.target = undefined;
    this.shown = '';
    this.node.hidden = true;
  }

  /** On each poll of the panel: the flood's held-back counts of the mesh shown, and its lines
   * again while following. */
  tick(reply: MeshesReply): void {
    if (!this.target) {
      return;
    }
    const id = this.target.id;
    this.showHeld((reply.meshes ?? []).find(m => m.id === id)?.held_back ?? undefined);
    if (this.follow.checked) {
      void this.refresh();
    }
  }

  /** "The output held back 12,000 lines of a flood (rank 3: 9,000 · rank 5: 3,000); they are here". */
  private showHeld(held: HeldBack | undefined): void {
    this.held.hidden = !held || !held.total;
    if (!held || !held.total) {
      return;
    }
    const ranks = Object.entries(held.ranks)
      .sort((a, b) => b[1] - a[1])
      .slice(0, 8)
      .map(([rank, n]) => `rank ${rank}: ${n.toLocaleString('en-US')}`);
    const more = Object.keys(held.ranks).length > 8 ? ' ...' : '';
    const text = `the cells' output held back ${held.total.toLocaleString('en-US')} lines of a flood ` +
      `(${ranks.join(' · ')}${more}); every line is here`;
    if (this.held.textContent !== text) {
      this.held.textContent = text;
    }
  }

  async refresh(): Promise<void> {
    if (!this.target || this.reading) {
      return;
    }
    this.reading = true;
    const query = new URLSearchParams({ id: this.target.id, name: this.target.name, tail: '500' });
    if (this.rank.value.trim() !== '') {
      query.set('rank', this.rank.value.trim());
    }
    if (this.stream.value) {
      query.set('stream', this.stream.value);
    }
    if (this.search.value) {
      query.set('grep', this.search.value);
    }
    try {
      const url = URLExt.join(this.settings.baseUrl, 'xmesh', 'api', 'logs') + '?' + query.toString();
      const response = await ServerConnection.makeRequest(url, {}, this.settings);
      const reply = await response.json();
      if (reply.error) {
        this.note.textContent = `error: ${reply.error}`;
        this.output.replaceChildren(); // nothing shown reads as an answer to the filter
        this.shown = '';
        return;
      }
      const records = reply.records as LogRecord[];
      this.note.textContent = `${records.length} of ${reply.total} line(s)`;
      const text = JSON.stringify(records.map(r => [r.time, r.rank, r.stream, r.text]));
      if (this.shown !== text) {
        const atBottom = this.output.scrollTop + this.output.clientHeight >= this.output.scrollHeight - 4;
        this.shown = text;
        this.output.replaceChildren(...records.map(recordLine));
        if (atBottom || this.firstRead) {
          this.output.scrollTop = this.output.scrollHeight;
        }
        this.firstRead = false;
      }
    } catch (e) {
      this.note.textContent = `error: the server did not answer: ${e}`;
    } finally {
      this.reading = false;
    }
  }
}
