import type { Sql } from "./db/sql.ts";
import { readdirSync, renameSync, rmSync, statSync } from "node:fs";
import { join } from "node:path";
import { FINAL_STATES } from "../jobs/model.ts";

/** The ended states as an SQL list, from the one list of them: a bundle of an ended job is no longer referenced. */
const ENDED = `(${FINAL_STATES.map((s) => `'${s}'`).join(", ")})`;

/**
 * The uploaded bundles: their bytes in the server's home, named by hash, and
 * a row each in the bundles table (size, first upload, last use). A bundle
 * is "there" only when both are; cleanup removes the row first, so a client
 * asking for a job after that is told to upload it again.
 */

export interface BundleRow {
  hash: string;
  bytes: number;
  created: number;
  lastUsed: number;
}

export interface BundlePolicy {
  /** Unreferenced bundles not used for longer than this are removed (0: all unreferenced ones). */
  retentionMs: number;
  /** Above this total, unreferenced bundles go least recently used first. */
  maxBytes: number;
}

export interface BundleSweep {
  removed: { hash: string; bytes: number; why: "expired" | "over size" }[];
  /** Stray files (interrupted uploads, files without a row) removed. */
  strays: number;
  keptBytes: number;
}

const FILE = /^([0-9a-f]{64})\.tar\.gz$/;

/** An upload on its way in: its temporary file, kept as the bundle once checked, removed otherwise. */
export interface Receiving {
  path: string;
  keep(bytes: number): Promise<void>;
  drop(): void;
}

/**
 * With several replicas, the folder is shared: a file another replica is
 * receiving or keeping now is neither in this process's in-flight set nor,
 * yet, in the table; strays are then removed only once this old.
 */
const SHARED_STRAY_MS = 3_600_000;

export class BundleStore {
  readonly dir: string;
  /** Temporary files of uploads being received or checked now, in this process: the sweep leaves them alone. */
  static local = () => ({ inFlight: new Set<string>() });
  private readonly inFlight: Set<string>;

  constructor(
    private readonly db: Sql,
    root: string,
    readonly local: { inFlight: Set<string> },
  ) {
    this.dir = join(root, "bundles");
    this.inFlight = local.inFlight;
  }

  path(hash: string): string {
    return join(this.dir, `${hash}.tar.gz`);
  }

  /** Its row and its file; a row whose file went missing is dropped (so the client uploads it again). */
  async has(hash: string): Promise<boolean> {
    if (!(await this.db.get("SELECT hash FROM bundles WHERE hash = ?", hash))) return false;
    try {
      statSync(this.path(hash));
      return true;
    } catch {
      await this.db.run("DELETE FROM bundles WHERE hash = ?", hash);
      return false;
    }
  }

  receiving(hash: string): Receiving {
    const name = `${hash}.tar.gz.${process.pid}.${crypto.randomUUID()}.tmp`;
    const path = join(this.dir, name);
    this.inFlight.add(name);
    let kept = false;
    return {
      path,
      keep: async (bytes) => {
        renameSync(path, this.path(hash));
        await this.add(hash, bytes);
        kept = true;
      },
      drop: () => {
        this.inFlight.delete(name);
        if (!kept) rmSync(path, { force: true });
      },
    };
  }

  async add(hash: string, bytes: number): Promise<void> {
    const now = Date.now();
    await this.db.run("INSERT INTO bundles (hash, bytes, created, last_used) VALUES (?, ?, ?, ?) ON CONFLICT (hash) DO UPDATE SET bytes = excluded.bytes, last_used = excluded.last_used", hash, bytes, now, now);
  }

  async touch(hash: string): Promise<void> {
    await this.db.run("UPDATE bundles SET last_used = ? WHERE hash = ?", Date.now(), hash);
  }

  async list(): Promise<BundleRow[]> {
    const rows = await this.db.all<{ hash: string; bytes: number; created: number; last_used: number }>("SELECT hash, bytes, created, last_used FROM bundles ORDER BY last_used, hash");
    return rows.map((r) => ({ hash: r.hash, bytes: Number(r.bytes), created: Number(r.created), lastUsed: Number(r.last_used) }));
  }

  /** Bundles a job that has not ended, or a task held by a worker, still needs; and the outputs of the tasks of a job that has not ended. */
  async referenced(): Promise<Set<string>> {
    const rows = await this.db.all<{ bundle: string }>(
      `SELECT bundle FROM jobs WHERE bundle IS NOT NULL AND state NOT IN ${ENDED}
       UNION SELECT bundle FROM tasks WHERE bundle IS NOT NULL AND state IN ('assigned', 'running')
       UNION SELECT c.outputs_bundle AS bundle FROM jobs c JOIN jobs p ON p.id = c.parent_id WHERE c.outputs_bundle IS NOT NULL AND p.state NOT IN ${ENDED}`,
    );
    return new Set(rows.map((r) => r.bundle));
  }

  private async remove(hash: string): Promise<void> {
    await this.db.run("DELETE FROM bundles WHERE hash = ?", hash);
    rmSync(this.path(hash), { force: true });
  }

  /**
   * Remove what no live job needs: first every bundle unused for longer than
   * the retention, then, while the total is over the cap, the least recently
   * used of the rest. Run under the writer lock (store.exclusive), so no
   * submission runs in between. `shared`: other replicas use the folder too.
   */
  async sweep(policy: BundlePolicy, now = Date.now(), shared = false): Promise<BundleSweep> {
    const inUse = await this.referenced();
    const result: BundleSweep = { removed: [], strays: 0, keptBytes: 0 };
    const kept: BundleRow[] = [];
    for (const b of await this.list()) {
      if (!inUse.has(b.hash) && now - b.lastUsed >= policy.retentionMs) {
        await this.remove(b.hash);
        result.removed.push({ hash: b.hash, bytes: b.bytes, why: "expired" });
      } else kept.push(b);
    }
    let total = kept.reduce((n, b) => n + b.bytes, 0);
    // kept is least recently used first.
    for (const b of kept) {
      if (total <= policy.maxBytes) break;
      if (inUse.has(b.hash)) continue;
      await this.remove(b.hash);
      total -= b.bytes;
      result.removed.push({ hash: b.hash, bytes: b.bytes, why: "over size" });
    }
    result.keptBytes = total;
    // Besides uploads in flight, any temp file or rowless bundle here is left from a crash.
    const rows = new Set((await this.list()).map((b) => b.hash));
    for (const name of readdirSync(this.dir)) {
      const m = FILE.exec(name);
      if ((m && rows.has(m[1]!)) || this.inFlight.has(name)) continue;
      if (shared && now - (statSync(join(this.dir, name), { throwIfNoEntry: false })?.mtimeMs ?? 0) < SHARED_STRAY_MS) continue;
      rmSync(join(this.dir, name), { recursive: true, force: true });
      result.strays++;
    }
    return result;
  }
}
