import { Database } from "bun:sqlite";
import { mkdirSync } from "node:fs";
import { join } from "node:path";
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

export class Outbox {
  private readonly db: Database;
  /** The next number per task (this process is the only writer of its tasks). */
  private next = new Map<string, number>();

  constructor(layout: HomeLayout) {
    const dir = join(layout.root, "cluster");
    mkdirSync(dir, { recursive: true });
    this.db = new Database(join(dir, "outbox.db"), { create: true });
    this.db.exec("PRAGMA busy_timeout = 10000");
    this.db.exec("PRAGMA journal_mode = WAL");
    this.db.exec("PRAGMA synchronous = NORMAL");
    this.db.exec(SCHEMA);
  }

  append(task: string, kind: OutboxKind, body: Uint8Array | string, stream: "stdout" | "stderr" | null = null): number {
    let seq = this.next.get(task);
    if (seq === undefined) seq = (this.db.query<{ m: number | null }, [string]>("SELECT MAX(seq) AS m FROM items WHERE task = ?").get(task)?.m ?? 0) + 1;
    this.next.set(task, seq + 1);
    this.db.query("INSERT INTO items (task, seq, kind, stream, body) VALUES (?, ?, ?, ?, ?)").run(task, seq, kind, stream, typeof body === "string" ? Buffer.from(body) : body);
    return seq;
  }

  /** The oldest items of one kind (and stream) in a row, up to about `maxBytes`; a finish or handback goes alone. */
  batch(task: string, maxBytes: number): OutboxItem[] {
    const rows = this.db.query<{ seq: number; kind: OutboxKind; stream: "stdout" | "stderr" | null; body: Uint8Array }, [string]>("SELECT seq, kind, stream, body FROM items WHERE task = ? ORDER BY seq LIMIT 500").all(task);
    const first = rows[0];
    if (!first) return [];
    if (first.kind === "finish" || first.kind === "handback") return [first];
    const out: OutboxItem[] = [];
    let size = 0;
    for (const r of rows) {
      if (r.kind !== first.kind || r.stream !== first.stream || (out.length && size + r.body.length > maxBytes)) break;
      out.push(r);
      size += r.body.length;
    }
    return out;
  }

  /** The server has everything up to `seq`. */
  ack(task: string, seq: number): void {
    this.db.query("DELETE FROM items WHERE task = ? AND seq <= ?").run(task, seq);
  }

  /** The server no longer wants anything of this task (it took the task back). */
  drop(task: string): void {
    this.db.query("DELETE FROM items WHERE task = ?").run(task);
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
