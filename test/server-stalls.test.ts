import { afterAll, beforeAll, describe, expect, test } from "bun:test";
import { join } from "node:path";
import { cli, sandbox, serversOnPostgres, startCli } from "./helpers.ts";
import { type Kept, keepOutput, stopAll, waitFor } from "./fixtures/processes.ts";

/**
 * No request stalls the server. A real `gpulayer server` (on SQLite, and on
 * PostgreSQL under `bun run test:postgres`) is sent the requests that once
 * stalled it for everyone, each by whom may send it: a job whose env holds
 * 16 values of 64 KiB of letters (a user token), one event of 256 KiB of
 * letters (a worker's credential), and a job of 1,000 tasks in a chain whose
 * first task fails. Meanwhile another process asks `/v1/health` every 10 ms
 * (whether the previous answer came or not, so a stall shows in every probe
 * it delays): its p99 stays under 100 ms, and each request gets its proper
 * answer. The worker is this test speaking the workers' API with its
 * credential (what a hostile worker can send), so nothing but the server
 * does work.
 */

const ADMIN = "stalls-test-admin-token-0123456789";
const T = 180_000;
const P99_MS = 100;
const box = sandbox();
const serverHome = join(box.root, "server-home");
const procs: Kept[] = [];
let url = "";
let user = "";
let worker = { id: "", credential: "" };

const json = <T = any>(text: string): T => JSON.parse(text) as T;
const api = (path: string, token: string, init: { method?: string; body?: string } = {}) => fetch(`${url}${path}`, { ...init, headers: { authorization: `Bearer ${token}`, "content-type": "application/json" } });
const asWorker = (path: string, body?: unknown) => api(path, worker.credential, body === undefined ? {} : { method: "POST", body: JSON.stringify(body) });
const letters = (n: number) => "abcdefghijklmnopqrstuvwxyz".repeat(Math.ceil(n / 26)).slice(0, n);

const spec = (name: string, extra: Record<string, unknown> = {}) => ({
  name,
  argv: ["true"],
  commandText: "true",
  env: {},
  environment: { specs: [], extraIndexUrls: [], findLinks: [] },
  resources: { gpus: 0, frameworks: {} },
  ...extra,
});
const submitBody = (s: unknown) => JSON.stringify({ spec: s, bundle: null, labels: {}, workdir: "/tmp" });
const chain = (n: number) => ({
  ...spec("chain"),
  argv: [],
  commandText: "tasks",
  tasks: Array.from({ length: n }, (_, i) => ({ name: `t${i}`, needs: i ? [`t${i - 1}`] : [], spec: spec(`t${i}`) })),
});

/**
 * The prober, a process of its own (so that this test's own work, building
 * and sending megabytes, delays no probe): `/v1/health` with a user token
 * (authenticated, so through the database too) every 10 ms, whether the
 * last answer came or not, until a line on its stdin; then the latencies.
 */
const PROBER = `
const latencies = [];
const pending = [];
const timer = setInterval(() => {
  const start = performance.now();
  pending.push(fetch(process.env.PROBE_URL, { headers: { authorization: "Bearer " + process.env.PROBE_TOKEN } }).then(async (r) => {
    await r.text();
    latencies.push(r.status === 200 ? performance.now() - start : -r.status);
  }));
}, 10);
console.log("ready");
for await (const _ of console) break;
clearInterval(timer);
await Promise.all(pending);
console.log(JSON.stringify(latencies));
`;

