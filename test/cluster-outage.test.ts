import { afterAll, beforeAll, describe, expect, test } from "bun:test";
import { existsSync, mkdirSync, writeFileSync } from "node:fs";
import { join } from "node:path";
import { cli, sandbox, startCli } from "./helpers.ts";
import { type Kept, keepOutput, stopAll, waitFor } from "./fixtures/processes.ts";

/**
 * A final state always delivered: a server and a worker as processes on
 * 127.0.0.1, the server SIGKILLed while a job runs and kept down for many
 * times the worker-lost window (2 s here), the job ending meanwhile. The
 * worker keeps what it owes on disk and delivers it when the server is back;
 * the server counts its own downtime as no worker's silence; the client that
 * followed the job resumes and exits with the job's code. Then the worker
 * itself is killed during the outage with the job's end undelivered: started
 * again, it delivers that first. Every line arrives once, and no job runs
 * twice.
 */

const TOKEN = "outage-test-token-0123456789";
const FAST = { GPULAYER_HEARTBEAT_SECONDS: "0.3", GPULAYER_WORKER_LOST_SECONDS: "2", GPULAYER_WORKER_ENGINE: "none", GPULAYER_CANCEL_GRACE: "1", GPULAYER_WORKER_DRAIN_SECONDS: "1" };
const T = 120_000;
const box = sandbox();
const procs: Kept[] = [];
let url = "";
let port = 0;
let server: Kept;
let worker: Kept;

const env = () => ({ ...box.env, GPULAYER_SERVER: url, GPULAYER_TOKEN: TOKEN });
const gpl = (args: string[]) => cli(args, { env: env(), cwd: box.root });
const json = <T = any>(text: string): T => JSON.parse(text) as T;

async function startServer(): Promise<void> {
  server = keepOutput(startCli(["server", "--listen", `127.0.0.1:${port}`, "--json"], { env: { ...box.env, ...FAST, GPULAYER_HOME: join(box.root, "server-home"), GPULAYER_TOKEN: TOKEN } }), procs);
  url = await waitFor("the server", () => /"url": "([^"]+)"/.exec(server.out())?.[1]);
  port = Number(new URL(url).port);
}

async function stopServer(): Promise<void> {
  server.proc.kill("SIGKILL");
  await server.proc.exited;
}

function startWorker(): Kept {
  return keepOutput(startCli(["join", url, "--name", "w1", "--python", "python3"], { env: { ...box.env, ...FAST, GPULAYER_HOME: join(box.root, "w1-home"), GPULAYER_TOKEN: TOKEN } }), procs);
}

/** A job printing `n` numbered lines, then waiting for `release` to exist, then `n` more. */
const job = (release: string, n = 12) => ["--", "sh", "-c", `for i in $(seq 1 ${n}); do echo line-$i; done; while [ ! -e ${release} ]; do sleep 0.1; done; for i in $(seq ${n + 1} ${2 * n}); do echo line-$i; done`];
const expected = (n = 12) => Array.from({ length: 2 * n }, (_, i) => `line-${i + 1}`);

beforeAll(async () => {
  await startServer();
  worker = startWorker();
  await waitFor("the worker", () => worker.out().includes("as w1"));
}, T);

afterAll(async () => {
  await stopAll(procs);
  box.cleanup();
}, 30_000);

describe("the server stopped (SIGTERM) while a client follows a job", () => {
  test("stops cleanly: no internal error from the long poll the stop cut off; started again, the job ends and the client with it", async () => {
    const release = join(box.root, "release-sigterm");
    const follower = keepOutput(startCli(["job", "run", ...job(release)], { env: env(), cwd: box.root }), procs);
    await waitFor("the first half of the output", () => follower.out().includes("line-12"));
    server.proc.kill("SIGTERM");
    expect(await server.proc.exited).toBe(0);
    // Its output read to the end (the pipes may close after the exit is seen).
    const stopped = server;
    await Bun.sleep(300);
    expect(stopped.out()).not.toContain("internal error");
    await startServer();
    Bun.write(release, "");
    expect(await follower.proc.exited).toBe(0);
  }, T);
});

