import { markedJobCounts } from "../core/job-processes.ts";
import { liveness } from "../core/process-identity.ts";
import type { OutputFile } from "./outputs.ts";
import { FINAL_STATES, type JobEvent, type JobRecord, type JobStore } from "./store.ts";

export interface Phase {
  name: "task.prepare" | "task.run";
  seconds: number | null;
  state: "running" | "finished" | "failed";
  cache?: "hit" | "miss";
  status?: string;
  env_key?: string;
  /** Image jobs: what ran, pulled or reused. */
  image?: string;
  digest?: string;
  exit_code?: number;
  message?: string;
}

export interface JobStatus {
  id: string;
  name: string;
  state: JobRecord["state"];
  exit_code: number | null;
  command: string;
  workdir: string;
  created: string;
  env_key: string | null;
  error: string | null;
  /** Present (true) when the record says the job runs but its runner is gone: shown failed, nothing recorded. */
  lost?: true;
  phases: Phase[];
  tasks?: TaskStatus[];
  events: (JobEvent & { time: string })[];
}

/** A task of a job as readers show it. */
export interface TaskStatus {
  name: string;
  id: string;
  state: JobRecord["state"];
  needs: string[];
  exit_code: number | null;
  env_key: string | null;
  error: string | null;
  command: string;
  phases: Phase[];
  /** Through a server: the worker it ran on. */
  worker?: string | null;
  /** The files it left for the tasks that need it (its declared outputs), with their sizes. */
  outputs: OutputFile[];
}

/** A task's outputs, from its `task.outputs` event (the last one: a task run again on another worker says them again). */
export function outputsOfEvents(events: JobEvent[]): OutputFile[] {
  const e = events.findLast((x) => x.type === "task.outputs");
  return ((e?.data.files as OutputFile[] | undefined) ?? []).map((f) => ({ path: f.path, bytes: f.bytes }));
}

/** Phases come from events alone: one way for the data to flow, and the same answer for every reader. */
export function phasesOf(events: JobEvent[], now = Date.now()): Phase[] {
  const phases: Phase[] = [];
  const started: Record<string, number> = {};
  for (const e of events) {
    const d = e.data as Record<string, unknown>;
    if (e.type === "task.prepare.started" || e.type === "task.run.started") started[e.type] = e.ts;
    if (e.type === "task.prepare.finished") {
      phases.push({
        name: "task.prepare",
        seconds: d.seconds as number,
        state: "finished",
        cache: d.cache as "hit" | "miss",
        status: d.status as string,
        // An image job with requirements has both: the image, and the env built on top of it.
        ...(d.image ? { image: d.image as string, digest: d.digest as string, ...(d.env_key ? { env_key: d.env_key as string } : {}) } : { env_key: d.env_key as string }),
      });
    }
    if (e.type === "task.prepare.failed") phases.push({ name: "task.prepare", seconds: d.seconds as number, state: "failed", message: d.message as string });
    if (e.type === "task.run.finished") phases.push({ name: "task.run", seconds: d.seconds as number, state: "finished", exit_code: d.exit_code as number });
  }
  const has = (n: Phase["name"]) => phases.some((p) => p.name === n);
  if (started["task.prepare.started"] && !has("task.prepare")) phases.push({ name: "task.prepare", seconds: (now - started["task.prepare.started"]) / 1000, state: "running" });
  if (started["task.run.started"] && !has("task.run")) phases.push({ name: "task.run", seconds: (now - started["task.run.started"]) / 1000, state: "running" });
  return phases.sort((a, b) => (a.name === "task.prepare" ? -1 : 1) - (b.name === "task.prepare" ? -1 : 1));
}

/** A lost job's phases: one its runner left running ended when the record last changed, and failed (it did not finish). */
function endedPhases(events: JobEvent[], lastKnown: number): Phase[] {
  return phasesOf(events, lastKnown).map((p) => (p.state === "running" ? { ...p, state: "failed" as const } : p));
}

/** The status of a job as a reader shows it (see shownJob): reads only, whatever state the record is in. */
export function jobStatus(store: JobStore, record: JobRecord): JobStatus {
  const lost = lostReason(record);
  const job = lost ? shownJob(record) : record;
  const events = store.events(job.id);
  return {
    id: job.id,
    name: job.name,
    state: job.state,
    exit_code: job.exitCode,
    command: job.spec.commandText,
    workdir: job.spec.workdir,
    created: new Date(job.created).toISOString(),
    env_key: job.envKey,
    error: job.error,
    ...(lost ? { lost: true as const } : {}),
    phases: lost ? endedPhases(events, record.updated) : phasesOf(events),
    ...(job.spec.tasks ? { tasks: taskStatuses(store, job, Boolean(lost)) } : {}),
    events: events.map((e) => ({ ts: e.ts, type: e.type, data: e.data, time: new Date(e.ts).toISOString() })),
  };
}

/** Each task of a job; when the job's runner is gone, a task the record says is going is shown failed with it. */
function taskStatuses(store: JobStore, job: JobRecord, lost: boolean): TaskStatus[] {
  const needs = new Map((job.spec.tasks ?? []).map((t) => [t.name, t.needs]));
  return store.tasks(job.id).map((t) => {
    const gone = lost && !FINAL_STATES.includes(t.state);
    const events = store.events(t.id);
    return {
      name: t.task!,
      id: t.id,
      state: gone ? "failed" : t.state,
      needs: needs.get(t.task!) ?? [],
      exit_code: t.exitCode,
      env_key: t.envKey,
      error: gone ? "the job's runner is gone" : t.error,
      command: t.spec.commandText,
      phases: gone ? endedPhases(events, t.updated) : phasesOf(events),
      outputs: outputsOfEvents(events),
    };
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
