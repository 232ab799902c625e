import { afterAll, beforeAll, describe, expect, test } from "bun:test";
import { existsSync, mkdirSync, readFileSync, writeFileSync } from "node:fs";
import { join } from "node:path";
import { cli, sandbox, startCli } from "./helpers.ts";
import { type Kept, keepOutput, stopAll, waitFor } from "./fixtures/processes.ts";
import { hasPostgres, type Postgres, type PostgresDatabase, postgresDatabase } from "./fixtures/postgres.ts";

/**
 * Exactly once, under faults, on the database as users run it: three
 * `gpulayer server` replicas on one real PostgreSQL (fsync and
 * synchronous_commit on), three workers given every replica, and a few
 * hundred short jobs submitted by clients that try again when no replica can
 * serve them, as a user's script would. Meanwhile replicas are SIGKILLed and
 * the database is stopped (`pg_ctl stop -m immediate`) and started again, at
 * random moments. Afterwards, from the database: every job a client was
 * answered 201 for exists and succeeded, ran once (one line in the file
 * every job appends to, from the attempt whose task ended), and ended once.
 * One fault is also played on purpose: the database stopped just after a
 * job was handed to a worker that has yet to fetch the job's folder.
 */

const TOKEN = "durability-test-token-0123456789";
// A worker counts as lost only after a silence no fault here causes, and its jobs are given out again only after a lease no run lasts:
// so a job that runs twice is the coordinator's doing, never a lease that ran out on this loaded machine.
const SETTINGS = { GPULAYER_HEARTBEAT_SECONDS: "0.5", GPULAYER_WORKER_LOST_SECONDS: "15", GPULAYER_WORKER_LEASE: "120", GPULAYER_WORKER_ENGINE: "none", GPULAYER_CANCEL_GRACE: "1", GPULAYER_WORKER_DRAIN_SECONDS: "1" };
const JOBS = 200;
const SUBMITTERS = 6;
const T = 300_000;
const box = sandbox();
const procs: Kept[] = [];
const files = join(box.root, "shared-files");
const runs = join(box.root, "runs.txt");
let db: PostgresDatabase | undefined;
let pg: Postgres;
let database = "";
let sql: InstanceType<typeof Bun.SQL>;

/** A replica on a port of its own for the whole test: killed and started again, it is where its clients and workers look. */
interface Replica {
  i: number;
  port: number;
  kept: Kept | null;
}
const replicas: Replica[] = [];
const workers: Kept[] = [];
const urls = () => replicas.map((r) => `http://127.0.0.1:${r.port}`);

async function freePort(): Promise<number> {
  const s = Bun.listen({ hostname: "127.0.0.1", port: 0, socket: { data() {} } });
  const port = s.port;
  s.stop(true);
  return port;
}

const serves = async (r: Replica) => (await fetch(`http://127.0.0.1:${r.port}/v1/health`).catch(() => null))?.status === 200;

/** Start it and wait until it serves; a start while the database is down fails (it says so and exits), and is tried again. */
async function startReplica(r: Replica): Promise<void> {
  for (;;) {
    const kept = keepOutput(startCli(["server", "--listen", `127.0.0.1:${r.port}`, "--database", database, "--files", files], { env: { ...box.env, ...SETTINGS, GPULAYER_HOME: join(box.root, `replica-${r.i}`), GPULAYER_TOKEN: TOKEN } }), procs);
    r.kept = kept;
    let exited = false;
    void kept.proc.exited.then(() => (exited = true));
    while (!exited && !(await serves(r))) await Bun.sleep(100);
    if (!exited) return;
    await Bun.sleep(300);
  }
}

// The job writes which job and attempt ran it (its folder on the worker is named JOB-ATTEMPT): a retried submit's second job is told apart.
const SCRIPT = `basename "$PWD" >> ${runs}`;

