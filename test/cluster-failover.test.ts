import { afterAll, beforeAll, describe, expect, test } from "bun:test";
import { existsSync, mkdirSync, readdirSync, readFileSync, statSync } from "node:fs";
import { join } from "node:path";
import { cli, sandbox, startCli } from "./helpers.ts";
import { keepOutput, stopAll, waitFor } from "./fixtures/processes.ts";
import { homeLayout } from "../src/config/paths.ts";

/**
 * Workers that die or leave: a server and workers as separate processes on
 * 127.0.0.1, each with its own home. A worker killed with SIGKILL mid-job is
 * declared lost and its job runs again elsewhere (up to the attempt limit);
 * one stopped with SIGTERM drains, then hands back what is left.
 */

const TOKEN = "failover-test-token-0123456789";
const FAST = { GPULAYER_HEARTBEAT_SECONDS: "0.3", GPULAYER_WORKER_LOST_SECONDS: "2", GPULAYER_WORKER_LEASE: "3", GPULAYER_WORKER_ENGINE: "none", GPULAYER_CANCEL_GRACE: "1", GPULAYER_WORKER_DRAIN_SECONDS: "1" };
const T = 90_000;
const box = sandbox();
const procs: { proc: ReturnType<typeof startCli>; out: () => string }[] = [];
const workers = new Map<string, (typeof procs)[number]>();
let url = "";

const keep = (proc: ReturnType<typeof startCli>) => keepOutput(proc, procs);


const env = () => ({ ...box.env, GPULAYER_SERVER: url, GPULAYER_TOKEN: TOKEN });
const gpl = (args: string[]) => cli(args, { env: env(), cwd: box.root });
const json = <T = any>(text: string): T => JSON.parse(text) as T;

const homeOf = (name: string) => join(box.root, `home-${name}`);
const joinArgs = (name: string, extra: string[] = []) => ["join", url, "--name", name, "--python", "python3", ...extra];

/** Start `gpulayer join` and wait until it has joined (its own log says so). */
async function startWorker(name: string, extra: string[] = []): Promise<void> {
  const w = keep(startCli(joinArgs(name, extra), { env: { ...box.env, ...FAST, GPULAYER_HOME: homeOf(name), GPULAYER_TOKEN: TOKEN } }));
  workers.set(name, w);
  await waitFor(`worker ${name}`, () => w.out().includes(`as ${name}`));
}

/** Every attempt's shell records its pid: killed at the end, since a SIGKILLed worker leaves its job's process group behind. */
const pids = join(box.root, "pids");
const job = (body: string) => ["job", "run", "--", "sh", "-c", `echo $$ >> ${pids}; ${body}`];

async function runningOn(): Promise<string> {
  return waitFor("a running job", async () => {
    const [j] = json<any[]>((await gpl(["job", "list", "--json", "--limit", "1"])).stdout);
    return j?.state === "running" && j.worker;
  });
}

beforeAll(async () => {
  const server = keep(startCli(["server", "--listen", "127.0.0.1:0", "--json"], { env: { GPULAYER_TOKEN: TOKEN, ...box.env, ...FAST, GPULAYER_JOB_MAX_ATTEMPTS: "2" } }));
  url = (await waitFor("the server", () => /"url": "([^"]+)"/.exec(server.out())?.[1])) as string;
  await Promise.all([startWorker("wa"), startWorker("wb")]);
}, T);

afterAll(async () => {
  await stopAll(procs);
  if (existsSync(pids)) {
    for (const pid of readFileSync(pids, "utf8").trim().split("\n").map(Number)) {
      try {
        process.kill(-pid, "SIGKILL");
      } catch {
        // ended already
      }
    }
  }
  box.cleanup();
}, 30_000);

