import type { SubmitRequest } from "../cluster/protocol.ts";
import { timingSafeEqual } from "node:crypto";
import type * as v from "valibot";
import { type BundleLimits, bundleFiles, inspectBundle, isBundleHash } from "../cluster/bundle.ts";
import { BundleError } from "../errors.ts";
import { contentHash as sha256 } from "../core/hashing.ts";
import type { Coordinator } from "./coordinator.ts";
import { HttpFail } from "./http-fail.ts";
import { receiveTo } from "./receive.ts";
import { boundEvents, jobTooLarge, MAX_JSON_DEPTH, nestsDeeper } from "./request-limits.ts";
import { DatabaseDown } from "./db/sql.ts";
import type { JobsApi } from "./jobs-api.ts";
import * as S from "./schemas.ts";
import { artifactRoute, type ArtifactSettings } from "./artifact-routes.ts";
import { wheelRoute } from "./wheel-routes.ts";
import type { WorkerRow } from "./store.ts";
import type { ReportItem } from "./report-items.ts";
import { workerView } from "./worker-view.ts";
import { serverMetrics } from "./metrics.ts";
import { type DashboardContext, dashboardRoute, withSecurityHeaders } from "./dashboard/routes.ts";
import type { Sessions } from "./dashboard/session.ts";
import type { CredentialCache } from "./credential-cache.ts";

/**
 * The HTTP API under /v1. Every request carries a bearer token: the
 * server's (clients, and workers registering) or a worker's own credential
 * (given at registration; good only for that worker's routes). A missing or
 * wrong one gets a bare 401 before anything else is looked at. A worker's
 * credential stops working once it has left or been declared lost, and
 * fetches only the bundles of the tasks it holds now, and the outputs of the
 * tasks those need: any other hash is answered as a missing bundle, whether
 * the server has it or not.
 */

/** Who is asking: the server's own token (everything), a named user or join token, or a worker's credential. */
type Caller = { role: "admin" } | { role: "user" | "join"; name: string } | { role: "worker"; worker: WorkerRow; secretHash: string };

export interface RouteContext {
  coord: Coordinator;
  jobs: JobsApi;
  token: string;
  limits: BundleLimits;
  /** JSON bodies (output chunks included). */
  maxBodyBytes: number;
  /** A job's or prepare's request (coordinator.max_job). */
  maxJobBytes: number;
  artifacts: ArtifactSettings;
  /** The dashboard's sign-in sessions (dashboard/session.ts). */
  sessions: Sessions;
  /** coordinator.metrics_token: a token good for /metrics only (a scraper need not hold a user token). */
  metricsToken: string | null;
  /** Which replica this is (printed at start, told at /v1/health). */
  replica: string;
  /** Workers' credentials, kept a few seconds (credential-cache.ts). */
  credentials: CredentialCache;
  /** Whether the database answers now (server.ts DatabaseHealth). */
  health: { readonly error: string | null; down(error: unknown): void };
  onError(error: unknown): void;
}

const DATABASE_DOWN = "this gpulayer server replica cannot reach its database; it takes no work until it can";

const reply = (data: unknown, status = 200) => Response.json(data, { status });
const MAX_WAIT_MS = 30_000;

/** The server's own tokens' hashes (the admin and metrics tokens: a few), made once rather than on every request. */
const hashesOfTokens = new Map<string, Buffer>();

/** Whether the token whose hash is `givenHash` is `token`, in constant time. */
function hashIsOf(givenHash: string, token: string): boolean {
  let known = hashesOfTokens.get(token);
  if (!known) hashesOfTokens.set(token, (known = Buffer.from(sha256(token), "hex")));
  return timingSafeEqual(Buffer.from(givenHash, "hex"), known);
}

function tokenEquals(given: string, token: string): boolean {
  return hashIsOf(sha256(given), token);
}

/** The bearer token a request carries, if any: `Bearer` (any case), blanks, then the token, which holds none. */
function bearerOf(req: Request): string | null {
  const header = req.headers.get("authorization");
  if (!header || header.length < 8 || header.slice(0, 6).toLowerCase() !== "bearer") return null;
  const token = header.slice(6).trimStart();
  return token.length > 0 && token.length < header.length - 6 && !/\s/.test(token) ? token : null;
}

