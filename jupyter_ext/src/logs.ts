// The panel's logs view: one allocation's per-rank log files (GET /xmesh/api/logs), filtered by
// rank, stream and a search (a regular expression, as `xmesh logs --grep`), newest at the
// bottom; in follow mode it reads them again on every poll of the panel.
import { URLExt } from '@jupyterlab/coreutils';
import { ServerConnection } from '@jupyterlab/services';

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

export class LogsView {
  readonly node: HTMLElement;
  private readonly title: HTMLElement;
  private readonly rank: HTMLInputElement;
  private readonly stream: HTMLSelectElement;
  private readonly search: HTMLInputElement;
  private readonly follow: HTMLInputElement;
  private readonly note: HTMLElement;
  private readonly output: HTMLPreElement;
  private target: Target | undefined;
  private reading = false;

  constructor(private readonly settings: ServerConnection.ISettings) {
    this.node = document.createElement('div');
    this.node.className = 'xmesh-logs';
    this.node.hidden = true;
    this.title = document.createElement('h3');
    const close = document.createElement('button');
    close.className = 'jp-Button jp-mod-styled jp-mod-minimal xmesh-logs-close';
    close.textContent = 'close';
    close.addEventListener('click', () => this.close());
    this.rank = this.input('number', 'xmesh-logs-rank', 'all ranks');
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
    this.output = document.createElement('pre');
    this.output.className = 'xmesh-logs-output';
    this.node.append(this.title, close, filters, this.note, this.output);
  }

  private input(type: string, className: string, placeholder: string): HTMLInputElement {
    const e = document.createElement('input');
    e.type = type;
    e.className = className;
    e.placeholder = placeholder;
    return e;
  }

  open(target: Target): void {
    this.target = target;
    this.title.textContent = `Logs of ${target.name || target.id}`;
    this.node.dataset.mesh = target.name || target.id;
    this.node.hidden = false;
    void this.refresh();
  }

  close(): void {
    this.target = undefined;
    this.node.hidden = true;
  }

  /** On each poll of the panel: reads again while following. */
  tick(): void {
    if (this.target && this.follow.checked) {
      void this.refresh();
    }
  }

  async refresh(): Promise<void> {
    if (!this.target || this.reading) {
      return;
    }
    this.reading = true;
    const query = new URLSearchParams({ id: this.target.id, name: this.target.name, tail: '500' });
    if (this.rank.value !== '') {
      query.set('rank', this.rank.value);
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
        return;
      }
      const records = reply.records as LogRecord[];
      this.note.textContent = `${records.length} of ${reply.total} line(s)`;
      const text = records.map(formatRecord).join('\n');
      if (this.output.textContent !== text) {
        const atBottom = this.output.scrollTop + this.output.clientHeight >= this.output.scrollHeight - 4;
        this.output.textContent = text;
        if (atBottom) {
          this.output.scrollTop = this.output.scrollHeight;
        }
      }
    } catch (e) {
      this.note.textContent = `error: the server did not answer: ${e}`;
    } finally {
      this.reading = false;
    }
  }
}
