import { afterAll, beforeAll, describe, expect, test } from "bun:test";
import { mkdirSync } from "node:fs";
import { join } from "node:path";
import { cli, sandbox, startCli } from "./helpers.ts";
import { type Kept, keepOutput, stopAll, waitFor } from "./fixtures/processes.ts";
import { hasPostgres, type PostgresDatabase, postgresDatabase } from "./fixtures/postgres.ts";
import { machineProbe } from "./fixtures/fleet-rows.ts";

/**
 * Two `gpulayer server` replicas on one real PostgreSQL; a worker joined to
 * the first alone, its long poll waiting there. A job submitted to the second
 * is handed to that worker there, and the first hears of it by a NOTIFY. Here
 * the first's listening connection is cut (pg_terminate_backend, again as
 * soon as it is back) until the task is handed out, so the NOTIFY is lost:
 * the worker still gets its task within a few seconds, not at the end of its
 * 25-second poll, as the first replica looks again at its waiting polls.
 * A worker's credential, kept a few seconds by each replica it is presented
 * to, stops working there as soon as the worker joins again at the other
 * (a new credential), and gets nothing done there even when that news is
 * lost too: each change compares it with the worker's own under its lock.
 */

const TOKEN = "wakeups-test-token-0123456789";
const FAST = { GPULAYER_HEARTBEAT_SECONDS: "0.5", GPULAYER_WORKER_LOST_SECONDS: "20", GPULAYER_WORKER_ENGINE: "none" };
const box = sandbox();
const procs: Kept[] = [];
let db: PostgresDatabase | undefined;
let database = "";
let sql: InstanceType<typeof Bun.SQL>;
const urls: string[] = [];
const files = join(box.root, "shared-files");

function startReplica(i: number): Kept {
  return keepOutput(startCli(["server", "--listen", "127.0.0.1:0", "--json", "--database", database, "--files", files], { env: { ...box.env, ...FAST, GPULAYER_HOME: join(box.root, `replica-${i}`), GPULAYER_TOKEN: TOKEN } }), procs);
}

// A machine without PostgreSQL runs none of this; CI installs it and requires it (GPULAYER_TEST_REQUIRE_POSTGRES).
const suite = hasPostgres ? describe : describe.skip;

beforeAll(async () => {
  if (!hasPostgres) return;
  db = await postgresDatabase();
  ({ database, sql } = db);
  mkdirSync(files, { recursive: true });
  for (const i of [0, 1]) {
    const kept = startReplica(i);
    urls.push(await waitFor("a replica", () => /"url": "([^"]+)"/.exec(kept.out())?.[1]));
  }
  const worker = keepOutput(startCli(["join", urls[0]!, "--name", "w0", "--python", "python3"], { env: { ...box.env, ...FAST, GPULAYER_HOME: join(box.root, "w0-home"), GPULAYER_TOKEN: TOKEN } }), procs);
  await waitFor("the worker", () => worker.out().includes("as w0"));
}, 120_000);

afterAll(async () => {
  await stopAll(procs);
  await db?.close();
  box.cleanup();
}, 60_000);

const submit = async (): Promise<string> => {
  const r = await cli(["job", "run", "--detach", "--json", "--", "echo", "ran"], { env: { ...box.env, GPULAYER_SERVER: urls[1]!, GPULAYER_TOKEN: TOKEN }, cwd: box.root });
  expect(r.code, r.stderr).toBe(0);
  return (JSON.parse(r.stdout) as { id: string }).id;
};
const ended = (id: string) => waitFor("the job's end", async () => (await sql.unsafe("SELECT state FROM jobs WHERE id = $1 AND state IN ('succeeded', 'failed', 'cancelled')", [id]))[0]?.state as string | undefined, 30_000);

