import type { PrepareRequestPayload, PrepareTaskResult, RemoteSpec, WorkerCache, WorkerState } from "../cluster/protocol.ts";
import { mkdirSync } from "node:fs";
import { BundleStore } from "./bundles.ts";
import { ArtifactStore } from "./artifacts.ts";
import { WheelStore } from "./wheels.ts";
import { BuildClaims } from "./build-claims.ts";
import { TokenStore } from "./tokens.ts";
import { chunks, isLockTimeout, marks, type Sql, type SqlValue } from "./db/sql.ts";
import { newRev, WORKER_HEAVY_FIELDS, WORKER_LIGHT_COLUMNS, type WorkerRow, workerRows } from "./worker-rows.ts";

export type { WorkerRow } from "./worker-rows.ts";
import { redactDeep, redactUrl } from "../env/index-light.ts";
import { neededTasks } from "../jobs/outputs.ts";
import { holdStreams, insertEvents, STREAM_LOCK_CLASS, type StreamEvent } from "./event-streams.ts";
import type { JobEventData, JobEventName, JobState, RecordedEvent } from "../jobs/model.ts";

/**
 * The coordinator's state in its database (db/: SQLite in its home, or
 * PostgreSQL): workers, jobs, their tasks (one per attempt, or one per
 * worker for a prepare), events, output and the bundles uploaded (their
 * bytes sit in the server's files folder, by hash). Every method is one or a
 * few queries; what must change together runs in `exclusive`.
 */


export interface JobRow {
  id: string;
  name: string;
  state: JobState;
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
  /** A task's outputs: the archive its worker uploaded (a bundle's hash), or null. */
  outputsBundle: string | null;
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

export type NewTask = Omit<TaskRow, "state" | "result" | "delivered" | "cancel" | "cancelSent" | "appliedSeq" | "created" | "updated">;

export interface StoredEvent extends RecordedEvent {
  seq: number;
}

type Row = Record<string, unknown>;
const json = <T>(s: unknown): T => JSON.parse(String(s)) as T;

function toJob(r: Row): JobRow {
  return {
    id: r.id as string,
    name: r.name as string,
    state: r.state as JobState,
    created: Number(r.created),
    updated: Number(r.updated),
    spec: json(r.spec),
    bundle: r.bundle as string | null,
    labels: json(r.labels),
    workdir: r.workdir as string,
    exitCode: r.exit_code === null || r.exit_code === undefined ? null : Number(r.exit_code),
    error: r.error as string | null,
    envKey: r.env_key as string | null,
    workerId: r.worker_id as string | null,
    attempts: Number(r.attempts),
    waiting: r.waiting as string | null,
    cancelRequested: Boolean(r.cancel_requested),
    logSize: Number(r.log_size),
    parentId: (r.parent_id as string | null) ?? null,
    task: (r.task as string | null) ?? null,
    needs: r.needs ? json(r.needs) : [],
    outputsBundle: (r.outputs_bundle as string | null) ?? null,
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
    attempt: Number(r.attempt),
    gpus: json(r.gpus),
    prepare: r.prepare ? json(r.prepare) : null,
    bundle: r.bundle as string | null,
    result: r.result ? json(r.result) : null,
    delivered: Boolean(r.delivered),
    cancel: Boolean(r.cancel),
    cancelSent: Boolean(r.cancel_sent),
    appliedSeq: Number(r.applied_seq ?? 0),
    created: Number(r.created),
    updated: Number(r.updated),
  };
}

/** The advisory locks' first key (int4 pair space, apart from the writer lock's bigint) for workers a dispatch pass holds: "gpd" in ASCII. */
const DISPATCH_LOCK_CLASS = 0x677064;



/** Rows in one multi-row statement at most (a dozen parameters each). */
const ROWS_PER_STATEMENT = 200;

/** The states of a task held by its worker now, and that condition on a task's own row. */
const HELD = "('assigned', 'running')";
const ACTIVE = `state IN ${HELD}`;
/** A job waiting for a worker: queued, held by no task, and not a job of tasks (its tasks are dispatched, each on its own). */
const QUEUED = `state = 'queued' AND NOT EXISTS (SELECT 1 FROM tasks WHERE tasks.job_id = jobs.id AND tasks.state IN ${HELD}) AND NOT EXISTS (SELECT 1 FROM jobs c WHERE c.parent_id = jobs.id)`;
const JOB_COLUMNS: Record<string, string> = { state: "state", exitCode: "exit_code", error: "error", envKey: "env_key", workerId: "worker_id", attempts: "attempts", waiting: "waiting", cancelRequested: "cancel_requested", outputsBundle: "outputs_bundle" };
const TASK_COLUMNS: Record<string, string> = { state: "state", result: "result", delivered: "delivered", cancel: "cancel", cancelSent: "cancel_sent", appliedSeq: "applied_seq" };
const WORKER_COLUMNS: Record<string, string> = { state: "state", lastSeen: "last_seen", freeGpus: "free_gpus", probe: "probe", labels: "labels", slots: "slots", joinedWith: "joined_with", cache: "cache", rev: "rev" };

/** What a column may keep: never a URL's credentials (error messages and results included). */
function sqlValue(v: unknown): SqlValue {
  if (v === null || v === undefined) return null;
  if (typeof v === "boolean") return v ? 1 : 0;
  if (typeof v === "object") return JSON.stringify(redactDeep(v));
  return typeof v === "string" ? redactUrl(v) : (v as number);
}

export const newId = (n = 8) => Buffer.from(crypto.getRandomValues(new Uint8Array(n))).toString("hex");

/** What one server process keeps beside the database (uploads in flight, downloads being read): shared by its transactions' stores. */
interface ProcessState {
  bundles: BundleStore["local"];
  artifacts: ArtifactStore["local"];
  tokens: TokenStore["local"];
}

export class ServerStore {
  readonly bundles: BundleStore;
  readonly artifacts: ArtifactStore;
  readonly wheels: WheelStore;
  /** Who builds an env artifact or compiles a wheel now (build-claims.ts). */
  readonly claims: BuildClaims;
  readonly tokens: TokenStore;

