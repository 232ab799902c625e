import { createCipheriv, createDecipheriv, hkdfSync, randomBytes } from "node:crypto";
import { holdsCredentials, lostCredentials } from "../env/index-light.ts";
import type { Sql } from "./db/sql.ts";

/**
 * What a request held that the server's database may not keep in the clear:
 * the request as sent, credentials included, by job or prepare id, until it
 * ends. The jobs table keeps the redacted copy.
 *
 * One server on SQLite keeps the originals in its memory only: after a
 * restart a stored request that had credentials cannot be built any more,
 * and says so rather than going to the index without them. Replicas on
 * PostgreSQL must hand a worker a request another replica took, so there the
 * original is sealed (AES-256-GCM, under a key derived from the server's
 * token, which every replica holds and the database never sees) into
 * held_secrets, and deleted when what needs it ends.
 */

export class SecretSeal {
  private readonly key: Buffer;
  constructor(serverToken: string) {
    this.key = Buffer.from(hkdfSync("sha256", serverToken, "gpulayer", "held request credentials v1", 32));
  }
  seal(value: unknown): string {
    const iv = randomBytes(12);
    const cipher = createCipheriv("aes-256-gcm", this.key, iv);
    const body = Buffer.concat([cipher.update(JSON.stringify(value), "utf8"), cipher.final()]);
    return Buffer.concat([iv, cipher.getAuthTag(), body]).toString("base64");
  }
  /** Null when it was sealed under another token (the server's token changed): as lost as after a restart. */
  open<T>(sealed: string): T | null {
    try {
      const raw = Buffer.from(sealed, "base64");
      const decipher = createDecipheriv("aes-256-gcm", this.key, raw.subarray(0, 12));
      decipher.setAuthTag(raw.subarray(12, 28));
      return JSON.parse(Buffer.concat([decipher.update(raw.subarray(28)), decipher.final()]).toString("utf8")) as T;
    } catch {
      return null;
    }
  }
}

export class HeldSecrets<T> {
  private held = new Map<string, T>();

  /** `seal`: kept sealed in the database (replicas) rather than in memory; `kind` keeps job and prepare ids apart there. */
  constructor(
    private readonly kind: "job" | "prepare",
    private readonly sealer: SecretSeal | null,
  ) {}

  /** Keep the original only when the stored copy lost something. */
  async hold(sql: Sql, id: string, original: T): Promise<void> {
    if (!holdsCredentials(original)) return;
    if (!this.sealer) this.held.set(id, original);
    else await sql.run("INSERT INTO held_secrets (id, sealed, created) VALUES (?, ?, ?)", `${this.kind}:${id}`, this.sealer.seal(original), Date.now());
  }

  /** The request to hand a worker, or null when its credentials were lost with a restart. */
  async resolve(sql: Sql, id: string, stored: T): Promise<T | null> {
    if (!lostCredentials(stored)) return this.held.get(id) ?? stored;
    if (!this.sealer) return this.held.get(id) ?? null;
    const row = await sql.get<{ sealed: string }>("SELECT sealed FROM held_secrets WHERE id = ?", `${this.kind}:${id}`);
    return row ? this.sealer.open<T>(row.sealed) : null;
  }

  /** Drop what no longer runs. */
  async keepOnly(sql: Sql, alive: (id: string) => Promise<boolean>): Promise<void> {
    for (const id of [...this.held.keys()]) if (!(await alive(id))) this.held.delete(id);
    if (!this.sealer) return;
    const prefix = `${this.kind}:`;
    for (const r of await sql.all<{ id: string }>("SELECT id FROM held_secrets WHERE id LIKE ?", `${prefix}%`)) {
      if (!(await alive(r.id.slice(prefix.length)))) await sql.run("DELETE FROM held_secrets WHERE id = ?", r.id);
    }
  }
}

export const CREDENTIALS_LOST = "the index credentials it was submitted with were kept in the server's memory only, and the server has restarted since: submit it again";
