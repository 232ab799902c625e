import { contentHash as sha256 } from "../../core/hashing.ts";
import type { Sql } from "../db/sql.ts";

/**
 * Dashboard sessions: a token typed once on the sign-in page becomes a
 * random session id in a cookie (HttpOnly, SameSite=Strict, Secure over
 * https); the token itself never goes in a URL or a cookie. Sessions are
 * rows of the server's database, by the id's SHA-256 (whoever reads the
 * database cannot sign in with what is there), so every replica knows them:
 * a load balancer needs no stickiness.
 */

export const COOKIE = "gpulayer_session";
/** How long a session lasts without a new sign-in. */
export const SESSION_MS = 12 * 3600_000;

/** A signed-in user: who, and the token's proof (its hash), checked again on every request: a revoked token ends its sessions. */
export interface SignedIn {
  who: string;
  proof: string;
}

export class Sessions {
  constructor(
    private readonly sql: Sql,
    private readonly now: () => number = Date.now,
  ) {}

  async create(user: SignedIn): Promise<string> {
    const id = Buffer.from(crypto.getRandomValues(new Uint8Array(32))).toString("hex");
    // Expired ones go as new ones come: the table holds the live sessions only.
    await this.sql.run("DELETE FROM sessions WHERE expires <= ?", this.now());
    await this.sql.run("INSERT INTO sessions (id, who, proof, expires) VALUES (?, ?, ?, ?)", sha256(id), user.who, user.proof, this.now() + SESSION_MS);
    return id;
  }

  /** Who the session is, or null when there is none, it expired, or its token is no longer good (`valid`). */
  async who(id: string | null, valid: (proof: string) => Promise<boolean>): Promise<string | null> {
    if (!id) return null;
    const s = await this.sql.get<SignedIn & { expires: number }>("SELECT who, proof, expires FROM sessions WHERE id = ?", sha256(id));
    if (!s) return null;
    if (Number(s.expires) <= this.now() || !(await valid(s.proof))) {
      await this.drop(id);
      return null;
    }
    return s.who;
  }

  async drop(id: string | null): Promise<void> {
    if (id) await this.sql.run("DELETE FROM sessions WHERE id = ?", sha256(id));
  }
}

export function sessionId(req: Request): string | null {
  for (const part of (req.headers.get("cookie") ?? "").split(";")) {
    const [name, ...value] = part.trim().split("=");
    if (name === COOKIE && /^[0-9a-f]{64}$/.test(value.join("="))) return value.join("=");
  }
  return null;
}

/** Served over https (directly, or behind a proxy that says so): the cookie is then Secure. */
export function overHttps(req: Request): boolean {
  return new URL(req.url).protocol === "https:" || req.headers.get("x-forwarded-proto") === "https";
}

export function sessionCookie(id: string, req: Request): string {
  return `${COOKIE}=${id}; Path=/; HttpOnly; SameSite=Strict; Max-Age=${SESSION_MS / 1000}${overHttps(req) ? "; Secure" : ""}`;
}

export function clearedCookie(req: Request): string {
  return `${COOKIE}=; Path=/; HttpOnly; SameSite=Strict; Max-Age=0${overHttps(req) ? "; Secure" : ""}`;
}

/**
 * A form post from this server's own pages: a browser says where a post
 * comes from (Origin, or Sec-Fetch-Site); one from another site is refused,
 * whatever cookie it carries. A client that says neither is not a browser.
 */
export function sameOrigin(req: Request): boolean {
  const origin = req.headers.get("origin");
  if (origin) {
    const url = new URL(req.url);
    const host = req.headers.get("host") ?? url.host;
    return origin === `${url.protocol}//${host}` || origin === `https://${host}`;
  }
  const site = req.headers.get("sec-fetch-site");
  return !site || site === "same-origin" || site === "none";
}
