import { afterAll, beforeAll, describe, expect, test } from "bun:test";
import { mkdirSync, readFileSync } from "node:fs";
import { join } from "node:path";
import { cli, sandbox, startCli } from "./helpers.ts";
import { type Kept, keepOutput, stopAll, waitFor } from "./fixtures/processes.ts";
import { hasPostgres, type Postgres, type PostgresDatabase, postgresDatabase } from "./fixtures/postgres.ts";
import { SCHEMA_VERSION } from "../src/server/db/migrations.ts";

/**
 * Several `gpulayer server` replicas on one real PostgreSQL, as processes on
 * 127.0.0.1: three started at the same moment against an empty database
 * (it is migrated once), four workers joined with all three URLs, jobs
 * submitted round-robin to the replicas. Each job runs exactly once; a
 * replica SIGKILLed while jobs are dispatched and streamed loses none of
 * them: the client following a job keeps getting its output from another
 * replica, and the workers move there. A worker that dies is declared lost
 * once, by one replica, not once per replica.
 */

const TOKEN = "replicas-test-token-0123456789";
const FAST = { GPULAYER_HEARTBEAT_SECONDS: "0.3", GPULAYER_WORKER_LOST_SECONDS: "2", GPULAYER_WORKER_LEASE: "4", GPULAYER_WORKER_ENGINE: "none", GPULAYER_CANCEL_GRACE: "1", GPULAYER_WORKER_DRAIN_SECONDS: "1" };
const T = 240_000;
const box = sandbox();
const procs: Kept[] = [];
let db: PostgresDatabase | undefined;
let pg: Postgres;
let database = "";
let sql: InstanceType<typeof Bun.SQL>;
const replicas: { url: string; kept: Kept }[] = [];
const workers: Kept[] = [];
const files = join(box.root, "shared-files");
const runs = join(box.root, "runs.txt");

const clientEnv = (server: string) => ({ ...box.env, GPULAYER_SERVER: server, GPULAYER_TOKEN: TOKEN });
const all = () => replicas.map((r) => r.url).join(",");

function startReplica(i: number): Kept {
  return keepOutput(
    startCli(["server", "--listen", "127.0.0.1:0", "--json", "--database", database, "--files", files], { env: { ...box.env, ...FAST, GPULAYER_HOME: join(box.root, `replica-${i}`), GPULAYER_TOKEN: TOKEN } }),
    procs,
  );
}

/** Each worker is given every replica, starting at a different one, so they talk to all three. */
function startWorker(i: number): Kept {
  const urls = replicas.map((r) => r.url);
  const mine = [...urls.slice(i % urls.length), ...urls.slice(0, i % urls.length)].join(",");
  return keepOutput(startCli(["join", mine, "--name", `w${i}`, "--python", "python3"], { env: { ...box.env, ...FAST, GPULAYER_HOME: join(box.root, `w${i}-home`), GPULAYER_TOKEN: TOKEN } }), procs);
}

async function submit(server: string, mark: string, script = `echo ${mark} >> ${runs}; echo out-${mark}`): Promise<string> {
  const r = await cli(["job", "run", "--detach", "--json", "--", "sh", "-c", script], { env: clientEnv(server), cwd: box.root });
  if (r.code !== 0) throw new Error(`submit ${mark}: ${r.stderr}`);
  return (JSON.parse(r.stdout) as { id: string }).id;
}

const ended = async (ids: string[]) => {
  const rows = await sql.unsafe(`SELECT id, state FROM jobs WHERE id = ANY($1::text[])`, [ids]);
  return rows.length === ids.length && rows.every((r: { state: string }) => ["succeeded", "failed", "cancelled"].includes(r.state)) ? rows : null;
};

// A machine without PostgreSQL runs none of this; CI installs it and requires it (GPULAYER_TEST_REQUIRE_POSTGRES).
const suite = hasPostgres ? describe : describe.skip;

