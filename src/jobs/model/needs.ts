import { ExitCode } from "../../errors.ts";
import type { JobEventData } from "./events.ts";
import { isFinal, type JobState } from "./states.ts";

/**
 * The `needs` rule of a job of tasks, pure: the local runner (jobs/job-tasks.ts)
 * and the server (server/job-tasks.ts) ask it the same questions of their own
 * records. A task starts once every task it needs has succeeded; one whose need
 * ended otherwise (failed, skipped, cancelled) is skipped, never started; once
 * the job is cancelled, no task starts and each not started is cancelled. The
 * job ends when all its tasks have, failed with the first failed task's exit code.
 */

/** What a task not started yet does now. `wait`: the tasks it needs that have not succeeded yet. */
export type Readiness = { end: "cancelled" } | { end: "skipped"; because: string } | { wait: string[] } | { ready: true };

/** `stateOf`: a sibling's state as its record has it (any word that is not a final state counts as not ended). */
export function readiness(needs: readonly string[], stateOf: (task: string) => string | undefined, jobCancelled: boolean): Readiness {
  if (jobCancelled) return { end: "cancelled" };
  for (const n of needs) {
    const s = stateOf(n);
    if (s && isFinal(s) && s !== "succeeded") return { end: "skipped", because: `not started: ${n}, which it needs, ${s}` };
  }
  const pending = needs.filter((n) => stateOf(n) !== "succeeded");
  return pending.length ? { wait: pending } : { ready: true };
}

/**
 * The tasks not started yet that end now, the skips a skip causes included
 * (needs point backwards or forwards in the file), each after the need that
 * ended it. `notStarted`: whether a task has not started yet. Linear in tasks
 * and needs: a chain of a thousand tasks whose first fails is one pass.
 */
export function unstartedEnds(
  tasks: readonly { name: string; needs: readonly string[] }[],
  stateOf: (task: string) => string | undefined,
  notStarted: (task: string) => boolean,
  jobCancelled: boolean,
): { task: string; end: "cancelled" | "skipped"; because: string | null }[] {
  const ended = new Map<string, string>();
  const now = (t: string) => ended.get(t) ?? stateOf(t);
  const out: { task: string; end: "cancelled" | "skipped"; because: string | null }[] = [];
  const neededBy = new Map<string, { name: string; needs: readonly string[] }[]>();
  for (const t of tasks) if (notStarted(t.name)) for (const n of t.needs) (neededBy.get(n) ?? neededBy.set(n, []).get(n)!).push(t);
  const ends: string[] = [];
  const look = (t: { name: string; needs: readonly string[] }) => {
    if (ended.has(t.name) || !notStarted(t.name)) return;
    const r = readiness(t.needs, now, jobCancelled);
    if (!("end" in r)) return;
    ended.set(t.name, r.end);
    out.push({ task: t.name, end: r.end, because: r.end === "skipped" ? r.because : null });
    ends.push(t.name);
  };
  for (const t of tasks) look(t);
  // What needs a task that just ended may end in turn (only those: each need is followed once).
  for (let i = 0; i < ends.length; i++) for (const t of neededBy.get(ends[i]!) ?? []) look(t);
  return out;
}

/** A job of tasks, once all its tasks have ended: its state, exit code, error, and its `job.finished` event's data. */
export function jobEnd(
  taskStates: readonly string[],
  jobCancelled: boolean,
  firstFailed: { task: string | null; exitCode: number | null } | null,
): { state: JobState; exitCode: number; error: string | null; event: JobEventData["job.finished"] } {
  const state: JobState = jobCancelled ? "cancelled" : taskStates.every((s) => s === "succeeded") ? "succeeded" : "failed";
  const exitCode = firstFailed?.exitCode ?? (state === "cancelled" ? ExitCode.cancelled : state === "succeeded" ? 0 : ExitCode.failed);
  return {
    state,
    exitCode,
    error: firstFailed ? `task ${firstFailed.task} failed (exit ${firstFailed.exitCode})` : null,
    event: { state, exit_code: exitCode, ...(firstFailed ? { failed_task: firstFailed.task } : {}) },
  };
}
