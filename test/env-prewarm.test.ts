import { afterAll, beforeAll, describe, expect, test } from "bun:test";
import { existsSync, mkdirSync, readdirSync } from "node:fs";
import { join } from "node:path";
import { PackageIndex } from "./fixtures/index.ts";
import { CLI_ARGV, cli, makeWorkerVenv, sandbox, tempDir } from "./helpers.ts";
import { jobToEnd, keepOutput, type Kept, stopAll, waitFor } from "./fixtures/processes.ts";

/**
 * A new worker warm before its first job (worker.prefetch_envs): a real
 * server, and workers on 127.0.0.1 each in its own mount namespace where its
 * own home is mounted at one path, with one worker venv (as identical
 * machines of a fleet have them; test/cluster-artifacts.test.ts does the same).
 * w1 builds two envs, one used by more jobs; w2 joins with --prefetch-envs 1
 * and fetches that one before any job; w3 joins with the default (0).
 */

const TOKEN = "prewarm-test-token-0123456789";
const FAST = { GPULAYER_HEARTBEAT_SECONDS: "0.5", GPULAYER_WORKER_LOST_SECONDS: "10", GPULAYER_WORKER_ENGINE: "none", GPULAYER_WORKER_DRAIN_SECONDS: "1" };
const T = 180_000;
const world = tempDir("gpl-prewarm-");
const index = new PackageIndex(join(world, "index"));
const server = sandbox();
const client = sandbox();
const kept: Kept[] = [];
let url = "";
const HOME = join(world, "home");
const VENV = join(world, "venv");
const boxes: Record<string, ReturnType<typeof sandbox>> = {};

const gpl = (args: string[]) => cli(args, { env: { ...client.env, GPULAYER_SERVER: url, GPULAYER_TOKEN: TOKEN }, cwd: client.root });
const api = async <X = any>(path: string): Promise<X> => (await fetch(`${url}${path}`, { headers: { authorization: `Bearer ${TOKEN}` } })).json() as Promise<X>;

function startWorker(name: string, extra: string[] = []) {
  const box = sandbox();
  boxes[name] = box;
  const argv = [...CLI_ARGV, "join", url, "--name", name, "--label", `box=${name}`, "--python", join(VENV, "bin", "python"), ...extra];
  const proc = Bun.spawn(["unshare", "-m", "sh", "-c", `mount --bind "${box.home}" "${HOME}" && exec "$@"`, "sh", ...argv], { env: { ...box.env, ...FAST, GPULAYER_HOME: HOME, GPULAYER_TOKEN: TOKEN }, stdout: "pipe", stderr: "pipe", stdin: "ignore" });
  return keepOutput(proc, kept);
}

/** A job on one worker, run to its end: its status document. */
const jobOn = (worker: string, pkg: string) => jobToEnd(gpl, ["-p", pkg, "--index-url", index.url, "--label", `box=${worker}`, "--", "python", "-c", `import ${pkg}`]);

const workerDoc = async (name: string) => (JSON.parse((await gpl(["workers", "--json"])).stdout) as any[]).find((w) => w.name === name);
const envsOf = (name: string) => (existsSync(join(boxes[name]!.home, "envs-v1")) ? readdirSync(join(boxes[name]!.home, "envs-v1")).filter((n) => /^[0-9a-f]{64}$/.test(n)) : []);

beforeAll(async () => {
  index.start();
  index.wheel({ name: "alpha", version: "1.0", files: { "alpha/__init__.py": "" } });
  index.wheel({ name: "beta", version: "1.0", files: { "beta/__init__.py": "" } });
  mkdirSync(HOME);
  await makeWorkerVenv(VENV, { env: server.env });
  const srv = keepOutput(Bun.spawn([...CLI_ARGV, "server", "--listen", "127.0.0.1:0", "--json"], { env: { GPULAYER_TOKEN: TOKEN, ...server.env, ...FAST }, stdout: "pipe", stderr: "pipe", stdin: "ignore" }), kept);
  url = (await waitFor("the server", async () => /"url": "([^"]+)"/.exec(srv.out())?.[1])) as string;
  startWorker("w1");
  await waitFor("w1", async () => ((await api<unknown[]>("/v1/workers")).length === 1 ? true : null));
}, T);

afterAll(async () => {
  await stopAll(kept);
  index.stop();
  for (const b of [server, client, ...Object.values(boxes)]) b.cleanup();
}, 30_000);

describe("prefetching envs on joining", () => {
  test("a worker joining with --prefetch-envs 1 fetches the fleet's most used env before any job, says so in workers, and its job reuses it; with the default, nothing is fetched", async () => {
    const alpha = [await jobOn("w1", "alpha"), await jobOn("w1", "alpha")];
    const beta = await jobOn("w1", "beta");
    for (const s of [...alpha, beta]) expect(s.state).toBe("succeeded");
    const [alphaKey, betaKey] = [alpha[0].env_key as string, beta.env_key as string];
    expect(alpha[1].env_key).toBe(alphaKey);
    await waitFor("both artifacts", async () => {
      const keys = (await api<{ artifacts: { key: string }[] }>("/v1/artifacts")).artifacts.map((a) => a.key);
      return keys.includes(alphaKey) && keys.includes(betaKey);
    });
    const asked = index.requests.length;

    startWorker("w2", ["--prefetch-envs", "1"]);
    const w2 = await waitFor("w2's prefetch", async () => {
      const w = await workerDoc("w2");
      return w?.prefetch?.state === "done" ? w : null;
    });
    expect(w2.prefetch).toMatchObject({ state: "done", wanted: 1, planned: 1, fetched: 1, present: 0, keys: [alphaKey] });
    expect(w2.prefetch.bytes).toBeGreaterThan(0);
    expect(envsOf("w2")).toEqual([alphaKey]);
    const human = await gpl(["workers"]);
    expect(human.stdout).toMatch(/prefetch +w2: 1 fetched \([^)]+\) of 1 wanted/);

    // Its first job for that env finds it here: no fetch, no build, nothing asked of the index.
    const onW2 = await jobOn("w2", "alpha");
    expect(onW2.state).toBe("succeeded");
    expect(onW2.env_key).toBe(alphaKey);
    expect(onW2.phases.find((p: { name: string }) => p.name === "task.prepare")).toMatchObject({ cache: "hit" });
    expect(onW2.events.filter((e: { type: string; data: { step?: string } }) => e.type === "task.prepare.step" && ["fetching", "building"].includes(e.data.step ?? ""))).toEqual([]);
    expect(index.requests.length).toBe(asked);

    startWorker("w3");
    const w3 = await waitFor("w3's cache report", async () => {
      const w = await workerDoc("w3");
      return w && (await api<any[]>("/v1/workers")).find((x) => x.name === "w3")?.cache ? w : null;
    });
    expect(w3.prefetch).toBeNull();
    expect(envsOf("w3")).toEqual([]);
  }, T);
});
