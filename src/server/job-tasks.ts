import { FINAL_JOB_STATES } from "../cluster/protocol.ts";
import { ExitCode } from "../errors.ts";
import type { JobRow, ServerJobState, ServerStore } from "./store.ts";

/**
 * A job of several tasks on the server: the job's row is never dispatched;
 * each task is a row of its own (parent_id, task, needs), matched to a worker
 * on its own once every task it needs has succeeded. A task whose need
 * failed (or was skipped, or cancelled) is skipped, never started; the job
 * ends when all its tasks have, with the first failed task's exit code.
 */

/** Why queued tasks are not dispatched now: `skips` end unstarted, in the order their needs ended (a need before what needs it); `waits` say for what. */
export interface Blocked {
  skips: { task: JobRow; because: string }[];
  waits: Map<string, string>;
}

/**
 * What stops each queued task from being dispatched now, for all of them at
 * once: a task whose need failed is skipped, and so is, down the line, every
 * task that needs a skipped one; a task whose needs have not all succeeded
 * waits. Each job's tasks are read once and each need looked at a few times:
 * linear in tasks and needs, however long the chain a failure ends.
 */
export async function blockedTasks(store: ServerStore, queued: JobRow[]): Promise<Blocked> {
  const blocked: Blocked = { skips: [], waits: new Map() };
  const byParent = new Map<string, JobRow[]>();
  const add = <K, V>(m: Map<K, V[]>, k: K, v: V) => (m.get(k) ?? m.set(k, []).get(k)!).push(v);
  for (const t of queued) if (t.parentId) add(byParent, t.parentId, t);
  for (const [parentId, waiting] of byParent) {
    if ((await store.job(parentId))?.cancelRequested) {
      for (const task of waiting) blocked.skips.push({ task, because: JOB_CANCELLED });
      continue;
    }
    const state = new Map((await store.tasksOf(parentId)).map((t) => [t.task!, t.state as string]));
    const ended = (n: string) => FINAL_JOB_STATES.includes(state.get(n) ?? "") && state.get(n) !== "succeeded";
    const neededBy = new Map<string, JobRow[]>();
    for (const t of waiting) for (const n of t.needs) add(neededBy, n, t);
    // From the tasks whose need ended unsuccessfully, down through what needs them (a need's state becomes `skipped` as it goes).
    const skip = (t: JobRow) => {
      const n = t.needs.find(ended)!;
      blocked.skips.push({ task: t, because: `not started: ${n}, which it needs, ${state.get(n)}` });
      state.set(t.task!, "skipped");
    };
    const front = waiting.filter((t) => t.needs.some(ended));
    front.forEach(skip);
    for (let i = 0; i < front.length; i++) {
      for (const t of neededBy.get(front[i]!.task!) ?? []) {
        if (state.get(t.task!) === "skipped") continue;
        skip(t);
        front.push(t);
      }
    }
    for (const t of waiting) {
      if (state.get(t.task!) === "skipped") continue;
      const pending = t.needs.filter((n) => state.get(n) !== "succeeded");
      if (pending.length) blocked.waits.set(t.id, `the tasks it needs (${pending.join(", ")})`);
    }
  }
  return blocked;
}

export const JOB_CANCELLED = "the job was cancelled";

/** Ended without ever starting (no exit code: nothing ran); `cancelled` when the job was cancelled first. */
export async function endUnstarted(store: ServerStore, task: JobRow, because: string): Promise<void> {
  const state: ServerJobState = because === JOB_CANCELLED ? "cancelled" : "skipped";
  await store.event(task.id, `task.${state}`, { because });
  await store.updateJob(task.id, { state, error: because, waiting: null, exitCode: null });
  if (task.parentId) await store.event(task.parentId, `task.${state}`, { task: task.task, because });
}

/**
 * The job's own row, from its tasks': running once one has started, ended
 * once all have. Returns whether the job's row changed (its watchers wake).
 */
export async function settleJob(store: ServerStore, parentId: string): Promise<boolean> {
  const job = await store.job(parentId);
  if (!job || FINAL_JOB_STATES.includes(job.state)) return false;
  const tasks = await store.tasksOf(parentId);
  // Each task's end, once, in the job's own events (skipped and cancelled ones were told by endUnstarted).
  const told = new Set((await store.events(parentId)).filter((e) => /^task\.(finished|skipped|cancelled)$/.test(e.type)).map((e) => e.data.task));
  let changed = false;
  for (const t of tasks) {
    if (!FINAL_JOB_STATES.includes(t.state) || told.has(t.task)) continue;
    await store.event(parentId, "task.finished", { task: t.task, state: t.state, exit_code: t.exitCode });
    changed = true;
  }
  if (tasks.every((t) => FINAL_JOB_STATES.includes(t.state))) {
    const failed = tasks.filter((t) => t.state === "failed").sort((a, b) => a.updated - b.updated)[0];
    const state: ServerJobState = job.cancelRequested ? "cancelled" : tasks.every((t) => t.state === "succeeded") ? "succeeded" : "failed";
    const exitCode = failed?.exitCode ?? (state === "cancelled" ? ExitCode.cancelled : state === "succeeded" ? 0 : ExitCode.failed);
    await store.event(parentId, "job.finished", { state, exit_code: exitCode, ...(failed ? { failed_task: failed.task } : {}) });
    await store.updateJob(parentId, { state, exitCode, error: failed ? `task ${failed.task} failed (exit ${failed.exitCode})` : null, waiting: null });
    return true;
  }
  if (job.state === "queued" && tasks.some((t) => t.state !== "queued")) {
    await store.updateJob(parentId, { state: "running" });
    return true;
  }
  return changed;
}