/** `work` while the prober asks, from 200 ms before it starts to 200 ms after it ends: its result and the probes' latencies. */
async function healthWhile<R>(work: () => Promise<R>): Promise<{ result: R; p99: number; max: number; probes: number }> {
  const prober = Bun.spawn([process.execPath, "-e", PROBER], { env: { ...process.env, PROBE_URL: `${url}/v1/health`, PROBE_TOKEN: user }, stdin: "pipe", stdout: "pipe", stderr: "inherit" });
  const lines = prober.stdout.pipeThrough(new TextDecoderStream()).getReader();
  let out = "";
  while (!out.includes("ready\n")) {
    const { value, done } = await lines.read();
    if (done) throw new Error(`the prober ended: ${out}`);
    out += value;
  }
  await Bun.sleep(200);
  const result = await work();
  await Bun.sleep(200);
  prober.stdin.write("stop\n");
  await prober.stdin.end();
  for (;;) {
    const { value, done } = await lines.read();
    if (done) break;
    out += value;
  }
  const latencies = json<number[]>(out.trim().split("\n").at(-1)!).sort((x, y) => x - y);
  if (latencies[0]! < 0) throw new Error(`/v1/health answered ${-latencies[0]!}`);
  return { result, p99: latencies[Math.ceil(latencies.length * 0.99) - 1]!, max: latencies.at(-1)!, probes: latencies.length };
}

/** The worker polls once: the tasks it is handed now. */
async function handed(): Promise<{ id: string; job_id: string }[]> {
  const r = await asWorker(`/v1/workers/${worker.id}/tasks?wait=0`);
  expect(r.status).toBe(200);
  return json(await r.text()).tasks;
}

const finish = (taskId: string, state: "succeeded" | "failed", exit = state === "succeeded" ? 0 : 1) => asWorker(`/v1/tasks/${taskId}/finish`, { state, exit_code: exit, error: null });

beforeAll(async () => {
  const env = { ...box.env, GPULAYER_HOME: serverHome, GPULAYER_TOKEN: ADMIN, GPULAYER_WORKER_LOST_SECONDS: "600", GPULAYER_WORKER_LEASE: "1200" };
  const server = keepOutput(startCli(["server", "--listen", "127.0.0.1:0", "--json"], { env }), procs);
  url = await waitFor("the server", () => /"url": "([^"]+)"/.exec(server.out())?.[1]);
  const made = await cli(["server", "token", "create", "--role", "user", "--name", "alice", "--json"], { env: { ...box.env, GPULAYER_HOME: serverHome } });
  expect(made.code, made.stderr).toBe(0);
  user = json(made.stdout).token;
  const probe = { hostname: "stalls-box", os: "linux", arch: "x64", cpus: 1, memoryBytes: 1 << 30, gpus: [], python: { path: "/usr/bin/python3", version: "3.12.0" }, frameworks: {}, cuda: null, engine: null, probeMs: 1 };
  const r = await api("/v1/workers/register", ADMIN, { method: "POST", body: JSON.stringify({ name: "w1", labels: {}, slots: 4, probe }) });
  expect(r.status).toBe(201);
  worker = json(await r.text());
  // A server that has answered a few requests (its code compiled): what is measured is each request's own cost, not a cold start's.
  for (const s of [spec("warm"), chain(3)]) {
    const sub = await api("/v1/jobs", user, { method: "POST", body: submitBody(s) });
    expect(sub.status).toBe(201);
    const jobId = json(await sub.text()).id;
    const task = await waitFor("the warm-up task", async () => (await handed())[0]);
    expect((await asWorker(`/v1/tasks/${task.id}/events`, { events: [{ ts: Date.now(), type: "task.prepare.step", data: { step: "warm" } }] })).status).toBe(200);
    expect((await finish(task.id, "failed")).status).toBe(200);
    await waitFor("the warm-up job to end", async () => json((await (await api(`/v1/jobs/${jobId}`, user)).text())).state === "failed");
  }
}, T);

afterAll(async () => {
  await stopAll(procs);
  box.cleanup();
}, 30_000);