describe("a worker that dies", () => {
  test("killed with SIGKILL mid-job: declared lost, the job re-queued on another worker, its output and exit code reach the client", async () => {
    const client = keep(startCli(job('echo "attempt on $(hostname)"; sleep 2; echo finished; exit 5'), { env: env(), cwd: box.root }));
    const first = await runningOn();
    await waitFor("the first output", () => client.out().includes("attempt on"));
    workers.get(first)!.proc.kill("SIGKILL");
    const code = await client.proc.exited;
    expect(code).toBe(5);
    expect(client.out()).toContain(`re-queued: worker ${first} lost: no heartbeat`);
    expect(client.out()).toContain("finished");
    const [j] = json<any[]>((await gpl(["job", "list", "--json", "--limit", "1"])).stdout);
    const s = json((await gpl(["job", "status", j.id, "--json"])).stdout);
    expect(s.worker).not.toBe(first);
    expect(s.attempts).toBe(2);
    const types = s.events.map((e: any) => e.type);
    expect(types.filter((t: string) => t === "job.assigned")).toHaveLength(2);
    expect(types).toContain("job.requeued");
    expect(s.phases.map((p: any) => [p.name, p.state])).toEqual([["task.prepare", "finished"], ["task.run", "finished"]]);
    const all = json<any[]>((await gpl(["workers", "--all", "--json"])).stdout);
    expect(all.find((w) => w.name === first).state).toBe("lost");
  }, T);

  test("lost again and again: failed after the attempt limit, visibly in its events", async () => {
    await startWorker("wc");
    const client = keep(startCli(job("echo go; sleep 30"), { env: env(), cwd: box.root }));
    for (let attempt = 1; attempt <= 2; attempt++) {
      const on = await waitFor(`attempt ${attempt}`, async () => {
        const [j] = json<any[]>((await gpl(["job", "list", "--json", "--limit", "1"])).stdout);
        return j?.state === "running" && j.attempts === attempt && j.worker;
      });
      workers.get(on)!.proc.kill("SIGKILL");
    }
    expect(await client.proc.exited).toBe(1);
    expect(client.out()).toContain("gave up after 2 attempt(s)");
    const [j] = json<any[]>((await gpl(["job", "list", "--json", "--limit", "1"])).stdout);
    expect(j.state).toBe("failed");
    const s = json((await gpl(["job", "status", j.id, "--json"])).stdout);
    expect(s.events.map((e: any) => e.type)).toContain("job.lost");
    // The lost attempt's run never ended: it is in the events, not shown as a phase still running.
    expect(s.phases).toEqual([]);
  }, T);
});

describe("a worker that is stopped", () => {
  test("SIGTERM: no new work, the job is handed back after the drain time and finishes elsewhere; the worker leaves", async () => {
    await Promise.all([startWorker("wd"), startWorker("we")]);
    const marker = join(box.root, "ran-once");
    const client = keep(startCli(job(`if [ -e ${marker} ]; then echo second-run; else touch ${marker}; echo first-run; sleep 30; fi`), { env: env(), cwd: box.root }));
    const first = await runningOn();
    const w = workers.get(first)!;
    w.proc.kill("SIGTERM");
    expect(await w.proc.exited).toBe(0);
    expect(w.out()).toContain("taking no more work");
    expect(w.out()).toContain("handing back 1 task(s)");
    expect(await client.proc.exited).toBe(0);
    expect(client.out()).toContain("first-run");
    expect(client.out()).toContain("second-run");
    expect(client.out()).toContain(`re-queued: worker ${first} left`);
    const all = json<any[]>((await gpl(["workers", "--all", "--json"])).stdout);
    expect(all.find((x) => x.name === first).state).toBe("left");
  }, T);
});

