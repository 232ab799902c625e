import type { Sql } from "./db/sql.ts";
import { rmSync, statSync } from "node:fs";
import { join } from "node:path";
import { lruOrder } from "../gc/policy.ts";
import type { BuildClaims, Granted } from "./build-claims.ts";

/**
 * Wheels workers compiled without build isolation (env/build/wheelhouse.ts), by sha256: the bytes in the
 * server's home beside the env artifacts, a row each (the sdist's digest, the conditions hash of the
 * interpreter and build variables, what the build imported, who compiled it). One per sdist, conditions and
 * inputs (a duplicate compile on two workers is answered 409); kept under the artifacts' size limit, least
 * recently used first, as env artifacts are (server/artifacts.ts). A build claim on an sdist under one set of
 * conditions (build-claims.ts) says which worker compiles it now: the others wait for its wheel.
 */

export interface WheelRow {
  sha: string;
  sdist: string;
  conditions: string;
  inputsHash: string;
  name: string;
  wheel: string;
  /** `{ seconds, inputs }` as the worker sent them (JSON). */
  entry: string;
  bytes: number;
  builtBy: string;
  created: number;
  lastUsed: number;
}

export class WheelStore {
  readonly dir: string;

  constructor(
    private readonly db: Sql,
    root: string,
    private readonly claims: BuildClaims,
  ) {
    this.dir = join(root, "wheels");
  }

  path(sha: string): string {
    return join(this.dir, `${sha}.whl`);
  }

  private row(r: Record<string, unknown>): WheelRow {
    return { sha: String(r.sha), sdist: String(r.sdist), conditions: String(r.conditions), inputsHash: String(r.inputs_hash), name: String(r.name), wheel: String(r.wheel), entry: String(r.entry), bytes: Number(r.bytes), builtBy: String(r.built_by), created: Number(r.created), lastUsed: Number(r.last_used) };
  }

  /** The wheels of one sdist under one set of conditions, newest first; a row whose file went missing is dropped. */
  async forSdist(sdist: string, conditions: string): Promise<WheelRow[]> {
    return this.present(await this.db.all("SELECT * FROM wheels WHERE sdist = ? AND conditions = ? ORDER BY created DESC", sdist, conditions));
  }

  /** The wheels of one project under one set of conditions, any sdist, newest first (for an offline worker, which fetches no sdist). */
  async forName(name: string, conditions: string): Promise<WheelRow[]> {
    return this.present(await this.db.all("SELECT * FROM wheels WHERE name = ? AND conditions = ? ORDER BY created DESC", name, conditions));
  }

  private async present(found: Record<string, unknown>[]): Promise<WheelRow[]> {
    const rows = found.map((r) => this.row(r));
    const there: WheelRow[] = [];
    for (const w of rows) if (this.hasFile(w.sha)) there.push(w);
      else await this.drop(w.sha);
    return there;
  }

  async get(sha: string): Promise<WheelRow | null> {
    const r = await this.db.get("SELECT * FROM wheels WHERE sha = ?", sha);
    return r && this.hasFile(String(r.sha)) ? this.row(r) : null;
  }

  async existing(sdist: string, conditions: string, inputsHash: string): Promise<WheelRow | null> {
    const r = await this.db.get("SELECT * FROM wheels WHERE sdist = ? AND conditions = ? AND inputs_hash = ?", sdist, conditions, inputsHash);
    return r && this.hasFile(String(r.sha)) ? this.row(r) : null;
  }

  private hasFile(sha: string): boolean {
    return statSync(this.path(sha), { throwIfNoEntry: false }) !== undefined;
  }

  async add(row: Omit<WheelRow, "created" | "lastUsed">): Promise<void> {
    const now = Date.now();
    await this.db.run(
      "INSERT INTO wheels (sha, sdist, conditions, inputs_hash, name, wheel, entry, bytes, built_by, created, last_used) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
      row.sha, row.sdist, row.conditions, row.inputsHash, row.name, row.wheel, row.entry, row.bytes, row.builtBy, now, now,
    );
  }

  async touch(sha: string): Promise<void> {
    await this.db.run("UPDATE wheels SET last_used = ? WHERE sha = ?", Date.now(), sha);
  }

  async drop(sha: string): Promise<void> {
    await this.db.run("DELETE FROM wheels WHERE sha = ?", sha);
    rmSync(this.path(sha), { force: true });
  }

  async totals(): Promise<{ count: number; bytes: number }> {
    const r = await this.db.get<{ n: number; b: number | null }>("SELECT COUNT(*) AS n, SUM(bytes) AS b FROM wheels");
    return { count: Number(r?.n ?? 0), bytes: Number(r?.b ?? 0) };
  }

  /** Least recently used first, down to `maxBytes`. */
  async trim(maxBytes: number): Promise<number> {
    const rows = (await this.db.all("SELECT * FROM wheels")).map((r) => this.row(r));
    let total = rows.reduce((n, w) => n + w.bytes, 0);
    let removed = 0;
    const bySha = new Map(rows.map((w) => [w.sha, w]));
    for (const e of lruOrder(rows.map((w) => ({ id: w.sha, state: "ready" as const, lastUsedMs: w.lastUsed, createdMs: w.created })))) {
      if (total <= maxBytes) break;
      await this.drop(e.id);
      total -= bySha.get(e.id)!.bytes;
      removed++;
    }
    return removed;
  }

  /** Claim the compile of `sdist` under `conditions` for a worker's task (build-claims.ts). */
  claim(sdist: string, conditions: string, worker: { id: string; name: string }, taskId: string, ttlMs: number): Promise<Granted> {
    return this.claims.claim(claimId(sdist, conditions), worker, taskId, ttlMs);
  }

  claimOf(sdist: string, conditions: string): Promise<{ worker: string; workerId: string; taskId: string } | null> {
    return this.claims.of(claimId(sdist, conditions));
  }

  release(sdist: string, conditions: string, workerId: string): Promise<void> {
    return this.claims.release(claimId(sdist, conditions), workerId);
  }
}

/** Beside env artifacts' `KEY:PATH` claims in one table, never one of theirs. */
const claimId = (sdist: string, conditions: string) => `wheel:${sdist}:${conditions}`;
