import { eventIs, type OutputFile, type PHASE_STATES, type PhaseName, type RecordedEvent } from "./events.ts";
import type { JobState } from "./states.ts";

/**
 * The status document of a job (`job status --json`, and what a server
 * answers for one): built here for a job run on this machine and for one on
 * a fleet alike. Its shape is the users' (commands/_json.ts lists its keys).
 */

export interface Phase {
  name: PhaseName;
  seconds: number | null;
  state: (typeof PHASE_STATES)[number];
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
  state: JobState;
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
  events: (RecordedEvent & { time: string })[];
}

/** A task of a job as readers show it. */
export interface TaskStatus {
  name: string;
  id: string;
  state: JobState;
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
export function outputsOfEvents(events: RecordedEvent[]): OutputFile[] {
  const e = events.findLast((x) => eventIs(x, "task.outputs"));
  return ((e?.data.files as OutputFile[] | undefined) ?? []).map((f) => ({ path: f.path, bytes: f.bytes }));
}

/** What a job's record says, as either store keeps it. */
export interface JobFacts {
  id: string;
  name: string;
  state: JobState;
  exitCode: number | null;
  command: string;
  workdir: string;
  created: number; // ms
  envKey: string | null;
  error: string | null;
}

/** The document: the record, its phases, its tasks (a job of tasks) and its events (each with its time written out). */
export function statusDocument(job: JobFacts, phases: Phase[], events: RecordedEvent[], extra: { lost?: boolean; tasks?: TaskStatus[] } = {}): JobStatus {
  return {
    id: job.id,
    name: job.name,
    state: job.state,
    exit_code: job.exitCode,
    command: job.command,
    workdir: job.workdir,
    created: new Date(job.created).toISOString(),
    env_key: job.envKey,
    error: job.error,
    ...(extra.lost ? { lost: true as const } : {}),
    phases,
    ...(extra.tasks ? { tasks: extra.tasks } : {}),
    events: events.map((e) => ({ ts: e.ts, type: e.type, data: e.data, time: new Date(e.ts).toISOString() })),
  };
}

/** One task's entry in its job's document. */
export function taskStatus(task: Omit<JobFacts, "workdir" | "created"> & { task: string; needs: string[] }, phases: Phase[], outputs: OutputFile[], worker?: string | null): TaskStatus {
  return {
    name: task.task,
    id: task.id,
    state: task.state,
    needs: task.needs,
    exit_code: task.exitCode,
    env_key: task.envKey,
    error: task.error,
    command: task.command,
    phases,
    ...(worker === undefined ? {} : { worker }),
    outputs,
  };
}

/**
 * The phases of a job that has ended (or whose runner is gone) when a phase never said it finished: a cancel of a
 * job whose worker was lost, a runner killed. Ended when the record last changed, and failed (it did not finish),
 * not running on forever.
 */
export function endedPhases(events: RecordedEvent[], lastKnown: number): Phase[] {
  return phasesOf(events, lastKnown).map((p) => (p.state === "running" ? { ...p, state: "failed" as const } : p));
}

/** Phases come from events alone: one way for the data to flow, and the same answer for every reader. */
export function phasesOf(events: RecordedEvent[], now = Date.now()): Phase[] {
  const phases: Phase[] = [];
  const started: Partial<Record<PhaseName, number>> = {};
  for (const e of events) {
    if (eventIs(e, "task.prepare.started")) started["task.prepare"] = e.ts;
    else if (eventIs(e, "task.run.started")) started["task.run"] = e.ts;
    else if (eventIs(e, "task.prepare.finished")) {
      const d = e.data;
      phases.push({
        name: "task.prepare",
        seconds: d.seconds,
        state: "finished",
        cache: d.cache,
        status: d.status,
        // An image job with requirements has both: the image, and the env built on top of it.
        ...(d.image ? { image: d.image, digest: d.digest as string, ...(d.env_key ? { env_key: d.env_key } : {}) } : { env_key: d.env_key as string }),
      });
    } else if (eventIs(e, "task.prepare.failed")) phases.push({ name: "task.prepare", seconds: e.data.seconds, state: "failed", message: e.data.message });
    else if (eventIs(e, "task.run.finished")) phases.push({ name: "task.run", seconds: e.data.seconds, state: "finished", exit_code: e.data.exit_code });
  }
  const has = (n: PhaseName) => phases.some((p) => p.name === n);
  for (const name of ["task.prepare", "task.run"] as const) {
    const at = started[name];
    if (at && !has(name)) phases.push({ name, seconds: (now - at) / 1000, state: "running" });
  }
  return phases.sort((a, b) => (a.name === "task.prepare" ? -1 : 1) - (b.name === "task.prepare" ? -1 : 1));
}
