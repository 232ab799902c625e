import type { Database } from "bun:sqlite";
import { mkdirSync, readdirSync, renameSync, rmSync, statSync } from "node:fs";
import { join } from "node:path";
import type { ArtifactConditions } from "../env/shipping.ts";
import { lruOrder } from "../gc/policy.ts";

/**
 * Env artifacts workers uploaded (env/artifact.ts), by sha256: the bytes in
 * the server's home, a row each (the env key, the conditions it may be
 * unpacked under, who built it, size, first upload, last use). One artifact
 * per key and conditions, never replaced; kept under a size limit least
 * recently used first (gc/policy.ts lruOrder, as the local cache), never one
 * a download is reading. Claims say which worker is building a key for a
 * path now, so the others wait for its artifact instead of building too.
 */

export const ARTIFACTS_SCHEMA = `CREATE TABLE IF NOT EXISTS artifacts (sha TEXT PRIMARY KEY, env_key TEXT NOT NULL, env_path TEXT NOT NULL, conditions TEXT NOT NULL,
  bytes INTEGER NOT NULL, built_by TEXT NOT NULL, task_id TEXT NOT NULL, created REAL NOT NULL, last_used REAL NOT NULL);
CREATE INDEX IF NOT EXISTS artifacts_key ON artifacts(env_key);`;

export interface ArtifactRow {
  sha: string;
  key: string;
  conditions: ArtifactConditions;
  bytes: number;
  builtBy: string;
  taskId: string;
  created: number;
  lastUsed: number;
}

export interface ArtifactTrim {
  removed: { sha: string; key: string; bytes: number; built_by: string }[];
  skipped: { sha: string; reason: string }[];
  kept_bytes: number;
  kept: number;
  max_bytes: number;
}

interface Claim {
  worker: string;
  workerId: string;
  until: number;
}

const FILE = /^([0-9a-f]{64})\.tar\.zst$/;

export class ArtifactStore {
  readonly dir: string;
  /** Downloads being served, by sha: never trimmed meanwhile. */
  private reading = new Map<string, number>();
  private receivingNames = new Set<string>();
  private claims = new Map<string, Claim>();

  constructor(
    private readonly db: Database,
    root: string,
  ) {
    this.dir = join(root, "artifacts");
    mkdirSync(this.dir, { recursive: true });
  }

  path(sha: string): string {
    return join(this.dir, `${sha}.tar.zst`);
  }

  private row(r: Record<string, unknown>): ArtifactRow {
    return { sha: String(r.sha), key: String(r.env_key), conditions: JSON.parse(String(r.conditions)) as ArtifactConditions, bytes: Number(r.bytes), builtBy: String(r.built_by), taskId: String(r.task_id), created: Number(r.created), lastUsed: Number(r.last_used) };
  }

  forKey(key: string): ArtifactRow[] {
    return this.db.query<Record<string, unknown>, [string]>("SELECT * FROM artifacts WHERE env_key = ? ORDER BY created").all(key).map((r) => this.row(r)).filter((a) => this.hasFile(a.sha));
  }

  get(sha: string): ArtifactRow | null {
    const r = this.db.query<Record<string, unknown>, [string]>("SELECT * FROM artifacts WHERE sha = ?").get(sha);
    return r && this.hasFile(String(r.sha)) ? this.row(r) : null;
  }

  list(): ArtifactRow[] {
    return this.db.query<Record<string, unknown>, []>("SELECT * FROM artifacts ORDER BY last_used").all().map((r) => this.row(r));
  }

  /** A row whose file went missing is dropped: the key is built again. */
  private hasFile(sha: string): boolean {
    try {
      statSync(this.path(sha));
      return true;
    } catch {
      this.db.query("DELETE FROM artifacts WHERE sha = ?").run(sha);
      return false;
    }
  }

  /** The artifact already there for this key and path, if any: an upload for the same never replaces it. */
  existing(key: string, envPath: string): ArtifactRow | null {
    return this.forKey(key).find((a) => a.conditions.env_path === envPath) ?? null;
  }

