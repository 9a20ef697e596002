// The panel's sync section: per kernel or program, the last workspace sync that reached each host
// (sync_workspace's SyncReport: files added, changed, deleted, bytes received, when) and its
// running `watch=True` watchers (directories, syncs done, the last error). Read from the
// controllers' snapshots in the meshes reply; hidden while no controller has synced.
import { ControllerRow, element, MeshesReply, SyncHost, SyncWatcher } from './render';

function bytes(n: number): string {
  const units = ['B', 'KiB', 'MiB', 'GiB'];
  let i = 0;
  while (n >= 1024 && i < units.length - 1) {
    n /= 1024;
    i++;
  }
  return i ? `${n.toFixed(1)} ${units[i]}` : `${n} B`;
}

function at(seconds: number): string {
  return `at ${new Date(seconds * 1000).toLocaleTimeString('en-GB')}`;
}

function hostRow(h: SyncHost): HTMLElement {
  const what = h.same
    ? 'already up to date'
    : `${h.added} added, ${h.changed} changed, ${h.deleted} deleted, received ${bytes(h.bytes_received)}`;
  const checked = h.checked > h.time + 1 ? `, up to date ${at(h.checked)}` : '';
  const row = element('div', 'xmesh-sync-host',
    `${h.host}: ${h.dirs.join(', ')}: ${what} · ${at(h.time)} (${h.seconds.toFixed(2)} s)${checked}`);
  row.dataset.host = h.host;
  row.title = h.files.length ? `sent: ${h.files.join(', ')}` : 'nothing sent';
  return row;
}

function watcherRow(w: SyncWatcher): HTMLElement {
  const state = w.running ? 'watching' : 'stopped';
  const errors = w.errors ? ` · ${w.errors} failed, last: ${w.last_error}` : '';
  const row = element('div', `xmesh-sync-watcher${w.errors ? ' xmesh-error' : ''}`,
    `${state} ${w.dirs.join(', ')}: ${w.syncs} sync${w.syncs === 1 ? '' : 's'}${errors}`);
  row.dataset.state = state;
  row.title = w.last_summary;
  return row;
}

function controllerBlock(c: ControllerRow): HTMLElement {
  const block = element('div', 'xmesh-sync-controller');
  block.dataset.pid = String(c.pid);
  block.appendChild(element('div', 'xmesh-sync-owner', `${c.kind ?? 'program'} pid ${c.pid}${c.argv ? ` (${c.argv})` : ''}`));
  for (const h of c.sync?.hosts ?? []) {
    block.appendChild(hostRow(h));
  }
  for (const w of c.sync?.watchers ?? []) {
    block.appendChild(watcherRow(w));
  }
  return block;
}

export class SyncSection {
  readonly node = element('div', 'xmesh-sync');
  private readonly body = element('div', 'xmesh-sync-body');
  private shown = '';

  constructor() {
    this.node.hidden = true;
    this.node.append(element('h3', '', 'Workspace sync'), this.body);
  }

  update(reply: MeshesReply): void {
    const synced = (reply.controllers ?? []).filter(c => (c.sync?.hosts.length ?? 0) + (c.sync?.watchers.length ?? 0));
    this.node.hidden = !synced.length;
    // Rebuilt only when something changed, so hovering stays.
    const key = JSON.stringify(synced.map(c => [c.pid, c.sync]));
    if (key !== this.shown) {
      this.shown = key;
      this.body.replaceChildren(...synced.map(controllerBlock));
    }
  }
}
