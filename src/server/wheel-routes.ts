import { renameSync, rmSync } from "node:fs";
import * as v from "valibot";
import { contentHash } from "../core/hashing.ts";
import { fileSha256 } from "../env/index.ts";
import type { WorkerRow } from "./store.ts";
import type { WheelRow } from "./wheels.ts";
import type { Coordinator } from "./coordinator.ts";
import type { ArtifactSettings } from "./artifact-routes.ts";
import { CLAIM_MS } from "./build-claims.ts";
import { HttpFail } from "./http-fail.ts";
import { receiveTo } from "./receive.ts";

/**
 * /v1/wheels: wheels workers compiled without build isolation, between workers of this server
 * (env/build/wheelhouse.ts, server/wheels.ts). The switches and the size limit are the env artifacts'.
 *
 *   GET  /v1/wheels?sdist=S&conditions=C       (worker) the wheels of sdist S under conditions C, with what each was built against
 *   GET  /v1/wheels?name=N&conditions=C        (worker) the wheels of project N under conditions C, any sdist (an offline worker has none)
 *   PUT  /v1/wheels/SHA?task=T&sdist=S&conditions=C  (worker) a wheel compiled for task T, running on it now; its name and inputs in x-gpulayer-wheel
 *   GET  /v1/wheels/SHA                         (worker) the bytes
 *   POST /v1/wheels/claim                       (worker) {sdist, conditions, task, release?}: compile it here for task T, or wait for the holder
 *   POST /v1/wheels/report                      (worker) {sha}: it refused this wheel; dropped when its bytes no longer match its sha256
 *
 * As env artifacts (artifact-routes.ts): a compile claim is taken only for a task the worker runs now, and a wheel
 * is taken only from the worker holding the live claim of its sdist and conditions, for the task named in it; the
 * others wait for its wheel, or claim once its holder lets go or is lost. A duplicate upload is answered 409. The
 * server checks the digest as the bytes come; the fetching worker checks it again.
 */

type Caller = { role: "admin" | "user" | "join" } | { role: "worker"; worker: WorkerRow };

const SHA = /^[0-9a-f]{64}$/;
const NAME = /^[a-z0-9]([a-z0-9.-]*[a-z0-9])?$/;
const Inputs = v.strictObject({ imported: v.array(v.pipe(v.string(), v.maxLength(400))), files: v.array(v.pipe(v.string(), v.maxLength(4200))), missing: v.array(v.pipe(v.string(), v.maxLength(400))) });
const Entry = v.strictObject({ name: v.pipe(v.string(), v.regex(NAME)), wheel: v.pipe(v.string(), v.regex(/^[A-Za-z0-9_.+!-]+\.whl$/), v.maxLength(300)), seconds: v.pipe(v.number(), v.minValue(0)), inputs: Inputs });
const ReportBody = v.strictObject({ sha: v.pipe(v.string(), v.regex(SHA)) });
const ClaimBody = v.strictObject({ sdist: v.pipe(v.string(), v.regex(SHA)), conditions: v.pipe(v.string(), v.regex(SHA)), task: v.optional(v.pipe(v.string(), v.maxLength(200))), release: v.optional(v.boolean()) });

const reply = (data: unknown, status = 200) => Response.json(data, { status });

function view(w: WheelRow) {
  const entry = JSON.parse(w.entry) as { seconds: number; inputs: unknown };
  return { sha256: w.sha, name: w.name, wheel: w.wheel, bytes: w.bytes, seconds: entry.seconds, inputs: entry.inputs, built_by: w.builtBy, sdist: w.sdist };
}