  receiving(): { path: string; keep(row: Omit<ArtifactRow, "created" | "lastUsed">): void; drop(): void } {
    const name = `upload.${process.pid}.${crypto.randomUUID()}.tmp`;
    const path = join(this.dir, name);
    this.receivingNames.add(name);
    let kept = false;
    return {
      path,
      keep: (row) => {
        renameSync(path, this.path(row.sha));
        const now = Date.now();
        this.db
          .query("INSERT INTO artifacts (sha, env_key, env_path, conditions, bytes, built_by, task_id, created, last_used) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)")
          .run(row.sha, row.key, row.conditions.env_path, JSON.stringify(row.conditions), row.bytes, row.builtBy, row.taskId, now, now);
        kept = true;
      },
      drop: () => {
        this.receivingNames.delete(name);
        if (!kept) rmSync(path, { force: true });
      },
    };
  }

  /** A download starts: its file is not trimmed until `done`. */
  read(sha: string): () => void {
    this.reading.set(sha, (this.reading.get(sha) ?? 0) + 1);
    this.db.query("UPDATE artifacts SET last_used = ? WHERE sha = ?").run(Date.now(), sha);
    let ended = false;
    return () => {
      if (ended) return;
      ended = true;
      const n = (this.reading.get(sha) ?? 1) - 1;
      if (n > 0) this.reading.set(sha, n);
      else this.reading.delete(sha);
    };
  }

  /** Least recently used first, down to `maxBytes`; an artifact being downloaded stays. `dryRun`: only say. */
  trim(maxBytes: number, dryRun = false): ArtifactTrim {
    const rows = this.list();
    const entries = rows.map((a) => ({ id: a.sha, state: "ready" as const, lastUsedMs: a.lastUsed, createdMs: a.created }));
    const bySha = new Map(rows.map((a) => [a.sha, a]));
    let total = rows.reduce((n, a) => n + a.bytes, 0);
    const result: ArtifactTrim = { removed: [], skipped: [], kept_bytes: 0, kept: 0, max_bytes: maxBytes };
    for (const e of lruOrder(entries)) {
      if (total <= maxBytes) break;
      const a = bySha.get(e.id)!;
      if (this.reading.has(a.sha)) {
        result.skipped.push({ sha: a.sha, reason: "a worker is downloading it" });
        continue;
      }
      if (!dryRun) {
        this.db.query("DELETE FROM artifacts WHERE sha = ?").run(a.sha);
        rmSync(this.path(a.sha), { force: true });
      }
      total -= a.bytes;
      result.removed.push({ sha: a.sha, key: a.key, bytes: a.bytes, built_by: a.builtBy });
    }
    result.kept_bytes = total;
    result.kept = rows.length - result.removed.length;
    if (!dryRun) this.removeStrays();
    return result;
  }

  /** Files without a row, or uploads a crash interrupted. */
  private removeStrays(): void {
    const rows = new Set(this.list().map((a) => a.sha));
    for (const name of readdirSync(this.dir)) {
      const m = FILE.exec(name);
      if ((m && rows.has(m[1]!)) || this.receivingNames.has(name)) continue;
      rmSync(join(this.dir, name), { recursive: true, force: true });
    }
  }

  totals(): { count: number; bytes: number } {
    const rows = this.list();
    return { count: rows.length, bytes: rows.reduce((n, a) => n + a.bytes, 0) };
  }

  /**
   * Claim the build of `key` at `envPath` for a worker, for `ttlMs` (renewed
   * by claiming again): granted when no other live claim holds it; else the
   * holder's name. `release` gives it up.
   */
  claim(key: string, envPath: string, worker: { id: string; name: string }, ttlMs: number, now = Date.now()): { granted: true } | { granted: false; holder: string } {
    const id = `${key}\0${envPath}`;
    const held = this.claims.get(id);
    if (held && held.until > now && held.workerId !== worker.id) return { granted: false, holder: held.worker };
    this.claims.set(id, { worker: worker.name, workerId: worker.id, until: now + ttlMs });
    return { granted: true };
  }

  release(key: string, envPath: string, workerId: string): void {
    const id = `${key}\0${envPath}`;
    if (this.claims.get(id)?.workerId === workerId) this.claims.delete(id);
  }

  /** Who is building it now, if anyone. */
  builder(key: string, envPath: string, now = Date.now()): string | null {
    const held = this.claims.get(`${key}\0${envPath}`);
    return held && held.until > now ? held.worker : null;
  }

  /** A worker that left or was lost holds no claim. */
  dropClaimsOf(workerId: string): void {
    for (const [id, c] of this.claims) if (c.workerId === workerId) this.claims.delete(id);
  }
}