  private readonly local: ProcessState;

  /** `files`: where bundles and artifacts are kept (a folder every replica reaches). */
  constructor(
    readonly sql: Sql,
    readonly files: string,
    /** Given: a store on one transaction of this process's (exclusive); else this process's own, whose folders are made once here. */
    local?: ProcessState,
  ) {
    const state = local ?? { bundles: BundleStore.local(), artifacts: ArtifactStore.local(), tokens: TokenStore.local() };
    this.local = state;
    this.bundles = new BundleStore(sql, files, state.bundles);
    this.claims = new BuildClaims(sql);
    this.artifacts = new ArtifactStore(sql, files, state.artifacts, this.claims);
    this.wheels = new WheelStore(sql, files, this.claims);
    this.tokens = new TokenStore(sql, state.tokens);
    if (!local) for (const dir of [this.bundles.dir, this.artifacts.dir, this.wheels.dir]) mkdirSync(dir, { recursive: true });
  }

  /** `fn` with a store on one transaction holding the writer lock (db/sql.ts): the changes land together, one writer at a time. */
  exclusive<T>(fn: (store: ServerStore) => Promise<T>): Promise<T> {
    return this.sql.exclusive((tx) => fn(tx === this.sql ? this : new ServerStore(tx, this.files, this.local)));
  }

  /** `fn` with a store on one transaction under row locks only (db/sql.ts `transaction`). */
  transaction<T>(fn: (store: ServerStore) => Promise<T>): Promise<T> {
    return this.sql.transaction((tx) => fn(tx === this.sql ? this : new ServerStore(tx, this.files, this.local)));
  }

  private async update(table: string, columns: Record<string, string>, id: string, fields: Record<string, unknown>, touch: boolean): Promise<void> {
    const sets: string[] = touch ? ["updated = ?"] : [];
    const values: SqlValue[] = touch ? [Date.now()] : [];
    for (const [k, val] of Object.entries(fields)) {
      if (!columns[k]) throw new Error(`${table}: no column for ${k}`);
      sets.push(`${columns[k]} = ?`);
      values.push(sqlValue(val));
    }
    if (sets.length) await this.sql.run(`UPDATE ${table} SET ${sets.join(", ")} WHERE id = ?`, ...values, id);
  }

  /** Insertion order: SQLite's rowid, PostgreSQL's identity column. */
  private get inserted(): string {
    return this.sql.dialect === "sqlite" ? "rowid" : "ord";
  }