/** What only workers call (beats, polls, their tasks' reports): their credential is looked up first, the named tokens after. */
const WORKER_PATH = /^\/v1\/(tasks\/|workers\/[^/]+\/(heartbeat|tasks)$)/;

async function authenticate(req: Request, ctx: RouteContext): Promise<Caller | null> {
  const bearer = bearerOf(req);
  if (!bearer) return null;
  const secretHash = sha256(bearer);
  if (hashIsOf(secretHash, ctx.token)) return { role: "admin" };
  // Most requests of a busy fleet are its workers': one lookup each, not a miss among the named tokens first; and
  // on their paths (never a leave's), a credential found a moment ago is taken as found.
  const workerPath = WORKER_PATH.test(new URL(req.url).pathname);
  const asWorker = async (): Promise<Caller | null> => {
    const kept = workerPath ? ctx.credentials.get(secretHash) : null;
    if (kept) return { role: "worker", worker: kept, secretHash };
    const mark = ctx.credentials.mark();
    const worker = await ctx.coord.store.workerByCredential(secretHash);
    if (worker && workerPath) ctx.credentials.put(secretHash, worker, mark);
    return worker ? { role: "worker", worker, secretHash } : null;
  };
  const worker = workerPath ? await asWorker() : null;
  if (worker) return worker;
  const named = await ctx.coord.store.tokens.authenticate(bearer);
  if (named) return { role: named.role, name: named.name };
  return workerPath ? null : asWorker();
}

const bodyTooLarge = (limit: number) => new HttpFail(413, `request body too large (limit ${limit} bytes)`);

/** The body, refused (413) past the limit, counted as it arrives rather than trusted from Content-Length. */
async function readBody(req: Request, limit: number, tooLarge: (declared: number | null) => HttpFail = () => bodyTooLarge(limit)): Promise<Uint8Array> {
  const declared = Number(req.headers.get("content-length") ?? "0");
  if (declared > limit) throw tooLarge(declared);
  if (!req.body) return new Uint8Array();
  const parts: Uint8Array[] = [];
  let total = 0;
  for await (const chunk of req.body as unknown as AsyncIterable<Uint8Array>) {
    total += chunk.length;
    if (total > limit) throw tooLarge(null);
    parts.push(chunk);
  }
  return Buffer.concat(parts);
}

/** A JSON body checked against its schema; a job's or prepare's request against coordinator.max_job too (request-limits.ts). */
async function jsonBody<Sch extends v.GenericSchema>(req: Request, ctx: RouteContext, schema: Sch, job = false): Promise<v.InferOutput<Sch>> {
  // max_job is never past max_body (server.ts refuses it at start).
  const limit = job ? ctx.maxJobBytes : ctx.maxBodyBytes;
  const raw = await readBody(req, limit, job ? (declared) => jobTooLarge(limit, declared) : undefined);
  if (nestsDeeper(raw)) throw new HttpFail(400, `the body nests deeper than ${MAX_JSON_DEPTH} levels`);
  let data: unknown;
  try {
    data = JSON.parse(new TextDecoder().decode(raw));
  } catch {
    throw new HttpFail(400, "the body is not JSON");
  }
  const parsed = S.parseBody(schema, data);
  if (!parsed.ok) throw new HttpFail(400, parsed.message);
  return parsed.value;
}

/** A job's request: its shape, then its tasks a few at a time (schemas.ts parseTasks). */
async function submitBody(req: Request, ctx: RouteContext): Promise<SubmitRequest> {
  const { spec, ...body } = await jsonBody(req, ctx, S.SubmitSchema, true);
  if (!("tasks" in spec)) return { ...body, spec };
  const tasks = await S.parseTasks(spec.tasks);
  if (!tasks.ok) throw new HttpFail(400, tasks.message);
  return { ...body, spec: { ...spec, tasks: tasks.value } };
}

/**
 * An upload, streamed to a temporary file while it is hashed (never held in
 * memory whole), then checked by the streaming checker: the event loop keeps
 * turning, so health checks, heartbeats and long polls are answered meanwhile.
 */
async function putBundle(req: Request, ctx: RouteContext, hash: string): Promise<Response> {
  const stored = await receiveBundle(req, ctx, hash);
  return reply({ hash, stored }, stored ? 201 : 200);
}

