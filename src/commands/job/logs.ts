import { defineCommand } from "citty";
import { jobIdPrefix } from "../../jobs/job-id.ts";
import { commandContext } from "../_context.ts";
import { followLog, jobEnd } from "../../jobs/logs.ts";
import { JobStore } from "../../jobs/store.ts";
import { remoteTarget } from "../../cluster/client.ts";
import { rejectUnknownFlags, placeArgs } from "../_args.ts";
import { writeOut, writeErr } from "../../ui/terminal.ts";
import { ExitError, jobEndCode, UsageError } from "../../errors.ts";
import { prefixedLines } from "../_tasks-ui.ts";
import { printable } from "../../ui/escape.ts";

const args = {
  id: { type: "positional", required: true, valueHint: "ID", description: "Job id or a unique prefix of it" },
  follow: { type: "boolean", alias: "f", description: "Keep printing new output until the job ends, then exit with its exit code (as job run does)" },
  task: { type: "string", valueHint: "NAME", description: "A job of tasks: this task's output (without it: each task's, each line with [name]; with --follow, all of them as their lines come)" },
  ...placeArgs,
} as const;

export default defineCommand({
  meta: { name: "logs", description: "Print a job's output (stdout and stderr as they came)" },
  args,
  async run({ args: a, rawArgs }) {
    rejectUnknownFlags(rawArgs, args);
    // Checked here, before a server is asked: the same words either way.
    const id = jobIdPrefix(a.id);
    const ctx = await commandContext({ server: a.server, token: a.token, token_file: a["token-file"] });
    const remote = remoteTarget(ctx.settings, [], { local: a.local });
    if (remote) {
      // Output on stdout; a server that stops answering is said on stderr, once, and following goes on.
      const say = (m: string | null) => writeErr(m ? `warning: ${m}\n` : `the server answers again\n`);
      const end = await (await import("../_remote/views.ts")).remoteLogs(remote, id, Boolean(a.follow), say, a.task);
      if (end) endFollowed(end);
      return;
    }
    // A read: the store opened read-only; nothing recorded or signalled, even for a job whose runner is gone.
    const store = new JobStore(ctx.layout, { readOnly: true });
    const job = store.find(id);
    const tasks = store.tasks(job.id);
    let followed = job.id;
    if (a.task !== undefined) {
      const task = tasks.find((t) => t.task === a.task);
      if (!task) throw new UsageError(tasks.length ? `job ${job.id} has no task ${a.task} (tasks: ${tasks.map((t) => t.task).join(", ")})` : `--task: job ${job.id} is not a job of tasks`);
      await followLog(store, task.id, Boolean(a.follow), (chunk) => writeOut(chunk));
      followed = task.id;
    } else if (tasks.length) {
      // Each task's log, each line with its name: one after another, or (--follow) all at once as their lines come.
      const read = async (t: (typeof tasks)[number]) => {
        const lines = prefixedLines(`[${t.task}] `, (text) => writeOut(text));
        await followLog(store, t.id, Boolean(a.follow), (chunk) => lines.push(chunk));
        lines.flush();
      };
      if (a.follow) await Promise.all(tasks.map(read));
      else for (const t of tasks) await read(t);
    } else await followLog(store, job.id, Boolean(a.follow), (chunk) => writeOut(chunk));
    // Following, the job's true exit code is passed on, as `job run` passes it.
    const end = a.follow ? await jobEnd(store, followed) : null;
    store.close();
    if (end) endFollowed({ id: end.id, state: end.state, exitCode: end.exitCode, error: end.error });
  },
});

/** A followed job that did not succeed: one line on stderr saying how it ended (after its output), and its code, as `job run` passes it. */
function endFollowed(end: { id: string; state: string; exitCode: number | null; error: string | null }): void {
  const code = jobEndCode(end.exitCode, end.state);
  if (code === 0) return;
  // The error comes from the job (a message, a path): shown with control characters escaped.
  writeErr(`job ${end.id} ${end.state}${end.error ? `: ${printable(end.error)}` : end.exitCode !== null ? ` (exit ${end.exitCode})` : ""}\n`);
  throw new ExitError(code);
}