  // Workers
  async addWorker(w: Omit<WorkerRow, "freeGpus" | "cache">, secretHash: string): Promise<void> {
    await this.sql.run(
      "INSERT INTO workers (id, name, secret, labels, probe, slots, state, registered, last_seen, free_gpus, joined_with, rev) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
      w.id, w.name, secretHash, JSON.stringify(w.labels), JSON.stringify(w.probe), w.slots, w.state, w.registered, w.lastSeen, JSON.stringify(w.probe.gpus.map((g) => g.index)), w.joinedWith, newRev(),
    );
  }
  async worker(id: string): Promise<WorkerRow | null> {
    return (await workerRows(this.sql, await this.sql.all(`SELECT ${WORKER_LIGHT_COLUMNS} FROM workers WHERE id = ?`, id)))[0] ?? null;
  }
  async workerBySecret(secretHash: string): Promise<WorkerRow | null> {
    return (await workerRows(this.sql, await this.sql.all(`SELECT ${WORKER_LIGHT_COLUMNS} FROM workers WHERE secret = ?`, secretHash)))[0] ?? null;
  }
  /** The worker a credential authenticates: a lost one too (it may come back within its lease), none once it has left. */
  async workerByCredential(secretHash: string): Promise<WorkerRow | null> {
    const w = await this.workerBySecret(secretHash);
    return w && w.state !== "left" ? w : null;
  }
  /** Whether this credential is the worker's own now (not replaced, the worker not gone), its row held to the end of the transaction (shared, on PostgreSQL): no registration replaces it meanwhile. */
  async heldCredential(id: string, secretHash: string): Promise<boolean> {
    const share = this.sql.dialect === "postgres" ? " FOR SHARE" : "";
    const r = await this.sql.get<{ secret: string; state: string }>(`SELECT secret, state FROM workers WHERE id = ?${share}`, id);
    return r !== null && r.state !== "left" && r.secret === secretHash;
  }
  /** A worker's credential is replaced when it registers again (the one it had stops working). */
  async setWorkerSecret(id: string, secretHash: string): Promise<void> {
    await this.sql.run("UPDATE workers SET secret = ? WHERE id = ?", secretHash, id);
  }
  /** `present`: not lost nor left; `lost`: lost only; `name`: of that name; `silentBefore`: not heard from since then (the sweep's question, asked of the database rather than of every row). */
  async workers(opts: { present?: boolean; lost?: boolean; silentBefore?: number; name?: string } = {}): Promise<WorkerRow[]> {
    const where: string[] = [];
    const params: SqlValue[] = [];
    if (opts.name !== undefined) where.push("name = ?"), params.push(opts.name);
    if (opts.present) where.push("state NOT IN ('lost', 'left')");
    if (opts.lost) where.push("state = 'lost'");
    if (opts.silentBefore !== undefined) where.push("last_seen < ?"), params.push(opts.silentBefore);
    return workerRows(this.sql, await this.sql.all(`SELECT ${WORKER_LIGHT_COLUMNS} FROM workers ${where.length ? `WHERE ${where.join(" AND ")}` : ""} ORDER BY name, registered`, ...params));
  }
  /** Workers still here that joined with a named token no longer there (revoked): one query, whatever the fleet's size. */
  async workersOfRevokedTokens(): Promise<WorkerRow[]> {
    return workerRows(this.sql, await this.sql.all(`SELECT ${WORKER_LIGHT_COLUMNS} FROM workers w WHERE w.state NOT IN ('lost', 'left') AND w.joined_with IS NOT NULL AND NOT EXISTS (SELECT 1 FROM tokens t WHERE t.name = w.joined_with) ORDER BY name, registered`));
  }
  async updateWorker(id: string, fields: Partial<Pick<WorkerRow, "state" | "lastSeen" | "freeGpus" | "probe" | "labels" | "slots" | "joinedWith" | "cache">>): Promise<void> {
    // A heavy column's write gives the row a new rev: every process reads those columns again (worker-rows.ts).
    const heavy = WORKER_HEAVY_FIELDS.some((k) => fields[k] !== undefined);
    await this.update("workers", WORKER_COLUMNS, id, heavy ? { ...fields, rev: newRev() } : fields, false);
  }
  /** A sign of life from a worker here (idle or draining), its row locked to the end of the transaction; false when it is lost or gone. */
  /** Its sign of life, its row locked: its credential's hash, or null when it is lost or gone (not touched). */
  async touchWorker(id: string, now: number): Promise<string | null> {
    return (await this.sql.get<{ secret: string }>("UPDATE workers SET last_seen = ? WHERE id = ? AND state IN ('idle', 'draining') RETURNING secret", now, id))?.secret ?? null;
  }
  /**
   * Its state changed only from what it was: false when another replica got there first.
   * `lastSeen`: and only if not heard from since (a beat takes no writer lock: beat()).
   */
  async moveWorker(id: string, from: WorkerState, to: WorkerState, lastSeen?: number): Promise<boolean> {
    if (lastSeen === undefined) return (await this.sql.run("UPDATE workers SET state = ? WHERE id = ? AND state = ?", to, id, from)) > 0;
    return (await this.sql.run("UPDATE workers SET state = ? WHERE id = ? AND state = ? AND last_seen = ?", to, id, from, lastSeen)) > 0;
  }
  /**
   * A beat of an idle worker, outside the writer lock: one conditional UPDATE,
   * false when the worker is no longer idle (lost, left, draining: the caller
   * takes the locked path). On PostgreSQL its commit does not wait for the
   * WAL flush (synchronous_commit off for this transaction alone): a beat
   * lost in a crash costs nothing, the next comes seconds later.
   */
  /** `presented`: and only while its credential is this one. */
  async beat(id: string, fields: { lastSeen: number; freeGpus?: number[]; cache?: WorkerCache }, presented?: string): Promise<boolean> {
    const sets = ["last_seen = ?"];
    const values: SqlValue[] = [fields.lastSeen];
    if (fields.freeGpus) sets.push("free_gpus = ?"), values.push(sqlValue(fields.freeGpus));
    if (fields.cache) sets.push("cache = ?", "rev = ?"), values.push(sqlValue(fields.cache), newRev());
    // One statement, one round trip: set_config(..., true) holds for the statement's own transaction.
    const lazy = this.sql.dialect === "postgres" ? " FROM (SELECT set_config('synchronous_commit', 'off', true)) AS lazy_commit" : "";
    const same = presented === undefined ? "" : " AND secret = ?";
    return (await this.sql.run(`UPDATE workers SET ${sets.join(", ")}${lazy} WHERE id = ? AND state = 'idle'${same}`, ...values, id, ...(presented === undefined ? [] : [presented]))) > 0;
  }

