import { Database } from "bun:sqlite";
import { chmodSync, closeSync, existsSync, mkdirSync, openSync } from "node:fs";
import type { HomeLayout } from "../config/paths.ts";

/**
 * What a worker owes the server, on disk until the server has it: each
 * task's events, output and final state, numbered in the order they happened
 * (per task, from 1). An item is written here before it is sent and removed
 * only once the server acknowledged it, so an outage of any length, or this
 * worker's own restart, loses nothing; the server applies each number once,
 * so sending again after a lost acknowledgement doubles nothing. One
 * bun:sqlite file in the worker's home (`cluster/outbox.db`), WAL: several
 * tasks write to it at once.
 */

export type OutboxKind = "event" | "output" | "finish" | "handback";

export interface OutboxItem {
  seq: number;
  kind: OutboxKind;
  stream: "stdout" | "stderr" | null;
  body: Uint8Array;
}

const SCHEMA = "CREATE TABLE IF NOT EXISTS items (task TEXT NOT NULL, seq INTEGER NOT NULL, kind TEXT NOT NULL, stream TEXT, body BLOB NOT NULL, PRIMARY KEY (task, seq));";

/** SQLite's auto_vacuum modes: 2 gives freed pages back on `PRAGMA incremental_vacuum`. */
const INCREMENTAL = 2;
/** Free pages kept for the next items (4 KiB each): about 4 MB. */
const FREE_PAGES_KEPT = 1024;
/** What the WAL file is cut back to after a checkpoint. */
const WAL_KEPT_BYTES = 8 * 1024 * 1024;

export class Outbox {
  private readonly db: Database;
  /** The next number per task (this process is the only writer of its tasks). */
  private next = new Map<string, number>();

  constructor(layout: HomeLayout) {
    mkdirSync(layout.cluster, { recursive: true });
    const file = layout.outbox;
    // Jobs' output and events: the worker's alone (a --run-as job user reaches cluster/work beside it). SQLite gives
    // its -wal and -shm files the database file's mode, so the file is made 0600 before SQLite opens it.
    closeSync(openSync(file, "a", 0o600));
    // An older gpulayer's files (0644) are closed too.
    for (const f of [file, `${file}-wal`, `${file}-shm`]) if (existsSync(f)) chmodSync(f, 0o600);
    this.db = new Database(file, { create: true });
    this.db.exec("PRAGMA busy_timeout = 10000");
    // Pages an acknowledged item freed go back to the disk (a job's 400 MB of output must not stay a 400 MB file):
    // set before the first table on a new file; a file an older gpulayer made is converted once, while it holds nothing.
    this.db.exec("PRAGMA auto_vacuum = INCREMENTAL");
    this.db.exec(SCHEMA);
    const mode = this.db.query<{ auto_vacuum: number }, []>("PRAGMA auto_vacuum").get()?.auto_vacuum;
    if (mode !== INCREMENTAL && !this.db.query("SELECT 1 FROM items LIMIT 1").get()) this.db.exec("VACUUM");
    this.db.exec("PRAGMA journal_mode = WAL");
    this.db.exec("PRAGMA synchronous = NORMAL");
    this.db.exec(`PRAGMA journal_size_limit = ${WAL_KEPT_BYTES}`);
  }

  /** Free pages past a few MB are given back: after an acknowledgement, not per append. */
  private giveBackSpace(): void {
    const free = this.db.query<{ freelist_count: number }, []>("PRAGMA freelist_count").get()?.freelist_count ?? 0;
    if (free > FREE_PAGES_KEPT) this.db.exec("PRAGMA incremental_vacuum");
  }

  append(task: string, kind: OutboxKind, body: Uint8Array | string, stream: "stdout" | "stderr" | null = null): number {
    let seq = this.next.get(task);
    if (seq === undefined) seq = (this.db.query<{ m: number | null }, [string]>("SELECT MAX(seq) AS m FROM items WHERE task = ?").get(task)?.m ?? 0) + 1;
    this.next.set(task, seq + 1);
    this.db.query("INSERT INTO items (task, seq, kind, stream, body) VALUES (?, ?, ?, ?, ?)").run(task, seq, kind, stream, typeof body === "string" ? Buffer.from(body) : body);
    return seq;
  }

  /**
   * The oldest items, in order: a run of one kind (and stream) up to about `maxBytes`; or, while they come to
   * `mixedBytes` at most, items of several kinds (a short job's events, output and end in one request). A
   * handback goes alone, as does a finish that comes first; a finish ends a batch.
   */
  batch(task: string, maxBytes: number, mixedBytes = 0): OutboxItem[] {
    const rows = this.db.query<{ seq: number; kind: OutboxKind; stream: "stdout" | "stderr" | null; body: Uint8Array }, [string]>("SELECT seq, kind, stream, body FROM items WHERE task = ? ORDER BY seq LIMIT 500").all(task);
    const first = rows[0];
    if (!first) return [];
    if (first.kind === "finish" || first.kind === "handback") return [first];
    const out: OutboxItem[] = [];
    let size = 0;
    let mixed = false;
    for (const r of rows) {
      const same = r.kind === first.kind && r.stream === first.stream;
      const limit = same && !mixed ? maxBytes : mixedBytes;
      if (r.kind === "handback" || (out.length && size + r.body.length > limit)) break;
      mixed ||= !same;
      out.push(r);
      size += r.body.length;
      if (r.kind === "finish") break;
    }
    return out;
  }

  /** The server has everything up to `seq`. */
  ack(task: string, seq: number): void {
    this.db.query("DELETE FROM items WHERE task = ? AND seq <= ?").run(task, seq);
    this.giveBackSpace();
  }

  /** The server no longer wants anything of this task (it took the task back). */
  drop(task: string): void {
    this.db.query("DELETE FROM items WHERE task = ?").run(task);
    this.giveBackSpace();
  }

  /** Tasks with items not yet acknowledged, oldest first. */
  pendingTasks(): string[] {
    return this.db.query<{ task: string }, []>("SELECT task FROM items GROUP BY task ORDER BY MIN(rowid)").all().map((r) => r.task);
  }

  pending(task: string): number {
    return this.db.query<{ n: number }, [string]>("SELECT COUNT(*) AS n FROM items WHERE task = ?").get(task)?.n ?? 0;
  }

  close(): void {
    this.db.close();
  }
}