/** An upload kept as a bundle once its hash and its entries check out; false when the server had it already. */
async function receiveBundle(req: Request, ctx: RouteContext, hash: string): Promise<boolean> {
  const store = ctx.coord.store.bundles;
  if (await store.has(hash)) return false;
  const tmp = store.receiving(hash);
  try {
    const received = await receiveTo(req, ctx.limits.maxBytes, tmp.path);
    if (received.hash !== hash) throw new HttpFail(400, "bundle refused: its content does not match its hash");
    try {
      await inspectBundle(tmp.path, ctx.limits);
    } catch (error) {
      if (error instanceof BundleError) throw new HttpFail(400, error.message);
      throw error;
    }
    await tmp.keep(received.bytes);
  } finally {
    tmp.drop();
  }
  return true;
}

/**
 * A task's outputs from the worker that holds it: an archive checked as any
 * bundle (limits, no links out, no `..`), kept among them, and recorded on
 * the task with the files the server itself read from it.
 */
async function putOutputs(req: Request, ctx: RouteContext, w: WorkerRow, taskId: string, hash: string | undefined): Promise<Response> {
  if (!hash || !isBundleHash(hash)) throw new HttpFail(400, "not a bundle hash");
  await ctx.coord.taskOfWorker(w, taskId);
  await receiveBundle(req, ctx, hash);
  const files = await bundleFiles(ctx.coord.store.bundles.path(hash));
  await ctx.coord.taskOutputs(w, taskId, hash, files);
  return reply({ hash, files }, 201);
}

const waitMs = (url: URL, fallback = 25) => Math.min(MAX_WAIT_MS, Math.max(0, Number(url.searchParams.get("wait") ?? fallback) * 1000 || 0));
const intParam = (url: URL, name: string) => Math.max(0, Math.floor(Number(url.searchParams.get(name) ?? "0")) || 0);

