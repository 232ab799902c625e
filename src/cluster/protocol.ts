import { UsageError } from "../errors.ts";
import type { WireEnvironment } from "../env/index-light.ts";
import type { JobSpec } from "../jobs/spec.ts";
import type { JobStatus } from "../jobs/model.ts";

/**
 * What the coordinator, its workers and its clients say to each other: the
 * JSON shapes of the HTTP API under /v1. One place, so the three sides agree.
 */

export interface GpuInfo {
  index: number;
  uuid: string | null;
  name: string | null;
  memoryMiB: number | null;
  driver: string | null;
}

/** A machine as a worker reports it: read in milliseconds, nothing imported. */
export interface MachineProbe {
  hostname: string;
  os: string;
  arch: string;
  cpus: number;
  memoryBytes: number;
  gpus: GpuInfo[];
  python: { path: string; version: string } | null;
  /** Why the worker's Python could not be probed, if it could not. */
  pythonError?: string;
  /** Every distribution the worker's Python has (normalised name → version); torch's from its version.py. */
  frameworks: Record<string, string>;
  /** torch.version.cuda, when torch is there. */
  cuda: string | null;
  engine: "docker" | "podman" | null;
  probeMs: number;
  /** worker.offline: it builds no env, only fetches other workers' artifacts. */
  offline?: boolean;
  /** worker.share_envs: false when it neither uploads nor fetches env artifacts. */
  shareEnvs?: boolean;
  /** The conda environments here, as conda finds them, each with the distributions its Python has (for `resources.frameworks`). */
  conda?: { name: string | null; prefix: string; frameworks: Record<string, string> }[];
}

export const WORKER_STATES = ["idle", "busy", "draining", "lost", "left"] as const;
export type WorkerState = (typeof WORKER_STATES)[number];

/** What a worker's env cache holds, as it reports it (with its heartbeats, when it changed): for the dashboard and /metrics. */
/** What a worker fetched on joining (worker.prefetch_envs): `wanted` the most it fetches, `planned` those the server listed for it. */
export interface WorkerPrefetch {
  state: "prefetching" | "done" | "off" | "failed";
  wanted: number;
  planned: number;
  /** Fetched now, or already here (ready, or made by a job meanwhile). */
  fetched: number;
  present: number;
  bytes: number;
  keys: string[];
  /** Why it is off or failed. */
  reason?: string;
}

export interface WorkerCache {
  bytes: number;
  entries: number;
  prefetch?: WorkerPrefetch;
  /** python and requirements_file: what tells two envs of one request apart (absent from workers older than them). */
  envs: { key: string; summary: string; bytes: number; last_used: string | null; state: string; python?: { version: string; path: string } | null; requirements_file?: { path: string; digest: string } | null }[];
}

export interface WorkerView {
  id: string;
  name: string;
  labels: Record<string, string>;
  joined_with: string | null;
  state: WorkerState;
  registered: string;
  last_seen: string;
  slots: number;
  running: number;
  free_gpus: number[];
  probe: MachineProbe;
  /** Its env cache as it last reported it (null before its first report): `env list` and `env show` of the fleet. */
  cache: WorkerCache | null;
}

/** One job's or task's spec as it travels: the local JobSpec without its folder; its request's paths are relative to the bundle's root. */
type TravellingSpec = Omit<JobSpec, "workdir" | "tasks" | "environment"> & { environment: WireEnvironment };

/** A job as it travels. */
export type RemoteSpec = TravellingSpec & {
  /** A job of tasks: each task's own spec, as it travels; run in the job's folder on its worker. */
  tasks?: { name: string; needs: string[]; spec: TravellingSpec }[];
};

export interface SubmitRequest {
  spec: RemoteSpec;
  bundle: string | null;
  labels: Record<string, string>;
  /** The client's folder, for display only. */
  workdir: string;
}

export interface SubmitResponse {
  id: string;
  state: string;
  waiting: string | null;
}

/** What `env prepare` asks of each worker: the request a job's environment section makes, and the image pull policy. */
export type PrepareRequestPayload = WireEnvironment & { pull?: string };

export interface PrepareTaskResult {
  status: "built" | "reused" | "fetched" | "pulled" | "failed";
  seconds: number;
  /** status fetched: the artifact's size, the download's seconds, and the worker that built it. */
  fetched?: { bytes: number; seconds: number; built_by: string };
  key?: string;
  path?: string;
  /** Which build made the env: "uv (fast path)" or "pip". */
  installer_path?: string | null;
  /** pip check's findings on the env, as a local `env prepare` warns of them (a host env). */
  check?: string[];
  /** A uv project's env: the worker's packages it holds another version of, the lock's (as locally). */
  shadowed?: { name: string; worker: string; locked: string }[];
  image?: string;
  digest?: string;
  message?: string;
}

