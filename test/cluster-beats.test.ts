import { afterAll, beforeAll, describe, expect, test } from "bun:test";
import { join } from "node:path";
import { sandbox, startCli } from "./helpers.ts";
import { type Kept, keepOutput, stopAll, waitFor } from "./fixtures/processes.ts";
import { hasPostgres, type PostgresDatabase, postgresDatabase } from "./fixtures/postgres.ts";
import { WRITER_LOCK } from "../src/server/db/postgres.ts";

/**
 * A worker's beat and the writer lock, on a real `gpulayer server` on
 * PostgreSQL. This test holds the lock itself (as another replica does
 * mid-dispatch): an idle worker's beat is answered meanwhile, the lock not
 * needed to say it is alive. A worker declared lost still comes back by
 * the locked path: it keeps its task and the job says it is back. The
 * worker is this test speaking the workers' API with its credential.
 */

const ADMIN = "beats-test-admin-token-0123456789";
const T = 120_000;
const box = sandbox();
const procs: Kept[] = [];
let db: PostgresDatabase | undefined;
let sql: InstanceType<typeof Bun.SQL>;
let url = "";
let worker = { id: "", credential: "" };

const json = <T = any>(text: string): T => JSON.parse(text) as T;
const api = (path: string, token: string, init: { method?: string; body?: string } = {}) => fetch(`${url}${path}`, { ...init, headers: { authorization: `Bearer ${token}`, "content-type": "application/json" } });
const asWorker = (path: string, body?: unknown) => api(path, worker.credential, body === undefined ? {} : { method: "POST", body: JSON.stringify(body) });
const beat = (running: string[]) => asWorker(`/v1/workers/${worker.id}/heartbeat`, { running, free_gpus: [] });
const workerState = async () => (await sql.unsafe("SELECT state, last_seen FROM workers WHERE id = $1", [worker.id]))[0] as { state: string; last_seen: number };

/** `work` while this test holds the coordinator's writer lock: what it gave back before the lock was let go, or "waiting" after 10 s. */
async function underWriterLock<R>(work: () => Promise<R>): Promise<R | "waiting"> {
  return (await sql.begin(async (tx) => {
    await tx.unsafe("SELECT pg_advisory_xact_lock($1)", [WRITER_LOCK]);
    return Promise.race([work(), Bun.sleep(10_000).then(() => "waiting" as const)]);
  })) as R | "waiting";
}

// Skipped only without a PostgreSQL to start (the beats under test are PostgreSQL's); CI sets GPULAYER_TEST_REQUIRE_POSTGRES, so there it never skips.
const suite = hasPostgres ? describe : describe.skip;

beforeAll(async () => {
  if (!hasPostgres) return;
  db = await postgresDatabase();
  ({ sql } = db);
  const { database } = db;
  const env = { ...box.env, GPULAYER_HOME: join(box.root, "server-home"), GPULAYER_TOKEN: ADMIN, GPULAYER_HEARTBEAT_SECONDS: "0.5", GPULAYER_WORKER_LOST_SECONDS: "2", GPULAYER_WORKER_LEASE: "600" };
  const server = keepOutput(startCli(["server", "--listen", "127.0.0.1:0", "--json", "--database", database, "--files", join(box.root, "files")], { env }), procs);
  url = await waitFor("the server", () => /"url": "([^"]+)"/.exec(server.out())?.[1]);
  const probe = { hostname: "beats-box", os: "linux", arch: "x64", cpus: 1, memoryBytes: 1 << 30, gpus: [], python: { path: "/usr/bin/python3", version: "3.12.0" }, frameworks: {}, cuda: null, engine: null, probeMs: 1 };
  const r = await api("/v1/workers/register", ADMIN, { method: "POST", body: JSON.stringify({ name: "w1", labels: {}, slots: 1, probe }) });
  expect(r.status).toBe(201);
  worker = json(await r.text());
}, T);

afterAll(async () => {
  await stopAll(procs);
  await db?.close();
  box.cleanup();
}, 60_000);

suite("a worker's beat and the writer lock (PostgreSQL)", () => {
  test("while another holds the writer lock, an idle worker's beat is answered and the server has its sign of life", async () => {
    expect((await beat([])).status).toBe(200);
    const before = Number((await workerState()).last_seen);
    await Bun.sleep(5);
    const answered = await underWriterLock(async () => {
      const r = await beat([]);
      return { status: r.status, body: json(await r.text()), seen: await workerState() };
    });
    expect(answered).not.toBe("waiting");
    if (answered === "waiting") return;
    expect(answered.status).toBe(200);
    expect(answered.body).toEqual({ cancel: [] });
    expect(answered.seen.state).toBe("idle");
    expect(Number(answered.seen.last_seen)).toBeGreaterThan(before);
  }, T);

  test("a worker declared lost beats again: it is back by the locked path, keeps its task, and the job says so", async () => {
    const spec = { name: "kept", argv: ["true"], commandText: "true", env: {}, environment: { specs: [], extraIndexUrls: [], findLinks: [] }, resources: { gpus: 0, frameworks: {} } };
    const sub = await api("/v1/jobs", ADMIN, { method: "POST", body: JSON.stringify({ spec, bundle: null, labels: {}, workdir: "/tmp" }) });
    expect(sub.status).toBe(201);
    const jobId = json(await sub.text()).id;
    const task = await waitFor("the task", async () => json((await (await asWorker(`/v1/workers/${worker.id}/tasks?wait=0`)).text())).tasks[0]);
    // Silent past GPULAYER_WORKER_LOST_SECONDS: lost, its task still its own (the lease is long).
    await waitFor("the worker to be lost", async () => (await workerState()).state === "lost", 15_000);
    const r = await beat([task.id]);
    expect(r.status).toBe(200);
    expect(json(await r.text())).toEqual({ cancel: [] });
    expect((await workerState()).state).toBe("idle");
    const events = json((await (await api(`/v1/jobs/${jobId}`, ADMIN)).text())).events.map((e: { type: string }) => e.type);
    expect(events).toContain("job.worker_lost");
    expect(events).toContain("job.worker_back");
    expect((await asWorker(`/v1/tasks/${task.id}/finish`, { state: "succeeded", exit_code: 0, error: null })).status).toBe(200);
    expect(json((await (await api(`/v1/jobs/${jobId}`, ADMIN)).text())).state).toBe("succeeded");
  }, T);
});
