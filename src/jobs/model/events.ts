/**
 * A job's events: what happened to it, in order, each with its data. The
 * names are defined here once (JobEventData's keys); every writer (the local
 * runner and its tasks, the server, a worker relaying its runner's) takes
 * them typed, so a name or a field it does not know fails the typecheck.
 * Stored as these strings with their data as JSON, in the SQLite job store
 * and in the server's database; a reader takes what it finds (a database
 * written by another version may hold names this one does not) and narrows
 * it with `eventIs`.
 */

/** A task's phases, as events time them and status documents show them. */
export const PHASE_NAMES = ["task.prepare", "task.run"] as const;
export type PhaseName = (typeof PHASE_NAMES)[number];
/** Where a phase stands: under way, ended well, or ended in failure. */
export const PHASE_STATES = ["running", "finished", "failed"] as const;

/** What a job's worker on the fleet adds to an event it relays: the local record that ran it there. */
export type RelayMark = { local_job?: string };

export interface JobEventData {
  /** Recorded with the job (a task's own record: `job` is its job's id; on a server: the labels it asked for). */
  "job.submitted": { name: string; command: string; labels?: Record<string, string>; job?: string };
  // On a fleet: where the job goes.
  "job.waiting": { for: string };
  "job.assigned": { worker: string; worker_id: string; attempt: number; gpus: number[] };
  "job.requeued": { reason: string; attempt: number; worker: string | null };
  "job.lost": { message: string; worker: string | null };
  "job.worker_lost": { worker: string; message: string };
  "job.worker_back": { worker: string };
  /** The server failed the job without running it (its spec or bundle cannot be had). */
  "job.failed": { message: string };
  // Its end.
  "job.cancel.requested": { by?: string; worker?: string | null; tasks?: (string | null)[] };
  "job.cancelled": { reason: string | null; child_pid?: number | null; child?: string; leftovers?: number };
  /** A job of tasks: its end, from its tasks'. */
  "job.finished": { state: string; exit_code: number | null; failed_task?: string | null };
  // A job of tasks, in the job's own events: each task's way.
  "task.assigned": { task: string | null; worker: string; attempt: number };
  "task.started": { task: string; id: string; gpus?: number[] };
  "task.finished": { task: string | null; state: string; exit_code: number | null };
  /** In the task's own events (`because` alone) and in its job's (with `task`). */
  "task.skipped": { because: string; task?: string | null };
  "task.cancelled": { because: string; task?: string | null };
  // A task's phases (a job without tasks is one task).
  "task.prepare.started": { image: string | null };
  "task.prepare.step": { step: string; detail: string };
  "task.prepare.quiet": { tool: string; seconds: number };
  "task.prepare.finished": PrepareFinished;
  "task.prepare.failed": { seconds: number; message: string };
  /** On a worker: the job's bundle could not be fetched or unpacked. */
  "task.bundle.failed": { message: string };
  /** `pid`: the command's main process (a container: the engine CLI's); none when it could not start. */
  "task.run.started": { pid?: number; container?: string; engine?: string; command: string };
  "task.run.finished": { exit_code: number; seconds: number; signal?: string | number; error?: string };
  /** A task's declared outputs, kept for the tasks that need it (on a fleet, written by the server alone, from the archive it checked). */
  "task.outputs": { files: OutputFile[] };
  /** A declared output was not there when the task ended: the task failed. */
  "task.outputs.missing": { message: string };
  /** The outputs could not be kept (on a fleet: their upload failed). */
  "task.outputs.failed": { message: string };
}

/** A file a task left for the tasks that need it, relative to its folder (with `/`). */
export interface OutputFile {
  path: string;
  bytes: number;
}

/** An env found, fetched or built; or an image (and the env on top of it, when the job has requirements). */
export type PrepareFinished = {
  seconds: number;
  status: string;
  cache: "hit" | "miss";
  env_key?: string;
  path?: string;
  installer_path?: string | null;
  fetched?: { bytes: number; seconds: number; built_by: string | null };
  image?: string;
  digest?: string;
  engine?: string;
  image_status?: string;
  image_seconds?: number;
  env_status?: string;
  env_seconds?: number;
  /** A uv project's env: the worker packages the lock brings its own version of. */
  shadowed?: { name: string; worker: string; locked: string }[];
  /** Built: the requirements built without isolation, compiled (and its seconds) or taken from the wheelhouse. */
  wheels?: WheelDoc[];
};

export interface WheelDoc {
  name: string;
  wheel: string;
  from: "compiled" | "wheelhouse" | "fleet";
  /** From the fleet: the worker that compiled it. */
  built_by?: string;
  seconds: number;
  built_against: string[];
}

export type JobEventName = keyof JobEventData;

/** Every name: isJobEventName checks a type against it, and tests list them. */
export const JOB_EVENT_NAMES = [
  "job.submitted",
  "job.waiting",
  "job.assigned",
  "job.requeued",
  "job.lost",
  "job.worker_lost",
  "job.worker_back",
  "job.failed",
  "job.cancel.requested",
  "job.cancelled",
  "job.finished",
  "task.assigned",
  "task.started",
  "task.finished",
  "task.skipped",
  "task.cancelled",
  "task.prepare.started",
  "task.prepare.step",
  "task.prepare.quiet",
  "task.prepare.finished",
  "task.prepare.failed",
  "task.bundle.failed",
  "task.run.started",
  "task.run.finished",
  "task.outputs",
  "task.outputs.missing",
  "task.outputs.failed",
] as const satisfies readonly JobEventName[];

// The list above holds every name of JobEventData: one missing fails the typecheck here.
const everyName: Exclude<JobEventName, (typeof JOB_EVENT_NAMES)[number]> extends never ? true : never = true;
void everyName;

/** One event, its data typed by its name: a discriminated union on `type`. */
export type JobEventOf<N extends JobEventName = JobEventName> = { [K in N]: { type: K; data: JobEventData[K] } }[N];

/** An event as it is kept: its type a string (a database may hold names of another version), its data as recorded. */
export interface RecordedEvent {
  ts: number; // ms
  type: string;
  data: Record<string, unknown>;
}

/** What records an event: the job store, the server's store, a worker's channel to the server. */
export type EventSink = <N extends JobEventName>(type: N, data: JobEventData[N]) => void;

/** A recorded event seen as the one its name says (its data typed); false for any other name. */
export function eventIs<N extends JobEventName>(e: RecordedEvent, name: N): e is RecordedEvent & { type: N; data: JobEventData[N] & Record<string, unknown> } {
  return e.type === name;
}

/** Whether a recorded name is one of this version's. */
export function isJobEventName(type: string): type is JobEventName {
  return (JOB_EVENT_NAMES as readonly string[]).includes(type);
}
