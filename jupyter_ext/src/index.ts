// The xmesh panel (issue 22): a left-sidebar list of this user's meshes, each with a grid of its
// ranks coloured by state, read from the server extension's /xmesh/api/meshes (which asks the
// controllers beside their cells, so it answers while a cell is blocked in a call).
import { JupyterFrontEnd, JupyterFrontEndPlugin } from '@jupyterlab/application';
import { Dialog, showDialog } from '@jupyterlab/apputils';
import { URLExt } from '@jupyterlab/coreutils';
import { ServerConnection } from '@jupyterlab/services';
import { IStatusBar } from '@jupyterlab/statusbar';
import { LabIcon } from '@jupyterlab/ui-components';
import { Widget } from '@lumino/widgets';

import { DebuggerSection } from './debugger';
import { LogsView } from './logs';
import { MeshList, MeshesReply, MeshRow } from './render';
import { SyncSection } from './sync';

const POLL_MS = 800; // a change shows within a second (bench/panel_latency.py)
const HIDDEN_POLL_MS = 5000;

function stoppedCount(reply: MeshesReply): number {
  let n = 0;
  for (const mesh of reply.meshes ?? []) {
    n += mesh.ranks.filter(r => r.state === 'stopped').length;
  }
  return n;
}

/** "2 ranks stopped in pdb" in the status bar while there are any; a click opens the panel. */
function stoppedBadge(open: () => void): { node: HTMLElement; set: (n: number) => void } {
  const node = document.createElement('div');
  node.className = 'xmesh-status-badge';
  node.title = 'xmesh: ranks stopped in pdb (click for the panel)';
  node.addEventListener('click', open);
  return {
    node,
    set: (n: number) => {
      node.textContent = n ? `xmesh: ${n} rank${n === 1 ? '' : 's'} stopped in pdb` : '';
      node.hidden = !n;
    }
  };
}

const meshIcon = new LabIcon({
  name: 'xmesh:mesh',
  svgstr:
    '<svg xmlns="http://www.w3.org/2000/svg" width="16" height="16" viewBox="0 0 16 16">' +
    '<g class="jp-icon3" fill="#616161">' +
    '<rect x="1" y="1" width="4" height="4"/><rect x="6" y="1" width="4" height="4"/>' +
    '<rect x="11" y="1" width="4" height="4"/><rect x="1" y="6" width="4" height="4"/>' +
    '<rect x="6" y="6" width="4" height="4"/><rect x="11" y="6" width="4" height="4"/>' +
    '<rect x="1" y="11" width="4" height="4"/><rect x="6" y="11" width="4" height="4"/>' +
    '<rect x="11" y="11" width="4" height="4"/></g></svg>'
});

/** The sidebar: polls the meshes while it is shown. */
export class MeshPanel extends Widget {
  private timer: number | undefined;
  private readonly settings = ServerConnection.makeSettings();
  private readonly meshes: MeshList;
  private readonly debugger: DebuggerSection;
  private readonly logs: LogsView;
  private readonly sync = new SyncSection();
  private last: MeshesReply | undefined; // the latest list: polls ask whether it is still current

  /** Says how many ranks are stopped in pdb (the panel's tab badge and the status bar). */
  onStopped: (count: number) => void = () => undefined;

  constructor(app: JupyterFrontEnd) {
    super();
    this.logs = new LogsView(this.settings);
    this.meshes = new MeshList({
      stop: mesh => void this.stop(mesh),
      logs: mesh => this.logs.open({ id: mesh.id, name: mesh.name }, mesh.held_back),
      insertAttach: mesh => void insertAttach(app, mesh)
    });
    this.id = 'xmesh-panel';
    this.addClass('xmesh-panel');
    this.title.icon = meshIcon;
    this.title.caption = 'xmesh: meshes';
    this.debugger = new DebuggerSection(this.settings);
    // The debugger first: stopped ranks are what needs the user.
    this.node.append(this.debugger.node, this.meshes.node, this.logs.node, this.sync.node);
  }

  protected onAfterShow(): void {
    window.clearInterval(this.timer);
    void this.refresh();
    this.timer = window.setInterval(() => void this.refresh(), POLL_MS);
  }

  protected onBeforeHide(): void {
    // Hidden, it still looks every few seconds: the badge says when ranks stop.
    window.clearInterval(this.timer);
    this.timer = window.setInterval(() => void this.refresh(), HIDDEN_POLL_MS);
  }

  protected onBeforeDetach(): void {
    window.clearInterval(this.timer);
    this.timer = undefined;
  }