  // Jobs
  async addJob(j: Pick<JobRow, "id" | "name" | "spec" | "bundle" | "labels" | "workdir"> & Partial<Pick<JobRow, "parentId" | "task" | "needs">>): Promise<void> {
    const now = Date.now();
    await this.sql.run(
      "INSERT INTO jobs (id, name, state, created, updated, spec, bundle, labels, workdir, parent_id, task, needs) VALUES (?, ?, 'queued', ?, ?, ?, ?, ?, ?, ?, ?, ?)",
      j.id, j.name, now, now, sqlValue(j.spec), j.bundle, sqlValue(j.labels), sqlValue(j.workdir), j.parentId ?? null, j.task ?? null, j.parentId ? JSON.stringify(j.needs ?? []) : null,
    );
  }
  /** A job's task rows, in the job file's order. */
  async tasksOf(parentId: string): Promise<JobRow[]> {
    return (await this.sql.all(`SELECT * FROM jobs WHERE parent_id = ? ORDER BY ${this.inserted}`, parentId)).map(toJob);
  }
  async job(id: string): Promise<JobRow | null> {
    const r = await this.sql.get("SELECT * FROM jobs WHERE id = ?", id);
    return r ? toJob(r) : null;
  }
  async jobsByPrefix(prefix: string): Promise<JobRow[]> {
    // A task's row by its whole id (a client following it); by a prefix, jobs only.
    if (prefix.length === 16) return (await this.sql.all("SELECT * FROM jobs WHERE id = ?", prefix)).map(toJob);
    return (await this.sql.all("SELECT * FROM jobs WHERE id LIKE ? AND parent_id IS NULL LIMIT 2", `${prefix}%`)).map(toJob);
  }
  async jobs(limit: number): Promise<JobRow[]> {
    return (await this.sql.all(`SELECT * FROM jobs WHERE parent_id IS NULL ORDER BY created DESC, ${this.inserted} DESC LIMIT ?`, limit)).map(toJob);
  }
  /** Queued and not yet given to a worker (an assigned job stays "queued" until its worker starts preparing it). */
  async queuedJobs(): Promise<JobRow[]> {
    // A job of tasks is never dispatched itself: its tasks are, each on its own.
    return (
      await this.sql.all(
        `SELECT * FROM jobs WHERE ${QUEUED} ORDER BY created, ${this.inserted}`,
      )
    ).map(toJob);
  }
  async updateJob(id: string, fields: Partial<Pick<JobRow, "state" | "exitCode" | "error" | "envKey" | "workerId" | "attempts" | "waiting" | "cancelRequested" | "outputsBundle">>): Promise<void> {
    await this.update("jobs", JOB_COLUMNS, id, fields, true);
  }

