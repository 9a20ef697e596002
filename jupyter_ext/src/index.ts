// The xmesh panel (issue 22): a left-sidebar list of this user's meshes, each with a grid of its
// ranks coloured by state, read from the server extension's /xmesh/api/meshes (which asks the
// controllers beside their cells, so it answers while a cell is blocked in a call).
import { JupyterFrontEnd, JupyterFrontEndPlugin } from '@jupyterlab/application';
import { Dialog, showDialog } from '@jupyterlab/apputils';
import { URLExt } from '@jupyterlab/coreutils';
import { ServerConnection } from '@jupyterlab/services';
import { IStatusBar } from '@jupyterlab/statusbar';
import { LabIcon } from '@jupyterlab/ui-components';
import { Menu, Widget } from '@lumino/widgets';

import { DebuggerSection } from './debugger';
import { LogsView } from './logs';
import { closeLeftoverPrompts } from './prompts';
import { controllerTitle, MeshList, MeshesReply, MeshRow, RankRow } from './render';
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

/** The id of the kernel of the notebook in front of the user (JupyterLab's current widget, or
 * Notebook 7's page), if it is one: the debugger section talks to that kernel by default. */
function activeKernelId(app: JupyterFrontEnd): string | undefined {
  // eslint-disable-next-line @typescript-eslint/no-explicit-any
  const widget = app.shell.currentWidget as any;
  return widget?.sessionContext?.session?.kernel?.id ?? undefined;
}

/** A rank the user asked to pause and attach to: its console opens once the panel sees it stopped. */
interface PendingAttach {
  pid: number;
  actor: string;
  rank: number;
}

/** The sidebar: polls the meshes while it is shown. */
export class MeshPanel extends Widget {
  private timer: number | undefined;
  private readonly settings = ServerConnection.makeSettings();
  private readonly meshes: MeshList;
  private readonly debugger: DebuggerSection;
  private readonly logs: LogsView;
  private readonly sync = new SyncSection();
  private last: MeshesReply | undefined; // the latest list: polls ask whether it is still current
  private pendingAttach: PendingAttach | undefined;

  /** Says how many ranks are stopped in pdb (the panel's tab badge and the status bar). */
  onStopped: (count: number) => void = () => undefined;

  constructor(private readonly app: JupyterFrontEnd) {
    super();
    this.logs = new LogsView(this.settings);
    this.meshes = new MeshList({
      stop: mesh => void this.stop(mesh),
      logs: (mesh, rank) => this.logs.open({ id: mesh.id, name: mesh.name }, mesh.held_back, rank),
      rank: (mesh, rank, event) => this.rankMenu(mesh, rank, event),
      insertAttach: mesh => void insertAttach(app, mesh)
    });
    this.id = 'xmesh-panel';
    this.addClass('xmesh-panel');
    this.title.icon = meshIcon;
    this.title.caption = 'xmesh: meshes';
    this.debugger = new DebuggerSection(this.settings, () => activeKernelId(app));
    this.debugger.onAnswer = () => closeLeftoverPrompts();
    this.addRankCommands();
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
    this.attachWhenStopped(reply);
    closeLeftoverPrompts();
    this.meshes.update(reply, now);
    this.sync.update(reply);
    this.logs.tick(reply);
    this.onStopped(stoppedCount(reply));
  }

  /** What a click on a rank offers: attach (a stopped rank), pause and attach (a rank in a
   * call of a kernel's or program's actors), and that rank's logs. */
  private rankMenu(mesh: MeshRow, rank: RankRow, event: MouseEvent): void {
    const menu = new Menu({ commands: this.app.commands });
    menu.addClass('xmesh-rank-menu');
    const args = { id: mesh.id, rank: rank.rank };
    if (rank.state === 'stopped' && mesh.owner) {
      menu.addItem({ command: 'xmesh:rank-attach', args });
    } else if (rank.state === 'call' && mesh.owner && rank.actor) {
      menu.addItem({ command: 'xmesh:rank-pause', args });
    }
    menu.addItem({ command: 'xmesh:rank-logs', args });
    menu.open(event.clientX, event.clientY);
  }

  private meshOf(args: { id?: unknown; rank?: unknown }): [MeshRow, RankRow] | undefined {
    const mesh = this.last?.meshes?.find(m => m.id === args.id);
    const rank = mesh?.ranks.find(r => r.rank === args.rank);
    return mesh && rank ? [mesh, rank] : undefined;
  }

  private addRankCommands(): void {
    const commands = this.app.commands;
    const label = (what: string) => (args: { rank?: unknown }) => `${what} rank ${args.rank}`;
    commands.addCommand('xmesh:rank-attach', {
      label: label('Attach to'),
      execute: args => {
        const found = this.meshOf(args);
        if (found && found[0].owner) {
          this.debugger.attach({ pid: found[0].owner.pid, mesh: found[0].name || found[0].id, rank: found[1] });
        }
      }
    });
    commands.addCommand('xmesh:rank-pause', {
      label: label('Pause and attach to'),
      execute: args => {
        const found = this.meshOf(args);
        if (found && found[0].owner && found[1].actor) {
          const [mesh, rank] = found;
          this.pendingAttach = { pid: mesh.owner!.pid, actor: rank.actor!, rank: rank.rank };
          this.debugger.aimAt(mesh.owner!.pid);
          this.debugger.node.open = true;
          void this.debugger.send([`pause ${rank.actor} ranks(${rank.rank})`]);
        }
      }
    });
    commands.addCommand('xmesh:rank-logs', {
      label: label('Logs of'),
      execute: args => {
        const found = this.meshOf(args);
        if (found) {
          this.logs.open({ id: found[0].id, name: found[0].name }, found[0].held_back, found[1].rank);
        }
      }
    });
  }

  /** The console opens on a rank paused from its menu once the panel sees it stopped. */
  private attachWhenStopped(reply: MeshesReply): void {
    const want = this.pendingAttach;
    if (!want) {
      return;
    }
    for (const mesh of reply.meshes ?? []) {
      const rank = mesh.ranks.find(r => r.rank === want.rank && r.state === 'stopped' && r.actor === want.actor);
      if (rank && mesh.owner?.pid === want.pid) {
        this.pendingAttach = undefined;
        this.debugger.attach({ pid: want.pid, mesh: mesh.name || mesh.id, rank });
        return;
      }
    }
  }

  /** Stops an allocation's procs, once the user confirms. */
  async stop(mesh: MeshRow): Promise<void> {
    const label = mesh.name || `unnamed allocation ${mesh.id}`;
    const owner = mesh.owner ? ` (${controllerTitle(mesh.owner)} uses it and is told)` : '';
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