describe("the server down for a long while as a job ends", () => {
  test("the job's end and every line arrive once; the client that followed it exits 0", async () => {
    const release = join(box.root, "release-1");
    const follower = startCli(["job", "run", ...job(release)], { env: env(), cwd: box.root });
    let out = "";
    let err = "";
    const reading = Promise.all([
      (async () => {
        for await (const c of follower.stdout) out += new TextDecoder().decode(c);
      })(),
      (async () => {
        for await (const c of follower.stderr) err += new TextDecoder().decode(c);
      })(),
    ]);
    await waitFor("the first half of the output", () => out.includes("line-12"));
    await stopServer();
    Bun.write(release, "");
    // Long past the worker-lost window, and the job has ended meanwhile.
    await Bun.sleep(8000);
    await startServer();
    const code = await follower.exited;
    await reading;
    expect(err).toContain("the server does not answer");
    expect(code).toBe(0);
    expect(out.trim().split("\n")).toEqual(expected());
    const [j] = json<any[]>((await gpl(["job", "list", "--json", "--limit", "1"])).stdout);
    expect(j.state).toBe("succeeded");
    expect(j.attempts).toBe(1);
    expect((await gpl(["job", "logs", j.id])).stdout.trim().split("\n")).toEqual(expected());
  }, T);
});

describe("job logs --follow started during an outage", () => {
  test("waits for the server, prints every line once, and exits with the job's own code", async () => {
    const release = join(box.root, "release-logs");
    const id = (await gpl(["job", "run", "-d", "--", "sh", "-c", `echo first; while [ ! -e ${release} ]; do sleep 0.1; done; echo last; exit 7`])).stdout.trim();
    await waitFor("the job to run", async () => (await gpl(["job", "logs", id])).stdout.includes("first"));
    await stopServer();
    const follower = startCli(["job", "logs", id, "--follow"], { env: env(), cwd: box.root });
    const [out, err] = [new Response(follower.stdout).text(), new Response(follower.stderr).text()];
    await Bun.sleep(1500);
    Bun.write(release, "");
    await startServer();
    expect(await follower.exited).toBe(7);
    expect(await out).toBe("first\nlast\n");
    expect(await err).toContain("the server does not answer");
    // How it ended, after its output, as job run ends: one line on stderr.
    expect((await err).trim().split("\n").at(-1)).toBe(`job ${id} failed (exit 7)`);
  }, T);
});

describe("the worker killed during the outage, its job's end undelivered", () => {
  test("started again, it delivers what it owes before it joins: the job succeeded, once, every line there", async () => {
    const release = join(box.root, "release-2");
    const d = await gpl(["job", "run", "-d", ...job(release)]);
    const id = d.stdout.trim();
    await waitFor("the job to run", async () => (await gpl(["job", "logs", id])).stdout.includes("line-12"));
    await stopServer();
    Bun.write(release, "");
    await waitFor("the job to end on the worker", () => worker.out().includes(`job ${id}: ended here`), 30_000);
    worker.proc.kill("SIGKILL");
    await worker.proc.exited;
    await startServer();
    worker = startWorker();
    await waitFor("the worker to join again", () => worker.out().includes("as w1"), 60_000);
    const s = await waitFor("the job's final state", async () => {
      const r = json((await gpl(["job", "status", id, "--json"])).stdout);
      return r.state === "succeeded" || r.state === "failed" ? r : null;
    });
    expect(s.state).toBe("succeeded");
    expect(s.attempts).toBe(1);
    expect(worker.out()).toContain("delivering what 1 task(s) of a previous run left undelivered");
    expect((await gpl(["job", "logs", id])).stdout.trim().split("\n")).toEqual(expected());
  }, T);
});

describe("a job of tasks across a server restart", () => {
  test("the server SIGKILLed while the first task runs: started again, it dispatches the task that needs it, and the job ends once, succeeded", async () => {
    const release = join(box.root, "release-tasks");
    const dir = join(box.root, "tasks-job");
    mkdirSync(dir, { recursive: true });
    writeFileSync(join(dir, "job.yaml"), ["tasks:", `  first: {command: "echo first-up; while [ ! -e ${release} ]; do sleep 0.1; done; echo first-done"}`, "  second: {command: echo second-ran, needs: [first]}", ""].join("\n"));
    const d = await cli(["job", "run", "-d", "-f", "job.yaml"], { env: env(), cwd: dir });
    const id = d.stdout.trim();
    await waitFor("the first task to run", async () => (await gpl(["job", "logs", id, "--task", "first"])).stdout.includes("first-up"));
    await stopServer();
    await startServer();
    Bun.write(release, "");
    const s = await waitFor("the job's final state", async () => {
      const r = json((await gpl(["job", "status", id, "--json"])).stdout);
      return ["succeeded", "failed", "cancelled"].includes(r.state) ? r : null;
    }, 60_000);
    expect(s.state).toBe("succeeded");
    expect(s.tasks.map((t: { name: string; state: string }) => [t.name, t.state])).toEqual([
      ["first", "succeeded"],
      ["second", "succeeded"],
    ]);
    expect(s.events.filter((e: { type: string }) => e.type === "job.finished")).toHaveLength(1);
    expect((await gpl(["job", "logs", id])).stdout).toBe("[first] first-up\n[first] first-done\n[second] second-ran\n");
  }, T);
});