  // Tasks
  async addTask(t: NewTask): Promise<void> {
    const now = Date.now();
    await this.sql.run(
      "INSERT INTO tasks (id, kind, job_id, group_id, worker_id, state, attempt, gpus, prepare, bundle, created, updated) VALUES (?, ?, ?, ?, ?, 'assigned', ?, ?, ?, ?, ?, ?)",
      t.id, t.kind, t.jobId, t.groupId, t.workerId, t.attempt, JSON.stringify(t.gpus), sqlValue(t.prepare), t.bundle, now, now,
    );
  }
  /** Tasks a dispatch pass hands out, in as few statements as they fit. */
  async addTasks(tasks: NewTask[]): Promise<void> {
    const now = Date.now();
    for (let k = 0; k < tasks.length; k += ROWS_PER_STATEMENT) {
      const some = tasks.slice(k, k + ROWS_PER_STATEMENT);
      await this.sql.run(
        `INSERT INTO tasks (id, kind, job_id, group_id, worker_id, state, attempt, gpus, prepare, bundle, created, updated) VALUES ${some.map(() => "(?, ?, ?, ?, ?, 'assigned', ?, ?, ?, ?, ?, ?)").join(", ")}`,
        ...some.flatMap((t) => [t.id, t.kind, t.jobId, t.groupId, t.workerId, t.attempt, JSON.stringify(t.gpus), sqlValue(t.prepare), t.bundle, now, now]),
      );
    }
  }
  /** Jobs a dispatch pass handed out: each one's attempt and worker, its waiting line cleared; one statement on PostgreSQL. */
  async jobsHandedOut(jobs: { id: string; attempts: number; workerId: string }[]): Promise<void> {
    if (this.sql.dialect !== "postgres") {
      for (const j of jobs) await this.updateJob(j.id, { attempts: j.attempts, workerId: j.workerId, waiting: null });
      return;
    }
    const now = Date.now();
    for (let k = 0; k < jobs.length; k += ROWS_PER_STATEMENT) {
      const some = jobs.slice(k, k + ROWS_PER_STATEMENT);
      await this.sql.run(
        `UPDATE jobs SET attempts = v.attempts, worker_id = v.worker_id, waiting = NULL, updated = ? FROM (VALUES ${some.map(() => "(?::text, ?::int, ?::text)").join(", ")}) AS v(id, attempts, worker_id) WHERE jobs.id = v.id`,
        now,
        ...some.flatMap((j) => [j.id, j.attempts, j.workerId]),
      );
    }
  }
  /** Jobs that wait, all for one reason (a dispatch pass's line for an ask no worker has room for): one statement. */
  async jobsWaiting(ids: string[], reason: string): Promise<void> {
    const now = Date.now();
    for (const some of chunks(ids)) await this.sql.run(`UPDATE jobs SET waiting = ?, updated = ? WHERE id IN (${marks(some)})`, sqlValue(reason), now, ...some);
  }
  /** The task as committed now, its row locked to the end of the transaction: what a change without the writer lock decides on. */
  async lockedTask(id: string): Promise<TaskRow | null> {
    const r = await this.sql.get(`SELECT * FROM tasks WHERE id = ?${this.forUpdate}`, id);
    return r ? toTask(r) : null;
  }
  /** A worker's tasks held now, locked (see lockedTask). */
  async lockedActiveTasks(workerId: string): Promise<TaskRow[]> {
    return (await this.sql.all(`SELECT * FROM tasks WHERE worker_id = ? AND ${ACTIVE} ORDER BY created${this.forUpdate}`, workerId)).map(toTask);
  }
  /**
   * Holds a job's row to the end of the transaction: settling a job from its tasks' rows is one at a time. On
   * PostgreSQL its event stream's lock, shared, comes first, in the same statement: those who write its events
   * take them in that order too (an event, then the row), so a follower queued for the stream never sits between
   * two of them (a cycle PostgreSQL undoes only after its deadlock_timeout, a second).
   */
  async lockJob(id: string): Promise<void> {
    if (this.sql.dialect !== "postgres") return void (await this.sql.get("SELECT id FROM jobs WHERE id = ?", id));
    await this.sql.get(`SELECT j.id FROM (SELECT pg_advisory_xact_lock_shared(${STREAM_LOCK_CLASS}, hashtext(?))) AS l, jobs AS j WHERE j.id = ? FOR UPDATE OF j`, id, id);
  }
  /**
   * Queued jobs' rows, locked for a dispatch pass to change, oldest first:
   * without those another change holds (SKIP LOCKED: that pass places them,
   * or a cancel ends them) or that were handed out since the pass read them
   * (their worker set).
   */
  async claimQueuedJobs(ids: string[]): Promise<JobRow[]> {
    const rows: JobRow[] = [];
    for (const some of chunks(ids)) rows.push(...(await this.sql.all(`SELECT * FROM jobs WHERE id IN (${marks(some)}) AND state = 'queued' AND worker_id IS NULL ORDER BY created${this.skipLocked}`, ...some)).map(toJob));
    return rows;
  }
  async claimQueuedJob(id: string): Promise<JobRow | null> {
    return (await this.claimQueuedJobs([id]))[0] ?? null;
  }
  /**
   * Workers for a dispatch pass to give work to, each held from other passes
   * to the end of the transaction: without those another pass holds or that
   * take no new work now. Held by a transaction-scoped advisory lock, not the
   * row's, so their beats, polls and reports never wait on a pass.
   */
  async claimWorkers(ids: string[]): Promise<WorkerRow[]> {
    const held = this.sql.dialect === "postgres" ? ` AND pg_try_advisory_xact_lock(${DISPATCH_LOCK_CLASS}, hashtext(id))` : "";
    const rows: WorkerRow[] = [];
    for (const some of chunks(ids)) rows.push(...(await workerRows(this.sql, await this.sql.all(`SELECT ${WORKER_LIGHT_COLUMNS} FROM workers WHERE id IN (${marks(some)}) AND state = 'idle'${held} ORDER BY id`, ...some))));
    return rows;
  }
  /** Waits for any pass that holds the worker (claimWorkers), and keeps new ones off it: its tasks, read after, are all of them. */
  async holdWorkerFromDispatch(id: string): Promise<void> {
    if (this.sql.dialect === "postgres") await this.sql.get(`SELECT pg_advisory_xact_lock(${DISPATCH_LOCK_CLASS}, hashtext(?)) AS held`, id);
  }
  /** The GPUs of each job these workers run now, by worker (one entry a job): their loads, read afresh. */
  async jobGpusOf(workerIds: string[]): Promise<{ workerId: string; gpus: number[] }[]> {
    const out: { workerId: string; gpus: number[] }[] = [];
    for (const some of chunks(workerIds)) {
      for (const r of await this.sql.all(`SELECT worker_id, gpus FROM tasks WHERE worker_id IN (${marks(some)}) AND kind = 'job' AND ${ACTIVE}`, ...some)) out.push({ workerId: r.worker_id as string, gpus: json<number[]>(r.gpus) });
    }
    return out;
  }
  /** Whether any job waits to be dispatched: one indexed look. */
  async anyQueued(): Promise<boolean> {
    return Boolean(await this.sql.get(`SELECT 1 AS yes FROM jobs WHERE ${QUEUED} LIMIT 1`));
  }
  /** SQLite locks the whole file for a transaction; PostgreSQL locks rows. */
  private get forUpdate(): string {
    return this.sql.dialect === "postgres" ? " FOR UPDATE" : "";
  }
  private get skipLocked(): string {
    return this.sql.dialect === "postgres" ? " FOR UPDATE SKIP LOCKED" : "";
  }
  async task(id: string): Promise<TaskRow | null> {
    const r = await this.sql.get("SELECT * FROM tasks WHERE id = ?", id);
    return r ? toTask(r) : null;
  }
  /**
   * Of the workers whose long polls wait here (id → the credentials they came with), those a poll has news for:
   * a task to hand out, a cancel to send, or a dead credential (replaced, or the worker gone). One statement of
   * each kind per 500 workers, for all of them.
   */
  async pollNews(waiting: ReadonlyMap<string, readonly (string | null)[]>): Promise<string[]> {
    const news = new Set<string>();
    for (const ids of chunks([...waiting.keys()])) {
      const [work, rows] = await Promise.all([
        this.sql.all<{ id: string }>(`SELECT DISTINCT worker_id AS id FROM tasks WHERE worker_id IN (${marks(ids)}) AND ${ACTIVE} AND (delivered = 0 OR (cancel = 1 AND cancel_sent = 0))`, ...ids),
        this.sql.all<{ id: string; secret: string; state: string }>(`SELECT id, secret, state FROM workers WHERE id IN (${marks(ids)})`, ...ids),
      ]);
      for (const r of work) news.add(r.id);
      const live = new Map(rows.filter((r) => r.state !== "left").map((r) => [r.id, r.secret]));
      for (const id of ids) if ((waiting.get(id) ?? []).some((secret) => secret !== null && live.get(id) !== secret)) news.add(id);
    }
    return [...news];
  }
  /** Tasks a worker holds now (assigned or running). */
  async activeTasks(workerId?: string): Promise<TaskRow[]> {
    if (workerId) return (await this.sql.all(`SELECT * FROM tasks WHERE worker_id = ? AND ${ACTIVE} ORDER BY created`, workerId)).map(toTask);
    return (await this.sql.all(`SELECT * FROM tasks WHERE ${ACTIVE} ORDER BY created`)).map(toTask);
  }
  /** Whether the worker holds a task now (assigned or running) whose job or prepare request uses this bundle. */
  async workerHoldsBundle(workerId: string, hash: string): Promise<boolean> {
    const r = await this.sql.get(
      `SELECT 1 AS yes FROM tasks LEFT JOIN jobs ON jobs.id = tasks.job_id WHERE tasks.worker_id = ? AND tasks.state IN ${HELD} AND (tasks.bundle = ? OR jobs.bundle = ?) LIMIT 1`,
      workerId, hash, hash,
    );
    return Boolean(r);
  }
  /**
   * A task's inputs: the outputs archives of the tasks it needs, directly or through others (jobs/outputs.ts). What
   * a worker is handed with the task, and the only outputs its credential fetches (workerNeedsOutputs).
   */
  async inputsOf(job: JobRow): Promise<{ task: string; bundle: string }[]> {
    if (!job.parentId || !job.needs.length) return [];
    const siblings = await this.tasksOf(job.parentId);
    const needed = neededTasks(siblings.map((s) => ({ name: s.task!, needs: s.needs })), job.task!);
    return siblings.filter((s) => needed.includes(s.task!) && s.outputsBundle).map((s) => ({ task: s.task!, bundle: s.outputsBundle! }));
  }
  /** Whether the worker holds a task now among whose inputs (inputsOf) is this archive. */
  async workerNeedsOutputs(workerId: string, hash: string): Promise<boolean> {
    const held = (await this.sql.all(`SELECT jobs.* FROM tasks JOIN jobs ON jobs.id = tasks.job_id WHERE tasks.worker_id = ? AND tasks.state IN ${HELD} AND jobs.parent_id IS NOT NULL`, workerId)).map(toJob);
    for (const h of held) if ((await this.inputsOf(h)).some((i) => i.bundle === hash)) return true;
    return false;
  }
  async activeTaskOfJob(jobId: string): Promise<TaskRow | null> {
    const r = await this.sql.get(`SELECT * FROM tasks WHERE job_id = ? AND ${ACTIVE} ORDER BY created DESC LIMIT 1`, jobId);
    return r ? toTask(r) : null;
  }
  /** The job's task held now, locked (see lockedTask): one that ended while this waited for it is not returned. */
  async lockedActiveTaskOfJob(jobId: string): Promise<TaskRow | null> {
    const r = await this.sql.get(`SELECT * FROM tasks WHERE job_id = ? AND ${ACTIVE} ORDER BY created DESC LIMIT 1${this.forUpdate}`, jobId);
    return r ? toTask(r) : null;
  }
  async groupTasks(groupId: string): Promise<TaskRow[]> {
    return (await this.sql.all("SELECT * FROM tasks WHERE group_id = ? ORDER BY created", groupId)).map(toTask);
  }
  async updateTask(id: string, fields: Partial<Pick<TaskRow, "state" | "result" | "delivered" | "cancel" | "cancelSent" | "appliedSeq">>): Promise<void> {
    await this.update("tasks", TASK_COLUMNS, id, fields, true);
  }