async function route(req: Request, ctx: RouteContext, caller: Caller): Promise<Response> {
  const url = new URL(req.url);
  const parts = url.pathname.split("/").filter(Boolean);
  const { coord, jobs } = ctx;
  const method = req.method;
  const asWorker = (id?: string): WorkerRow => {
    if (caller.role !== "worker" || (id !== undefined && caller.worker.id !== id)) throw new HttpFail(403, "only the worker itself may do this");
    return { ...caller.worker, presented: caller.secretHash };
  };
  // A user token does what clients do; a join token registers a worker, nothing more.
  const needUser = () => {
    if (caller.role !== "admin" && caller.role !== "user") throw new HttpFail(403, caller.role === "join" ? "a join token only registers workers; this needs a user token" : "this needs a user token");
  };
  const needJoin = () => {
    if (caller.role !== "admin" && caller.role !== "join") throw new HttpFail(403, caller.role === "user" ? "a user token cannot register a worker; join with a join token (gpulayer server token create --role join)" : "registering needs a join token");
  };
  if (parts[0] !== "v1") throw new HttpFail(404, "not found");
  const [, kind, id, action] = parts;

  if (kind === "workers") {
    if (!id && method === "GET") return needUser(), reply(await workerView(ctx.coord.store));
    if (id === "register" && method === "POST") return needJoin(), reply(await coord.register(await jsonBody(req, ctx, S.RegisterSchema), caller.role === "join" ? caller.name : null), 201);
    if (id && action === "heartbeat" && method === "POST") return reply(await coord.heartbeat(asWorker(id), await jsonBody(req, ctx, S.HeartbeatSchema)));
    if (id && action === "tasks" && method === "GET") return reply(await coord.poll(asWorker(id), waitMs(url), req.signal, caller.role === "worker" ? caller.secretHash : undefined));
    if (id && action === "leave" && method === "POST") return await coord.leave(asWorker(id), (await jsonBody(req, ctx, S.LeaveSchema)).final), reply({ ok: true });
  }
  if (kind === "tasks" && id) {
    const w = asWorker();
    if (action === "events" && method === "POST") {
      const body = await jsonBody(req, ctx, S.EventsSchema);
      return await coord.taskEvents(w, id, boundEvents(body.events), body.seq), reply({ ok: true });
    }
    if (action === "output" && method === "POST") {
      const seq = intParam(url, "seq") || undefined;
      const lengths = (url.searchParams.get("lengths") ?? "").split(",").filter(Boolean).map(Number);
      if (lengths.some((n) => !Number.isInteger(n) || n < 0)) throw new HttpFail(400, "lengths: comma-separated byte counts");
      return await coord.taskOutput(w, id, await readBody(req, ctx.maxBodyBytes), url.searchParams.get("stream") === "stderr" ? "stderr" : "stdout", seq, lengths.length ? lengths : undefined), reply({ ok: true });
    }
    if (action === "outputs" && method === "PUT") return await putOutputs(req, ctx, w, id, parts[4]);
    if (action === "finish" && method === "POST") return await coord.taskFinish(w, id, await jsonBody(req, ctx, S.FinishSchema)), reply({ ok: true });
    if (action === "reports" && method === "POST") {
      const body = await jsonBody(req, ctx, S.ReportsSchema);
      return await coord.taskReports(w, id, reportItems(body.items), body.seq), reply({ ok: true });
    }
    if (action === "handback" && method === "POST") {
      const body = await jsonBody(req, ctx, S.HandbackSchema);
      return await coord.handback(w, id, body.reason, body.seq), reply({ ok: true });
    }
  }
  if (kind === "bundles" && id) {
    if (!isBundleHash(id)) throw new HttpFail(400, "not a bundle hash");
    const bundles = coord.store.bundles;
    // A worker sees only its own tasks' bundles; to it, any other is missing.
    const visible = async () => (await bundles.has(id)) && (caller.role === "admin" || caller.role === "user" || (caller.role === "worker" && ((await coord.store.workerHoldsBundle(caller.worker.id, id)) || (await coord.store.workerNeedsOutputs(caller.worker.id, id)))));
    if (method === "HEAD") return new Response(null, { status: (await visible()) ? 200 : 404 });
    if (method === "GET") return (await visible()) ? (await bundles.touch(id), new Response(Bun.file(bundles.path(id)))) : reply({ error: "no such bundle" }, 404);
    if (method === "PUT") return needUser(), await putBundle(req, ctx, id);
  }
  if (kind === "artifacts") return artifactRoute(req, url, id, caller, coord, ctx.artifacts, (schema) => jsonBody(req, ctx, schema));
  if (kind === "wheels") return wheelRoute(req, url, id, caller, coord, ctx.artifacts, (schema) => jsonBody(req, ctx, schema));
  if (kind === "jobs") {
    needUser();
    if (!id && method === "POST") return reply(await jobs.submit(await submitBody(req, ctx)), 201);
    if (!id && method === "GET") return reply(await jobs.list(Math.min(1000, intParam(url, "limit") || 50)));
    if (id && !action && method === "GET") return reply(await jobs.status(await jobs.find(id)));
    if (id && action === "outputs" && method === "GET") return reply(await jobs.outputs(await jobs.find(id)));
    if (id && action === "cancel" && method === "POST") return reply(await jobs.cancel((await jobs.find(id)).id));
    if (id && action === "log" && method === "GET") {
      const job = await jobs.find(id);
      return new Response(await coord.store.readLog(job.id, intParam(url, "offset"), Number.MAX_SAFE_INTEGER), { headers: { "content-type": "application/octet-stream", "x-gpulayer-job": job.id } });
    }
    if (id && action === "watch" && method === "GET") return reply(await jobs.watch((await jobs.find(id)).id, intParam(url, "log"), intParam(url, "after"), waitMs(url, 20), req.signal));
  }
  if (kind === "prepares") {
    needUser();
    if (!id && method === "POST") return reply(await jobs.prepare(await jsonBody(req, ctx, S.PrepareSchema, true)), 201);
    if (id && method === "GET") return reply(await jobs.group(id, intParam(url, "known"), waitMs(url, 20), req.signal, intParam(url, "after")));
  }
  throw new HttpFail(404, `no route ${method} ${url.pathname}`);
}