  /** Starts looking (every few seconds until the panel is shown). */
  start(): void {
    this.onBeforeHide();
    void this.refresh();
  }

  async refresh(): Promise<void> {
    const since = this.last?.revision ? `?since=${encodeURIComponent(this.last.revision)}` : '';
    const url = URLExt.join(this.settings.baseUrl, 'xmesh', 'api', 'meshes') + since;
    let reply: MeshesReply;
    try {
      const response = await ServerConnection.makeRequest(url, {}, this.settings);
      reply = (await response.json()) as MeshesReply;
      if (!response.ok && !reply.error) {
        reply = { error: `the server answered ${response.status} ${response.statusText}` };
      }
    } catch (e) {
      reply = { error: `the server did not answer: ${e}` };
    }
    if (reply.unchanged && this.last) {
      this.last.server_time = reply.server_time; // the same list: only its ages move on
      reply = this.last;
    } else {
      this.last = reply.error ? undefined : reply;
    }
    const now = reply.server_time ?? Date.now() / 1000;
    this.debugger.update(reply);
    this.meshes.update(reply, now);
    this.sync.update(reply);
    this.logs.tick(reply);
    this.onStopped(stoppedCount(reply));
  }

  /** Stops an allocation's procs, once the user confirms. */
  async stop(mesh: MeshRow): Promise<void> {
    const label = mesh.name || `unnamed allocation ${mesh.id}`;
    const owner = mesh.owner ? ` (${mesh.owner.kind} pid ${mesh.owner.pid} uses it)` : '';
    const answer = await showDialog({
      title: `Stop ${label}?`,
      body: `Its ${mesh.procs} procs and their actors end${owner}; calls waiting on them fail.`,
      buttons: [Dialog.cancelButton(), Dialog.warnButton({ label: 'Stop' })]
    });
    if (!answer.button.accept) {
      return;
    }
    const url = URLExt.join(this.settings.baseUrl, 'xmesh', 'api', 'stop');
    const response = await ServerConnection.makeRequest(
      url,
      { method: 'POST', body: JSON.stringify({ id: mesh.id }) },
      this.settings
    );
    if (!response.ok) {
      const reply = await response.json();
      await showDialog({ title: `Could not stop ${label}`, body: String(reply.error), buttons: [Dialog.okButton()] });
    }
    void this.refresh();
  }
}

/** A new cell below the active one in the current notebook, attaching the named allocation
 * (through the notebook's own commands, the same in JupyterLab and Notebook 7). */
async function insertAttach(app: JupyterFrontEnd, mesh: MeshRow): Promise<void> {
  const variable = mesh.name.replace(/[^A-Za-z0-9_]/g, '_').replace(/^(?=[0-9])/, '_');
  const code = `import xmesh\n${variable} = xmesh.attach(${JSON.stringify(mesh.name)})`;
  try {
    if (!app.commands.isEnabled('notebook:insert-cell-below')) {
      throw new Error('no notebook is open');
    }
    await app.commands.execute('notebook:insert-cell-below');
    await app.commands.execute('notebook:replace-selection', { text: code });
  } catch (e) {
    await showDialog({
      title: 'Open a notebook first',
      body: `xmesh.attach(${JSON.stringify(mesh.name)}) goes into a new cell of the current notebook (${e}).`,
      buttons: [Dialog.okButton()]
    });
  }
}

const plugin: JupyterFrontEndPlugin<void> = {
  id: 'xmesh-jupyter:panel',
  description: 'The xmesh panel: meshes and the state of their ranks',
  autoStart: true,
  optional: [IStatusBar],
  activate: (app: JupyterFrontEnd, statusBar: IStatusBar | null) => {
    const panel = new MeshPanel(app);
    app.shell.add(panel, 'left', { rank: 600 });
    const badge = stoppedBadge(() => app.shell.activateById(panel.id));
    badge.set(0);
    panel.onStopped = n => {
      badge.set(n);
      panel.title.className = n ? 'xmesh-tab-stopped' : '';
    };
    if (statusBar) {
      statusBar.registerStatusItem('xmesh-jupyter:stopped', { item: new Widget({ node: badge.node }), align: 'left' });
    }
    panel.start();
    // The View menu's "xmesh Meshes" (schema/panel.json): how Notebook 7 opens a side panel.
    app.commands.addCommand('xmesh:show-panel', {
      label: 'xmesh Meshes',
      caption: 'Show the meshes and the state of their ranks',
      execute: () => app.shell.activateById(panel.id)
    });
  }
};

export default plugin;
