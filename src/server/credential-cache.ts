import type { WorkerRow } from "./worker-rows.ts";

/**
 * Workers' credentials as their requests present them (by hash), kept for a
 * few seconds: most of a busy fleet's requests are its workers' beats, polls
 * and reports, and each was a database lookup of its own.
 *
 * A worker's entries go as soon as anything happens to the worker, here or
 * at another replica: its `worker:ID` wake-up (joining again, which replaces
 * its credential; leaving; being declared lost or dropped with its join
 * token). A wake-up lost with a replica's listening connection is made up
 * for by `ttlMs`: a dead credential works nowhere for longer than that.
 * What a request changes is still checked under the rows' locks where it
 * matters (a poll's credential, a task's owner); a worker's leaving is never
 * answered from here (routes.ts).
 */
export class CredentialCache {
  private readonly byHash = new Map<string, { worker: WorkerRow; until: number }>();
  private readonly hashesOf = new Map<string, Set<string>>();
  /** When each worker was last forgotten, by this cache's own count: a lookup begun before must not put back what it read. */
  private readonly forgotten = new Map<string, number>();
  private count = 0;
  /** Lookups begun before this count put nothing back (the map above was emptied since). */
  private floor = 0;

  constructor(
    private readonly ttlMs: number,
    private readonly now: () => number = Date.now,
    private readonly most = 50_000,
  ) {}

  /** The worker a credential (its hash) authenticated a moment ago, still good. */
  get(secretHash: string): WorkerRow | null {
    const hit = this.byHash.get(secretHash);
    if (!hit) return null;
    if (hit.until > this.now()) return hit.worker;
    this.drop(secretHash);
    return null;
  }

  /** Where a lookup begins: what `put` compares against. */
  mark(): number {
    return this.count;
  }

  /** What a lookup begun at `mark` found; dropped if the worker was forgotten since. */
  put(secretHash: string, worker: WorkerRow, mark: number): void {
    if (mark < this.floor || (this.forgotten.get(worker.id) ?? -1) > mark) return;
    // A bound, not a policy: past it, the oldest entries would rarely be asked for again.
    if (this.byHash.size >= this.most) this.clear();
    this.byHash.set(secretHash, { worker, until: this.now() + this.ttlMs });
    const hashes = this.hashesOf.get(worker.id) ?? new Set();
    hashes.add(secretHash);
    this.hashesOf.set(worker.id, hashes);
  }

  /** A wake-up's key: a worker's (`worker:ID`) forgets that worker's credentials. */
  heard(key: string): void {
    if (!key.startsWith("worker:")) return;
    const id = key.slice("worker:".length);
    this.count++;
    if (this.forgotten.size >= this.most) {
      this.forgotten.clear();
      this.floor = this.count;
    }
    this.forgotten.set(id, this.count);
    for (const hash of this.hashesOf.get(id) ?? []) this.byHash.delete(hash);
    this.hashesOf.delete(id);
  }

  private drop(secretHash: string): void {
    const hit = this.byHash.get(secretHash);
    this.byHash.delete(secretHash);
    if (!hit) return;
    const hashes = this.hashesOf.get(hit.worker.id);
    hashes?.delete(secretHash);
    if (hashes && !hashes.size) this.hashesOf.delete(hit.worker.id);
  }

  private clear(): void {
    this.byHash.clear();
    this.hashesOf.clear();
  }
}