describe(`no request stalls the server (${serversOnPostgres ? "PostgreSQL" : "SQLite"}): /v1/health p99 under ${P99_MS} ms meanwhile`, () => {
  let envJob = "";

  test("a job whose env holds 16 values of 64 KiB of letters (1 MB) is accepted", async () => {
    const env = Object.fromEntries(Array.from({ length: 16 }, (_, i) => [`BIG_${i}`, letters(64 * 1024)]));
    const body = submitBody(spec("big-env", { env }));
    const { result, p99, max, probes } = await healthWhile(async () => {
      const r = await api("/v1/jobs", user, { method: "POST", body });
      return { status: r.status, doc: json(await r.text()) };
    });
    expect(result.status, JSON.stringify(result.doc)).toBe(201);
    envJob = result.doc.id;
    expect(p99, `p99 ${p99.toFixed(1)} ms, slowest ${max.toFixed(1)} ms over ${probes} probes`).toBeLessThan(P99_MS);
    const status = json((await (await api(`/v1/jobs/${envJob}`, user)).text()));
    expect(status.state).toBe("queued");
  }, T);

  test("one event of 256 KiB of letters from a worker's credential is kept cut to the event limit", async () => {
    const task = (await handed()).find((t) => t.job_id === envJob);
    expect(task).toBeDefined();
    const event = { ts: Date.now(), type: "task.prepare.step", data: { step: "resolve", detail: letters(256 * 1024) } };
    const { result, p99, max, probes } = await healthWhile(async () => {
      const r = await asWorker(`/v1/tasks/${task!.id}/events`, { events: [event] });
      return { status: r.status, text: await r.text() };
    });
    expect(result.status, result.text).toBe(200);
    expect(p99, `p99 ${p99.toFixed(1)} ms, slowest ${max.toFixed(1)} ms over ${probes} probes`).toBeLessThan(P99_MS);
    const kept = json((await (await api(`/v1/jobs/${envJob}`, user)).text())).events.find((e: { type: string }) => e.type === "task.prepare.step");
    expect(kept.data.step).toBe("resolve");
    expect(kept.data.detail.length).toBeLessThan(64 * 1024);
    expect(kept.data.detail).toContain("cut by the server");
    expect((await finish(task!.id, "succeeded")).status).toBe(200);
  }, T);

  test("a job of 1,000 tasks in a chain whose first task fails: its 999 skips are written without stalling anyone", async () => {
    const body = submitBody(chain(1000));
    const submitted = await healthWhile(async () => {
      const r = await api("/v1/jobs", user, { method: "POST", body });
      return { status: r.status, doc: json(await r.text()) };
    });
    expect(submitted.result.status, JSON.stringify(submitted.result.doc)).toBe(201);
    expect(submitted.p99, `submit: p99 ${submitted.p99.toFixed(1)} ms, slowest ${submitted.max.toFixed(1)} ms over ${submitted.probes} probes`).toBeLessThan(P99_MS);
    const jobId = submitted.result.doc.id;
    const first = await waitFor("the first task to be handed out", async () => (await handed())[0]);
    const failed = await healthWhile(async () => {
      const r = await finish(first.id, "failed", 3);
      return { status: r.status, text: await r.text() };
    });
    expect(failed.result.status, failed.result.text).toBe(200);
    expect(failed.p99, `skips: p99 ${failed.p99.toFixed(1)} ms, slowest ${failed.max.toFixed(1)} ms over ${failed.probes} probes`).toBeLessThan(P99_MS);
    const read = await healthWhile(async () => json((await (await api(`/v1/jobs/${jobId}`, user)).text())));
    expect(read.p99, `status: p99 ${read.p99.toFixed(1)} ms, slowest ${read.max.toFixed(1)} ms over ${read.probes} probes`).toBeLessThan(P99_MS);
    const status = read.result;
    expect(status.state).toBe("failed");
    expect(status.exit_code).toBe(3);
    const states = status.tasks.map((t: { state: string }) => t.state);
    expect(states[0]).toBe("failed");
    expect(states.slice(1).every((s: string) => s === "skipped")).toBe(true);
    expect(status.tasks[1].error).toBe("not started: t0, which it needs, failed");
    expect(status.tasks[999].error).toBe("not started: t998, which it needs, skipped");
  }, T);
});

