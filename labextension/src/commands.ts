/**
 * The extension's commands: used by the sidebar's buttons, the palette and dashboard links.
 */
import { JupyterFrontEnd } from '@jupyterlab/application';
import {
  Clipboard,
  Dialog,
  InputDialog,
  Notification,
  showDialog,
  showErrorMessage
} from '@jupyterlab/apputils';

import { Widget } from '@lumino/widgets';

import {
  ApiError,
  createCluster,
  extendCluster,
  forgetCluster,
  ICluster,
  runDoctor,
  scaleCluster,
  stopCluster,
  takeoverCluster
} from './api';
import { doctorTableHtml } from './doctor';
import { DashboardTabs, openDashboard } from './dashboard';
import { DetailTabs, showDetails } from './details';
import { hms } from './format';
import { LogTabs, showLogs } from './logs';
import { isRestoring } from './restore';
import { takeOver } from './takeover';

export namespace CommandIDs {
  export const openDashboard = 'slurm-ray:open-dashboard';
  export const stop = 'slurm-ray:stop';
  export const forget = 'slurm-ray:forget';
  export const copyAttach = 'slurm-ray:copy-attach';
  export const showLogs = 'slurm-ray:show-logs';
  export const showDetails = 'slurm-ray:show-details';
  export const extend = 'slurm-ray:extend';
  export const scale = 'slurm-ray:scale';
  export const takeover = 'slurm-ray:takeover';
  export const refresh = 'slurm-ray:refresh';
  export const create = 'slurm-ray:create';
  export const showSidebar = 'slurm-ray:show-sidebar';
  export const doctor = 'slurm-ray:doctor';
}

/** What the commands need from the rest of the extension. */
export interface ICommandContext {
  refresh: () => Promise<void>;
  /** Drop a forgotten cluster from the sidebar now. */
  remove: (id: string) => void;
  /** Cluster id → name, from the sidebar's last listing. */
  nameOf: (id: string) => string | undefined;
  /** Cluster id → the cluster as last listed (its owner, for the takeover's question). */
  clusterOf: (id: string) => ICluster | undefined;
  defaultProfile: () => string;
  sidebarId: string;
  /** The open cluster tabs of each kind (restored after a reload). */
  tabs: { dashboard: DashboardTabs; logs: LogTabs; details: DetailTabs };
}

interface IClusterArgs {
  id?: string;
  name?: string;
}

async function pickCluster(
  app: JupyterFrontEnd,
  ctx: ICommandContext,
  args: IClusterArgs
): Promise<IClusterArgs | null> {
  if (args.id) {
    return { id: args.id, name: args.name ?? ctx.nameOf(args.id) };
  }
  const answer = await InputDialog.getText({
    title: 'Cluster id',
    placeholder: 'e.g. ray-1a2b3c4d'
  });
  return answer.button.accept && answer.value
    ? { id: answer.value, name: ctx.nameOf(answer.value) }
    : null;
}

/** A picked cluster: its id, name and how to name it in a dialog. */
interface IPicked {
  id: string;
  name?: string;
  label: string;
}

/** Whether the user confirmed a destructive action (its button says `action`). */
async function confirmed(title: string, body: string, action: string): Promise<boolean> {
  const result = await showDialog({
    title,
    body,
    buttons: [Dialog.cancelButton(), Dialog.warnButton({ label: action })]
  });
  return result.button.accept;
}

/**
 * A command that acts on one cluster: the one in its arguments (the sidebar's buttons), or
 * the one the user names (the palette); nothing happens when none is picked.
 */
function clusterCommand(
  app: JupyterFrontEnd,
  ctx: ICommandContext,
  label: string,
  caption: string,
  action: (picked: IPicked, args: Record<string, unknown>) => unknown
) {
  return {
    label,
    caption,
    execute: async (args: Record<string, unknown>) => {
      const picked = await pickCluster(app, ctx, args as IClusterArgs);
      if (!picked?.id) {
        return;
      }
      const named = picked.name ? `${picked.name} (${picked.id})` : picked.id;
      await action({ id: picked.id, name: picked.name, label: named }, args);
    }
  };
}

/** What a command that ends something (a cluster, a record) asks, does and says. */
interface IDestructive {
  label: string;
  caption: string;
  question: string;
  warning: (cluster: string) => string;
  button: string;
  act: (picked: IPicked) => Promise<string>; // what to tell on success
  failure: (error: unknown, cluster: string) => string; // the error dialog's title
}