describe("a task's outputs while the server is down", () => {
  test("are sent once it is back: the task that made them succeeds, and the task that needs them reads them", async () => {
    const dir = join(box.root, "outputs-job");
    mkdirSync(dir, { recursive: true });
    const release = join(box.root, "release-outputs");
    writeFileSync(
      join(dir, "job.yaml"),
      [
        "name: outputs-outage",
        "tasks:",
        `  make: {command: "echo made; while [ ! -e ${release} ]; do sleep 0.1; done; echo kept > out.txt", outputs: [out.txt]}`,
        "  use: {command: cat out.txt, needs: [make]}",
        "",
      ].join("\n"),
    );
    const id = (await cli(["job", "run", "-d", "-f", "job.yaml"], { env: env(), cwd: dir })).stdout.trim();
    await waitFor("the first task to run", async () => json((await gpl(["job", "status", id, "--json"])).stdout).tasks?.[0]?.state === "running");
    await stopServer();
    // The task ends while no server answers: what it owes (its events, then its outputs) goes once one is back.
    writeFileSync(release, "");
    await Bun.sleep(3000);
    await startServer();
    const status = await waitFor("the job to end", async () => {
      const doc = json((await gpl(["job", "status", id, "--json"])).stdout);
      return doc.state === "succeeded" || doc.state === "failed" ? doc : null;
    }, 60_000);
    expect(status.tasks.map((t: any) => [t.name, t.state, t.outputs])).toEqual([
      ["make", "succeeded", [{ path: "out.txt", bytes: 5 }]],
      ["use", "succeeded", []],
    ]);
    expect((await gpl(["job", "logs", status.tasks[1].id])).stdout).toBe("kept\n");
  }, T);
});

describe("every worker lost for a moment", () => {
  test("a job submitted meanwhile waits for one to come back (it is not refused as if none had joined), then runs once", async () => {
    worker.proc.kill("SIGKILL");
    await worker.proc.exited;
    await waitFor("w1 to be lost", async () => json<any[]>((await gpl(["workers", "--json"])).stdout).every((w) => w.state === "lost"), 20_000);
    const submitted = await gpl(["job", "run", "-d", "--json", "--", "echo", "after-the-loss"]);
    expect(submitted.code, submitted.stderr).toBe(0);
    const id = json(submitted.stdout).id;
    expect(json((await gpl(["job", "status", id, "--json"])).stdout).state).toBe("queued");
    worker = startWorker();
    const status = await waitFor("the job to end", async () => {
      const doc = json((await gpl(["job", "status", id, "--json"])).stdout);
      return doc.state === "succeeded" || doc.state === "failed" ? doc : null;
    }, 60_000);
    expect([status.state, status.attempts]).toEqual(["succeeded", 1]);
    expect((await gpl(["job", "logs", id])).stdout).toBe("after-the-loss\n");
  }, T);

  test("a server no worker ever joined refuses a job in one line saying so; one whose workers all left says that instead", async () => {
    // A sandbox of its own: its own store too (on PostgreSQL, the file's database holds the other server's workers).
    const alone = sandbox();
    const lone = keepOutput(startCli(["server", "--listen", "127.0.0.1:0", "--json"], { env: { ...alone.env, ...FAST, GPULAYER_TOKEN: TOKEN } }), procs);
    const loneUrl = await waitFor("the lone server", () => /"url": "([^"]+)"/.exec(lone.out())?.[1]);
    const r = await cli(["job", "run", "--", "true"], { env: { ...alone.env, GPULAYER_SERVER: loneUrl, GPULAYER_TOKEN: TOKEN }, cwd: alone.root });
    expect([r.code, r.stderr.trim().split("\n").at(-1)]).toEqual([1, "error: job refused: no workers have joined this server (on a GPU box: gpulayer join URL --token-file FILE)"]);
    // One joins, then leaves (SIGTERM): the refusal says so, not that none ever joined.
    const once = keepOutput(startCli(["join", loneUrl, "--name", "once", "--python", "python3"], { env: { ...alone.env, ...FAST, GPULAYER_HOME: join(alone.root, "once-home"), GPULAYER_TOKEN: TOKEN } }), procs);
    await waitFor("it to join", () => once.out().includes("as once"));
    once.proc.kill("SIGTERM");
    expect(await once.proc.exited).toBe(0);
    const left = await cli(["job", "run", "--", "true"], { env: { ...alone.env, GPULAYER_SERVER: loneUrl, GPULAYER_TOKEN: TOKEN }, cwd: alone.root });
    expect([left.code, left.stderr.trim().split("\n").at(-1)]).toEqual([1, "error: job refused: no worker is connected now: once joined before and left (on a GPU box: gpulayer join URL --token-file FILE)"]);
  }, T);
});
