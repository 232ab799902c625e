import * as v from "valibot";
import { artifactFault } from "../env/index.ts";
import type { WorkerRow } from "./store.ts";
import type { ArtifactRow } from "./artifacts.ts";
import type { Coordinator } from "./coordinator.ts";
import { CLAIM_MS } from "./build-claims.ts";
import { HttpFail } from "./http-fail.ts";
import { receiveTo } from "./receive.ts";

/**
 * /v1/artifacts: env artifacts between workers of this server (env/store/artifact.ts,
 * server/artifacts.ts).
 *
 *   GET  /v1/artifacts?key=K&path=P   (worker) what there is for K, who builds it now, who could
 *   GET  /v1/artifacts/popular?limit=N&envs=D&platform=..&interpreter=..&python=..&base=..
 *                                     (worker) the N most used artifacts it may unpack (worker.prefetch_envs)
 *   POST /v1/artifacts/claim          (worker) {key, path, task, release?}: build it here for task T, or wait for the holder
 *   PUT  /v1/artifacts/SHA?task=T&key=K  (worker) the artifact of a build for task T, its conditions in x-gpulayer-conditions
 *   POST /v1/artifacts/report         (worker) {sha, reason}: it refused this artifact; dropped when the server finds it unsound too
 *   GET  /v1/artifacts/SHA            (worker, user) the bytes
 *   GET  /v1/artifacts                (user) every artifact, with totals
 *   POST /v1/artifacts/gc             (user) {max_bytes?, dry_run?}: trim least recently used first
 *
 * A build claim is taken only for a task the worker is running now, and an
 * artifact is taken only from the worker holding the live claim of its key
 * and path, for the task named in that claim: so only what a task of that
 * worker built, while it builds or uploads it. The server checks each
 * artifact as an unpacker does (env/store/artifact.ts artifactFault) before keeping
 * it, and again when a worker reports it refused one: an unsound one is
 * dropped, and the next build's artifact takes its place. Once per key and
 * path otherwise, never past the size limit.
 */

export interface ArtifactSettings {
  maxBytes: number;
  /** coordinator.share_envs */
  share: boolean;
  /** The files folder is shared with other replicas (their uploads in flight are not strays). */
  sharedFiles: boolean;
}

type Caller = { role: "admin" | "user" | "join" } | { role: "worker"; worker: WorkerRow };

const SHA = /^[0-9a-f]{64}$/;

const Conditions = v.strictObject({ env_path: v.pipe(v.string(), v.startsWith("/"), v.maxLength(4096)), platform: v.pipe(v.string(), v.maxLength(200)), interpreter: v.pipe(v.string(), v.maxLength(4096)), python: v.pipe(v.string(), v.maxLength(50)), base: v.pipe(v.string(), v.regex(/^[0-9a-f]{64}$/)) });
const PopularQuery = v.strictObject({ limit: v.pipe(v.string(), v.regex(/^\d{1,4}$/), v.transform(Number), v.minValue(1)), envs: v.pipe(v.string(), v.startsWith("/"), v.maxLength(4096)), platform: v.pipe(v.string(), v.maxLength(200)), interpreter: v.pipe(v.string(), v.maxLength(4096)), python: v.pipe(v.string(), v.maxLength(50)), base: v.pipe(v.string(), v.regex(/^[0-9a-f]{64}$/)) });
/** How far back jobs count towards an env's use (what a joining worker prefetches). */
const POPULAR_WINDOW_MS = 7 * 86_400_000;
const GcBody = v.strictObject({ max_bytes: v.optional(v.pipe(v.number(), v.minValue(0))), dry_run: v.optional(v.boolean()) });
const ClaimBody = v.strictObject({ key: v.pipe(v.string(), v.regex(SHA)), path: v.pipe(v.string(), v.startsWith("/"), v.maxLength(4096)), task: v.optional(v.pipe(v.string(), v.maxLength(200))), release: v.optional(v.boolean()) });
const ReportBody = v.strictObject({ sha: v.pipe(v.string(), v.regex(SHA)), reason: v.pipe(v.string(), v.maxLength(2000)) });

const reply = (data: unknown, status = 200) => Response.json(data, { status });

