// Rendering the meshes' reply into the panel: a card per allocation, made once and updated in
// place on every poll (cells keep their elements, so hovering a rank survives a refresh).

export interface RankRow {
  rank: number;
  state: string;
  pid?: number;
  host?: string;
  coords?: Record<string, number>;
  why?: string;
  endpoints?: string[];
  since?: number; // when its oldest unanswered call began (epoch seconds, the server's clock)
  actor?: string;
  where?: string;
  reason?: string; // why pdb stopped: breakpoint, exception, attached...
  process_state?: string;
}

/** The kernel or program that owns a mesh, as its snapshot names it. */
export interface Owner {
  pid: number;
  kind: string;
  argv: string;
  notebook?: string; // a kernel's notebook (the server's session path, else the path it started for)
  kernel_id?: string;
}

/** A short name: the notebook's file name, a program's script, else the pid. */
export function controllerName(o: { pid: number; kind?: string; argv?: string; notebook?: string }): string {
  if (o.notebook) {
    return o.notebook.split('/').pop() || o.notebook;
  }
  if (o.kind === 'kernel') {
    return `kernel pid ${o.pid}`;
  }
  const script = (o.argv ?? '').split(' ').find((w, i) => i > 0 && !w.startsWith('-'));
  return script ? script.split('/').pop() || script : `program pid ${o.pid}`;
}

/** The whole of it, for hover texts: "notebook work/train.ipynb (kernel pid 42)". */
export function controllerTitle(o: { pid: number; kind?: string; argv?: string; notebook?: string }): string {
  if (o.kind === 'kernel') {
    return `${o.notebook ? `notebook ${o.notebook}` : 'a kernel'} (kernel pid ${o.pid})`;
  }
  return `${o.argv || 'a program'} (${o.kind ?? 'program'} pid ${o.pid})`;
}

export interface MeshRow {
  id: string;
  name: string;
  labels: string[];
  sizes: number[];
  host: string;
  controller_pid: number;
  attached: boolean;
  created: number; // epoch seconds, the server's clock
  procs: number;
  procs_alive: number;
  stopping: boolean;
  owner: Owner | null;
  held_back?: HeldBack | null;
  ranks: RankRow[];
}

/** Lines a flood made the display (the cells' output) hold back; the log files have them. */
export interface HeldBack {
  total: number;
  ranks: Record<string, number>;
}

export interface SyncHost {
  host: string;
  dirs: string[];
  same: boolean;
  added: number;
  changed: number;
  deleted: number;
  bytes_received: number;
  time: number; // when the last sync that changed something reached it
  checked: number; // when a sync last found it (up to date or not)
  seconds: number;
  files: string[];
}

export interface SyncWatcher {
  dirs: string[];
  running: boolean;
  syncs: number;
  errors: number;
  last_error: string;
  last_summary: string;
}

/** What one controller (kernel or program) answered: its sync view among the rest. */
export interface ControllerRow {
  pid: number;
  kind?: string;
  argv?: string;
  notebook?: string;
  kernel_id?: string;
  error?: string;
  sync?: { hosts: SyncHost[]; watchers: SyncWatcher[] };
}

/** What the mesh cards' buttons do (the panel supplies them). */
export interface MeshActions {
  stop(mesh: MeshRow): void;
  logs(mesh: MeshRow, rank?: number): void;
  rank?: (mesh: MeshRow, rank: RankRow, event: MouseEvent) => void; // a click on a rank's cell
  insertAttach?: (mesh: MeshRow) => void; // absent where no notebook can take code
}

export interface MeshesReply {
  error?: string;
  revision?: string; // asked again with ?since=revision, an unchanged list is {unchanged: true}
  unchanged?: boolean;
  server_time?: number; // the server's clock when it answered: ages are counted from it
  runtime_dir?: string;
  agent?: { pid: number; host: string } | null;
  meshes?: MeshRow[];
  controllers?: ControllerRow[];
  unreachable?: { locator: string; error: string }[]; // other hosts' agents that did not answer
}

const STATES: [string, string][] = [
  ['idle', 'idle'],
  ['call', 'in a call'],
  ['stopped', 'stopped in pdb'],
  ['dead', 'dead'],
  ['detached', 'no controller']
];

export function element(tag: string, className: string, text?: string): HTMLElement {
  const e = document.createElement(tag);
  e.className = className;
  if (text !== undefined) {
    e.textContent = text;
  }
  return e;
}

export function age(seconds: number): string {
  if (seconds < 120) {
    return `${Math.round(seconds)} s`;
  }
  if (seconds < 7200) {
    return `${Math.round(seconds / 60)} min`;
  }
  return `${(seconds / 3600).toFixed(1)} h`;
}

