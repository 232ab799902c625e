import { Database } from "bun:sqlite";
import { statSync } from "node:fs";
import { ownerOnlyFolder } from "../core/owner-only.ts";
import { join } from "node:path";
import type { HomeLayout } from "../config/paths.ts";
import { UsageError, UserError } from "../errors.ts";
import { redactDeep, redactUrl } from "../env/index-light.ts";
import type { JobSpec } from "./spec.ts";
import { jobIdPrefix } from "./job-id.ts";
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
 */
export class JobStore {
  readonly db: Database;
  /** A database from before jobs of tasks, opened by a reader (which never migrates): it holds no tasks. */
  private readonly hasTasks: boolean;
  constructor(
    readonly layout: HomeLayout,
    opts: { readOnly?: boolean } = {},
  ) {
    const path = join(layout.jobs, "jobs.db");
    if (opts.readOnly) {
      // An empty file is a database a full disk kept from being made: as good as none (its first writer makes it).
      const present = (statSync(path, { throwIfNoEntry: false })?.size ?? 0) > 0;
      this.db = present ? new Database(path, { readonly: true }) : new Database(":memory:");
      this.db.exec("PRAGMA busy_timeout = 10000");
      if (!present) {
        this.db.exec(SCHEMA);
        migrate(this.db);
      }
      this.hasTasks = columnsOf(this.db).has("parent_id");
      return;
    }
    // Jobs' environment values and output: closed to others, files an older gpulayer made 0644 included.
    ownerOnlyFolder(layout.jobs);
    this.db = new Database(path, { create: true });
    this.db.exec("PRAGMA busy_timeout = 10000");
    this.db.exec("PRAGMA journal_mode = WAL");
    this.db.exec("PRAGMA synchronous = NORMAL");
    this.db.exec(SCHEMA);
    migrate(this.db);
    this.hasTasks = true;
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
    this.db.transaction(() => {
      this.db.query("INSERT INTO jobs (id, name, state, created, updated, spec) VALUES (?, ?, 'queued', ?, ?, ?)").run(id, spec.name, now, now, JSON.stringify(redactDeep(spec)));
      this.insertEvent(id, now, "job.submitted", JSON.stringify({ name: spec.name, command: spec.commandText } satisfies JobEventData["job.submitted"]));
      // A job of tasks: a record per task, queued with the job; each has its own events, log and phases.
      for (const t of spec.tasks ?? []) {
        this.db
          .query("INSERT INTO jobs (id, name, state, created, updated, spec, parent_id, task) VALUES (?, ?, 'queued', ?, ?, ?, ?, ?)")
          .run(newId(), `${spec.name}/${t.name}`, now, now, JSON.stringify(redactDeep(t.spec)), id, t.name);
      }
    })();
    // The record as written, without reading it back.
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
  find(typed: string): JobRecord {
    const prefix = jobIdPrefix(typed);
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
    this.db.query(`UPDATE jobs SET ${sets.join(", ")} WHERE id = ?`).run(...values, id);
  }

  event<N extends JobEventName>(id: string, type: N, data: JobEventData[N]): void {
    this.insertEvent(id, Date.now(), type, JSON.stringify(redactDeep(data)));
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
    this.db.close();
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