suite("a wake-up between replicas lost with the listening connection", () => {
  test("the worker polling at the other replica gets its task within seconds, not at its poll's end", async () => {
    // A first job, heard of as usual: the worker's next poll starts as it takes it, so it has 25 s to wait when the next comes.
    expect(await ended(await submit())).toBe("succeeded");
    // Every replica's LISTEN connection cut, and cut again as it comes back, until the task is handed out.
    let cutting = true;
    const cuts = (async () => {
      while (cutting) {
        await sql.unsafe("SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = current_database() AND query ILIKE 'LISTEN%' AND pid <> pg_backend_pid()");
        await Bun.sleep(20);
      }
    })();
    let handedAt = 0;
    try {
      const id = await submit();
      await waitFor("the task handed to w0", async () => (await sql.unsafe("SELECT 1 FROM tasks WHERE job_id = $1", [id])).length > 0, 20_000);
      handedAt = Date.now();
      cutting = false;
      await cuts;
      expect(await ended(id)).toBe("succeeded");
      // The worker's poll would have waited out its 25 s; looked at again, it is answered within the second.
      expect(Date.now() - handedAt).toBeLessThan(5_000);
    } finally {
      cutting = false;
      await cuts;
    }
  }, 60_000);

  /** A worker as the protocol sees it, joined through `url` (again, with `resume`). */
  const join = async (url: string, name: string, resume?: { id: string; credential: string }) => {
    const r = await fetch(`${url}/v1/workers/register`, { method: "POST", headers: { authorization: `Bearer ${TOKEN}`, "content-type": "application/json" }, body: JSON.stringify({ name, labels: {}, slots: 1, probe: machineProbe(`host-${name}`), ...(resume ? { resume: { id: resume.id, credential: resume.credential } } : {}) }) });
    const body = (await r.json()) as { id: string; credential: string; error?: string };
    expect([r.status, body.error]).toEqual([201, undefined]);
    return { id: body.id, credential: body.credential };
  };
  const beat = async (url: string, w: { id: string; credential: string }) => (await fetch(`${url}/v1/workers/${w.id}/heartbeat`, { method: "POST", headers: { authorization: `Bearer ${w.credential}`, "content-type": "application/json" }, body: JSON.stringify({ running: [] }) })).status;

  // A worker heard from this recently is taken for still running, and not joined again (register.ts liveWindowMs).
  const LIVE_MS = 1_600;

  test("a worker's credential, replaced as it joins again at one replica, is refused at the other at once", async () => {
    const first = await join(urls[1]!, "restarted");
    expect(await beat(urls[0]!, first)).toBe(200); // now kept at replica 0, for seconds
    await Bun.sleep(LIVE_MS);
    const again = await join(urls[1]!, "restarted", first);
    const joinedAt = Date.now();
    expect(again.id).toBe(first.id);
    await waitFor("the old credential refused at replica 0", async () => (await beat(urls[0]!, first)) === 401, 10_000);
    // The news travels as a NOTIFY: a moment, not the seconds a credential is kept.
    expect(Date.now() - joinedAt).toBeLessThan(1_000);
    expect(await beat(urls[0]!, again)).toBe(200);
  }, 60_000);

  test("with that news lost too (the listening connections cut), the old credential still gets nothing done: each change compares it with the worker's own", async () => {
    const first = await join(urls[1]!, "restarted-unheard");
    let cutting = true;
    const cuts = (async () => {
      while (cutting) {
        await sql.unsafe("SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = current_database() AND query ILIKE 'LISTEN%' AND pid <> pg_backend_pid()");
        await Bun.sleep(20);
      }
    })();
    try {
      expect(await beat(urls[0]!, first)).toBe(200); // kept at replica 0 for seconds, and its news will not come
      await Bun.sleep(LIVE_MS);
      await join(urls[1]!, "restarted-unheard", first);
      const freeGpus = async () => (await sql.unsafe("SELECT free_gpus FROM workers WHERE id = $1", [first.id]))[0].free_gpus as string;
      const before = await freeGpus();
      const old = await fetch(`${urls[0]!}/v1/workers/${first.id}/heartbeat`, { method: "POST", headers: { authorization: `Bearer ${first.credential}`, "content-type": "application/json" }, body: JSON.stringify({ running: [], free_gpus: [7, 7, 7] }) });
      expect(old.status).toBe(401);
      expect(await freeGpus()).toBe(before);
      const report = await fetch(`${urls[0]!}/v1/tasks/no-such-task/events`, { method: "POST", headers: { authorization: `Bearer ${first.credential}`, "content-type": "application/json" }, body: JSON.stringify({ seq: 1, events: [{ ts: Date.now(), type: "task.run.started", data: {} }] }) });
      expect(report.status).toBe(401);
    } finally {
      cutting = false;
      await cuts;
    }
  }, 60_000);
});
