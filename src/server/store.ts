import { Database } from "bun:sqlite";
import { mkdirSync } from "node:fs";
import { join } from "node:path";
import type { MachineProbe, PrepareRequestPayload, PrepareTaskResult, RemoteSpec, WorkerCache, WorkerState } from "../cluster/protocol.ts";
import { BundleStore } from "./bundles.ts";
import { ARTIFACTS_SCHEMA, ArtifactStore } from "./artifacts.ts";
import { TokenStore } from "./tokens.ts";
import { redactDeep, redactUrl } from "../env/url-credentials.ts";

/**
 * The coordinator's state in one bun:sqlite file in its home: workers, jobs,
 * their tasks (one per attempt, or one per worker for a prepare), events,
 * output and the bundles uploaded (their bytes sit next to it, by hash).
 */

export interface WorkerRow {
  id: string;
  name: string;
  labels: Record<string, string>;
  probe: MachineProbe;
  slots: number;
  state: WorkerState;
  registered: number;
  lastSeen: number;
  freeGpus: number[];
  /** The named join token it registered with (null: the server's own token); revoking that token drops the worker. */
  joinedWith: string | null;
  /** Its env cache as it last reported it; null before its first report. */
  cache: WorkerCache | null;
}

/** `skipped`: a task of a job that never started (a task it needs failed, or the job was cancelled first). */
export type ServerJobState = "queued" | "preparing" | "running" | "succeeded" | "failed" | "cancelled" | "skipped";

export interface JobRow {
  id: string;
  name: string;
  state: ServerJobState;
  created: number;
  updated: number;
  spec: RemoteSpec;
  bundle: string | null;
  labels: Record<string, string>;
  workdir: string;
  exitCode: number | null;
  error: string | null;
  envKey: string | null;
  workerId: string | null;
  attempts: number;
  waiting: string | null;
  cancelRequested: boolean;
  logSize: number;
  /** A task's row: its job, its name there, and the tasks it needs (null and [] for a job itself). */
  parentId: string | null;
  task: string | null;
  needs: string[];
}

export type TaskState = "assigned" | "running" | "done" | "lost" | "handed_back";

export interface TaskRow {
  id: string;
  kind: "job" | "prepare";
  jobId: string | null;
  groupId: string | null;
  workerId: string;
  state: TaskState;
  attempt: number;
  gpus: number[];
  prepare: PrepareRequestPayload | null;
  bundle: string | null;
  result: (PrepareTaskResult & { state?: string }) | null;
  delivered: boolean;
  cancel: boolean;
  cancelSent: boolean;
  /** The last item of the worker's outbox applied (worker/outbox.ts): a number seen again is not applied twice. */
  appliedSeq: number;
  created: number;
  updated: number;
}

export interface StoredEvent {
  seq: number;
  ts: number;
  type: string;
  data: Record<string, unknown>;
}

const SCHEMA = `
CREATE TABLE IF NOT EXISTS workers (id TEXT PRIMARY KEY, name TEXT NOT NULL, secret TEXT NOT NULL UNIQUE, labels TEXT NOT NULL, probe TEXT NOT NULL,
  slots INTEGER NOT NULL, state TEXT NOT NULL, registered REAL NOT NULL, last_seen REAL NOT NULL, free_gpus TEXT NOT NULL DEFAULT '[]');
CREATE TABLE IF NOT EXISTS jobs (id TEXT PRIMARY KEY, name TEXT NOT NULL, state TEXT NOT NULL, created REAL NOT NULL, updated REAL NOT NULL, spec TEXT NOT NULL,
  bundle TEXT, labels TEXT NOT NULL, workdir TEXT NOT NULL, exit_code INTEGER, error TEXT, env_key TEXT, worker_id TEXT, attempts INTEGER NOT NULL DEFAULT 0,
  waiting TEXT, cancel_requested INTEGER NOT NULL DEFAULT 0, log_size INTEGER NOT NULL DEFAULT 0);
CREATE INDEX IF NOT EXISTS jobs_state ON jobs(state, created);
CREATE TABLE IF NOT EXISTS tasks (id TEXT PRIMARY KEY, kind TEXT NOT NULL, job_id TEXT, group_id TEXT, worker_id TEXT NOT NULL, state TEXT NOT NULL,
  attempt INTEGER NOT NULL, gpus TEXT NOT NULL, prepare TEXT, bundle TEXT, result TEXT, delivered INTEGER NOT NULL DEFAULT 0, cancel INTEGER NOT NULL DEFAULT 0,
  cancel_sent INTEGER NOT NULL DEFAULT 0, created REAL NOT NULL, updated REAL NOT NULL);
CREATE INDEX IF NOT EXISTS tasks_worker ON tasks(worker_id, state);
CREATE INDEX IF NOT EXISTS tasks_group ON tasks(group_id);
CREATE INDEX IF NOT EXISTS tasks_job ON tasks(job_id, state);
CREATE TABLE IF NOT EXISTS events (seq INTEGER PRIMARY KEY AUTOINCREMENT, job_id TEXT NOT NULL, ts REAL NOT NULL, type TEXT NOT NULL, data TEXT NOT NULL);
CREATE INDEX IF NOT EXISTS events_job ON events(job_id, seq);
CREATE TABLE IF NOT EXISTS logs (seq INTEGER PRIMARY KEY AUTOINCREMENT, job_id TEXT NOT NULL, start INTEGER NOT NULL, stream INTEGER NOT NULL, data BLOB NOT NULL);
CREATE INDEX IF NOT EXISTS logs_job ON logs(job_id, start);
CREATE TABLE IF NOT EXISTS bundles (hash TEXT PRIMARY KEY, bytes INTEGER NOT NULL, created REAL NOT NULL, last_used REAL NOT NULL);
`;