/** GET /metrics: the server's token, a user token, or the metrics token. */
async function metrics(req: Request, ctx: RouteContext): Promise<Response> {
  const bearer = bearerOf(req);
  const caller = await authenticate(req, ctx);
  const allowed = caller?.role === "admin" || caller?.role === "user" || Boolean(bearer && ctx.metricsToken && tokenEquals(bearer, ctx.metricsToken));
  if (!allowed) return new Response("unauthorized\n", { status: 401, headers: { "content-type": "text/plain" } });
  const running = new Map((await workerView(ctx.coord.store)).map((w) => [w.id, w.running]));
  const workers = (await ctx.coord.store.workers()).map((w) => ({ ...w, running: running.get(w.id) ?? 0 }));
  return new Response(await serverMetrics(ctx.coord.store, workers), { headers: { "content-type": "text/plain; version=0.0.4; charset=utf-8" } });
}

export function handler(ctx: RouteContext): (req: Request) => Promise<Response> {
  const dashboard: DashboardContext = {
    coord: ctx.coord,
    jobs: ctx.jobs,
    sessions: ctx.sessions,
    signIn: async (token) => {
      if (tokenEquals(token, ctx.token)) return { who: "admin", proof: "admin" };
      const named = await ctx.coord.store.tokens.authenticate(token);
      return named?.role === "user" ? { who: named.name, proof: sha256(token) } : null;
    },
    stillValid: async (proof) => proof === "admin" || (await ctx.coord.store.tokens.hasHash(proof)),
  };
  return async (req) => {
    const path = new URL(req.url).pathname;
    // The API is under /v1; /metrics for Prometheus; everything else is the dashboard, behind its own session.
    if (path !== "/v1" && !path.startsWith("/v1/")) {
      // HEAD is GET without the body, for pages and /metrics alike.
      const head = req.method === "HEAD";
      const asked = head ? new Request(req.url, { method: "GET", headers: req.headers }) : req;
      let res: Response;
      try {
        res = path === "/metrics" && asked.method === "GET" ? await metrics(asked, ctx) : await dashboardRoute(asked, dashboard);
      } catch (error) {
        if (error instanceof HttpFail) res = new Response(error.message, { status: error.status, headers: { "content-type": "text/plain" } });
        else if (error instanceof DatabaseDown) {
          ctx.health.down(error);
          res = new Response(`${DATABASE_DOWN}\n`, { status: 503, headers: { "content-type": "text/plain" } });
        } else {
          ctx.onError(error);
          res = new Response("internal error in the gpulayer server (see its log)", { status: 500, headers: { "content-type": "text/plain" } });
        }
      }
      res = withSecurityHeaders(res);
      return head ? new Response(null, { status: res.status, headers: res.headers }) : res;
    }
    // /v1/health without a token (a load balancer's probe) is told only whether this replica serves; with one, which replica and why.
    const health = path === "/v1/health" && req.method === "GET";
    const bearer = bearerOf(req);
    const probe = health && !req.headers.has("authorization");
    // Without its database a replica can check no token but its own: everything is a 503 (clients and workers move to another replica).
    if (ctx.health.error !== null) {
      if (!health) return reply({ error: DATABASE_DOWN }, 503);
      return reply(bearer && tokenEquals(bearer, ctx.token) ? { ok: false, replica: ctx.replica, database: `unreachable: ${ctx.health.error}` } : { ok: false }, 503);
    }
    if (probe) return reply({ ok: true });
    try {
      const caller = await authenticate(req, ctx);
      if (!caller) return reply({ error: "unauthorized" }, 401);
      if (health) return reply({ ok: true, replica: ctx.replica, database: "ok" });
      return await route(req, ctx, caller);
    } catch (error) {
      if (error instanceof HttpFail) return reply({ error: error.message, ...error.extra }, error.status);
      if (error instanceof DatabaseDown) {
        ctx.health.down(error);
        return reply({ error: DATABASE_DOWN }, 503);
      }
      ctx.onError(error);
      return reply({ error: "internal error in the gpulayer server (see its log)" }, 500);
    }
  };
}

/** A report's items as the coordinator applies them: events bounded as `/events` bounds them, output decoded. */
function reportItems(items: v.InferOutput<typeof S.ReportsSchema>["items"]): ReportItem[] {
  const events = boundEvents(items.flatMap((i) => (i.event ? [i.event] : [])));
  let e = 0;
  return items.map((i) => (i.event ? { event: events[e++]! } : i.output !== undefined ? { output: Buffer.from(i.output, "base64"), stream: i.stream! } : { finish: i.finish! }));
}
