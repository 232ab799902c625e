import { Database } from "bun:sqlite";
import { statSync } from "node:fs";
import { ownerOnlyFolder } from "../core/owner-only.ts";
import { join } from "node:path";
import type { HomeLayout } from "../config/paths.ts";
import { UsageError, UserError } from "../errors.ts";
import { redactDeep, redactUrl } from "../env/index-light.ts";
import type { JobSpec } from "./spec.ts";
import type { JobEventData, JobEventName, JobState, RecordedEvent } from "./model.ts";

export interface JobRecord {
  id: string;
  name: string;
  state: JobState;
  created: number; // ms
  updated: number;
  spec: JobSpec;
  exitCode: number | null;
  runnerPid: number | null;
  childPid: number | null;
  /** Start times recorded with the pids (src/core/process-identity.ts): a reused pid is never taken for them. */
  runnerStart: number | null;
  childStart: number | null;
  /** The boot the pids were recorded in (Linux boot id). */
  pidBoot: string | null;
  envKey: string | null;
  error: string | null;
  /** A task's record: the job it belongs to, and its name there (null for a job itself). */
  parentId: string | null;
  task: string | null;
}

interface JobRow {
  id: string;
  name: string;
  state: JobState;
  created: number;
  updated: number;
  spec: string;
  exit_code: number | null;
  runner_pid: number | null;
  child_pid: number | null;
  // Added by migration: absent when a reader opens a database no writer has migrated yet.
  runner_start?: number | null;
  child_start?: number | null;
  pid_boot?: string | null;
  parent_id?: string | null;
  task?: string | null;
  env_key: string | null;
  error: string | null;
}

const SCHEMA = `
CREATE TABLE IF NOT EXISTS jobs (
  id TEXT PRIMARY KEY, name TEXT NOT NULL, state TEXT NOT NULL, created REAL NOT NULL, updated REAL NOT NULL,
  spec TEXT NOT NULL, exit_code INTEGER, runner_pid INTEGER, child_pid INTEGER, env_key TEXT, error TEXT
);
CREATE INDEX IF NOT EXISTS jobs_created ON jobs(created);
CREATE TABLE IF NOT EXISTS events (
  seq INTEGER PRIMARY KEY AUTOINCREMENT, job_id TEXT NOT NULL, ts REAL NOT NULL, type TEXT NOT NULL, data TEXT NOT NULL
);
CREATE INDEX IF NOT EXISTS events_job ON events(job_id, seq);
`;

/** Columns added since the first schema: ALTER TABLE ADD COLUMN where missing, so an existing database keeps its jobs. */
const ADDED_COLUMNS: [name: string, type: string][] = [
  ["runner_start", "INTEGER"],
  ["child_start", "INTEGER"],
  ["pid_boot", "TEXT"],
  ["parent_id", "TEXT"],
  ["task", "TEXT"],
];

function columnsOf(db: Database): Set<string> {
  return new Set(db.query<{ name: string }, []>("PRAGMA table_info(jobs)").all().map((c) => c.name));
}

function migrate(db: Database): void {
  const have = columnsOf(db);
  for (const [name, type] of ADDED_COLUMNS) {
    if (have.has(name)) continue;
    try {
      db.exec(`ALTER TABLE jobs ADD COLUMN ${name} ${type}`);
    } catch (error) {
      // Another gpulayer process added it first.
      if (!/duplicate column name/i.test((error as Error).message)) throw error;
    }
  }
}

/**
 * Jobs and their events in bun:sqlite; WAL and a busy timeout make it safe for many gpulayer processes at once.
 * With readOnly (job status, list, logs) the database is opened read-only: no folder or file is created, no
 * migration runs, and no checkpoint rewrites it on close; with no database yet, an empty one in memory answers.
 * A writer opens the database on its first use (a `job run` whose writes are held opens it once its command runs).
 */