type Row = Record<string, unknown>;
const json = <T>(s: unknown): T => JSON.parse(String(s)) as T;

function toWorker(r: Row): WorkerRow {
  return { id: r.id as string, name: r.name as string, labels: json(r.labels), probe: json(r.probe), slots: r.slots as number, state: r.state as WorkerState, registered: r.registered as number, lastSeen: r.last_seen as number, freeGpus: json(r.free_gpus), joinedWith: (r.joined_with as string | null) ?? null, cache: r.cache ? json(r.cache) : null };
}

function toJob(r: Row): JobRow {
  return {
    id: r.id as string,
    name: r.name as string,
    state: r.state as ServerJobState,
    created: r.created as number,
    updated: r.updated as number,
    spec: json(r.spec),
    bundle: r.bundle as string | null,
    labels: json(r.labels),
    workdir: r.workdir as string,
    exitCode: r.exit_code as number | null,
    error: r.error as string | null,
    envKey: r.env_key as string | null,
    workerId: r.worker_id as string | null,
    attempts: r.attempts as number,
    waiting: r.waiting as string | null,
    cancelRequested: Boolean(r.cancel_requested),
    logSize: r.log_size as number,
    parentId: (r.parent_id as string | null) ?? null,
    task: (r.task as string | null) ?? null,
    needs: r.needs ? json(r.needs) : [],
  };
}

function toTask(r: Row): TaskRow {
  return {
    id: r.id as string,
    kind: r.kind as TaskRow["kind"],
    jobId: r.job_id as string | null,
    groupId: r.group_id as string | null,
    workerId: r.worker_id as string,
    state: r.state as TaskState,
    attempt: r.attempt as number,
    gpus: json(r.gpus),
    prepare: r.prepare ? json(r.prepare) : null,
    bundle: r.bundle as string | null,
    result: r.result ? json(r.result) : null,
    delivered: Boolean(r.delivered),
    cancel: Boolean(r.cancel),
    cancelSent: Boolean(r.cancel_sent),
    appliedSeq: (r.applied_seq as number | undefined) ?? 0,
    created: r.created as number,
    updated: r.updated as number,
  };
}

const JOB_COLUMNS: Record<string, string> = { state: "state", exitCode: "exit_code", error: "error", envKey: "env_key", workerId: "worker_id", attempts: "attempts", waiting: "waiting", cancelRequested: "cancel_requested" };
const TASK_COLUMNS: Record<string, string> = { state: "state", result: "result", delivered: "delivered", cancel: "cancel", cancelSent: "cancel_sent", appliedSeq: "applied_seq" };
const WORKER_COLUMNS: Record<string, string> = { state: "state", lastSeen: "last_seen", freeGpus: "free_gpus", probe: "probe", labels: "labels", slots: "slots", joinedWith: "joined_with", cache: "cache" };

/** What a column may keep: never a URL's credentials (error messages and results included). */
function sqlValue(v: unknown): string | number | null {
  if (v === null || v === undefined) return null;
  if (typeof v === "boolean") return v ? 1 : 0;
  if (typeof v === "object") return JSON.stringify(redactDeep(v));
  return typeof v === "string" ? redactUrl(v) : (v as number);
}