/** What hovering a rank says: rank, coordinates, host, pid, and its state in words. */
export function rankTitle(r: RankRow, now: number): string {
  const coords = Object.entries(r.coords ?? {})
    .map(([k, v]) => `${k}=${v}`)
    .join(', ');
  let state = r.state;
  if (r.state === 'call') {
    state = `in a call: ${(r.endpoints ?? []).join(', ')} (${Math.max(0, now - (r.since ?? now)).toFixed(1)} s)`;
  } else if (r.state === 'stopped') {
    state = `stopped in pdb: ${r.actor ?? '?'} at ${r.where ?? '?'}`;
  } else if (r.state === 'dead') {
    state = `dead: ${r.why ?? '?'}`;
  } else if (r.state === 'detached') {
    state = 'running, no controller attached';
  }
  return `rank ${r.rank}${coords ? ` (${coords})` : ''} on ${r.host ?? '?'}, pid ${r.pid ?? '?'}: ${state}`;
}

/** A rank's cell brought up to date (class, number, hover text, data attributes for tests). */
function updateCell(cell: HTMLElement, r: RankRow, numbered: boolean, now: number): void {
  const className = `xmesh-rank xmesh-state-${r.state}`;
  if (cell.className !== className) {
    cell.className = className;
  }
  const text = numbered ? String(r.rank) : '';
  if (cell.textContent !== text) {
    cell.textContent = text;
  }
  const title = rankTitle(r, now);
  if (cell.title !== title) {
    cell.title = title;
  }
  cell.dataset.rank = String(r.rank);
  cell.dataset.state = r.state;
}

const MAX_COLUMNS = 32; // what a sidebar's width shows as cells you can point at

/** Columns for a last dimension of `size`: all of it where it fits, else rows of a divisor of it
 * (so that rows still line up with its coordinates: gpus=512 as 16 rows of 32), else 32. */
export function gridColumns(size: number): number {
  if (size <= MAX_COLUMNS) {
    return size;
  }
  for (let d = MAX_COLUMNS; d >= 8; d--) {
    if (size % d === 0) {
      return d;
    }
  }
  return MAX_COLUMNS;
}

/** The grid laid out by the mesh's last dimension (wrapped where it is long); its cells are reused while the mesh keeps its
 * size, so what the pointer hovers stays put across polls. */
function updateGrid(grid: HTMLElement, mesh: MeshRow, now: number): void {
  const columns = gridColumns(mesh.sizes.length ? mesh.sizes[mesh.sizes.length - 1] : Math.max(1, mesh.ranks.length));
  const template = `repeat(${columns}, minmax(${columns > 16 ? 4 : 10}px, 1fr))`;
  if (grid.style.gridTemplateColumns !== template) {
    grid.style.gridTemplateColumns = template;
    grid.classList.toggle('xmesh-grid-dense', columns > 16); // no numbers: small squares
  }
  while (grid.children.length > mesh.ranks.length) {
    grid.lastElementChild?.remove();
  }
  while (grid.children.length < mesh.ranks.length) {
    grid.appendChild(element('div', 'xmesh-rank'));
  }
  mesh.ranks.forEach((r, i) => updateCell(grid.children[i] as HTMLElement, r, columns <= 16, now));
}

function actionButton(label: string, action: string, run: () => void): HTMLButtonElement {
  const b = document.createElement('button');
  b.className = 'jp-Button jp-mod-styled jp-mod-minimal xmesh-mesh-action';
  b.textContent = label;
  b.dataset.action = action;
  b.addEventListener('click', run);
  return b;
}

function ownerText(mesh: MeshRow): string {
  if (mesh.owner) {
    return controllerTitle(mesh.owner);
  }
  return mesh.attached ? `controller pid ${mesh.controller_pid}` : 'detached';
}

/** A card's title: its name; an unnamed mesh by the notebook or program that made it. */
export function meshTitle(mesh: MeshRow): string {
  if (mesh.name) {
    return mesh.name;
  }
  return mesh.owner ? `unnamed mesh of ${controllerName(mesh.owner)}` : `unnamed mesh ${mesh.id}`;
}

/** The order of the cards: by owner (its notebook or program), then oldest first, so a new mesh
 * never moves the others around. */
export function meshOrder(a: MeshRow, b: MeshRow): number {
  const owner = (m: MeshRow) => (m.owner ? controllerName(m.owner) : '\uffff'); // detached ones last
  return owner(a).localeCompare(owner(b)) || a.created - b.created || a.id.localeCompare(b.id);
}

/** One allocation's card, made once per allocation id and updated on every poll; its buttons act
 * on the mesh as last seen. */