export interface TaskAssignment {
  id: string;
  kind: "job" | "prepare";
  attempt: number;
  job_id: string | null;
  bundle: string | null;
  gpus: number[];
  spec?: RemoteSpec;
  prepare?: PrepareRequestPayload;
  /** A task of a job: the outputs of the tasks it needs (directly or not), each an archive to fetch and put in its folder first. */
  inputs?: { task: string; bundle: string }[];
}

/** What a job's tasks left (`job outputs` through a server): each task's archive and its files. */
export interface JobOutputsView {
  id: string;
  tasks: { name: string; bundle: string | null; files: { path: string; bytes: number }[] }[];
}

export interface PollResponse {
  tasks: TaskAssignment[];
  cancel: string[];
}

export interface RegisterResponse {
  id: string;
  name: string;
  credential: string;
  heartbeat_seconds: number;
  /** Out of touch with the server this long, a worker's jobs are given out again: it stops them before (worker/agent.ts). */
  lease_seconds?: number;
  /** Taken back as the worker it was (it presented a credential the server knows). */
  resumed?: boolean;
}

export interface TaskEventIn {
  ts: number;
  type: string;
  data: Record<string, unknown>;
}

export interface FinishRequest {
  state: "succeeded" | "failed" | "cancelled";
  exit_code: number | null;
  error: string | null;
  result?: PrepareTaskResult;
}

/** One outbox item in `POST /v1/tasks/ID/reports`: an event, a piece of output (base64: a report is JSON), or the task's end. */
export type ReportItemWire = { event: TaskEventIn } | { output: string; stream: "stdout" | "stderr" } | { finish: FinishRequest };

/** A report of several kinds: items from `seq` on, in order, an end only as the last. */
export type ReportsRequest = {
  seq: number;
  items: ReportItemWire[];
};

export interface WatchResponse {
  state: string;
  exit_code: number | null;
  error: string | null;
  worker: string | null;
  waiting: string | null;
  /** New output since the offset asked for, chunk by chunk (base64), each with its stream. */
  output: { stream: "stdout" | "stderr"; data: string }[];
  log_offset: number;
  events: { seq: number; ts: number; type: string; data: Record<string, unknown> }[];
  done: boolean;
}

/** What a remote `job status --json` prints: the local shape, plus where it ran. */
export interface RemoteJobStatus extends JobStatus {
  worker: string | null;
  attempts: number;
  waiting: string | null;
  labels: Record<string, string>;
}

export interface PrepareGroupView {
  id: string;
  done: boolean;
  tasks: { id: string; worker: string; state: string; result: PrepareTaskResult | null }[];
  /** Build steps after the `after` the client gave, oldest first: `seq` is the next `after`. */
  steps?: { seq: number; worker: string; type: string; data: Record<string, unknown> }[];
}

/** K=V pairs from --label flags. */
export function parseLabels(pairs: string[], origin = "--label"): Record<string, string> {
  const labels: Record<string, string> = {};
  for (const pair of pairs) {
    const i = pair.indexOf("=");
    const key = i > 0 ? pair.slice(0, i) : "";
    if (!/^[A-Za-z0-9][A-Za-z0-9_.\/-]{0,62}$/.test(key)) throw new UsageError(`${origin} ${pair}: expected KEY=VALUE (letters, digits, . _ / - in the key)`);
    labels[key] = pair.slice(i + 1);
  }
  return labels;
}

/** Every `--label K=V` (or `--label=K=V`) before `--`. */
export function labelsFromArgs(rawArgs: string[]): Record<string, string> {
  const pairs: string[] = [];
  for (let i = 0; i < rawArgs.length && rawArgs[i] !== "--"; i++) {
    const arg = rawArgs[i]!;
    if (arg === "--label") {
      if (rawArgs[i + 1] === undefined) throw new UsageError("--label needs a value (K=V)");
      pairs.push(rawArgs[++i]!);
    } else if (arg.startsWith("--label=")) pairs.push(arg.slice(8));
  }
  return parseLabels(pairs);
}

export function formatLabels(labels: Record<string, string>): string {
  const parts = Object.entries(labels).map(([k, v]) => `${k}=${v}`);
  return parts.length ? parts.join(",") : "-";
}
