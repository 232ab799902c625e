import { afterAll, beforeAll, describe, expect, test } from "bun:test";
import { existsSync, readdirSync } from "node:fs";
import { join } from "node:path";
import { PackageIndex } from "./fixtures/index.ts";
import { cli, HAS_UV, makeWorkerVenv, sandbox, startCli, tempDir } from "./helpers.ts";
import { jobToEnd, type Kept, keepOutput, stopAll, waitFor } from "./fixtures/processes.ts";

/**
 * A new worker warm for its first build: a real server and workers on
 * 127.0.0.1, each on a venv holding packages of its own (a GPU box holds
 * hundreds). On joining, a worker makes what a home's first build makes once
 * (the stand-ins of its packages, uv's check of them) without putting
 * anything in its env cache; its first job's build then takes them instead
 * of checking the worker's packages itself.
 */

const TOKEN = "warm-test-token-0123456789";
const FAST = { GPULAYER_HEARTBEAT_SECONDS: "0.5", GPULAYER_WORKER_LOST_SECONDS: "10", GPULAYER_WORKER_ENGINE: "none", GPULAYER_WORKER_DRAIN_SECONDS: "1" };
const T = 120_000;
const world = tempDir("gpl-warm-");
const index = new PackageIndex(join(world, "index"));
const server = sandbox();
const client = sandbox();
const kept: Kept[] = [];
let url = "";
let python = "";

const gpl = (args: string[]) => cli(args, { env: { ...client.env, GPULAYER_SERVER: url, GPULAYER_TOKEN: TOKEN }, cwd: client.root });

function startWorker(name: string, extra: Record<string, string> = {}): { kept: Kept; home: string } {
  const box = sandbox();
  const proc = startCli(["join", url, "--name", name, "--label", `box=${name}`, "--python", python], { env: { ...box.env, ...FAST, GPULAYER_HOME: box.home, GPULAYER_TOKEN: TOKEN, ...extra } });
  return { kept: keepOutput(proc, kept), home: box.home };
}

const envEntries = (home: string) => (existsSync(join(home, "envs-v1")) ? readdirSync(join(home, "envs-v1")) : []);
/** The stand-in slots of the home, by worker state: folders of placeholders a build takes. */
function slots(home: string): string[][] {
  const root = join(home, "tools", "standins-v2");
  if (!existsSync(root)) return [];
  return readdirSync(root, { withFileTypes: true })
    .filter((d) => d.isDirectory())
    .flatMap((d) => readdirSync(join(root, d.name), { withFileTypes: true }).filter((s) => s.isDirectory()).map((s) => readdirSync(join(root, d.name, s.name)).sort()));
}

/** A job on one worker, run to its end: its status document. */
const jobOn = (worker: string, pkg: string) => jobToEnd(gpl, ["-p", pkg, "--index-url", index.url, "--label", `box=${worker}`, "--", "python", "-c", `import ${pkg}`]);

const steps = (status: any): { step: string; detail: string }[] => status.events.filter((e: { type: string }) => e.type === "task.prepare.step").map((e: { data: { step: string; detail: string } }) => e.data);

beforeAll(async () => {
  index.start();
  index.wheel({ name: "alpha", version: "1.0", files: { "alpha/__init__.py": "" } });
  index.wheel({ name: "gamma", version: "1.0", files: { "gamma/__init__.py": "" } });
  index.wheel({ name: "delta", version: "1.0", files: { "delta/__init__.py": "" } });
  python = await makeWorkerVenv(join(world, "venv"), { env: server.env, packages: ["gamma==1.0", "delta==1.0"], findLinks: index.dir });
  const srv = keepOutput(startCli(["server", "--listen", "127.0.0.1:0", "--json"], { env: { ...server.env, ...FAST, GPULAYER_TOKEN: TOKEN } }), kept);
  url = (await waitFor("the server", async () => /"url": "([^"]+)"/.exec(srv.out())?.[1])) as string;
}, T);

afterAll(async () => {
  await stopAll(kept);
  index.stop();
  for (const b of [server, client]) b.cleanup();
}, 30_000);

// Skipped only without uv: the stand-ins are what the fast path shows uv. CI installs uv (.ci/run), so there it runs.
describe.skipIf(!HAS_UV)("a worker warm for its first build", () => {
  test("on joining it makes the stand-ins of its packages and nothing in its env cache; its first job's build takes them and does not check the worker's packages again", async () => {
    const w1 = startWorker("w1");
    await waitFor("w1's warm-up", () => /warmed up for a first build on \S+ in [\d.]+ s/.test(w1.kept.out()), 20_000).catch((e) => { console.error(w1.kept.out()); throw e; });
    // One slot: a placeholder for each of the worker's packages (pip among them), each a folder of METADATA, WHEEL, INSTALLER, RECORD.
    const [slot, ...more] = slots(w1.home);
    expect(more).toEqual([]);
    expect(slot).toContain("gamma-1.0.dist-info");
    expect(slot).toContain("delta-1.0.dist-info");
    // Nothing a job could take, nor a scratch folder left behind.
    expect(envEntries(w1.home)).toEqual([]);

    const first = await jobOn("w1", "alpha");
    expect(first.state).toBe("succeeded");
    const done = steps(first);
    expect(done.map((s) => s.step)).toContain("installing");
    expect(done.filter((s) => s.detail.includes("once per worker state"))).toEqual([]);
    // The slot went into the build and came back for the next one.
    expect(slots(w1.home)).toEqual([slot!]);
  }, T);

  test("without a warm-up, a fresh home's first build on that Python checks the worker's packages: the step the warm-up spares", async () => {
    const box = sandbox();
    const r = await cli(["env", "prepare", "-p", "alpha", "--index-url", index.url, "--python", python, "--json"], { env: { ...box.env, GPULAYER_HOME: box.home }, cwd: box.root });
    if (r.code) console.error(r.stderr);
    expect(r.code).toBe(0);
    expect(r.stderr).toMatch(/checking uv pip check of the worker's \d+ packages \(once per worker state\)/);
  }, T);
});
