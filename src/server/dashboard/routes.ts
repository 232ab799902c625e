import { isFinal } from "../../jobs/model.ts";
import type { Coordinator } from "../coordinator.ts";
import { HttpFail } from "../http-fail.ts";
import type { JobsApi } from "../jobs-api.ts";
import { cacheHits } from "../metrics.ts";
import { workerView } from "../worker-view.ts";
import { SCRIPT, STYLE } from "./assets.ts";
import { envsPage, jobPage, jobsPage, signInPage, type WorkerLine, workersPage } from "./pages.ts";
import { clearedCookie, sameOrigin, sessionCookie, sessionId, type Sessions, type SignedIn } from "./session.ts";

/**
 * The dashboard at `/`: read-only pages behind the same tokens as the API.
 * The sign-in page takes a token once and keeps a session cookie; every page,
 * asset and live read needs that session (pages send the browser to sign in,
 * the rest answer 401). Form posts from another site are refused.
 */

export interface DashboardContext {
  coord: Coordinator;
  jobs: JobsApi;
  sessions: Sessions;
  /** Who a token signs in as (`admin`, or a user token's name), with its proof; null for any other token (a join token included). */
  signIn(token: string): Promise<SignedIn | null>;
  /** Whether the token a session was made with is still good (not revoked). */
  stillValid(proof: string): Promise<boolean>;
}

const SECURITY_HEADERS = {
  "content-security-policy": "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self'; connect-src 'self'; form-action 'self'; frame-ancestors 'none'; base-uri 'none'",
  "x-content-type-options": "nosniff",
  "x-frame-options": "DENY",
  // same-origin, not no-referrer: under no-referrer a browser sends `Origin: null` with the sign-in form, which sameOrigin refuses.
  "referrer-policy": "same-origin",
  "cache-control": "no-store",
};

/** Every answer outside the API carries the security headers, whatever made it (a 401 of /metrics, a 413, a 500). */
export function withSecurityHeaders(res: Response): Response {
  for (const [k, v] of Object.entries(SECURITY_HEADERS)) if (!res.headers.has(k)) res.headers.set(k, v);
  return res;
}

/** The security headers are added once, to every answer outside the API, by whoever serves this (withSecurityHeaders). */
function respond(body: string | null, status: number, headers: Record<string, string> = {}): Response {
  return new Response(body, { status, headers });
}

const page = (text: string, status = 200) => respond(text, status, { "content-type": "text/html; charset=utf-8" });
/** The sign-in page's inline stylesheet, allowed by its hash and nothing else inline. */
const STYLE_HASH = `'sha256-${new Bun.CryptoHasher("sha256").update(STYLE).digest("base64")}'`;
const signIn = (error: string | null, status = 200) =>
  respond(signInPage(error), status, { "content-type": "text/html; charset=utf-8", "content-security-policy": SECURITY_HEADERS["content-security-policy"].replace("style-src 'self'", `style-src ${STYLE_HASH}`) });
const redirect = (to: string, extra: Record<string, string> = {}) => respond(null, 303, { location: to, ...extra });
/** How much of a log a job's page shows (its end), and a live read brings at a time. */
const PAGE_LOG_BYTES = 256 * 1024;
const LIVE_LOG_BYTES = 256 * 1024;
/** The longest sign-in form read: a token and its field name. */
const MAX_FORM_BYTES = 4096;

async function formToken(req: Request): Promise<string> {
  const text = await req.text();
  if (text.length > MAX_FORM_BYTES) throw new HttpFail(413, "the form is too large");
  return new URLSearchParams(text).get("token")?.trim() ?? "";
}

async function workerLines(ctx: DashboardContext): Promise<WorkerLine[]> {
  const rows = new Map((await ctx.coord.store.workers()).map((w) => [w.id, w]));
  const hits = await cacheHits(ctx.coord.store);
  return (await workerView(ctx.coord.store)).map((w) => ({ ...w, cache: rows.get(w.id)?.cache ?? null, hits: hits.get(w.id) ?? null }));
}

