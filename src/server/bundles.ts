import type { Database } from "bun:sqlite";
import { mkdirSync, readdirSync, renameSync, rmSync, statSync } from "node:fs";
import { join } from "node:path";

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
  keep(bytes: number): void;
  drop(): void;
}

export class BundleStore {
  readonly dir: string;
  /** Temporary files of uploads being received or checked now: the sweep leaves them alone. */
  private inFlight = new Set<string>();

  constructor(
    private readonly db: Database,
    root: string,
  ) {
    this.dir = join(root, "bundles");
    mkdirSync(this.dir, { recursive: true });
  }

  path(hash: string): string {
    return join(this.dir, `${hash}.tar.gz`);
  }

  /** Its row and its file; a row whose file went missing is dropped (so the client uploads it again). */
  has(hash: string): boolean {
    if (!this.db.query("SELECT hash FROM bundles WHERE hash = ?").get(hash)) return false;
    try {
      statSync(this.path(hash));
      return true;
    } catch {
      this.db.query("DELETE FROM bundles WHERE hash = ?").run(hash);
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
      keep: (bytes) => {
        renameSync(path, this.path(hash));
        this.add(hash, bytes);
        kept = true;
      },
      drop: () => {
        this.inFlight.delete(name);
        if (!kept) rmSync(path, { force: true });
      },
    };
  }

  add(hash: string, bytes: number): void {
    const now = Date.now();
    this.db.query("INSERT OR REPLACE INTO bundles (hash, bytes, created, last_used) VALUES (?, ?, ?, ?)").run(hash, bytes, now, now);
  }

  touch(hash: string): void {
    this.db.query("UPDATE bundles SET last_used = ? WHERE hash = ?").run(Date.now(), hash);
  }

  list(): BundleRow[] {
    return this.db
      .query<{ hash: string; bytes: number; created: number; last_used: number }, []>("SELECT hash, bytes, created, last_used FROM bundles ORDER BY last_used, hash")
      .all()
      .map((r) => ({ hash: r.hash, bytes: r.bytes, created: r.created, lastUsed: r.last_used }));
  }

  /** Bundles a job that has not ended, or a task held by a worker, still needs. */
  referenced(): Set<string> {
    const rows = this.db
      .query<{ bundle: string }, []>(
        `SELECT bundle FROM jobs WHERE bundle IS NOT NULL AND state NOT IN ('succeeded', 'failed', 'cancelled', 'skipped')
         UNION SELECT bundle FROM tasks WHERE bundle IS NOT NULL AND state IN ('assigned', 'running')`,
      )
      .all();
    return new Set(rows.map((r) => r.bundle));
  }

  private remove(hash: string): void {
    this.db.query("DELETE FROM bundles WHERE hash = ?").run(hash);
    rmSync(this.path(hash), { force: true });
  }

  /**
   * Remove what no live job needs: first every bundle unused for longer than
   * the retention, then, while the total is over the cap, the least recently
   * used of the rest. Synchronous, like every other write to the store, so no
   * submission or upload runs in between.
   */
  sweep(policy: BundlePolicy, now = Date.now()): BundleSweep {
    const inUse = this.referenced();
    const result: BundleSweep = { removed: [], strays: 0, keptBytes: 0 };
    const kept: BundleRow[] = [];
    for (const b of this.list()) {
      if (!inUse.has(b.hash) && now - b.lastUsed >= policy.retentionMs) {
        this.remove(b.hash);
        result.removed.push({ hash: b.hash, bytes: b.bytes, why: "expired" });
      } else kept.push(b);
    }
    let total = kept.reduce((n, b) => n + b.bytes, 0);
    // kept is least recently used first.
    for (const b of kept) {
      if (total <= policy.maxBytes) break;
      if (inUse.has(b.hash)) continue;
      this.remove(b.hash);
      total -= b.bytes;
      result.removed.push({ hash: b.hash, bytes: b.bytes, why: "over size" });
    }
    result.keptBytes = total;
    // Besides uploads in flight, any temp file or rowless bundle here is left from a crash.
    const rows = new Set(this.list().map((b) => b.hash));
    for (const name of readdirSync(this.dir)) {
      const m = FILE.exec(name);
      if ((m && rows.has(m[1]!)) || this.inFlight.has(name)) continue;
      rmSync(join(this.dir, name), { recursive: true, force: true });
      result.strays++;
    }
    return result;
  }
}
