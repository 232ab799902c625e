import { markedJobCounts } from "../core/job-processes.ts";
import { liveness } from "../core/process-identity.ts";
import { endedPhases, FINAL_STATES, type JobStatus, outputsOfEvents, phasesOf, statusDocument, type TaskStatus, taskStatus } from "./model.ts";
import type { JobRecord, JobStore } from "./store.ts";

// The status document (model/status.ts) from this machine's job store, and whether a job's runner still lives.

/** The status of a job as a reader shows it (see shownJob): reads only, whatever state the record is in. */
export function jobStatus(store: JobStore, record: JobRecord): JobStatus {
  const lost = lostReason(record);
  const job = lost ? shownJob(record) : record;
  const events = store.events(job.id);
  const phases = lost ? endedPhases(events, record.updated) : phasesOf(events);
  return statusDocument(factsOf(job), phases, events, { lost: Boolean(lost), ...(job.spec.tasks ? { tasks: taskStatuses(store, job, Boolean(lost)) } : {}) });
}

const factsOf = (r: JobRecord) => ({ id: r.id, name: r.name, state: r.state, exitCode: r.exitCode, command: r.spec.commandText, workdir: r.spec.workdir, created: r.created, envKey: r.envKey, error: r.error });

/** Each task of a job; when the job's runner is gone, a task the record says is going is shown failed with it. */
function taskStatuses(store: JobStore, job: JobRecord, lost: boolean): TaskStatus[] {
  const needs = new Map((job.spec.tasks ?? []).map((t) => [t.name, t.needs]));
  return store.tasks(job.id).map((t) => {
    const gone = lost && !FINAL_STATES.includes(t.state);
    const facts = { ...factsOf(t), task: t.task!, needs: needs.get(t.task!) ?? [], ...(gone ? { state: "failed" as const, error: "the job's runner is gone" } : {}) };
    const events = store.events(t.id);
    return taskStatus(facts, gone ? endedPhases(events, t.updated) : phasesOf(events), outputsOfEvents(events));
  });
}

/**
 * Is the process that runs this job still alive? Its pid must exist AND have the
 * start time recorded with it (a pid reused by another process is not the runner).
 * A record from before start times were kept cannot be checked: counted alive
 * while its pid exists (never signalled on that ground; see cancelJob). Reads only.
 */
export function runnerAlive(job: JobRecord): boolean {
  return liveness({ pid: job.runnerPid, start: job.runnerStart, boot: job.pidBoot }) !== "gone";
}

/** Why a job the record says is still going has in fact lost its runner (SIGKILL, OOM, reboot); null when it has not. */
export function lostReason(job: JobRecord): string | null {
  if (FINAL_STATES.includes(job.state) || !job.runnerPid || runnerAlive(job)) return null;
  const reason = `the gpulayer process running this job (pid ${job.runnerPid}) is gone; it ended without recording an outcome`;
  const child = job.childPid ? liveness({ pid: job.childPid, start: job.childStart, boot: job.pidBoot }) : "gone";
  if (child === "alive") return `${reason}; its command (pid ${job.childPid}) still runs: gpulayer job cancel ${job.id} stops it`;
  // Its main process died with the runner; what it started may live on.
  const left = markedJobCounts().get(job.id) ?? 0;
  return left ? `${reason}; ${left} process(es) it started still run: gpulayer job cancel ${job.id} stops them` : reason;
}

/**
 * The job as a reader shows it: one whose runner died is shown failed, with the
 * reason as its error. Nothing is written and nothing signalled: the record stays
 * as the runner left it until `job cancel` (which acts) records an end.
 */
export function shownJob(job: JobRecord): JobRecord {
  const lost = lostReason(job);
  return lost ? { ...job, state: "failed", error: job.error ? `${job.error}; ${lost}` : lost } : job;
}