  // Events and output
  async event<N extends JobEventName>(jobId: string, type: N, data: JobEventData[N]): Promise<void> {
    await this.relayedEvents(jobId, [{ type, data }]);
  }
  /** An event a worker recorded, kept as it came: its name may be one of another version's (a worker not upgraded yet). */
  async relayedEvent(jobId: string, e: Pick<RecordedEvent, "type" | "data">): Promise<void> {
    await this.relayedEvents(jobId, [e]);
  }
  /**
   * Several, in order, in one statement (a worker's report carries a few at once). `stream`: what one reader
   * follows them in (followEvents): the job itself, or a prepare's group over its tasks (event-streams.ts).
   */
  async relayedEvents(jobId: string, events: Pick<RecordedEvent, "type" | "data">[], stream = jobId): Promise<void> {
    await this.eventsOfStreams(events.map((e) => ({ ...e, jobId, stream })));
  }
  /** These event streams' locks, shared, to the commit: a writer takes a job's stream before its row (lockJob). */
  async holdStreams(streams: string[]): Promise<void> {
    await holdStreams(this.sql, streams);
  }
  /** Events of several jobs at once, each stream's in order (a dispatch pass's): as few statements as they fit. */
  async eventsOfStreams(events: StreamEvent[]): Promise<void> {
    if (events.length) await insertEvents(this.sql, events, sqlValue);
  }
  /**
   * The events of these ids after a mark, as one follower reads its stream (a job's own id, or a prepare's group
   * and its tasks' ids): on PostgreSQL under the stream's lock, taken alone, so no seq below what it returns is
   * still to commit. SQLite has one writer: its commits are in seq order.
   */
  async followEvents(stream: string, ids: string[], afterSeq: number, signal?: AbortSignal): Promise<(StoredEvent & { jobId: string })[]> {
    const read = async (sql: Sql) => {
      const out: (StoredEvent & { jobId: string })[] = [];
      for (const part of chunks(ids)) {
        const rows = await sql.all<{ seq: number; job_id: string; ts: number; type: string; data: string }>(
          `SELECT seq, job_id, ts, type, data FROM events WHERE job_id IN (${part.map(() => "?").join(", ")}) AND seq > ? ORDER BY seq`,
          ...part,
          afterSeq,
        );
        for (const r of rows) out.push({ seq: Number(r.seq), jobId: r.job_id, ts: Number(r.ts), type: r.type, data: JSON.parse(r.data) });
      }
      return out.sort((a, b) => a.seq - b.seq);
    };
    if (this.sql.dialect !== "postgres") return read(this.sql);
    // A follower gone (its request ended) stops asking: nothing new for it.
    for (; !signal?.aborted; ) {
      try {
        return await this.sql.transaction(async (tx) => {
          // Read committed, whatever the database's default: the read after the wait must see what committed during it.
          await tx.run("SET TRANSACTION ISOLATION LEVEL READ COMMITTED");
          // Waited for a while at most, then asked again: a follower never holds a pooled connection long while a writer is in flight.
          await tx.get(`SELECT set_config('lock_timeout', '2s', true) AS timeout, pg_advisory_xact_lock(${STREAM_LOCK_CLASS}, hashtext(?)) AS held`, stream);
          return read(tx);
        });
      } catch (error) {
        if (!isLockTimeout(error)) throw error;
      }
    }
    return [];
  }
  async events(jobId: string, afterSeq = 0): Promise<StoredEvent[]> {
    return (await this.sql.all<{ seq: number; ts: number; type: string; data: string }>("SELECT seq, ts, type, data FROM events WHERE job_id = ? AND seq > ? ORDER BY seq", jobId, afterSeq)).map((r) => ({
      seq: Number(r.seq),
      ts: Number(r.ts),
      type: r.type,
      data: JSON.parse(r.data),
    }));
  }
  /** Every event of these types, oldest first, with the worker its job last ran on: what /metrics counts. */
  async phaseEvents(types: JobEventName[]): Promise<{ jobId: string; ts: number; type: string; data: Record<string, unknown>; workerId: string | null }[]> {
    const marks = types.map(() => "?").join(", ");
    return (
      await this.sql.all<{ job_id: string; ts: number; type: string; data: string; worker_id: string | null }>(`SELECT e.job_id, e.ts, e.type, e.data, j.worker_id FROM events e LEFT JOIN jobs j ON j.id = e.job_id WHERE e.type IN (${marks}) ORDER BY e.seq`, ...types)
    ).map((r) => ({ jobId: r.job_id, ts: Number(r.ts), type: r.type, data: JSON.parse(r.data), workerId: r.worker_id }));
  }
  /** How each `env prepare --server` task ended, by the worker that ran it (the prepares a job made are its events). */
  async prepareTaskResults(): Promise<{ workerId: string; status: PrepareTaskResult["status"] }[]> {
    const rows = await this.sql.all<{ worker_id: string; result: string }>("SELECT worker_id, result FROM tasks WHERE kind = 'prepare' AND result IS NOT NULL ORDER BY created");
    return rows.map((r) => ({ workerId: r.worker_id, status: json<PrepareTaskResult>(r.result).status }));
  }
  /** How many jobs (and tasks of jobs) are in each state. */
  async jobStateCounts(): Promise<Map<string, number>> {
    return new Map((await this.sql.all<{ state: string; n: number }>("SELECT state, COUNT(*) AS n FROM jobs GROUP BY state")).map((r) => [r.state, Number(r.n)]));
  }
  /** Output as it came, stdout (1) and stderr (2) interleaved in one log with byte offsets: the size moved and the chunk added together. */
  async appendLog(jobId: string, data: Uint8Array, stream: 1 | 2 = 1): Promise<number> {
    if (this.sql.dialect === "postgres") {
      // One statement: the job's size grown and the piece written at its old end (a round trip per piece, not two).
      const row = await this.sql.get<{ start: number }>(
        "WITH grown AS (UPDATE jobs SET log_size = log_size + ?::bigint WHERE id = ? RETURNING log_size) INSERT INTO logs (job_id, start, stream, data) SELECT ?, log_size - ?::bigint, ?::int, ?::bytea FROM grown RETURNING start",
        data.length, jobId, jobId, data.length, stream, data,
      );
      return Number(row?.start ?? 0) + data.length;
    }
    return this.sql.exclusive(async (tx) => {
      const end = Number((await tx.get<{ log_size: number }>("UPDATE jobs SET log_size = log_size + ? WHERE id = ? RETURNING log_size", data.length, jobId))?.log_size ?? data.length);
      await tx.run("INSERT INTO logs (job_id, start, stream, data) VALUES (?, ?, ?, ?)", jobId, end - data.length, stream, data);
      return end;
    });
  }
  /** At most `max` bytes of output from `offset` on: rows read a page at a time (never a whole big log into memory), the last cut to fit. */
  async readChunks(jobId: string, offset: number, max = 1024 * 1024): Promise<{ stream: 1 | 2; data: Uint8Array }[]> {
    const chunks: { stream: 1 | 2; data: Uint8Array }[] = [];
    let total = 0;
    let from = offset;
    for (;;) {
      const rows = await this.sql.all<{ start: number; stream: number; data: Uint8Array }>("SELECT start, stream, data FROM logs WHERE job_id = ? AND start + length(data) > ? ORDER BY start LIMIT 64", jobId, from);
      for (const r of rows) {
        const start = Number(r.start);
        const piece = r.data.subarray(Math.max(0, from - start)).subarray(0, max - total);
        chunks.push({ stream: Number(r.stream) as 1 | 2, data: piece });
        total += piece.length;
        if (total >= max) return chunks;
      }
      if (rows.length < 64) return chunks;
      const last = rows[rows.length - 1]!;
      from = Number(last.start) + last.data.length;
    }
  }

  async readLog(jobId: string, offset: number, max?: number): Promise<Uint8Array> {
    return Buffer.concat((await this.readChunks(jobId, offset, max)).map((c) => c.data));
  }
}