/** One job, answered 201: on "cannot reach" or "no replica can serve it" (503) the submit is tried again, as a script would. */
async function submit(tries: { n: number }): Promise<string> {
  for (;;) {
    const r = await cli(["job", "run", "--detach", "--json", "--", "sh", "-c", SCRIPT], { env: { ...box.env, GPULAYER_SERVER: urls().join(","), GPULAYER_TOKEN: TOKEN }, cwd: box.root });
    if (r.code === 0) return (JSON.parse(r.stdout) as { id: string }).id;
    if (!/cannot reach|can serve it now/.test(r.stderr)) throw new Error(`a submit failed otherwise than for a fault: ${r.stderr}`);
    tries.n++;
    await Bun.sleep(200);
  }
}

const rand = (lo: number, hi: number) => lo + Math.random() * (hi - lo);

// A machine without PostgreSQL runs none of this; CI installs it and requires it (GPULAYER_TEST_REQUIRE_POSTGRES).
const suite = hasPostgres ? describe : describe.skip;

beforeAll(async () => {
  if (!hasPostgres) return;
  db = await postgresDatabase();
  ({ pg, database, sql } = db);
  mkdirSync(files, { recursive: true });
  for (let i = 0; i < 3; i++) replicas.push({ i, port: await freePort(), kept: null });
  await Promise.all(replicas.map(startReplica));
  for (let i = 0; i < 3; i++) {
    const mine = [...urls().slice(i), ...urls().slice(0, i)].join(",");
    const w = keepOutput(startCli(["join", mine, "--name", `w${i}`, "--python", "python3"], { env: { ...box.env, ...SETTINGS, GPULAYER_HOME: join(box.root, `w${i}-home`), GPULAYER_TOKEN: TOKEN } }), procs);
    await waitFor(`worker w${i}`, () => w.out().includes(`as w${i}`));
    workers.push(w);
  }
}, T);

afterAll(async () => {
  await stopAll(procs);
  await db?.close();
  box.cleanup();
}, 60_000);

