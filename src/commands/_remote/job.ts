import { ExitCode, ExitError, UserError } from "../../errors.ts";
import type { JobSpec } from "../../jobs/spec.ts";
import { formatBytes, formatSeconds, type Output, shortKey } from "../../ui/output.ts";
import type { RemoteTarget } from "../../cluster/client.ts";
import { exitCodeOf, followJob, type JobUpdate, jobStatus, needsFolder, requestCancel, type SubmitOptions, submitJob } from "../../cluster/jobs-client.ts";
import type { WatchResponse } from "../../cluster/protocol.ts";
import { packLines } from "./pack-lines.ts";
import { formatLabels, labelsFromArgs } from "../../cluster/protocol.ts";
import { writeOut, writeErr } from "../../ui/terminal.ts";
import { printable } from "../../ui/escape.ts";
import { PrefixedOutput, jobStdout, tasksIO, tasksSummary } from "../_tasks-ui.ts";

/**
 * `job run` against a server, printed: the library (src/cluster/jobs-client.ts)
 * packs, submits and follows; this prints what it yields, as the local
 * branch does, and exits with the job's exit code.
 */

/** A line on stderr for each event worth a line; errors as errors. */
export function printEvent(out: Output, u: Extract<JobUpdate, { kind: "event" }>): void {
  const { type, data: d, worker } = u;
  if (type === "job.waiting") out.progress(`waiting for ${d.for}`);
  if (type === "job.assigned") out.progress(`assigned to worker ${d.worker} (attempt ${d.attempt}${Array.isArray(d.gpus) && d.gpus.length ? `, GPUs ${d.gpus.join(",")}` : ""})`);
  if (type === "task.prepare.step") out.phase(`[${worker}] ${d.step} ${d.detail}`);
  if (type === "task.prepare.quiet") out.phase(`[${worker}] still preparing; ${d.tool} has said nothing for ${formatSeconds(Number(d.seconds))}`);
  if (type === "task.prepare.finished") {
    // An image job: the image, and the env built on top of it when it has requirements, each reused or not.
    const what = d.image ? `image ${String(d.image)} ${d.image_status ?? d.status}${d.env_key ? `, env ${shortKey(String(d.env_key))} ${d.env_status}` : ""}` : `${d.status} env ${shortKey(String(d.env_key ?? ""))}`;
    out.progress(`task.prepare ${what} in ${formatSeconds(Number(d.seconds))} on ${worker}`);
  }
  if (type === "task.prepare.failed") out.log.error(`task.prepare failed on ${worker}: ${d.message}`);
  if (type === "task.bundle.failed") out.log.error(`the job could not start on ${worker}: ${d.message}`);
  if (type === "job.requeued") out.log.warn(`re-queued: ${d.reason}`);
  if (type === "job.lost") out.log.error(String(d.message));
  if (type === "job.worker_lost") out.log.warn(`worker ${d.worker} does not answer (${d.message}); the job stays its own until its lease ends, then runs elsewhere`);
  if (type === "job.cancel.requested") out.progress(`cancelling on ${d.worker}`);
}