export async function dashboardRoute(req: Request, ctx: DashboardContext): Promise<Response> {
  const url = new URL(req.url);
  const path = url.pathname;
  const method = req.method;
  if (path === "/login") {
    if (method === "GET") return (await ctx.sessions.who(sessionId(req), ctx.stillValid)) ? redirect("/jobs") : signIn(null);
    if (method !== "POST") return respond("method not allowed", 405);
    if (!sameOrigin(req)) return respond("a sign-in from another site is refused", 403, { "content-type": "text/plain" });
    const who = await ctx.signIn(await formToken(req));
    if (!who) return signIn("That is not a token this server takes (the server's token, or a user token).", 401);
    return redirect("/jobs", { "set-cookie": sessionCookie(await ctx.sessions.create(who), req) });
  }
  if (path === "/logout" && method === "POST") {
    if (!sameOrigin(req)) return respond("a post from another site is refused", 403, { "content-type": "text/plain" });
    await ctx.sessions.drop(sessionId(req));
    return redirect("/login", { "set-cookie": clearedCookie(req) });
  }
  // Everything else needs a session.
  if (!(await ctx.sessions.who(sessionId(req), ctx.stillValid))) {
    if (method === "GET" && !path.startsWith("/assets/") && !path.startsWith("/dash/api/")) return redirect("/login");
    return respond("sign in first", 401, { "content-type": "text/plain" });
  }
  if (method !== "GET") return respond("method not allowed", 405);
  if (path === "/") return redirect("/jobs");
  if (path === "/assets/style.css") return respond(STYLE, 200, { "content-type": "text/css; charset=utf-8" });
  if (path === "/assets/app.js") return respond(SCRIPT, 200, { "content-type": "text/javascript; charset=utf-8" });
  if (path === "/workers") return page(workersPage(await workerLines(ctx)));
  if (path === "/envs") return page(envsPage(await workerLines(ctx)));
  if (path === "/jobs") {
    const filter = { state: url.searchParams.get("state") ?? "", worker: url.searchParams.get("worker") ?? "" };
    const jobs = (await ctx.jobs.list(200)).filter((j) => (!filter.state || j.state === filter.state) && (!filter.worker || j.worker === filter.worker || j.tasks?.some((t) => t.worker === filter.worker)));
    return page(jobsPage(jobs, filter, (await ctx.coord.store.workers()).map((w) => w.name)));
  }
  const job = /^\/jobs\/([0-9a-f]{1,16})$/.exec(path);
  if (job) {
    const row = await findJob(ctx, job[1]!);
    if (!row) return page(messagePage("No such job"), 404);
    const status = await ctx.jobs.status(row);
    // The log's last part only: a big log is for `gpulayer job logs`, not for one page.
    const from = Math.max(0, row.logSize - PAGE_LOG_BYTES);
    const tail = await ctx.coord.store.readLog(row.id, from, PAGE_LOG_BYTES);
    return page(jobPage(status, new TextDecoder().decode(tail), from + tail.length, !isFinal(status.state), from));
  }
  const live = /^\/dash\/api\/jobs\/([0-9a-f]{16})\/log$/.exec(path);
  if (live) {
    const row = await ctx.coord.store.job(live[1]!);
    if (!row) return respond("no such job", 404);
    // An offset past the end (or nonsense) reads from the end: what the page is told is where the log really is.
    const asked = Math.floor(Number(url.searchParams.get("offset") ?? "0"));
    const offset = Number.isFinite(asked) ? Math.min(Math.max(0, asked), row.logSize) : row.logSize;
    const chunk = await ctx.coord.store.readLog(row.id, offset, LIVE_LOG_BYTES);
    return respond(new TextDecoder().decode(chunk), 200, { "content-type": "text/plain; charset=utf-8", "x-gpulayer-state": row.state, "x-gpulayer-log-size": String(offset + chunk.length) });
  }
  return page(messagePage("Not found"), 404);
}

async function findJob(ctx: DashboardContext, id: string) {
  try {
    return await ctx.jobs.find(id);
  } catch {
    return null;
  }
}

/** A bare page of one line (not found): its text is ours, never the request's. */
function messagePage(message: string): string {
  return `<!doctype html><html lang="en"><head><meta charset="utf-8"><title>${message} · gpulayer</title><link rel="stylesheet" href="/assets/style.css"></head><body><main><h1>${message}</h1><p><a href="/jobs">Jobs</a></p></main></body></html>`;
}
