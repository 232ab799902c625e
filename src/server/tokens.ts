import type { Sql } from "./db/sql.ts";
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

const NAME = /^[A-Za-z0-9][A-Za-z0-9._-]{0,62}$/;
/** last_used is written at most this often per token: a request is not a write. */
const TOUCH_MS = 60_000;

type Stored = { name: string; role: string; created: number; last_used: number | null };
const toRow = (r: Stored): TokenRow => ({ name: r.name, role: r.role as TokenRole, created: Number(r.created), lastUsed: r.last_used === null ? null : Number(r.last_used) });

export class TokenStore {
  /** When this process last wrote each token's last use. */
  static local = () => ({ touched: new Map<string, number>() });
  private readonly touched: Map<string, number>;

  constructor(
    private readonly db: Sql,
    readonly local: { touched: Map<string, number> },
  ) {
    this.touched = local.touched;
  }

  /** A new token: returned once, only its hash kept. */
  async create(name: string, role: TokenRole, now = Date.now()): Promise<string> {
    if (!NAME.test(name)) throw new UsageError(`--name ${JSON.stringify(name)}: a token name is letters, digits, '.', '_' and '-' (at most 63), starting with a letter or digit`);
    if (!TOKEN_ROLES.includes(role)) throw new UsageError(`--role ${role}: one of ${TOKEN_ROLES.join(", ")}`);
    if (await this.db.get("SELECT 1 AS yes FROM tokens WHERE name = ?", name)) throw new UsageError(`a token named ${name} exists already (gpulayer server token revoke ${name} first)`);
    const token = `gpl${role[0]}_${Buffer.from(crypto.getRandomValues(new Uint8Array(24))).toString("base64url")}`;
    await this.db.run("INSERT INTO tokens (name, role, hash, created, last_used) VALUES (?, ?, ?, ?, NULL)", name, role, sha256(token), now);
    return token;
  }

  async list(): Promise<TokenRow[]> {
    return (await this.db.all<Stored>("SELECT name, role, created, last_used FROM tokens ORDER BY name")).map(toRow);
  }

  /** False when there was no such token. */
  async revoke(name: string): Promise<boolean> {
    return (await this.db.run("DELETE FROM tokens WHERE name = ?", name)) > 0;
  }

  /** The token a secret is, by its hash; its last use noted (at most once a minute). */
  async authenticate(secret: string, now = Date.now()): Promise<TokenRow | null> {
    const hash = sha256(secret);
    const r = await this.db.get<Stored>("SELECT name, role, created, last_used FROM tokens WHERE hash = ?", hash);
    if (!r) return null;
    if (now - (this.touched.get(r.name) ?? 0) >= TOUCH_MS) {
      this.touched.set(r.name, now);
      await this.db.run("UPDATE tokens SET last_used = ? WHERE name = ?", now, r.name);
    }
    return toRow(r);
  }

  /** Whether a token of this hash is still there (not revoked): what a dashboard session is checked against. */
  async hasHash(hash: string): Promise<boolean> {
    return Boolean(await this.db.get("SELECT 1 AS yes FROM tokens WHERE hash = ?", hash));
  }
}