export async function wheelRoute(req: Request, url: URL, sub: string | undefined, caller: Caller, coord: Coordinator, settings: ArtifactSettings, body: <S extends v.GenericSchema>(schema: S) => Promise<v.InferOutput<S>>): Promise<Response> {
  const store = coord.store.wheels;
  if (caller.role !== "worker") throw new HttpFail(403, "only a worker of this server may do this");
  const w = caller.worker;
  const method = req.method;
  if (!sub && method === "GET") {
    const sdist = url.searchParams.get("sdist");
    const name = url.searchParams.get("name");
    const conditions = url.searchParams.get("conditions") ?? "";
    if (!SHA.test(conditions)) throw new HttpFail(400, "conditions: a sha256 digest");
    if (name !== null && sdist === null) {
      if (!NAME.test(name)) throw new HttpFail(400, "name: a project name, PEP 503 form");
      return reply({ share: settings.share, wheels: settings.share ? (await store.forName(name, conditions)).map(view) : [] });
    }
    if (!SHA.test(sdist ?? "")) throw new HttpFail(400, "sdist, conditions: sha256 digests");
    return reply({ share: settings.share, wheels: settings.share ? (await store.forSdist(sdist!, conditions)).map(view) : [] });
  }
  if (sub === "claim" && method === "POST") {
    const claim = await body(ClaimBody);
    if (claim.release) return await store.release(claim.sdist, claim.conditions, w.id), reply({ released: true });
    if (!settings.share) return reply({ granted: true });
    const taskId = claim.task ?? "";
    const held = await store.claimOf(claim.sdist, claim.conditions);
    // A renewal of the worker's own claim for the same task goes on while its wheel uploads; a new claim needs a task running now.
    if (!(held?.workerId === w.id && held.taskId === taskId)) {
      const task = taskId ? await coord.store.task(taskId) : null;
      if (!task || task.workerId !== w.id || (task.state !== "assigned" && task.state !== "running")) throw new HttpFail(403, `a compile claim is taken only for a task this worker is running now${taskId ? ` (task ${taskId} is not)` : " (the claim names none)"}`);
    }
    return reply(await store.claim(claim.sdist, claim.conditions, { id: w.id, name: w.name }, taskId, CLAIM_MS));
  }
  if (sub === "report" && method === "POST") {
    const { sha } = await body(ReportBody);
    if (!(await coord.store.activeTasks(w.id)).length) throw new HttpFail(403, "a wheel is reported only by a worker running a task");
    const row = await store.get(sha);
    if (!row) return reply({ dropped: false, reason: "no such wheel" });
    // The worker's word alone drops nothing: the server hashes the bytes it keeps.
    const got = await fileSha256(store.path(sha));
    if (got !== sha) await store.drop(sha);
    return reply(got !== sha ? { dropped: true, reason: "its bytes do not match its sha256" } : { dropped: false, reason: "the server finds it sound" });
  }
  if (sub && SHA.test(sub) && method === "GET") {
    const row = await store.get(sub);
    if (!row) return reply({ error: "no such wheel" }, 404);
    await store.touch(sub);
    return new Response(Bun.file(store.path(sub)), { headers: { "content-type": "application/zip", "x-gpulayer-built-by": row.builtBy } });
  }
  if (sub && SHA.test(sub) && method === "PUT") return upload(req, url, sub, w, coord, settings);
  throw new HttpFail(404, `no route ${method} ${url.pathname}`);
}

async function upload(req: Request, url: URL, sha: string, w: WorkerRow, coord: Coordinator, settings: ArtifactSettings): Promise<Response> {
  const store = coord.store.wheels;
  if (!settings.share) throw new HttpFail(403, "this server does not share envs or wheels (coordinator.share_envs is false)");
  const sdist = url.searchParams.get("sdist") ?? "";
  const conditions = url.searchParams.get("conditions") ?? "";
  const taskId = url.searchParams.get("task") ?? "";
  if (!SHA.test(sdist) || !SHA.test(conditions)) throw new HttpFail(400, "sdist, conditions: sha256 digests");
  // Only from a compile a task of this worker claimed (for a task it ran then): a worker cannot plant wheels outside its own work.
  await holdsClaim(coord, w, sdist, conditions, taskId);
  let entry: v.InferOutput<typeof Entry>;
  try {
    entry = v.parse(Entry, JSON.parse(Buffer.from(req.headers.get("x-gpulayer-wheel") ?? "", "base64").toString("utf8")));
  } catch {
    throw new HttpFail(400, "x-gpulayer-wheel: not the wheel's name and build inputs");
  }
  const inputsHash = contentHash(JSON.stringify(entry.inputs));
  const there = await store.existing(sdist, conditions, inputsHash);
  if (there) return reply({ sha256: there.sha, stored: false, reason: `a wheel of this build is there already (compiled by ${there.builtBy})` }, 409);
  if (await store.get(sha)) return reply({ sha256: sha, stored: false, reason: "this wheel is there already" }, 409);
  const tmp = `${store.path(sha)}.${process.pid}.${crypto.randomUUID()}.tmp`;
  try {
    const received = await receiveTo(req, settings.maxBytes, tmp, `the wheel is larger than coordinator.artifacts_max_size (${settings.maxBytes} bytes)`);
    if (received.hash !== sha) throw new HttpFail(400, "wheel refused: its content does not match its sha256");
    // Checked again now the bytes are in: the claim may have lapsed, another upload of the same build may have finished meanwhile.
    await holdsClaim(coord, w, sdist, conditions, taskId);
    if (await store.existing(sdist, conditions, inputsHash)) return reply({ sha256: sha, stored: false, reason: "a wheel of this build arrived first" }, 409);
    renameSync(tmp, store.path(sha));
    await store.add({ sha, sdist, conditions, inputsHash, name: entry.name, wheel: entry.wheel, entry: JSON.stringify({ seconds: entry.seconds, inputs: entry.inputs }), bytes: received.bytes, builtBy: w.name });
  } finally {
    rmSync(tmp, { force: true });
  }
  await store.release(sdist, conditions, w.id);
  const trimmed = await store.trim(settings.maxBytes);
  return reply({ sha256: sha, stored: true, trimmed }, 201);
}

/** Refused (403) unless `w` holds the live compile claim of `sdist` under `conditions`, taken for `taskId`. */
async function holdsClaim(coord: Coordinator, w: WorkerRow, sdist: string, conditions: string, taskId: string): Promise<void> {
  const held = await coord.store.wheels.claimOf(sdist, conditions);
  if (held?.workerId === w.id && held.taskId === taskId && taskId) return;
  const why = !held ? "no compile claim of it is held" : held.workerId !== w.id ? `${held.worker} holds its compile claim` : "this worker's claim of it is for another task";
  throw new HttpFail(403, `wheel refused: sdist ${sdist.slice(0, 12)} is taken only from the compile a task of this worker claimed, while it holds the claim; ${why}`);
}