export const newId = (n = 8) => Buffer.from(crypto.getRandomValues(new Uint8Array(n))).toString("hex");

export class ServerStore {
  readonly db: Database;
  readonly bundles: BundleStore;
  readonly artifacts: ArtifactStore;
  readonly tokens: TokenStore;

  constructor(readonly dir: string) {
    mkdirSync(dir, { recursive: true, mode: 0o700 });
    this.db = new Database(join(dir, "server.db"), { create: true });
    this.db.exec("PRAGMA busy_timeout = 10000");
    this.db.exec("PRAGMA journal_mode = WAL");
    this.db.exec("PRAGMA synchronous = NORMAL");
    this.db.exec(SCHEMA);
    for (const column of ["workers ADD COLUMN joined_with TEXT", "tasks ADD COLUMN applied_seq INTEGER NOT NULL DEFAULT 0", "jobs ADD COLUMN parent_id TEXT", "workers ADD COLUMN cache TEXT", "jobs ADD COLUMN task TEXT", "jobs ADD COLUMN needs TEXT"]) {
      try {
        this.db.exec(`ALTER TABLE ${column}`);
      } catch (error) {
        if (!/duplicate column name/i.test((error as Error).message)) throw error;
      }
    }
    this.db.exec("CREATE INDEX IF NOT EXISTS jobs_parent ON jobs(parent_id)");
    this.bundles = new BundleStore(this.db, dir);
    this.db.exec(ARTIFACTS_SCHEMA);
    this.artifacts = new ArtifactStore(this.db, dir);
    this.tokens = new TokenStore(this.db);
  }

  private update(table: string, columns: Record<string, string>, id: string, fields: Record<string, unknown>, touch: boolean): void {
    const sets: string[] = touch ? ["updated = ?"] : [];
    const values: (string | number | null)[] = touch ? [Date.now()] : [];
    for (const [k, val] of Object.entries(fields)) {
      if (!columns[k]) throw new Error(`${table}: no column for ${k}`);
      sets.push(`${columns[k]} = ?`);
      values.push(sqlValue(val));
    }
    if (sets.length) this.db.query(`UPDATE ${table} SET ${sets.join(", ")} WHERE id = ?`).run(...values, id);
  }

  // Workers
  addWorker(w: Omit<WorkerRow, "freeGpus" | "cache">, secretHash: string): void {
    this.db
      .query("INSERT INTO workers (id, name, secret, labels, probe, slots, state, registered, last_seen, free_gpus, joined_with) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)")
      .run(w.id, w.name, secretHash, JSON.stringify(w.labels), JSON.stringify(w.probe), w.slots, w.state, w.registered, w.lastSeen, JSON.stringify(w.probe.gpus.map((g) => g.index)), w.joinedWith);
  }
  worker(id: string): WorkerRow | null {
    const r = this.db.query<Row, [string]>("SELECT * FROM workers WHERE id = ?").get(id);
    return r ? toWorker(r) : null;
  }
  workerBySecret(secretHash: string): WorkerRow | null {
    const r = this.db.query<Row, [string]>("SELECT * FROM workers WHERE secret = ?").get(secretHash);
    return r ? toWorker(r) : null;
  }
  /** The worker a credential authenticates: a lost one too (it may come back within its lease), none once it has left. */
  workerByCredential(secretHash: string): WorkerRow | null {
    const w = this.workerBySecret(secretHash);
    return w && w.state !== "left" ? w : null;
  }
  /** A worker's credential is replaced when it registers again (the one it had stops working). */
  setWorkerSecret(id: string, secretHash: string): void {
    this.db.query("UPDATE workers SET secret = ? WHERE id = ?").run(secretHash, id);
  }
  workers(opts: { present?: boolean } = {}): WorkerRow[] {
    const where = opts.present ? "WHERE state NOT IN ('lost', 'left')" : "";
    return this.db.query<Row, []>(`SELECT * FROM workers ${where} ORDER BY name, registered`).all().map(toWorker);
  }
  updateWorker(id: string, fields: Partial<Pick<WorkerRow, "state" | "lastSeen" | "freeGpus" | "probe" | "labels" | "slots" | "joinedWith" | "cache">>): void {
    this.update("workers", WORKER_COLUMNS, id, fields, false);
  }