function view(a: ArtifactRow) {
  return { sha256: a.sha, key: a.key, bytes: a.bytes, built_by: a.builtBy, conditions: a.conditions, created: new Date(a.created).toISOString(), last_used: new Date(a.lastUsed).toISOString() };
}

/** `body`: the request's JSON checked against a schema (routes.ts jsonBody: size limit, one clear 400). */
export async function artifactRoute(req: Request, url: URL, sub: string | undefined, caller: Caller, coord: Coordinator, settings: ArtifactSettings, body: <S extends v.GenericSchema>(schema: S) => Promise<v.InferOutput<S>>): Promise<Response> {
  const store = coord.store.artifacts;
  const method = req.method;
  const worker = () => {
    if (caller.role !== "worker") throw new HttpFail(403, "only a worker of this server may do this");
    return caller.worker;
  };
  const user = () => {
    if (caller.role !== "admin" && caller.role !== "user") throw new HttpFail(403, "this needs a user token");
  };

  if (!sub && method === "GET") {
    if (caller.role === "worker") {
      const key = url.searchParams.get("key") ?? "";
      const path = url.searchParams.get("path") ?? "";
      if (!SHA.test(key)) throw new HttpFail(400, "key: not an env key");
      const builders = (await coord.store.workers()).filter((w) => w.state !== "left" && w.state !== "lost" && !w.probe.offline).map((w) => w.name);
      return reply({ share: settings.share, artifacts: settings.share ? (await store.forKey(key)).map(view) : [], building: await store.builder(key, path), builders });
    }
    user();
    const t = await store.totals();
    return reply({ share: settings.share, max_bytes: settings.maxBytes, count: t.count, bytes: t.bytes, artifacts: (await store.list()).map(view), wheels: await coord.store.wheels.totals() });
  }
  if (sub === "popular" && method === "GET") {
    worker();
    if (!settings.share) return reply({ share: false, artifacts: [] });
    const q = v.safeParse(PopularQuery, Object.fromEntries(url.searchParams));
    if (!q.success) throw new HttpFail(400, `${v.getDotPath(q.issues[0]) ?? "query"}: ${q.issues[0].message}`);
    const { limit, ...want } = q.output;
    const found = await store.popular(want, limit, Date.now() - POPULAR_WINDOW_MS);
    return reply({ share: true, artifacts: found.map((a) => ({ ...view(a), uses: a.uses })) });
  }
  if (sub === "claim" && method === "POST") {
    const w = worker();
    const claim = await body(ClaimBody);
    if (claim.release) return await store.release(claim.key, claim.path, w.id), reply({ released: true });
    if (!settings.share) return reply({ granted: true });
    const taskId = claim.task ?? "";
    const held = await store.claimOf(claim.key, claim.path);
    // A renewal of the worker's own claim for the same task goes on after the task ended (the upload runs in the background); a new claim needs a task running now.
    if (!(held?.workerId === w.id && held.taskId === taskId)) {
      const task = taskId ? await coord.store.task(taskId) : null;
      if (!task || task.workerId !== w.id || (task.state !== "assigned" && task.state !== "running")) throw new HttpFail(403, `a build claim is taken only for a task this worker is running now${taskId ? ` (task ${taskId} is not)` : " (the claim names none)"}`);
    }
    return reply(await store.claim(claim.key, claim.path, { id: w.id, name: w.name }, taskId, CLAIM_MS));
  }
  if (sub === "report" && method === "POST") {
    const w = worker();
    const report = await body(ReportBody);
    // Reading an artifact again costs the server: only a worker preparing a task now (the one that fetched it) may ask.
    if (!(await coord.store.activeTasks(w.id)).length) throw new HttpFail(403, "an artifact is reported only by a worker running a task");
    const a = await store.get(report.sha);
    if (!a) return reply({ dropped: false, reason: "no such artifact" });
    // The worker's word alone drops nothing (a worker could drop every good artifact): the server checks it too.
    const fault = await artifactFault(store.path(a.sha), a.sha, a.key, a.conditions.env_path);
    if (fault) await store.drop(a.sha);
    return reply(fault ? { dropped: true, reason: fault } : { dropped: false, reason: "the server finds it sound" });
  }
  if (sub === "gc" && method === "POST") {
    user();
    const gc = await body(GcBody);
    return reply(await store.trim(gc.max_bytes ?? settings.maxBytes, gc.dry_run ?? false, settings.sharedFiles));
  }
  if (sub && SHA.test(sub) && method === "GET") {
    if (caller.role === "join") throw new HttpFail(403, "a join token only registers workers");
    const a = await store.get(sub);
    if (!a) return reply({ error: "no such artifact" }, 404);
    const done = await store.read(sub);
    const file = Bun.file(store.path(sub));
    // The download holds the artifact against trimming until its last byte is sent (or the worker goes away).
    const body = file.stream().pipeThrough(new TransformStream({ flush: () => done() }));
    req.signal.addEventListener("abort", done, { once: true });
    return new Response(body, { headers: { "content-type": "application/zstd", "content-length": String(a.bytes), "x-gpulayer-built-by": a.builtBy } });
  }
  if (sub && SHA.test(sub) && method === "PUT") return upload(req, url, sub, worker(), coord, settings);
  throw new HttpFail(404, `no route ${method} ${url.pathname}`);
}