beforeAll(async () => {
  if (!hasPostgres) return;
  db = await postgresDatabase();
  ({ pg, database, sql } = db);
  mkdirSync(files, { recursive: true });
  // Three replicas at once against the empty database: one migrates, the others wait for it and find it done.
  const kept = [0, 1, 2].map(startReplica);
  for (const k of kept) replicas.push({ kept: k, url: await waitFor("a replica", () => /"url": "([^"]+)"/.exec(k.out())?.[1]) });
  for (let i = 0; i < 4; i++) workers.push(startWorker(i));
  for (const [i, w] of workers.entries()) await waitFor(`worker w${i}`, () => w.out().includes(`as w${i}`));
}, T);

afterAll(async () => {
  await stopAll(procs);
  await db?.close();
  box.cleanup();
}, 60_000);

suite("server replicas on one PostgreSQL", () => {
  test("replicas that started together migrated the database once, and each says which replica it is", async () => {
    const versions = await sql.unsafe("SELECT version FROM schema_migrations ORDER BY version");
    expect(versions.map((r: { version: number }) => Number(r.version))).toEqual(Array.from({ length: SCHEMA_VERSION }, (_, i) => i + 1));
    const names = replicas.map((r) => JSON.parse(r.kept.out().slice(r.kept.out().indexOf("{"), r.kept.out().indexOf("}") + 1)).replica as string);
    expect(new Set(names).size).toBe(3);
    for (const r of replicas) {
      const health = await fetch(`${r.url}/v1/health`, { headers: { authorization: `Bearer ${TOKEN}` } });
      expect(health.status).toBe(200);
      expect(await health.json()).toMatchObject({ ok: true, database: "ok" });
      // The database's password never reaches what the server prints.
      expect(r.kept.out()).not.toContain("gpl:");
    }
  }, T);

  test("a token made with `server token create --database` works at every replica; a dashboard session made at one is good at the others", async () => {
    const made = await cli(["server", "token", "create", "--role", "user", "--name", "alice", "--database", database], { env: { ...box.env, GPULAYER_HOME: join(box.root, "admin") } });
    expect(made.code).toBe(0);
    const alice = made.stdout.trim();
    for (const r of replicas) expect((await cli(["job", "list"], { env: { ...clientEnv(r.url), GPULAYER_TOKEN: alice }, cwd: box.root })).code).toBe(0);
    const login = await fetch(`${replicas[0]!.url}/login`, { method: "POST", redirect: "manual", body: new URLSearchParams({ token: alice }), headers: { "content-type": "application/x-www-form-urlencoded", origin: replicas[0]!.url } });
    expect(login.status).toBe(303);
    const cookie = (login.headers.get("set-cookie") ?? "").split(";")[0]!;
    for (const r of replicas.slice(1)) {
      const page = await fetch(`${r.url}/jobs`, { headers: { cookie }, redirect: "manual" });
      expect(page.status).toBe(200);
      expect(await page.text()).toContain("Jobs");
    }
    // Revoked through the database: refused at every replica, its session ended.
    expect((await cli(["server", "token", "revoke", "alice", "--database", database], { env: { ...box.env, GPULAYER_HOME: join(box.root, "admin") } })).code).toBe(0);
    for (const r of replicas) expect((await fetch(`${r.url}/v1/jobs`, { headers: { authorization: `Bearer ${alice}` } })).status).toBe(401);
    expect((await fetch(`${replicas[2]!.url}/jobs`, { headers: { cookie }, redirect: "manual" })).status).toBe(303);
  }, T);

  test("100 jobs submitted round-robin to three replicas: each runs exactly once, none is lost", async () => {
    const ids: string[] = [];
    for (let batch = 0; batch < 10; batch++) {
      ids.push(...(await Promise.all(Array.from({ length: 10 }, (_, k) => submit(replicas[(batch * 10 + k) % 3]!.url, `job-${batch * 10 + k}`)))));
    }
    const rows = await waitFor("the 100 jobs to end", () => ended(ids), 180_000);
    expect(rows.filter((r: { state: string }) => r.state !== "succeeded")).toEqual([]);
    // Run once each: one line per job in the file they all append to.
    const lines = readFileSync(runs, "utf8").trim().split("\n");
    expect(lines.length).toBe(100);
    expect(new Set(lines).size).toBe(100);
    // Dispatched once each: one assignment, and one more only for each time the job was given out again. On this loaded
    // machine a worker building its first env can go silent past the 4 s lease; its job then goes elsewhere, and the
    // stalled worker, awake, asks before running it (test/cluster-partition.test.ts), so the lines above stay 100.
    const assigned = await sql.unsafe(
      "SELECT job_id, SUM(CASE WHEN type = 'job.assigned' THEN 1 ELSE 0 END)::int AS a, SUM(CASE WHEN type = 'job.requeued' THEN 1 ELSE 0 END)::int AS r FROM events WHERE type IN ('job.assigned', 'job.requeued') AND job_id = ANY($1::text[]) GROUP BY job_id",
      [ids],
    );
    expect(assigned.length).toBe(100);
    expect(assigned.filter((row: { a: number; r: number }) => row.a !== row.r + 1)).toEqual([]);
    // Work went to every worker, whichever replica took the job.
    const by = await sql.unsafe("SELECT DISTINCT worker_id FROM jobs WHERE id = ANY($1::text[])", [ids]);
    expect(by.length).toBeGreaterThan(1);
  }, T);

  test("a replica SIGKILLed while jobs are dispatched and streamed: every job ends, the follower keeps the output, workers move", async () => {
    const [first, ...rest] = replicas;
    // A client following a job through the first replica (the first of its list).
    const script = `for i in $(seq 1 30); do echo line-$i; sleep 0.1; done`;
    const follower = keepOutput(startCli(["job", "run", "--", "sh", "-c", script], { env: clientEnv(all()), cwd: box.root }), procs);
    // And one following a job submitted elsewhere, with `job logs --follow`, also through the first replica.
    const detached = await submit(rest[0]!.url, "streamed", script.replace(/line-/g, "row-"));
    const logs = keepOutput(startCli(["job", "logs", detached, "--follow"], { env: clientEnv(all()), cwd: box.root }), procs);
    await waitFor("the first lines through the first replica", () => follower.out().includes("line-3") && logs.out().includes("row-3"));
    const more = await Promise.all(Array.from({ length: 12 }, (_, k) => submit(rest[k % 2]!.url, `late-${k}`)));
    first!.kept.proc.kill("SIGKILL");
    await first!.kept.proc.exited;
    expect(await follower.proc.exited).toBe(0);
    const lines = follower.out().split("\n").filter((l) => /^line-\d+$/.test(l));
    expect(lines).toEqual(Array.from({ length: 30 }, (_, i) => `line-${i + 1}`));
    expect(await logs.proc.exited).toBe(0);
    expect(logs.out().split("\n").filter((l) => /^row-\d+$/.test(l))).toEqual(Array.from({ length: 30 }, (_, i) => `row-${i + 1}`));
    const rows = await waitFor("the jobs submitted around the kill to end", () => ended(more), 120_000);
    expect(rows.filter((r: { state: string }) => r.state !== "succeeded")).toEqual([]);
    // The worker that talked to the dead replica moved to another one, and none was declared lost.
    await waitFor("w0 to move", () => workers[0]!.out().includes("now talking to"));
    expect((await sql.unsafe("SELECT name FROM workers WHERE state = 'lost'")).length).toBe(0);
    // The dead replica's clients find another: submitting with the whole list works.
    const after = await submit(all(), "after-kill");
    await waitFor("the job after the kill", () => ended([after]));
  }, T);

  test("a worker that dies is declared lost once, by one replica", async () => {
    const w3 = workers[3]!;
    // Only what the replicas say from now: on this loaded machine a worker may have been lost for a moment before
    // (past the 2 s window while a replica died) and come back, which its logs rightly tell.
    const before = replicas.map((r) => r.kept.out().length);
    w3.proc.kill("SIGKILL");
    await w3.proc.exited;
    await waitFor("w3 to be lost", async () => (await sql.unsafe("SELECT 1 FROM workers WHERE name = 'w3' AND state = 'lost'")).length === 1, 20_000);
    await Bun.sleep(1_500);
    const told = replicas.map((r, i) => r.kept.out().slice(before[i]).split("\n").filter((l) => l.includes("worker w3 lost")).length);
    expect(told.reduce((a, b) => a + b, 0)).toBe(1);
  }, T);

  test("a replica with another token is refused while others serve; `server token` in a replica's home without --database says where the tokens are", async () => {
    const other = await cli(["server", "--listen", "127.0.0.1:0", "--database", database, "--files", files], { env: { ...box.env, ...FAST, GPULAYER_HOME: join(box.root, "replica-odd"), GPULAYER_TOKEN: "another-token-0123456789abc" } });
    expect(other.code).toBe(1);
    expect(other.stderr).toMatch(/^error: replica \S+ on postgres:\/\/127\.0\.0\.1:\d+\/\w+ \(heard from [\d.]+ s ago\) uses another token: every replica needs the same one/);
    expect(other.stderr.split("\n").filter(Boolean)).toHaveLength(1);
    const local = await cli(["server", "token", "list"], { env: { ...box.env, GPULAYER_HOME: join(box.root, "replica-1") } });
    expect(local.code).toBe(2);
    expect(local.stderr).toContain("keeps its state in postgres://");
    expect(local.stderr).toContain("give that database with --database");
    // A load balancer's probe needs no token and learns only whether the replica serves.
    const probe = await fetch(`${replicas[1]!.url}/v1/health`);
    expect([probe.status, await probe.json()]).toEqual([200, { ok: true }]);
    expect((await fetch(`${replicas[1]!.url}/v1/health`, { headers: { authorization: "Bearer wrong-token-000000000000" } })).status).toBe(401);
  }, T);

  test("a replica whose database goes away says so and takes no work; it takes work again once the database answers, and no worker was lost for it", async () => {
    const live = replicas[1]!;
    const logged = replicas.slice(1).map((r) => r.kept.out().length);
    await pg.stop();
    await waitFor("the replica to notice", () => live.kept.out().includes("lost the database"), 20_000);
    const health = await fetch(`${live.url}/v1/health`, { headers: { authorization: `Bearer ${TOKEN}` } });
    expect(health.status).toBe(503);
    expect(await health.json()).toMatchObject({ ok: false, database: expect.stringContaining("unreachable") });
    expect([(await fetch(`${live.url}/v1/health`)).status]).toEqual([503]);
    const refused = await cli(["job", "list"], { env: clientEnv(live.url), cwd: box.root });
    expect(refused.code).not.toBe(0);
    expect(refused.stderr).toContain("cannot reach its database");
    // Longer than a worker may be silent (2 s): their beats are refused meanwhile, and that is no silence of theirs.
    await Bun.sleep(3_000);
    await pg.start();
    await waitFor("the replica to take work again", () => live.kept.out().includes("the database answers again"), 30_000);
    const id = await submit(live.url, "after-outage");
    const rows = await waitFor("the job after the database came back", () => ended([id]), 60_000);
    expect(rows[0].state).toBe("succeeded");
    await Bun.sleep(1_500);
    const since = replicas.slice(1).map((r, i) => r.kept.out().slice(logged[i]));
    expect(since.filter((text) => /worker w\d lost/.test(text))).toEqual([]);
    expect((await sql.unsafe("SELECT name FROM workers WHERE state = 'lost' AND name <> 'w3'")).length).toBe(0);
  }, T);
});