export async function runRemoteJob(target: RemoteTarget, spec: JobSpec, opts: { rawArgs: string[]; detach: boolean; out: Output; /** --workdir or a job file was given: that folder travels. */ sendWorkdir: boolean; reading: SubmitOptions["reading"] }): Promise<void> {
  const { out } = opts;
  const labels = labelsFromArgs(opts.rawArgs);
  const what = opts.sendWorkdir ? spec.workdir : "an empty folder";
  // Said only of a job that can run so (one that needs its folder is refused at the submit, alone).
  if (!opts.sendWorkdir && !needsFolder(spec)) out.progress("no --workdir or job file: the job runs in an empty folder on the worker; give --workdir . to send this folder");
  // Ctrl-C while the folder is packed or sent: nothing is submitted (or, once it is, it is cancelled below).
  let stoppedBy: string | null = null;
  const beforeSubmit = (signal: string) => (stoppedBy ??= signal);
  process.on("SIGINT", beforeSubmit);
  process.on("SIGTERM", beforeSubmit);
  const submitted = await submitJob(
    target,
    spec,
    labels,
    {
      stopped: () => stoppedBy,
      ...packLines(out, spec.workdir),
      onUpload: (p) => out.progress(`uploading ${what} (${p.files} entries, ${formatBytes(p.bytes)} packed, bundle ${shortKey(p.hash)})`),
      onAlreadyThere: (p) => out.log.debug(`bundle ${shortKey(p.hash)} of ${what} is already on the server; not sent again`),
    },
    { sendWorkdir: opts.sendWorkdir, reading: opts.reading },
  ).finally(() => {
    process.off("SIGINT", beforeSubmit);
    process.off("SIGTERM", beforeSubmit);
  });
  const id = submitted.id;
  // A signal during the upload came after the last check: the job went in, so it is cancelled now.
  if (stoppedBy && opts.detach) {
    await requestCancel(target, id);
    throw new UserError(`${stoppedBy}: job ${id} was cancelled as it was submitted`, ExitCode.cancelled);
  }
  if (opts.detach) {
    out.result({ id, state: submitted.state, server: target.url }, () => id, true);
    return;
  }
  out.progress(`job ${id} (${printable(spec.name)}) on ${target.url}${Object.keys(labels).length ? ` [${formatLabels(labels)}]` : ""}`);
  let cancelling = false;
  const onSignal = (signal: string) => {
    if (cancelling) return;
    cancelling = true;
    out.progress(`\n${signal}: cancelling job ${id}`);
    void requestCancel(target, id).catch((e) => out.log.warn(`cancel: ${(e as Error).message}`));
  };
  process.on("SIGINT", onSignal);
  process.on("SIGTERM", onSignal);
  if (stoppedBy) onSignal(stoppedBy);
  const onTrouble = (m: string | null) => (m ? out.log.warn(m) : out.progress(`the server answers again; following job ${id}`));
  let preparedFailure: string | null = null;
  try {
    if (spec.tasks) await followTasks(target, id, out, onTrouble);
    else {
      for await (const u of followJob(target, id, { onTrouble })) {
        // With --json, stdout carries only the final document: the job's output goes to stderr.
        if (u.kind === "output") void (out.json || u.stream === "stderr" ? writeErr(u.data) : writeOut(u.data));
        else {
          if (u.type === "task.prepare.failed") preparedFailure = String(u.data.message ?? "");
          printEvent(out, u);
        }
      }
    }
  } finally {
    process.off("SIGINT", onSignal);
    process.off("SIGTERM", onSignal);
  }
  const status = await jobStatus(target, id);
  if (spec.tasks) {
    out.progress(tasksSummary(status));
    if (out.json) out.result(status, () => "");
    const code = exitCodeOf(status);
    if (code !== 0) throw new ExitError(code);
    return;
  }
  const run = status.phases.find((p) => p.name === "task.run");
  if (run?.seconds != null) out.progress(`task.run exit ${status.exit_code} in ${formatSeconds(run.seconds)} (job ${id} ${status.state} on ${status.worker})`);
  // A failed build was said as it happened, naming the worker: not a second time.
  else if (status.error && status.error !== preparedFailure) out.log.error(`job ${id} ${status.state}: ${status.error}`);
  if (out.json) out.result(status, () => "");
  const code = exitCodeOf(status);
  if (code !== 0) throw new ExitError(code);
}

/**
 * A job of tasks on a server: the job's own events say when each task was
 * given to a worker; each task is then followed on its own (output and
 * events, each line with `[name] `), and this ends when the job and every
 * task followed have.
 */
async function followTasks(target: RemoteTarget, id: string, out: Output, onTrouble: (m: string | null) => void): Promise<void> {
  const followed = new Map<string, Promise<void>>();
  const io = tasksIO(out, { stdout: jobStdout(out.json, () => false) });
  const follow = async (name: string, taskId: string): Promise<WatchResponse & { because: string | null }> => {
    const task = io.forTask(name);
    const prefixed = new PrefixedOutput(out, `[${name}] `);
    const updates = followJob(target, taskId, { onTrouble });
    // Why a task whose command succeeded failed (its declared outputs), as the local run says it.
    let because: string | null = null;
    for (;;) {
      const next = await updates.next();
      if (next.done) return { ...next.value, because };
      const u = next.value;
      if (u.kind === "output") (u.stream === "stderr" ? task.onStderr : task.onStdout)?.(u.data);
      // What it waited for before it was given to a worker is over by now: followed from its assignment on.
      else if (u.type !== "job.waiting") {
        if (u.type === "task.outputs.missing" || u.type === "task.outputs.failed") because = String(u.data.message);
        printEvent(prefixed, u);
      }
    }
  };
  // A task given to a worker is followed from then on (it may still read "queued" until its worker starts preparing it).
  const assigned = new Set<string>();
  const startFollowing = async () => {
    const status = await jobStatus(target, id);
    for (const t of status.tasks ?? []) {
      const started = assigned.has(t.name) || !(t.state === "queued" || t.state === "skipped" || (t.state === "cancelled" && !t.phases.length));
      if (followed.has(t.name) || !started) continue;
      // Its end is told once its output is all here: in the order things happened.
      const ended = (u: WatchResponse & { because: string | null }) => {
        const detail = u.state === "failed" && u.because ? u.because : u.exit_code !== null ? `exit ${u.exit_code}` : null;
        out.progress(`[${t.name}] ${u.state}${detail ? ` (${detail})` : ""}`);
      };
      followed.set(t.name, follow(t.name, t.id).then(ended).finally(() => io.flush(t.name)));
    }
  };
  for await (const u of followJob(target, id, { onTrouble })) {
    if (u.kind !== "event") continue;
    if (u.type === "task.assigned") {
      assigned.add(String(u.data.task));
      await startFollowing();
    }
    if (u.type === "task.skipped" || u.type === "task.cancelled") out.progress(`[${String(u.data.task)}] ${u.type.slice(5)} (${String(u.data.because)})`);
  }
  await startFollowing();
  await Promise.all(followed.values());
}