  // Jobs
  addJob(j: Pick<JobRow, "id" | "name" | "spec" | "bundle" | "labels" | "workdir"> & Partial<Pick<JobRow, "parentId" | "task" | "needs">>): void {
    const now = Date.now();
    this.db
      .query("INSERT INTO jobs (id, name, state, created, updated, spec, bundle, labels, workdir, parent_id, task, needs) VALUES (?, ?, 'queued', ?, ?, ?, ?, ?, ?, ?, ?, ?)")
      .run(j.id, j.name, now, now, sqlValue(j.spec), j.bundle, sqlValue(j.labels), sqlValue(j.workdir), j.parentId ?? null, j.task ?? null, j.parentId ? JSON.stringify(j.needs ?? []) : null);
  }
  /** A job's task rows, in the job file's order. */
  tasksOf(parentId: string): JobRow[] {
    return this.db.query<Row, [string]>("SELECT * FROM jobs WHERE parent_id = ? ORDER BY rowid").all(parentId).map(toJob);
  }
  job(id: string): JobRow | null {
    const r = this.db.query<Row, [string]>("SELECT * FROM jobs WHERE id = ?").get(id);
    return r ? toJob(r) : null;
  }
  jobsByPrefix(prefix: string): JobRow[] {
    // A task's row by its whole id (a client following it); by a prefix, jobs only.
    if (prefix.length === 16) return this.db.query<Row, [string]>("SELECT * FROM jobs WHERE id = ?").all(prefix).map(toJob);
    return this.db.query<Row, [string]>("SELECT * FROM jobs WHERE id LIKE ? AND parent_id IS NULL LIMIT 2").all(`${prefix}%`).map(toJob);
  }
  jobs(limit: number): JobRow[] {
    return this.db.query<Row, [number]>("SELECT * FROM jobs WHERE parent_id IS NULL ORDER BY created DESC LIMIT ?").all(limit).map(toJob);
  }
  /** Queued and not yet given to a worker (an assigned job stays "queued" until its worker starts preparing it). */
  queuedJobs(): JobRow[] {
    // A job of tasks is never dispatched itself: its tasks are, each on its own.
    return this.db
      .query<Row, []>("SELECT * FROM jobs WHERE state = 'queued' AND NOT EXISTS (SELECT 1 FROM tasks WHERE tasks.job_id = jobs.id AND tasks.state IN ('assigned', 'running')) AND NOT EXISTS (SELECT 1 FROM jobs c WHERE c.parent_id = jobs.id) ORDER BY created, rowid")
      .all()
      .map(toJob);
  }
  updateJob(id: string, fields: Partial<Pick<JobRow, "state" | "exitCode" | "error" | "envKey" | "workerId" | "attempts" | "waiting" | "cancelRequested">>): void {
    this.update("jobs", JOB_COLUMNS, id, fields, true);
  }

  // Tasks
  addTask(t: Omit<TaskRow, "state" | "result" | "delivered" | "cancel" | "cancelSent" | "appliedSeq" | "created" | "updated">): void {
    const now = Date.now();
    this.db
      .query("INSERT INTO tasks (id, kind, job_id, group_id, worker_id, state, attempt, gpus, prepare, bundle, created, updated) VALUES (?, ?, ?, ?, ?, 'assigned', ?, ?, ?, ?, ?, ?)")
      .run(t.id, t.kind, t.jobId, t.groupId, t.workerId, t.attempt, JSON.stringify(t.gpus), sqlValue(t.prepare), t.bundle, now, now);
  }
  task(id: string): TaskRow | null {
    const r = this.db.query<Row, [string]>("SELECT * FROM tasks WHERE id = ?").get(id);
    return r ? toTask(r) : null;
  }
  /** Tasks a worker holds now (assigned or running). */
  activeTasks(workerId?: string): TaskRow[] {
    if (workerId) return this.db.query<Row, [string]>("SELECT * FROM tasks WHERE worker_id = ? AND state IN ('assigned', 'running') ORDER BY created").all(workerId).map(toTask);
    return this.db.query<Row, []>("SELECT * FROM tasks WHERE state IN ('assigned', 'running') ORDER BY created").all().map(toTask);
  }
  /** Whether the worker holds a task now (assigned or running) whose job or prepare request uses this bundle. */
  workerHoldsBundle(workerId: string, hash: string): boolean {
    const r = this.db
      .query<Row, [string, string, string]>(
        "SELECT 1 FROM tasks LEFT JOIN jobs ON jobs.id = tasks.job_id WHERE tasks.worker_id = ? AND tasks.state IN ('assigned', 'running') AND (tasks.bundle = ? OR jobs.bundle = ?) LIMIT 1",
      )
      .get(workerId, hash, hash);
    return Boolean(r);
  }
  activeTaskOfJob(jobId: string): TaskRow | null {
    const r = this.db.query<Row, [string]>("SELECT * FROM tasks WHERE job_id = ? AND state IN ('assigned', 'running') ORDER BY created DESC LIMIT 1").get(jobId);
    return r ? toTask(r) : null;
  }
  groupTasks(groupId: string): TaskRow[] {
    return this.db.query<Row, [string]>("SELECT * FROM tasks WHERE group_id = ? ORDER BY created").all(groupId).map(toTask);
  }
  updateTask(id: string, fields: Partial<Pick<TaskRow, "state" | "result" | "delivered" | "cancel" | "cancelSent" | "appliedSeq">>): void {
    this.update("tasks", TASK_COLUMNS, id, fields, true);
  }

