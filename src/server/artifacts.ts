import type { Sql } from "./db/sql.ts";
import { readdirSync, renameSync, rmSync, statSync } from "node:fs";
import { join } from "node:path";
import type { ArtifactConditions } from "../env/index-light.ts";
import { lruOrder } from "../gc/policy.ts";
import type { BuildClaims, Granted } from "./build-claims.ts";

/**
 * Env artifacts workers uploaded (env/store/artifact.ts), by sha256: the bytes in
 * the server's home, a row each (the env key, the conditions it may be
 * unpacked under, who built it, size, first upload, last use). One artifact
 * per key and conditions (one found unsound is dropped, and the next build's
 * replaces it); kept under a size limit least
 * recently used first (gc/policy.ts lruOrder, as the local cache), never one
 * a download is reading. Build claims (build-claims.ts) say which worker is building
 * a key for a path now, so the others wait for its artifact instead of building too.
 */

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

const FILE = /^([0-9a-f]{64})\.tar\.zst$/;
/** In a folder several replicas share, a file without a row may be another replica's upload in progress: removed only once this old. */
const SHARED_STRAY_MS = 3_600_000;

type Local = { reading: Map<string, number>; receiving: Set<string> };

export class ArtifactStore {
  readonly dir: string;
  /** Downloads this process serves, by sha (never trimmed meanwhile), and the uploads it receives. */
  static local = (): Local => ({ reading: new Map(), receiving: new Set() });

  constructor(
    private readonly db: Sql,
    root: string,
    readonly local: Local,
    private readonly claims: BuildClaims,
  ) {
    this.dir = join(root, "artifacts");
  }

  path(sha: string): string {
    return join(this.dir, `${sha}.tar.zst`);
  }

  private row(r: Record<string, unknown>): ArtifactRow {
    return { sha: String(r.sha), key: String(r.env_key), conditions: JSON.parse(String(r.conditions)) as ArtifactConditions, bytes: Number(r.bytes), builtBy: String(r.built_by), taskId: String(r.task_id), created: Number(r.created), lastUsed: Number(r.last_used) };
  }

  async forKey(key: string): Promise<ArtifactRow[]> {
    const rows = (await this.db.all("SELECT * FROM artifacts WHERE env_key = ? ORDER BY created", key)).map((r) => this.row(r));
    const there: ArtifactRow[] = [];
    for (const a of rows) if (await this.hasFile(a.sha)) there.push(a);
    return there;
  }

  async get(sha: string): Promise<ArtifactRow | null> {
    const r = await this.db.get("SELECT * FROM artifacts WHERE sha = ?", sha);
    return r && (await this.hasFile(String(r.sha))) ? this.row(r) : null;
  }

  async list(): Promise<ArtifactRow[]> {
    return (await this.db.all("SELECT * FROM artifacts ORDER BY last_used")).map((r) => this.row(r));
  }

  /**
   * What a joining worker prefetches (worker.prefetch_envs): the artifacts it may unpack (its conditions, each at
   * `envs/<key>`), most used first. Used: the jobs created since `since` whose env was that key (jobs.env_key, from
   * their task.prepare.finished), a job of tasks counting each task; a tie (an env prepared but not yet run) goes to
   * the most recently fetched.
   */
  async popular(want: Omit<ArtifactConditions, "env_path"> & { envs: string }, limit: number, since: number): Promise<(ArtifactRow & { uses: number })[]> {
    const uses = new Map((await this.db.all("SELECT env_key, COUNT(*) AS n FROM jobs WHERE env_key IS NOT NULL AND created >= ? GROUP BY env_key", since)).map((r) => [String(r.env_key), Number(r.n)]));
    const envs = want.envs.replace(/\/+$/, "");
    const fits = (await this.list()).filter((a) => a.conditions.env_path === `${envs}/${a.key}` && a.conditions.platform === want.platform && a.conditions.interpreter === want.interpreter && a.conditions.python === want.python && a.conditions.base === want.base);
    const ranked = fits.map((a) => ({ ...a, uses: uses.get(a.key) ?? 0 })).sort((x, y) => y.uses - x.uses || y.lastUsed - x.lastUsed);
    const there: (ArtifactRow & { uses: number })[] = [];
    for (const a of ranked) {
      if (there.length >= limit) break;
      if (await this.hasFile(a.sha)) there.push(a);
    }
    return there;
  }

  /** A row whose file went missing is dropped: the key is built again. */
  private async hasFile(sha: string): Promise<boolean> {
    try {
      statSync(this.path(sha));
      return true;
    } catch {
      await this.db.run("DELETE FROM artifacts WHERE sha = ?", sha);
      return false;
    }
  }

  /** The artifact already there for this key and path, if any: an upload for the same never replaces it. */
  async existing(key: string, envPath: string): Promise<ArtifactRow | null> {
    return (await this.forKey(key)).find((a) => a.conditions.env_path === envPath) ?? null;
  }