export class JobStore {
  private opened: Database | null = null;
  /** A database from before jobs of tasks, opened by a reader (which never migrates): it holds no tasks. */
  private hasTasks = true;
  /** Writes held by holdWrites, each ready to run as it was asked (its values and times taken then). */
  private held: (() => void)[] | null = null;
  private holdTimer: ReturnType<typeof setTimeout> | undefined;
  /** A held write that failed when the timer wrote it: thrown at the next flush. */
  private heldFailure: unknown = null;
  constructor(
    readonly layout: HomeLayout,
    opts: { readOnly?: boolean } = {},
  ) {
    if (!opts.readOnly) {
      // Jobs' environment values and output: closed to others, files an older gpulayer made 0644 included.
      ownerOnlyFolder(layout.jobs);
      return;
    }
    const path = join(layout.jobs, "jobs.db");
    // An empty file is a database a full disk kept from being made: as good as none (its first writer makes it).
    const present = (statSync(path, { throwIfNoEntry: false })?.size ?? 0) > 0;
    this.opened = present ? new Database(path, { readonly: true }) : new Database(":memory:");
    this.opened.exec("PRAGMA busy_timeout = 10000");
    if (!present) {
      this.opened.exec(SCHEMA);
      migrate(this.opened);
    }
    this.hasTasks = columnsOf(this.opened).has("parent_id");
  }

  private get db(): Database {
    if (this.opened) return this.opened;
    const db = new Database(join(this.layout.jobs, "jobs.db"), { create: true });
    db.exec("PRAGMA busy_timeout = 10000");
    db.exec("PRAGMA journal_mode = WAL");
    db.exec("PRAGMA synchronous = NORMAL");
    db.exec(SCHEMA);
    migrate(db);
    this.opened = db;
    return db;
  }

  /**
   * Holds this store's writes (create, update, event) in memory, to be
   * written in one transaction by flushWrites, by close, or `ms` later,
   * whichever comes first: a warm `job run` records its job while its
   * command starts, not before it (the database's open and first write are
   * milliseconds on the way to the command). Reads do not see held writes.
   */
  holdWrites(ms: number): void {
    if (this.held) return;
    this.held = [];
    this.holdTimer = setTimeout(() => {
      try {
        this.flushWrites();
      } catch (error) {
        this.heldFailure = error;
      }
    }, ms);
  }

  /** Writes what holdWrites held, at once; a no-op when nothing is held. */
  flushWrites(): void {
    clearTimeout(this.holdTimer);
    const held = this.held;
    this.held = null;
    const failure = this.heldFailure;
    this.heldFailure = null;
    if (failure) throw failure;
    if (held?.length) this.db.transaction(() => held.forEach((write) => write()))();
  }

  private write(run: () => void): void {
    if (this.held) this.held.push(run);
    else run();
  }

  logPath(id: string): string {
    return join(this.layout.jobs, `${id}.log`);
  }

  /** A task's outputs as it left them (a copy of its own: jobs/outputs.ts), kept with its record. */
  outputsDir(id: string): string {
    return join(this.layout.jobs, "outputs", id);
  }

  /**
   * Records a job without the credentials in its URLs (the database is read by
   * `job list`, backups, anyone with the file). The record returned holds the
   * whole spec, in memory only: a detached runner gets it on its stdin.
   */
  create(spec: JobSpec): JobRecord {
    const id = newId();
    const now = Date.now();
    const submitted = JSON.stringify({ name: spec.name, command: spec.commandText } satisfies JobEventData["job.submitted"]);
    const tasks = (spec.tasks ?? []).map((t) => [newId(), `${spec.name}/${t.name}`, JSON.stringify(redactDeep(t.spec)), t.name] as const);
    const recorded = JSON.stringify(redactDeep(spec));
    this.write(() =>
      this.db.transaction(() => {
        this.db.query("INSERT INTO jobs (id, name, state, created, updated, spec) VALUES (?, ?, 'queued', ?, ?, ?)").run(id, spec.name, now, now, recorded);
        this.insertEvent(id, now, "job.submitted", submitted);
        // A job of tasks: a record per task, queued with the job; each has its own events, log and phases.
        for (const [taskId, name, taskSpec, task] of tasks) {
          this.db.query("INSERT INTO jobs (id, name, state, created, updated, spec, parent_id, task) VALUES (?, ?, 'queued', ?, ?, ?, ?, ?)").run(taskId, name, now, now, taskSpec, id, task);
        }
      })(),
    );
    return { id, name: spec.name, state: "queued", created: now, updated: now, spec, exitCode: null, runnerPid: null, childPid: null, runnerStart: null, childStart: null, pidBoot: null, envKey: null, error: null, parentId: null, task: null };
  }