class MeshCard {
  readonly node = element('div', 'xmesh-mesh');
  private readonly facts = element('div', 'xmesh-mesh-facts');
  private readonly grid = element('div', 'xmesh-grid');
  private readonly buttons = element('div', 'xmesh-mesh-actions');
  private mesh: MeshRow;
  private stopping: boolean | undefined;

  constructor(mesh: MeshRow, now: number, private readonly actions: MeshActions) {
    this.mesh = mesh;
    this.node.dataset.meshId = mesh.id;
    this.node.dataset.mesh = mesh.name || mesh.id;
    const title = element('div', 'xmesh-mesh-title', meshTitle(mesh));
    title.title = `allocation ${mesh.id}`;
    this.node.append(title, this.facts, this.grid, this.buttons);
    // A click on a rank: what can be done with it (the panel's menu: attach, pause, its logs).
    this.grid.addEventListener('click', e => {
      const cell = (e.target as HTMLElement).closest('.xmesh-rank') as HTMLElement | null;
      const rank = cell ? this.mesh.ranks.find(r => String(r.rank) === cell.dataset.rank) : undefined;
      if (rank && this.actions.rank) {
        this.actions.rank(this.mesh, rank, e);
      }
    });
    this.update(mesh, now);
  }

  update(mesh: MeshRow, now: number): void {
    this.mesh = mesh;
    const shape = mesh.labels.map((l, i) => `${l}=${mesh.sizes[i]}`).join(' x ') || '-';
    const facts = `${shape} on ${mesh.host} · ${mesh.procs_alive}/${mesh.procs} procs alive · ${age(now - mesh.created)} · ` +
      ownerText(mesh) + (mesh.stopping ? ' · stopping' : '');
    if (this.facts.textContent !== facts) {
      this.facts.textContent = facts;
    }
    updateGrid(this.grid, mesh, now);
    if (this.stopping !== mesh.stopping) {
      this.stopping = mesh.stopping;
      this.buttons.replaceChildren();
      this.buttons.appendChild(actionButton('logs', 'logs', () => this.actions.logs(this.mesh)));
      const insert = this.actions.insertAttach;
      if (mesh.name && insert) {
        this.buttons.appendChild(actionButton('insert attach', 'attach', () => insert(this.mesh)));
      }
      if (!mesh.stopping) {
        this.buttons.appendChild(actionButton('stop', 'stop', () => this.actions.stop(this.mesh)));
      }
    }
  }
}

function renderLegend(): HTMLElement {
  const legend = element('div', 'xmesh-legend');
  for (const [state, words] of STATES) {
    legend.appendChild(element('span', `xmesh-state-${state}`, words));
  }
  return legend;
}

/** The meshes part of the panel: a header (agent, count, legend) and a card per allocation, kept
 * in the reply's order; cards of allocations gone are removed. */
export class MeshList {
  readonly node = element('div', 'xmesh-meshes');
  private readonly header = element('div', 'xmesh-meshes-header');
  private readonly list = element('div', 'xmesh-mesh-list');
  private readonly cards = new Map<string, MeshCard>();

  constructor(private readonly actions: MeshActions) {
    this.header.textContent = 'xmesh: reading meshes...';
    this.node.append(this.header, this.list);
  }

  /** now: the server's clock at this moment (the reply's time plus what passed since). */
  update(reply: MeshesReply, now: number): void {
    this.header.replaceChildren(element('h2', '', 'xmesh meshes'));
    if (reply.error) {
      this.header.appendChild(element('div', 'xmesh-error', reply.error));
      return;
    }
    const meshes = [...(reply.meshes ?? [])].sort(meshOrder);
    const agent = reply.agent ? `host agent pid ${reply.agent.pid} on ${reply.agent.host}` : 'no host agent runs';
    this.header.appendChild(element('div', 'xmesh-status', `${agent} · ${meshes.length} allocation(s)`));
    for (const u of reply.unreachable ?? []) {
      this.header.appendChild(element('div', 'xmesh-error xmesh-unreachable', `the host agent at ${u.locator} did not answer: ${u.error}`));
    }
    if (meshes.length) {
      this.header.appendChild(renderLegend());
    }
    const seen = new Set<string>();
    meshes.forEach((mesh, i) => {
      seen.add(mesh.id);
      let card = this.cards.get(mesh.id);
      if (card) {
        card.update(mesh, now);
      } else {
        card = new MeshCard(mesh, now, this.actions);
        this.cards.set(mesh.id, card);
      }
      if (this.list.children[i] !== card.node) {
        this.list.insertBefore(card.node, this.list.children[i] ?? null);
      }
    });
    for (const [id, card] of this.cards) {
      if (!seen.has(id)) {
        card.node.remove();
        this.cards.delete(id);
      }
    }
  }
}