  receiving(): { path: string; keep(row: Omit<ArtifactRow, "created" | "lastUsed">): Promise<void>; drop(): void } {
    const name = `upload.${process.pid}.${crypto.randomUUID()}.tmp`;
    const path = join(this.dir, name);
    this.local.receiving.add(name);
    let kept = false;
    return {
      path,
      keep: async (row) => {
        renameSync(path, this.path(row.sha));
        const now = Date.now();
        await this.db.run(
          "INSERT INTO artifacts (sha, env_key, env_path, conditions, bytes, built_by, task_id, created, last_used) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)",
          row.sha, row.key, row.conditions.env_path, JSON.stringify(row.conditions), row.bytes, row.builtBy, row.taskId, now, now,
        );
        kept = true;
      },
      drop: () => {
        this.local.receiving.delete(name);
        if (!kept) rmSync(path, { force: true });
      },
    };
  }

  /** A download starts: its file is not trimmed until `done`. */
  async read(sha: string): Promise<() => void> {
    const reading = this.local.reading;
    reading.set(sha, (reading.get(sha) ?? 0) + 1);
    await this.db.run("UPDATE artifacts SET last_used = ? WHERE sha = ?", Date.now(), sha);
    let ended = false;
    return () => {
      if (ended) return;
      ended = true;
      const n = (reading.get(sha) ?? 1) - 1;
      if (n > 0) reading.set(sha, n);
      else reading.delete(sha);
    };
  }

  /** Least recently used first, down to `maxBytes`; an artifact being downloaded stays. `dryRun`: only say. `shared`: other replicas use the folder. */
  async trim(maxBytes: number, dryRun = false, shared = false): Promise<ArtifactTrim> {
    const rows = await this.list();
    const entries = rows.map((a) => ({ id: a.sha, state: "ready" as const, lastUsedMs: a.lastUsed, createdMs: a.created }));
    const bySha = new Map(rows.map((a) => [a.sha, a]));
    let total = rows.reduce((n, a) => n + a.bytes, 0);
    const result: ArtifactTrim = { removed: [], skipped: [], kept_bytes: 0, kept: 0, max_bytes: maxBytes };
    for (const e of lruOrder(entries)) {
      if (total <= maxBytes) break;
      const a = bySha.get(e.id)!;
      if (this.local.reading.has(a.sha)) {
        result.skipped.push({ sha: a.sha, reason: "a worker is downloading it" });
        continue;
      }
      if (!dryRun) {
        await this.db.run("DELETE FROM artifacts WHERE sha = ?", a.sha);
        rmSync(this.path(a.sha), { force: true });
      }
      total -= a.bytes;
      result.removed.push({ sha: a.sha, key: a.key, bytes: a.bytes, built_by: a.builtBy });
    }
    result.kept_bytes = total;
    result.kept = rows.length - result.removed.length;
    if (!dryRun) await this.removeStrays(shared);
    return result;
  }

  /** Files without a row, or uploads a crash interrupted. */
  private async removeStrays(shared: boolean): Promise<void> {
    const rows = new Set((await this.list()).map((a) => a.sha));
    const now = Date.now();
    for (const name of readdirSync(this.dir)) {
      const m = FILE.exec(name);
      if ((m && rows.has(m[1]!)) || this.local.receiving.has(name)) continue;
      if (shared && now - (statSync(join(this.dir, name), { throwIfNoEntry: false })?.mtimeMs ?? 0) < SHARED_STRAY_MS) continue;
      rmSync(join(this.dir, name), { recursive: true, force: true });
    }
  }

  async totals(): Promise<{ count: number; bytes: number }> {
    const rows = await this.list();
    return { count: rows.length, bytes: rows.reduce((n, a) => n + a.bytes, 0) };
  }

  /** Claim the build of `key` at `envPath` for a worker's task (server/build-claims.ts). */
  claim(key: string, envPath: string, worker: { id: string; name: string }, taskId: string, ttlMs: number, now = Date.now()): Promise<Granted> {
    return this.claims.claim(`${key}:${envPath}`, worker, taskId, ttlMs, now);
  }

  /** The live claim on `key` at `envPath`, if any: who holds it, for which task. */
  claimOf(key: string, envPath: string, now = Date.now()): Promise<{ worker: string; workerId: string; taskId: string } | null> {
    return this.claims.of(`${key}:${envPath}`, now);
  }

  /** Remove an artifact found unsound (artifactFault): the next worker that needs its key builds it and its artifact is taken. */
  async drop(sha: string): Promise<void> {
    await this.db.run("DELETE FROM artifacts WHERE sha = ?", sha);
    rmSync(this.path(sha), { force: true });
  }

  async release(key: string, envPath: string, workerId: string): Promise<void> {
    await this.claims.release(`${key}:${envPath}`, workerId);
  }

  /** Who is building it now, if anyone. */
  async builder(key: string, envPath: string, now = Date.now()): Promise<string | null> {
    return (await this.claimOf(key, envPath, now))?.worker ?? null;
  }
}