describe("limits on what one request may hold: a clear 413 or 400 naming the limit", () => {
  test("a job request over coordinator.max_job (6.5 MB of env values) is refused with 413 before it is parsed", async () => {
    const env = Object.fromEntries(Array.from({ length: 100 }, (_, i) => [`BIG_${i}`, letters(64 * 1024)]));
    const body = submitBody(spec("too-big", { env }));
    const { result, p99, max, probes } = await healthWhile(async () => {
      const r = await api("/v1/jobs", user, { method: "POST", body });
      return { status: r.status, doc: json(await r.text()) };
    });
    expect(result.status).toBe(413);
    expect(result.doc.error).toMatch(/^job request too large: .* bytes, over the limit of 2 MiB \(coordinator\.max_job, GPULAYER_MAX_JOB_BYTES\)$/);
    expect(p99, `p99 ${p99.toFixed(1)} ms, slowest ${max.toFixed(1)} ms over ${probes} probes`).toBeLessThan(P99_MS);
  }, T);

  test("a job of more than 1,000 tasks is refused with 400", async () => {
    const r = await api("/v1/jobs", user, { method: "POST", body: submitBody(chain(1001)) });
    expect(r.status).toBe(400);
    expect(json(await r.text()).error).toBe("spec.tasks: at most 1000 tasks in a job (this one has 1001)");
  }, T);

  test("a job with two tasks of one name is refused with 400 naming the task", async () => {
    const s = { ...chain(3), tasks: [...chain(3).tasks, { name: "t1", needs: [], spec: spec("t1") }] };
    const r = await api("/v1/jobs", user, { method: "POST", body: submitBody(s) });
    expect(r.status).toBe(400);
    expect(json(await r.text()).error).toBe("spec.tasks: two tasks are named t1");
  }, T);

  test("a body nested 4 million levels deep is refused with 400 before it is parsed, without stalling the server", async () => {
    const body = `{"events": ${"[".repeat(4_000_000)}${"]".repeat(4_000_000)}}`;
    const { result, p99, max, probes } = await healthWhile(async () => {
      const r = await api(`/v1/workers/${worker.id}/heartbeat`, worker.credential, { method: "POST", body });
      return { status: r.status, text: await r.text() };
    });
    expect(result.status).toBe(400);
    expect(json(result.text).error).toBe("the body nests deeper than 64 levels");
    expect(p99, `p99 ${p99.toFixed(1)} ms, slowest ${max.toFixed(1)} ms over ${probes} probes`).toBeLessThan(P99_MS);
  }, T);

  test("an event still over 64 KiB once its long strings are cut is refused with 413", async () => {
    const sub = await api("/v1/jobs", user, { method: "POST", body: submitBody(spec("events")) });
    expect(sub.status).toBe(201);
    const jobId = json(await sub.text()).id;
    const task = await waitFor("the task to be handed out", async () => (await handed()).find((t) => t.job_id === jobId));
    const data = Object.fromEntries(Array.from({ length: 200 }, (_, i) => [`k${i}`, letters(4096)]));
    const r = await asWorker(`/v1/tasks/${task.id}/events`, { events: [{ ts: Date.now(), type: "task.prepare.step", data: { step: "small" } }, { ts: Date.now(), type: "task.prepare.step", data }] });
    expect(r.status).toBe(413);
    expect(json(await r.text()).error).toMatch(/^events\[1\] \(task\.prepare\.step\): .* bytes, over the limit of 64 KiB an event may hold$/);
    expect((await finish(task.id, "succeeded")).status).toBe(200);
  }, T);
});

describe("the job limit and the body limit", () => {
  test("a job limit past the body limit is refused at start, naming both (it would never be the one that refuses)", async () => {
    const r = await cli(["server", "--listen", "127.0.0.1:0"], { env: { ...box.env, GPULAYER_HOME: join(box.root, "limits-home"), GPULAYER_TOKEN: ADMIN, GPULAYER_MAX_JOB_BYTES: "16M" } });
    expect({ code: r.code, stderr: r.stderr.trim() }).toEqual({
      code: 2,
      stderr: "error: coordinator.max_job (GPULAYER_MAX_JOB_BYTES) must not be more than coordinator.max_body (GPULAYER_MAX_BODY_BYTES): a job's request is a JSON body",
    });
  });
});
