import type { JobEvent, JobRecord, JobStore } from "./store.ts";

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
  phases: Phase[];
  events: (JobEvent & { time: string })[];
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
        ...(d.image ? { image: d.image as string, digest: d.digest as string } : { env_key: d.env_key as string }),
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

export function jobStatus(store: JobStore, job: JobRecord): JobStatus {
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
    phases: phasesOf(events),
    events: events.map((e) => ({ ...e, time: new Date(e.ts).toISOString() })),
  };
}

/** Is the process that runs this job still alive? A runner killed hard leaves a job that says "running". */
export function runnerAlive(job: JobRecord): boolean {
  if (!job.runnerPid) return false;
  try {
    process.kill(job.runnerPid, 0);
    return true;
  } catch (error) {
    return (error as NodeJS.ErrnoException).code === "EPERM";
  }
}
