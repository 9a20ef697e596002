// Rendering the meshes' reply into the panel's node: plain DOM, rebuilt on each poll (a few
// hundred cells at most per mesh; 512 ranks draw in well under a frame).

export interface RankRow {
  rank: number;
  state: string;
  pid?: number;
  host?: string;
  coords?: Record<string, number>;
  why?: string;
  endpoints?: string[];
  since_s?: number;
  actor?: string;
  where?: string;
  process_state?: string;
}

export interface MeshRow {
  id: string;
  name: string;
  labels: string[];
  sizes: number[];
  host: string;
  controller_pid: number;
  attached: boolean;
  age_s: number;
  procs: number;
  procs_alive: number;
  stopping: boolean;
  owner: { pid: number; kind: string; argv: string } | null;
  ranks: RankRow[];
}

/** What the mesh cards' buttons do (the panel supplies them). */
export interface MeshActions {
  stop(mesh: MeshRow): void;
  insertAttach?: (mesh: MeshRow) => void; // absent where no notebook can take code
}

export interface MeshesReply {
  error?: string;
  runtime_dir?: string;
  agent?: { pid: number; host: string } | null;
  meshes?: MeshRow[];
}

const STATES: [string, string][] = [
  ['idle', 'idle'],
  ['call', 'in a call'],
  ['stopped', 'stopped in pdb'],
  ['dead', 'dead'],
  ['detached', 'no controller']
];

function element(tag: string, className: string, text?: string): HTMLElement {
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
export function rankTitle(r: RankRow): string {
  const coords = Object.entries(r.coords ?? {})
    .map(([k, v]) => `${k}=${v}`)
    .join(', ');
  let state = r.state;
  if (r.state === 'call') {
    state = `in a call: ${(r.endpoints ?? []).join(', ')} (${(r.since_s ?? 0).toFixed(1)} s)`;
  } else if (r.state === 'stopped') {
    state = `stopped in pdb: ${r.actor ?? '?'} at ${r.where ?? '?'}`;
  } else if (r.state === 'dead') {
    state = `dead: ${r.why ?? '?'}`;
  } else if (r.state === 'detached') {
    state = 'running, no controller attached';
  }
  return `rank ${r.rank}${coords ? ` (${coords})` : ''} on ${r.host ?? '?'}, pid ${r.pid ?? '?'}: ${state}`;
}

function renderGrid(mesh: MeshRow): HTMLElement {
  const grid = element('div', 'xmesh-grid');
  const columns = mesh.sizes.length ? mesh.sizes[mesh.sizes.length - 1] : Math.max(1, mesh.ranks.length);
  grid.style.gridTemplateColumns = `repeat(${columns}, minmax(10px, 1fr))`;
  for (const r of mesh.ranks) {
    const cell = element('div', `xmesh-rank xmesh-state-${r.state}`, columns <= 16 ? String(r.rank) : '');
    cell.title = rankTitle(r);
    cell.dataset.rank = String(r.rank);
    cell.dataset.state = r.state;
    grid.appendChild(cell);
  }
  return grid;
}

function actionButton(label: string, action: string, run: () => void): HTMLButtonElement {
  const b = document.createElement('button');
  b.className = 'jp-Button jp-mod-styled jp-mod-minimal xmesh-mesh-action';
  b.textContent = label;
  b.dataset.action = action;
  b.addEventListener('click', run);
  return b;
}

function renderMesh(mesh: MeshRow, actions: MeshActions): HTMLElement {
  const box = element('div', 'xmesh-mesh');
  box.dataset.mesh = mesh.name || mesh.id;
  box.appendChild(element('div', 'xmesh-mesh-title', mesh.name || `(unnamed ${mesh.id})`));
  const shape = mesh.labels.map((l, i) => `${l}=${mesh.sizes[i]}`).join(' x ') || '-';
  const owner = mesh.owner
    ? `${mesh.owner.kind} pid ${mesh.owner.pid}${mesh.owner.argv ? ` (${mesh.owner.argv})` : ''}`
    : mesh.attached
      ? `controller pid ${mesh.controller_pid}`
      : 'detached';
  box.appendChild(
    element(
      'div',
      'xmesh-mesh-facts',
      `${shape} on ${mesh.host} · ${mesh.procs_alive}/${mesh.procs} procs alive · ${age(mesh.age_s)} · ${owner}` +
        (mesh.stopping ? ' · stopping' : '')
    )
  );
  box.appendChild(renderGrid(mesh));
  const buttons = element('div', 'xmesh-mesh-actions');
  if (mesh.name && actions.insertAttach) {
    const insert = actions.insertAttach;
    buttons.appendChild(actionButton('insert attach', 'attach', () => insert(mesh)));
  }
  if (!mesh.stopping) {
    buttons.appendChild(actionButton('stop', 'stop', () => actions.stop(mesh)));
  }
  box.appendChild(buttons);
  return box;
}

function renderLegend(): HTMLElement {
  const legend = element('div', 'xmesh-legend');
  for (const [state, words] of STATES) {
    legend.appendChild(element('span', `xmesh-state-${state}`, words));
  }
  return legend;
}

export function renderMeshes(node: HTMLElement, reply: MeshesReply, actions: MeshActions): void {
  node.replaceChildren();
  node.appendChild(element('h2', '', 'xmesh meshes'));
  if (reply.error) {
    node.appendChild(element('div', 'xmesh-error', reply.error));
    return;
  }
  const meshes = reply.meshes ?? [];
  const agent = reply.agent ? `host agent pid ${reply.agent.pid} on ${reply.agent.host}` : 'no host agent runs';
  node.appendChild(element('div', 'xmesh-status', `${agent} · ${meshes.length} allocation(s)`));
  if (meshes.length) {
    node.appendChild(renderLegend());
  }
  for (const mesh of meshes) {
    node.appendChild(renderMesh(mesh, actions));
  }
}
