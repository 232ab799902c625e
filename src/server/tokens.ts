import type { Database } from "bun:sqlite";
import { contentHash as sha256 } from "../core/hashing.ts";
import { UsageError } from "../errors.ts";

/**
 * The server's named tokens, beside its own (the admin token, which may do
 * everything): a `user` token submits, reads, cancels and prepares; a `join`
 * token registers a worker and nothing else. Only each token's SHA-256 is
 * kept. `gpulayer server token …` writes this table in the server's home
 * directly, running server or not; the server reads it on every request (an
 * indexed lookup), so a revoked token stops working at once, and its sweep
 * drops the workers that joined with it.
 */

export type TokenRole = "user" | "join";
export const TOKEN_ROLES: TokenRole[] = ["user", "join"];

export interface TokenRow {
  name: string;
  role: TokenRole;
  created: number;
  lastUsed: number | null;
}

export const TOKENS_SCHEMA = "CREATE TABLE IF NOT EXISTS tokens (name TEXT PRIMARY KEY, role TEXT NOT NULL, hash TEXT NOT NULL UNIQUE, created REAL NOT NULL, last_used REAL);";

const NAME = /^[A-Za-z0-9][A-Za-z0-9._-]{0,62}$/;
/** last_used is written at most this often per token: a request is not a write. */
const TOUCH_MS = 60_000;

const toRow = (r: { name: string; role: string; created: number; last_used: number | null }): TokenRow => ({ name: r.name, role: r.role as TokenRole, created: r.created, lastUsed: r.last_used });

export class TokenStore {
  private touched = new Map<string, number>();

  constructor(private readonly db: Database) {
    db.exec(TOKENS_SCHEMA);
  }

  /** A new token: returned once, only its hash kept. */
  create(name: string, role: TokenRole, now = Date.now()): string {
    if (!NAME.test(name)) throw new UsageError(`--name ${JSON.stringify(name)}: a token name is letters, digits, '.', '_' and '-' (at most 63), starting with a letter or digit`);
    if (!TOKEN_ROLES.includes(role)) throw new UsageError(`--role ${role}: one of ${TOKEN_ROLES.join(", ")}`);
    if (this.db.query("SELECT 1 FROM tokens WHERE name = ?").get(name)) throw new UsageError(`a token named ${name} exists already (gpulayer server token revoke ${name} first)`);
    const token = `gpl${role[0]}_${Buffer.from(crypto.getRandomValues(new Uint8Array(24))).toString("base64url")}`;
    this.db.query("INSERT INTO tokens (name, role, hash, created, last_used) VALUES (?, ?, ?, ?, NULL)").run(name, role, sha256(token), now);
    return token;
  }

  list(): TokenRow[] {
    return this.db.query<{ name: string; role: string; created: number; last_used: number | null }, []>("SELECT name, role, created, last_used FROM tokens ORDER BY name").all().map(toRow);
  }

  /** False when there was no such token. */
  revoke(name: string): boolean {
    return this.db.query("DELETE FROM tokens WHERE name = ?").run(name).changes > 0;
  }

  /** The token a secret is, by its hash; its last use noted (at most once a minute). */
  authenticate(secret: string, now = Date.now()): TokenRow | null {
    const hash = sha256(secret);
    const r = this.db.query<{ name: string; role: string; created: number; last_used: number | null }, [string]>("SELECT name, role, created, last_used FROM tokens WHERE hash = ?").get(hash);
    if (!r) return null;
    if (now - (this.touched.get(r.name) ?? 0) >= TOUCH_MS) {
      this.touched.set(r.name, now);
      this.db.query("UPDATE tokens SET last_used = ? WHERE name = ?").run(now, r.name);
    }
    return toRow(r);
  }

  /** Whether a token of this hash is still there (not revoked): what a dashboard session is checked against. */
  hasHash(hash: string): boolean {
    return Boolean(this.db.query("SELECT 1 FROM tokens WHERE hash = ?").get(hash));
  }

  has(name: string): boolean {
    return Boolean(this.db.query("SELECT 1 FROM tokens WHERE name = ?").get(name));
  }
}