async function upload(req: Request, url: URL, sha: string, w: WorkerRow, coord: Coordinator, settings: ArtifactSettings): Promise<Response> {
  const store = coord.store.artifacts;
  if (!settings.share) throw new HttpFail(403, "this server does not share envs (coordinator.share_envs is false)");
  const key = url.searchParams.get("key") ?? "";
  const taskId = url.searchParams.get("task") ?? "";
  if (!SHA.test(key)) throw new HttpFail(400, "key: not an env key");
  let conditions: v.InferOutput<typeof Conditions>;
  try {
    conditions = v.parse(Conditions, JSON.parse(Buffer.from(req.headers.get("x-gpulayer-conditions") ?? "", "base64").toString("utf8")));
  } catch {
    throw new HttpFail(400, "x-gpulayer-conditions: not the artifact's conditions");
  }
  await holdsClaim(store, w, key, conditions.env_path, taskId);
  const there = await store.existing(key, conditions.env_path);
  if (there) return reply({ sha256: there.sha, stored: false, reason: `an artifact of this env is there already (built by ${there.builtBy});` }, 409);
  if (await store.get(sha)) return reply({ sha256: sha, stored: false, reason: "this artifact is there already" }, 409);
  const tmp = store.receiving();
  try {
    const received = await receiveTo(req, settings.maxBytes, tmp.path, `the artifact is larger than coordinator.artifacts_max_size (${settings.maxBytes} bytes)`);
    if (received.hash !== sha) throw new HttpFail(400, "artifact refused: its content does not match its sha256");
    const fault = await artifactFault(tmp.path, sha, key, conditions.env_path);
    if (fault) throw new HttpFail(400, `artifact refused: ${fault}`);
    // Checked again now the bytes are in: the claim may have lapsed, another upload of the same env may have finished meanwhile.
    await holdsClaim(store, w, key, conditions.env_path, taskId);
    if (await store.existing(key, conditions.env_path)) return reply({ sha256: sha, stored: false, reason: "an artifact of this env arrived first" }, 409);
    await tmp.keep({ sha, key, conditions, bytes: received.bytes, builtBy: w.name, taskId });
  } finally {
    tmp.drop();
  }
  await store.release(key, conditions.env_path, w.id);
  const trimmed = await store.trim(settings.maxBytes, false, settings.sharedFiles);
  return reply({ sha256: sha, stored: true, trimmed: trimmed.removed.length }, 201);
}

/** Refused (403) unless `w` holds the live build claim of `key` at `envPath`, taken for `taskId`. */
async function holdsClaim(store: Coordinator["store"]["artifacts"], w: WorkerRow, key: string, envPath: string, taskId: string): Promise<void> {
  const held = await store.claimOf(key, envPath);
  if (held?.workerId === w.id && held.taskId === taskId && taskId) return;
  const why = !held ? "no build claim of it is held" : held.workerId !== w.id ? `${held.worker} holds its build claim` : `this worker's claim of it is for another task`;
  throw new HttpFail(403, `artifact refused: env ${key.slice(0, 12)} at ${envPath} is taken only from the build a task of this worker claimed, while it holds the claim; ${why}`);
}
