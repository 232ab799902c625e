import type { FinishRequest, TaskEventIn } from "../cluster/protocol.ts";
import { runsOf } from "../core/runs.ts";
import { eventIs } from "../jobs/model.ts";
import { together } from "./db/sql.ts";
import type { ServerStore, TaskRow } from "./store.ts";
import { prepareSteps } from "./task-reports.ts";

/**
 * What a worker's outbox items write, whichever request carried them: events
 * (`POST /events`), output (`POST /output`), a task's end (`POST /finish`),
 * or several kinds at once (`POST /reports`: a short job's whole report in
 * one request). The coordinator locks the task, applies the fresh items here
 * and then writes the task's and the job's rows once each.
 */

export type ReportItem = { event: TaskEventIn } | { output: Uint8Array; stream: "stdout" | "stderr" } | { finish: FinishRequest };

type TaskFields = Parameters<ServerStore["updateTask"]>[1];
type JobFields = Parameters<ServerStore["updateJob"]>[1];

export interface Applied {
  /** The task's row as the items leave it (its applied seq is the caller's). */
  task: TaskFields;
  /** The job's row, as of the last item. */
  job: JobFields;
  /** The job's followers (and its parent's) are woken. */
  wakeJob: boolean;
  wakes: string[];
}

/** The output items a body joins (by `lengths`); one piece when the lengths do not add up. */
export function outputItems(data: Uint8Array, lengths: number[] | undefined, stream: "stdout" | "stderr"): ReportItem[] {
  const sizes = lengths && lengths.reduce((a, b) => a + b, 0) === data.length ? lengths : [data.length];
  let at = 0;
  return sizes.map((n) => ({ output: data.subarray(at, (at += n)), stream }));
}

/** The items after the first `skip` (applied before: sent again after a lost answer), written; what they make of the task's and job's rows. */
export async function applyItems(store: ServerStore, t: TaskRow, items: ReportItem[], skip: number): Promise<Applied> {
  const out: Applied = { task: {}, job: {}, wakeJob: false, wakes: [] };
  // A task reporting events has started, whether or not these were heard before.
  if (t.state === "assigned" && items.some((i) => "event" in i)) out.task.state = "running";
  const fresh = items.slice(skip);
  // Events first, all of them in order: a job's event stream is locked before its row (store.lockJob), which output
  // and the end write. Events and output are kept apart, each in its own order, so nothing else moves.
  // All of them sent together, in this order, on the transaction's connection (one round trip, not one each).
  const writes: (() => Promise<unknown>)[] = [];
  const events = fresh.flatMap((i) => ("event" in i ? [i.event] : []));
  if (events.length) writes.push(applyEvents(store, t, events, out));
  for (const run of runsOf(fresh, (a, b) => "output" in a && "output" in b && a.stream === b.stream)) {
    const item = run[0]!;
    if ("event" in item) continue;
    if ("output" in item) {
      const pieces = run.map((i) => (i as { output: Uint8Array }).output);
      const data = pieces.length === 1 ? pieces[0]! : Buffer.concat(pieces);
      if (t.jobId && data.length) {
        const jobId = t.jobId;
        writes.push(() => store.appendLog(jobId, data, item.stream === "stderr" ? 2 : 1));
        out.wakes.push(`job:${t.jobId}`);
      }
    } else {
      const { finish } = item;
      out.task = { ...out.task, state: "done", result: finish.result ? { ...finish.result, state: finish.state } : null };
      if (t.jobId) {
        Object.assign(out.job, { state: finish.state, exitCode: finish.exit_code, error: finish.error });
        out.wakeJob = true;
      }
      if (t.groupId) out.wakes.push(`group:${t.groupId}`);
    }
  }
  await together(...writes);
  // Events heard before still wake the job's followers, as they always did.
  if (t.jobId && items.some((i) => "event" in i)) out.wakeJob = true;
  return out;
}

/** The events' write, to start with the others; what they say of the job's row is in `out` when this returns. */
function applyEvents(store: ServerStore, t: TaskRow, events: TaskEventIn[], out: Applied): () => Promise<void> {
  const jobId = t.jobId;
  if (!jobId) {
    // A prepare's build steps, kept by task for `env prepare --server` to show.
    // Its group's reader follows every task's steps with one mark: the group is their stream (relayedEvents).
    if (t.groupId) out.wakes.push(`group:${t.groupId}`);
    return () => store.relayedEvents(
      prepareSteps(t.id),
      events.filter((e) => e.type.startsWith("task.prepare.")),
      t.groupId ?? t.id,
    );
  }
  // Outputs are said by the server alone, from the archive it received (taskOutputs).
  const fresh = events.filter((e) => e.type !== "task.outputs");
  // What the events say of the job's row, as of the last of them (an end after them says more).
  for (const e of fresh) {
    if (eventIs(e, "task.prepare.started")) out.job.state = "preparing";
    if (eventIs(e, "task.prepare.finished") && typeof e.data.env_key === "string") out.job.envKey = e.data.env_key;
    if (eventIs(e, "task.run.started")) out.job.state = "running";
  }
  // The server's clock, so running phases measure against the same clock that reads them.
  return () => store.relayedEvents(jobId, fresh);
}