/** A cluster command that asks for confirmation, acts, tells the outcome, and refreshes. */
function destructiveCommand(app: JupyterFrontEnd, ctx: ICommandContext, what: IDestructive) {
  return clusterCommand(app, ctx, what.label, what.caption, async picked => {
    if (!(await confirmed(what.question, what.warning(picked.label), what.button))) {
      return;
    }
    try {
      Notification.success(await what.act(picked), { autoClose: 5000 });
    } catch (error) {
      await showErrorMessage(what.failure(error, picked.label), (error as Error).message);
    }
    await ctx.refresh();
  });
}

export function addCommands(app: JupyterFrontEnd, ctx: ICommandContext): void {
  const { commands } = app;

  commands.addCommand(
    CommandIDs.openDashboard,
    clusterCommand(
      app,
      ctx,
      'Slurm Ray: Open Dashboard',
      'Open the Ray dashboard of the cluster in a tab',
      (picked, args) =>
        openDashboard(app, ctx.tabs.dashboard, picked.id, picked.name, isRestoring(args))
    )
  );

  commands.addCommand(
    CommandIDs.stop,
    destructiveCommand(app, ctx, {
      label: 'Slurm Ray: Stop Cluster…',
      caption: 'Cancel the Slurm job of the cluster',
      question: 'Stop the cluster?',
      warning: cluster => `This cancels the Slurm job of ${cluster}. Work running on it is lost.`,
      button: 'Stop',
      act: async picked => `${picked.label} is ${(await stopCluster(picked.id)).state}.`,
      failure: () => 'Could not stop the cluster'
    })
  );

  commands.addCommand(
    CommandIDs.forget,
    destructiveCommand(app, ctx, {
      label: 'Slurm Ray: Forget Ended Cluster…',
      caption: 'Delete the record of an ended cluster (or an unreadable record) from the registry',
      question: 'Forget the cluster?',
      warning: cluster =>
        `This deletes the record of ${cluster}: it leaves this list, and %slurm_ray attach no longer finds it. Its job directory and logs stay where they are.`,
      button: 'Forget',
      act: async picked => {
        await forgetCluster(picked.id);
        ctx.remove(picked.id);
        return `Forgot ${picked.label}.`;
      },
      failure: (error, cluster) =>
        error instanceof ApiError && error.status === 409
          ? `${cluster} is still active`
          : 'Could not forget the cluster'
    })
  );

  commands.addCommand(
    CommandIDs.copyAttach,
    clusterCommand(
      app,
      ctx,
      'Slurm Ray: Copy %slurm_ray attach Command',
      'Copy the magic that attaches a notebook to this cluster',
      picked => {
        const text = `%slurm_ray attach ${picked.name ?? picked.id}`;
        Clipboard.copyToSystem(text);
        Notification.info(`Copied: ${text}`, { autoClose: 3000 });
      }
    )
  );

  commands.addCommand(
    CommandIDs.showLogs,
    clusterCommand(
      app,
      ctx,
      'Slurm Ray: Show Logs',
      'Show the bootstrap events and job output of the cluster',
      (picked, args) => showLogs(app, ctx.tabs.logs, picked.id, picked.name, isRestoring(args))
    )
  );

  commands.addCommand(
    CommandIDs.showDetails,
    clusterCommand(
      app,
      ctx,
      'Slurm Ray: Show Cluster Details',
      'Why it waits, its walltime, and what it used (CPU- and GPU-hours, memory)',
      (picked, args) =>
        showDetails(
          app,
          ctx.tabs.details,
          picked.id,
          picked.name,
          CommandIDs.extend,
          commands,
          isRestoring(args)
        )
    )
  );

  commands.addCommand(
    CommandIDs.extend,
    clusterCommand(
      app,
      ctx,
      'Slurm Ray: Extend Walltime…',
      "Add walltime to the cluster's Slurm job (if the site allows it)",
      async picked => {
        const label = picked.label;
        const amount = await InputDialog.getText({
          title: `Extend the walltime of ${label}`,
          label: 'Walltime to add: +30 (minutes) or a Slurm duration like +1:00:00',
          text: '+30'
        });
        if (!amount.button.accept || !amount.value) {
          return;
        }
        try {
          const extended = await extendCluster(picked.id, amount.value);
          Notification.success(`${label}: walltime extended, ${hms(extended.time_left)} left.`, {
            autoClose: 8000
          });
        } catch (error) {
          const refused = error instanceof ApiError && error.status === 403;
          const field = error instanceof ApiError && error.field ? ` (${error.field})` : '';
          await showErrorMessage(
            refused
              ? 'Slurm refused to extend the walltime'
              : `Could not extend the walltime${field}`,
            (error as Error).message
          );
        }
        await ctx.refresh();
      }
    )
  );

  commands.addCommand(
    CommandIDs.scale,
    clusterCommand(
      app,
      ctx,
      'Slurm Ray: Scale…',
      'Ray nodes in all: the head allocation plus one-node worker jobs',
      async (picked, args) => {
        const label = picked.label;
        const wanted = typeof args.nodes === 'number' ? args.nodes : 1;
        const nodes = await InputDialog.getNumber({
          title: `Scale ${label}`,
          label: 'Ray nodes in all (pending worker jobs go first; running ones are drained)',
          value: wanted
        });
        if (!nodes.button.accept || nodes.value === null) {
          return;
        }
        try {
          const scaled = await scaleCluster(picked.id, nodes.value);
          Notification.success(
            scaled.applied
              ? `${label}: scaling to ${nodes.value} nodes.`
              : `${label}: scaling to ${nodes.value} nodes was asked of its owner.`,
            { autoClose: 8000 }
          );
        } catch (error) {
          const field = error instanceof ApiError && error.field ? ` (${error.field})` : '';
          await showErrorMessage(`Could not scale${field}`, (error as Error).message);
        }
        await ctx.refresh();
      }
    )
  );

  commands.addCommand(
    CommandIDs.takeover,
    clusterCommand(
      app,
      ctx,
      'Slurm Ray: Take Over Cluster…',
      'Make this Jupyter server the owner of the cluster (its owner stops acting as one)',
      picked =>
        takeOver(picked.id, picked.label, ctx.clusterOf(picked.id), {
          confirm: confirmed,
          takeover: takeoverCluster,
          success: message => Notification.success(message, { autoClose: 8000 }),
          failure: showErrorMessage,
          refresh: ctx.refresh
        })
    )
  );

  commands.addCommand(CommandIDs.doctor, {
    label: 'Slurm Ray: Doctor',
    caption: 'Check Slurm, the job dir, the cluster Python and Ray on a node, the network',
    execute: async () => {
      const running = Notification.emit(
        'Slurm Ray doctor: running a short test job…',
        'in-progress'
      );
      try {
        const report = await runDoctor();
        Notification.dismiss(running);
        const body = new Widget();
        body.addClass('jsr-doctor-report');
        body.node.innerHTML = doctorTableHtml(report); // every text escaped (doctor.ts)
        await showDialog({
          title: report.ok ? 'Slurm Ray doctor: ready' : 'Slurm Ray doctor: something to fix',
          body,
          buttons: [Dialog.okButton()]
        });
      } catch (error) {
        Notification.dismiss(running);
        await showErrorMessage('The doctor could not run', (error as Error).message);
      }
    }
  });

  commands.addCommand(CommandIDs.refresh, {
    label: 'Slurm Ray: Refresh Clusters',
    execute: () => ctx.refresh()
  });

  commands.addCommand(CommandIDs.showSidebar, {
    label: 'Slurm Ray: Show Clusters',
    execute: () => app.shell.activateById(ctx.sidebarId)
  });

  commands.addCommand(CommandIDs.create, {
    label: 'Slurm Ray: New Cluster from a Profile…',
    caption: 'Submit a cluster owned by the Jupyter server (a notebook can attach to it)',
    execute: async args => {
      const profile = await InputDialog.getText({
        title: 'New Ray cluster from a profile',
        label: "Profile (empty: the server's default)",
        text: String((args as any).profile ?? ctx.defaultProfile())
      });
      if (!profile.button.accept) {
        return;
      }
      const name = await InputDialog.getText({ title: 'Cluster name', text: 'ray' });
      if (!name.button.accept) {
        return;
      }
      const settings: Record<string, unknown> = { name: name.value || 'ray' };
      if (profile.value) {
        settings.profile = profile.value;
      }
      try {
        const created = await createCluster(settings);
        Notification.success(`Submitted ${created.name}: job ${created.job_id}`, {
          autoClose: 5000
        });
      } catch (error) {
        const field = error instanceof ApiError && error.field ? ` (${error.field})` : '';
        await showErrorMessage(`Could not create the cluster${field}`, (error as Error).message);
      }
      await ctx.refresh();
    }
  });
}

export const paletteCommands = [
  CommandIDs.showSidebar,
  CommandIDs.refresh,
  CommandIDs.create,
  CommandIDs.openDashboard,
  CommandIDs.stop,
  CommandIDs.forget,
  CommandIDs.copyAttach,
  CommandIDs.showLogs,
  CommandIDs.showDetails,
  CommandIDs.extend,
  CommandIDs.scale,
  CommandIDs.takeover,
  CommandIDs.doctor
];