  // Events and output
  event(jobId: string, type: string, data: Record<string, unknown> = {}, ts = Date.now()): void {
    this.db.query("INSERT INTO events (job_id, ts, type, data) VALUES (?, ?, ?, ?)").run(jobId, ts, type, sqlValue(data));
  }
  events(jobId: string, afterSeq = 0): StoredEvent[] {
    return this.db
      .query<{ seq: number; ts: number; type: string; data: string }, [string, number]>("SELECT seq, ts, type, data FROM events WHERE job_id = ? AND seq > ? ORDER BY seq")
      .all(jobId, afterSeq)
      .map((r) => ({ seq: r.seq, ts: r.ts, type: r.type, data: JSON.parse(r.data) }));
  }
  /** Every event of these types, oldest first, with the worker its job last ran on: what /metrics counts. */
  phaseEvents(types: string[]): { jobId: string; ts: number; type: string; data: Record<string, unknown>; workerId: string | null }[] {
    const marks = types.map(() => "?").join(", ");
    return this.db
      .query<{ job_id: string; ts: number; type: string; data: string; worker_id: string | null }, string[]>(`SELECT e.job_id, e.ts, e.type, e.data, j.worker_id FROM events e LEFT JOIN jobs j ON j.id = e.job_id WHERE e.type IN (${marks}) ORDER BY e.seq`)
      .all(...types)
      .map((r) => ({ jobId: r.job_id, ts: r.ts, type: r.type, data: JSON.parse(r.data), workerId: r.worker_id }));
  }
  /** How many jobs (and tasks of jobs) are in each state. */
  jobStateCounts(): Map<string, number> {
    return new Map(this.db.query<{ state: string; n: number }, []>("SELECT state, COUNT(*) AS n FROM jobs GROUP BY state").all().map((r) => [r.state, r.n]));
  }
  /** Output as it came, stdout (1) and stderr (2) interleaved in one log with byte offsets. */
  appendLog(jobId: string, data: Uint8Array, stream: 1 | 2 = 1): number {
    return this.db.transaction(() => {
      const size = this.db.query<{ log_size: number }, [string]>("SELECT log_size FROM jobs WHERE id = ?").get(jobId)?.log_size ?? 0;
      this.db.query("INSERT INTO logs (job_id, start, stream, data) VALUES (?, ?, ?, ?)").run(jobId, size, stream, data);
      this.db.query("UPDATE jobs SET log_size = ? WHERE id = ?").run(size + data.length, jobId);
      return size + data.length;
    })();
  }
  /** Output from byte `offset` on, chunk by chunk with its stream, at most about `max` bytes. */
  /** At most `max` bytes of output from `offset` on: rows read one at a time (never a whole big log into memory), the last cut to fit. */
  readChunks(jobId: string, offset: number, max = 1024 * 1024): { stream: 1 | 2; data: Uint8Array }[] {
    const rows = this.db.query<{ start: number; stream: 1 | 2; data: Uint8Array }, [string, number]>("SELECT start, stream, data FROM logs WHERE job_id = ? AND start + length(data) > ? ORDER BY start").iterate(jobId, offset);
    const chunks: { stream: 1 | 2; data: Uint8Array }[] = [];
    let total = 0;
    for (const r of rows) {
      const piece = r.data.subarray(Math.max(0, offset - r.start)).subarray(0, max - total);
      chunks.push({ stream: r.stream, data: piece });
      total += piece.length;
      if (total >= max) break;
    }
    return chunks;
  }

  readLog(jobId: string, offset: number, max?: number): Uint8Array {
    return Buffer.concat(this.readChunks(jobId, offset, max).map((c) => c.data));
  }

  close(): void {
    this.db.close();
  }
}