  /** A job's task records, in the job file's order; each holds the task's whole spec when `spec` is given (credentials included). */
  tasks(parentId: string, spec?: JobSpec): JobRecord[] {
    if (!this.hasTasks) return [];
    const rows = this.db.query<JobRow, [string]>("SELECT * FROM jobs WHERE parent_id = ? ORDER BY rowid").all(parentId).map(toRecord);
    if (!spec?.tasks) return rows;
    return rows.map((r) => ({ ...r, spec: spec.tasks!.find((t) => t.name === r.task)?.spec ?? r.spec }));
  }

  get(id: string): JobRecord | null {
    const row = this.db.query<JobRow, [string]>("SELECT * FROM jobs WHERE id = ?").get(id);
    return row ? toRecord(row) : null;
  }

  /** A unique prefix of an id is enough. */
  find(prefix: string): JobRecord {
    if (!/^[0-9a-f]{1,16}$/i.test(prefix)) throw new UsageError(`not a job id: ${prefix}`);
    // A task's record by its whole id (job status TASK_ID, as `tasks[].id` shows it); by a prefix, jobs only.
    if (prefix.length === 16) {
      const row = this.get(prefix.toLowerCase());
      if (row) return row;
    }
    const rows = this.db.query<JobRow, [string]>(`SELECT * FROM jobs WHERE id LIKE ? ${this.hasTasks ? "AND parent_id IS NULL" : ""} LIMIT 2`).all(`${prefix.toLowerCase()}%`);
    if (rows.length > 1) throw new UsageError(`job id prefix ${prefix} matches several jobs; give more of it`);
    if (!rows[0]) throw new UserError(`no job with id ${prefix} (see gpulayer job list)`);
    return toRecord(rows[0]);
  }

  list(limit = 50): JobRecord[] {
    return this.db.query<JobRow, [number]>(`SELECT * FROM jobs ${this.hasTasks ? "WHERE parent_id IS NULL" : ""} ORDER BY created DESC LIMIT ?`).all(limit).map(toRecord);
  }

  update(id: string, fields: Partial<Pick<JobRecord, "state" | "exitCode" | "runnerPid" | "childPid" | "runnerStart" | "childStart" | "pidBoot" | "envKey" | "error">>): void {
    const columns: Record<string, string> = {
      state: "state",
      exitCode: "exit_code",
      runnerPid: "runner_pid",
      childPid: "child_pid",
      runnerStart: "runner_start",
      childStart: "child_start",
      pidBoot: "pid_boot",
      envKey: "env_key",
      error: "error",
    };
    const sets: string[] = ["updated = ?"];
    const values: (string | number | null)[] = [Date.now()];
    for (const [k, val] of Object.entries(fields)) {
      sets.push(`${columns[k]} = ?`);
      values.push(typeof val === "string" ? redactUrl(val) : (val as number | null)); // an error may quote an index URL
    }
    this.write(() => this.db.query(`UPDATE jobs SET ${sets.join(", ")} WHERE id = ?`).run(...values, id));
  }

  event<N extends JobEventName>(id: string, type: N, data: JobEventData[N]): void {
    const ts = Date.now();
    const text = JSON.stringify(redactDeep(data));
    this.write(() => this.insertEvent(id, ts, type, text));
  }

  private insertEvent(id: string, ts: number, type: JobEventName, data: string): void {
    this.db.query("INSERT INTO events (job_id, ts, type, data) VALUES (?, ?, ?, ?)").run(id, ts, type, data);
  }

  events(id: string): RecordedEvent[] {
    return this.db
      .query<{ ts: number; type: string; data: string }, [string]>("SELECT ts, type, data FROM events WHERE job_id = ? ORDER BY seq")
      .all(id)
      .map((r) => ({ ts: r.ts, type: r.type, data: JSON.parse(r.data) }));
  }

  close(): void {
    this.flushWrites();
    this.opened?.close();
  }
}

function toRecord(row: JobRow): JobRecord {
  return {
    id: row.id,
    name: row.name,
    state: row.state,
    created: row.created,
    updated: row.updated,
    spec: JSON.parse(row.spec),
    exitCode: row.exit_code,
    runnerPid: row.runner_pid,
    childPid: row.child_pid,
    runnerStart: row.runner_start ?? null,
    childStart: row.child_start ?? null,
    pidBoot: row.pid_boot ?? null,
    envKey: row.env_key,
    error: row.error,
    parentId: row.parent_id ?? null,
    task: row.task ?? null,
  };
}

function newId(): string {
  return Buffer.from(crypto.getRandomValues(new Uint8Array(8))).toString("hex");
}