suite("exactly once with replicas SIGKILLed and the database stopped at random moments", () => {
  test("the tests' PostgreSQL runs as a user's does: fsync, synchronous_commit and full_page_writes on", async () => {
    const on = await sql.unsafe("SELECT name, setting FROM pg_settings WHERE name IN ('fsync', 'synchronous_commit', 'full_page_writes') ORDER BY name");
    expect(on.map((r: { name: string; setting: string }) => `${r.name}=${r.setting}`)).toEqual(["fsync=on", "full_page_writes=on", "synchronous_commit=on"]);
  }, T);

  test("a replica on a database that acknowledges commits before they are on disk says so when it starts", async () => {
    const lax = await pg.database();
    const admin = new Bun.SQL(pg.url, { max: 1 });
    await admin.unsafe(`ALTER DATABASE ${new URL(lax).pathname.slice(1)} SET synchronous_commit = off`);
    await admin.close();
    const server = keepOutput(startCli(["server", "--listen", "127.0.0.1:0", "--database", lax, "--files", files], { env: { ...box.env, ...SETTINGS, GPULAYER_HOME: join(box.root, "replica-lax"), GPULAYER_TOKEN: TOKEN } }), procs);
    await waitFor("the replica on the lax database to start", () => server.out().includes("listening") || server.proc.exitCode !== null);
    server.proc.kill("SIGTERM");
    await server.proc.exited;
    expect(server.out()).toContain("warning: the database runs with synchronous_commit=off: if it crashes, jobs it answered for can be lost or run twice");
    for (const r of replicas) expect(r.kept!.out()).not.toContain("warning: the database");
  }, T);

  test("a job handed to a worker just before the database stops is not failed by the outage: the worker fetches its folder once a replica can serve again", async () => {
    // A folder no worker has yet: the worker that takes the job asks a replica for it first.
    const project = join(box.root, "project-outage");
    mkdirSync(project);
    writeFileSync(join(project, "data.txt"), `${crypto.randomUUID()}\n`);
    // The workers stopped: the job is handed out (its poll answered), but the worker acts on it only once the database is down.
    for (const w of workers) w.proc.kill("SIGSTOP");
    try {
      const r = await cli(["job", "run", "--detach", "--json", "--workdir", project, "--", "cat", "data.txt"], { env: { ...box.env, GPULAYER_SERVER: urls().join(","), GPULAYER_TOKEN: TOKEN }, cwd: box.root });
      expect(r.code).toBe(0);
      const id = (JSON.parse(r.stdout) as { id: string }).id;
      await waitFor("the job to be handed to a worker", async () => (await sql.unsafe("SELECT 1 FROM tasks WHERE job_id = $1 AND delivered = 1", [id])).length === 1);
      await pg.stop();
      for (const w of workers) w.proc.kill("SIGCONT");
      // The worker asks for the folder meanwhile, and every replica answers 503.
      await Bun.sleep(2_000);
      await pg.start();
      const row = await waitFor("the job to end", async () => (await sql.unsafe("SELECT state, error FROM jobs WHERE id = $1 AND state IN ('succeeded', 'failed', 'cancelled')", [id]))[0], 60_000);
      expect(row).toEqual({ state: "succeeded", error: null });
    } finally {
      for (const w of workers) w.proc.kill("SIGCONT");
    }
  }, T);

  test(`${JOBS} jobs through replica kills and database restarts: each answered job exists, ran once and ended once`, async () => {
    const since = Date.now();
    const answered: string[] = [];
    const tries = { n: 0 };
    let next = 0;
    const submitters = Array.from({ length: SUBMITTERS }, async () => {
      while (next < JOBS) {
        next++;
        answered.push(await submit(tries));
      }
    });
    let submitting = true;
    const faults = { kills: 0, stops: 0 };
    const restarts: Promise<void>[] = [];
    const chaos = (async () => {
      while (submitting) {
        await Bun.sleep(rand(1_500, 3_500));
        if (!submitting) break;
        // About as many replica kills as database restarts, in random order.
        const kill = faults.kills === faults.stops ? Math.random() < 0.5 : faults.kills < faults.stops;
        if (kill) {
          const up = replicas.filter((r) => r.kept && r.kept.proc.exitCode === null && r.kept.proc.signalCode === null);
          const r = up[Math.floor(Math.random() * up.length)];
          if (!r || up.length < 2) continue;
          r.kept!.proc.kill("SIGKILL");
          await r.kept!.proc.exited;
          faults.kills++;
          restarts.push(Bun.sleep(rand(200, 2_000)).then(() => startReplica(r)));
        } else {
          await pg.stop();
          faults.stops++;
          await Bun.sleep(rand(200, 1_500));
          await pg.start();
        }
      }
    })();
    try {
      await Promise.all(submitters);
    } finally {
      // Also when a submit failed: no fault and no replica started after the test.
      submitting = false;
      await chaos;
      await Promise.all(restarts);
    }
    console.error(`${answered.length} jobs answered 201; ${faults.kills} replica kills, ${faults.stops} database restarts, ${tries.n} submits tried again`);
    expect(faults.kills).toBeGreaterThan(0);
    expect(faults.stops).toBeGreaterThan(0);

    // Every replica serves again: those killed were started again, and all of them found the restarted database.
    for (const r of replicas) await waitFor(`replica ${r.i} to serve`, () => serves(r), 30_000);
    // A job answered 201 and lost to the database's restart never shows up: the jobs found are awaited, then the answered ones counted.
    const ended = await waitFor(
      "every answered job the database holds to end",
      async () => {
        const rows = (await sql.unsafe("SELECT id, state FROM jobs WHERE id = ANY($1::text[])", [answered])) as { id: string; state: string }[];
        return rows.every((r) => ["succeeded", "failed", "cancelled"].includes(r.state)) ? rows : null;
      },
      120_000,
    );
    const found = new Set(ended.map((r) => r.id));
    expect(answered.filter((id) => !found.has(id))).toEqual([]);
    // Not succeeded: what happened to it, from its row and its events, for the failure's message.
    const unlike = ended.filter((r) => r.state !== "succeeded").map((r) => r.id);
    const why = unlike.length ? await sql.unsafe("SELECT j.id, j.state, j.error, j.attempts, (SELECT string_agg(e.type || ' ' || e.data, ' | ' ORDER BY e.seq) FROM events e WHERE e.job_id = j.id) AS events FROM jobs j WHERE j.id = ANY($1::text[])", [unlike]) : [];
    // With what the replicas and workers said of it.
    expect(why.map((r: { id: string }) => ({ ...r, said: procs.flatMap((p) => p.out().split("\n").filter((line) => line.includes(r.id))) }))).toEqual([]);

    // Per job, from the database: its tasks (one per assignment), its assignments, its ends; and from the file, the attempts that ran.
    const tasks = (await sql.unsafe("SELECT job_id, attempt, state FROM tasks WHERE job_id = ANY($1::text[])", [answered])) as { job_id: string; attempt: number; state: string }[];
    const events = (await sql.unsafe("SELECT job_id, type, COUNT(*)::int AS n FROM events WHERE job_id = ANY($1::text[]) AND type IN ('job.assigned', 'task.run.started', 'task.run.finished') GROUP BY job_id, type", [answered])) as { job_id: string; type: string; n: number }[];
    const ran = existsSync(runs) ? readFileSync(runs, "utf8").split("\n").filter(Boolean) : [];
    const wrong: string[] = [];
    for (const id of answered) {
      const mine = tasks.filter((t) => t.job_id === id);
      const count = (type: string) => events.find((e) => e.job_id === id && e.type === type)?.n ?? 0;
      const runsOf = ran.filter((line) => line.startsWith(`${id}-`));
      const done = mine.filter((t) => t.state === "done");
      const problems = [
        runsOf.length !== 1 && `ran ${runsOf.length} times (${runsOf.join(", ")})`,
        done.length !== 1 && `${done.length} tasks ended`,
        done.length === 1 && runsOf.length === 1 && runsOf[0] !== `${id}-${done[0]!.attempt}` && `ran as ${runsOf[0]}, but attempt ${done[0]!.attempt} ended`,
        count("job.assigned") !== mine.length && `${count("job.assigned")} assignments for ${mine.length} tasks`,
        count("task.run.started") !== 1 && `started ${count("task.run.started")} times`,
        count("task.run.finished") !== 1 && `finished ${count("task.run.finished")} times`,
      ].filter(Boolean);
      if (problems.length) wrong.push(`${id}: ${problems.join("; ")} [tasks: ${mine.map((t) => `${t.attempt}:${t.state}`).join(" ")}]`);
    }
    expect(wrong).toEqual([]);
    const again = answered.filter((id) => tasks.filter((t) => t.job_id === id).length > 1).length;
    console.error(`${again} job(s) assigned more than once (a task handed out whose answer never reached its worker is given out again), each run once`);
    // The faults were the replicas' and the database's, never a worker's: none was declared lost for them.
    expect(((await sql.unsafe("SELECT name FROM workers WHERE state = 'lost'")) as { name: string }[]).map((w) => w.name)).toEqual([]);
    const orphans = (await sql.unsafe("SELECT COUNT(*)::int AS n FROM jobs WHERE created >= $2 AND NOT (id = ANY($1::text[]))", [answered, since]))[0].n as number;
    console.error(`${orphans} job(s) in the database that no client was answered for (a submit committed, its answer cut off, tried again)`);
    // Jobs never answered (a submit whose answer was cut off, then tried again) ran at most once too: no line appears twice.
    expect(ran.length).toBe(new Set(ran).size);
  }, T);
});