describe("a worker started again", () => {
  // A folder of its own: box.root holds the workers' homes by now, too big a bundle to send around.
  const small = join(box.root, "small");
  mkdirSync(small, { recursive: true });
  const mine = async () => json<any[]>((await gpl(["workers", "--all", "--json"])).stdout).filter((w) => w.name === "wr");
  const identityFiles = () => {
    const dir = join(homeOf("wr"), "cluster", "identity");
    return readdirSync(dir).map((f) => join(dir, f));
  };

  test("killed with SIGKILL and started again on the same home: the same worker, idle, no lost duplicate; its job re-queued", async () => {
    await startWorker("wr", ["--label", "restart=yes"]);
    const [before] = await mine();
    expect(before.state).toBe("idle");
    // The id and credential are kept in the worker's home, readable by its owner only, and never printed.
    const [file, ...more] = identityFiles();
    expect(more).toEqual([]);
    expect(statSync(file!).mode & 0o777).toBe(0o600);
    expect(statSync(join(file!, "..")).mode & 0o777).toBe(0o700);
    const saved = json(readFileSync(file!, "utf8"));
    expect(saved).toMatchObject({ server: url, name: "wr", id: before.id });
    expect(saved.credential).toStartWith("gplw_");

    const marker = join(box.root, "restart-ran-once");
    const client = keep(startCli(["job", "run", "--label", "restart=yes", "--", "sh", "-c", `echo $$ >> ${pids}; if [ -e ${marker} ]; then echo second-run; else touch ${marker}; echo first-run; sleep 30; fi`], { env: env(), cwd: small }));
    expect(await runningOn()).toBe("wr");
    await waitFor("the first output", () => client.out().includes("first-run"));
    workers.get("wr")!.proc.kill("SIGKILL");
    await startWorker("wr", ["--label", "restart=yes"]);
    expect(workers.get("wr")!.out()).toContain(`joined ${url} as wr again (the same worker, ${before.id})`);

    expect(await client.proc.exited).toBe(0);
    expect(client.out()).toContain("second-run");
    // Re-queued when it came back (or, had it taken longer, when it was declared lost), as for any lost worker.
    expect(client.out()).toMatch(/re-queued: worker wr (restarted|lost)/);
    const [j] = json<any[]>((await gpl(["job", "list", "--json", "--limit", "1"])).stdout);
    expect(j).toMatchObject({ state: "succeeded", worker: "wr", attempts: 2 });

    const after = await waitFor("wr idle", async () => {
      const ws = await mine();
      return ws.length === 1 && ws[0].state === "idle" && ws;
    });
    expect(after[0].id).toBe(before.id);
    const now = json(readFileSync(file!, "utf8"));
    expect(now.id).toBe(before.id);
    // A new credential each time it registers: the old process's, had it survived, would no longer work.
    expect(now.credential).not.toBe(saved.credential);
    for (const p of procs) {
      expect(p.out()).not.toContain(saved.credential);
      expect(p.out()).not.toContain(now.credential);
    }
  }, T);

  test("a second join with the same name and home while the first runs is refused; the first keeps its worker", async () => {
    const [before] = await mine();
    const second = await cli(joinArgs("wr", ["--label", "restart=yes"]), { env: { ...box.env, ...FAST, GPULAYER_HOME: homeOf("wr"), GPULAYER_TOKEN: TOKEN } });
    expect(second.code).toBe(1);
    expect(second.stderr).toContain("worker wr is already running");
    expect(second.stderr).toContain("stop it first");
    const ws = await mine();
    expect(ws).toHaveLength(1);
    expect(ws[0]).toMatchObject({ id: before.id, state: "idle" });
    const r = await cli(["job", "run", "--label", "restart=yes", "--", "echo", "still-here"], { env: env(), cwd: small });
    expect(r.code).toBe(0);
    expect(r.stdout).toBe("still-here\n");
    expect(workers.get("wr")!.out()).not.toContain("taken over");
  }, T);

  test("a first process frozen long enough to count as gone is taken over; when it wakes it stops instead of polling too", async () => {
    const [before] = await mine();
    const first = workers.get("wr")!;
    first.proc.kill("SIGSTOP");
    await Bun.sleep(1200);
    await startWorker("wr", ["--label", "restart=yes"]);
    first.proc.kill("SIGCONT");
    expect(await first.proc.exited).toBe(1);
    expect(first.out()).toContain("worker wr was taken over by another gpulayer join with the same name and GPULAYER_HOME");
    const ws = await mine();
    expect(ws).toHaveLength(1);
    expect(ws[0]).toMatchObject({ id: before.id, state: "idle" });
    const r = await cli(["job", "run", "--label", "restart=yes", "--", "echo", "on the new one"], { env: env(), cwd: small });
    expect(r.stdout).toBe("on the new one\n");
  }, T);

  test("an identity the server does not know (its state was wiped) joins as a new worker", async () => {
    const { saveIdentity } = await import("../src/worker/identity.ts");
    const layout = homeLayout(homeOf("wn"));
    const file = saveIdentity(layout, { server: url, name: "wn", id: "0123456789ab", credential: "gplw_not-a-credential-this-server-gave" });
    await startWorker("wn");
    expect(workers.get("wn")!.out()).not.toContain("again");
    const ws = json<any[]>((await gpl(["workers", "--json"])).stdout).filter((w) => w.name === "wn");
    expect(ws).toHaveLength(1);
    const saved = json(readFileSync(file, "utf8"));
    expect(saved.id).toBe(ws[0].id);
    expect(saved.id).not.toBe("0123456789ab");
    expect(saved.credential).not.toContain("not-a-credential");
  }, T);
});
