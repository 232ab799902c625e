import type { Sql } from "./db/sql.ts";

/**
 * Build claims (a table: every replica sees them): which worker builds a thing for which of its tasks now, so
 * the others wait for what it uploads instead of building too. Env artifacts claim `KEY:PATH` (server/artifacts.ts),
 * compiled wheels `wheel:SDIST:CONDITIONS` (server/wheels.ts). A claim lives `ttlMs` unless renewed; a worker that
 * leaves or is lost holds none.
 */

/** How long a claim lives unless its holder renews it (workers renew every 20 s while they build and upload). */
export const CLAIM_MS = 60_000;

export type Granted = { granted: true } | { granted: false; holder: string };

export class BuildClaims {
  constructor(private readonly db: Sql) {}

  /** Granted when no other worker's live claim holds `id` (renewed by claiming again); else the holder's name. Under the writer lock, so two replicas never grant one build twice. */
  claim(id: string, worker: { id: string; name: string }, taskId: string, ttlMs: number, now = Date.now()): Promise<Granted> {
    return this.db.exclusive(async (tx) => {
      const held = await tx.get<{ worker: string; worker_id: string; until: number }>("SELECT worker, worker_id, until FROM artifact_claims WHERE id = ?", id);
      if (held && Number(held.until) > now && held.worker_id !== worker.id) return { granted: false as const, holder: held.worker };
      await tx.run(
        "INSERT INTO artifact_claims (id, worker, worker_id, task_id, until) VALUES (?, ?, ?, ?, ?) ON CONFLICT (id) DO UPDATE SET worker = excluded.worker, worker_id = excluded.worker_id, task_id = excluded.task_id, until = excluded.until",
        id, worker.name, worker.id, taskId, now + ttlMs,
      );
      return { granted: true as const };
    });
  }

  /** The live claim on `id`, if any: who holds it, for which task. */
  async of(id: string, now = Date.now()): Promise<{ worker: string; workerId: string; taskId: string } | null> {
    const held = await this.db.get<{ worker: string; worker_id: string; task_id: string | null; until: number }>("SELECT worker, worker_id, task_id, until FROM artifact_claims WHERE id = ?", id);
    return held && Number(held.until) > now ? { worker: held.worker, workerId: held.worker_id, taskId: held.task_id ?? "" } : null;
  }

  async release(id: string, workerId: string): Promise<void> {
    await this.db.run("DELETE FROM artifact_claims WHERE id = ? AND worker_id = ?", id, workerId);
  }

  /** A worker that left or was lost holds no claim. */
  async dropAllOf(workerId: string): Promise<void> {
    await this.db.run("DELETE FROM artifact_claims WHERE worker_id = ?", workerId);
  }
}
