import { afterAll, beforeAll, describe, expect, test } from "bun:test";
import { existsSync, mkdirSync, readdirSync, writeFileSync } from "node:fs";
import { join } from "node:path";
import { PackageIndex } from "./fixtures/index.ts";
import * as v from "valibot";
import { cli, makeWorkerVenv, readyKeys, sandbox, startCli } from "./helpers.ts";
import { DOCUMENTS } from "../src/commands/_json.ts";
import { keepOutput, stopAll, waitFor } from "./fixtures/processes.ts";

/**
 * The same request on this machine and on a fleet, all real processes on
 * 127.0.0.1: a server, one worker and a client, none with a GPU (nvidia-smi
 * finds none here).
 */

const TOKEN = "fleet-and-machine-token-0123456789";
const FAST = { GPULAYER_HEARTBEAT_SECONDS: "0.5", GPULAYER_WORKER_LOST_SECONDS: "3", GPULAYER_WORKER_ENGINE: "none", GPULAYER_WORKER_SLOTS: "1" };
const T = 120_000;
const boxes = { server: sandbox(), w1: sandbox(), client: sandbox() };
const index = new PackageIndex(join(boxes.client.root, "index"));
const procs: Parameters<typeof stopAll>[0] = [];
let url = "";

const fleetEnv = () => ({ ...boxes.client.env, GPULAYER_SERVER: url, GPULAYER_TOKEN: TOKEN });
const here = (args: string[], cwd = boxes.client.root) => cli(args, { env: boxes.client.env, cwd });
const fleet = (args: string[], cwd = boxes.client.root) => cli(args, { env: fleetEnv(), cwd });

beforeAll(async () => {
  index.start();
  index.wheel({ name: "gl-base", version: "1.0" });
  const server = keepOutput(startCli(["server", "--listen", "127.0.0.1:0", "--json"], { env: { ...boxes.server.env, ...FAST, GPULAYER_TOKEN: TOKEN } }), procs);
  url = (await waitFor("the server", async () => /"url": "([^"]+)"/.exec(server.out())?.[1])) as string;
  const venv = await makeWorkerVenv(join(boxes.w1.root, "venv"), { env: boxes.w1.env });
  keepOutput(startCli(["join", url, "--name", "w1", "--python", venv], { env: { ...boxes.w1.env, ...FAST, GPULAYER_TOKEN: TOKEN } }), procs);
  await waitFor("the worker", async () => (JSON.parse((await fleet(["workers", "--json"])).stdout) as unknown[]).length === 1);
}, T);

afterAll(async () => {
  await stopAll(procs);
  index.stop();
  for (const b of Object.values(boxes)) b.cleanup();
}, 30_000);

/** Whatever a build would leave in a home: any entry under envs-v1. */
const envsIn = (home: string) => (existsSync(join(home, "envs-v1")) ? readdirSync(join(home, "envs-v1")) : []);

describe("one rule for resources", () => {
  test("a GPU asked of machines without one is refused the same way here, as a task here, and through a server: one line, one exit code, nothing built or recorded", async () => {
    const dir = join(boxes.client.root, "gpu-job");
    mkdirSync(dir, { recursive: true });
    const env = `environment: {index_url: ${index.url}, requirements: [gl-base==1.0]}`;
    writeFileSync(join(dir, "job.yaml"), [env, "command: python -c 'import gl_base'", ""].join("\n"));
    writeFileSync(join(dir, "tasks.yaml"), [env, "tasks:", "  first: {command: echo first}", "  train: {command: python -c 'import gl_base', needs: [first], resources: {gpus: 1}}", ""].join("\n"));
    const single = ["job", "run", "--gpus", "1", "-f", "job.yaml"];
    const tasks = ["job", "run", "-f", "tasks.yaml"];
    const [localJob, remoteJob, localTasks, remoteTasks] = [await here(single, dir), await fleet(single, dir), await here(tasks, dir), await fleet(tasks, dir)];
    const JOB = "error: job refused: it needs 1 GPU; no machine it can run on has more than 0\n";
    const TASK = "error: task train refused: it needs 1 GPU; no machine it can run on has more than 0\n";
    expect([localJob.code, localJob.stderr]).toEqual([1, JOB]);
    expect([remoteJob.code, remoteJob.stderr.split("\n").slice(-2).join("\n")]).toEqual([1, JOB]);
    expect([localTasks.code, localTasks.stderr]).toEqual([1, TASK]);
    expect([remoteTasks.code, remoteTasks.stderr.split("\n").slice(-2).join("\n")]).toEqual([1, TASK]);
    // Refused before anything: no env on either machine, no job recorded here or on the server, and `first` never ran.
    expect(envsIn(boxes.client.home)).toEqual([]);
    expect(envsIn(boxes.w1.home)).toEqual([]);
    expect(JSON.parse((await here(["job", "list", "--json"])).stdout)).toEqual([]);
    expect(JSON.parse((await fleet(["job", "list", "--json"])).stdout)).toEqual([]);
    // Detached too: refused before it is started in the background.
    const detached = await here([...single, "--detach"], dir);
    expect([detached.code, detached.stderr]).toEqual([1, JOB]);
  }, T);
});

describe("commands that say where they act", () => {
  test("with a server configured, env list, env show and gc --dry-run answer about the fleet; --local about this machine; what has no fleet meaning asks for --local", async () => {
    const built = await fleet(["env", "prepare", "-p", "gl-base==1.0", "--index-url", index.url, "--json"]);
    expect(built.code).toBe(0);
    const key = (JSON.parse(built.stdout) as { workers: { key: string }[] }).workers[0]!.key;
    // The worker reports its cache with its heartbeats, and uploads the env as an artifact.
    await waitFor("w1's report and the artifact", async () => {
      const doc = v.parse(DOCUMENTS["env list --server"], JSON.parse((await fleet(["env", "list", "--json"])).stdout));
      return doc.workers[0]?.envs.some((e) => e.key === key) && doc.artifacts.some((a) => a.key === key);
    });
    // With the variable, and with --server as a flag (no longer an unknown option): the fleet's view, never this machine's empty cache.
    const listed = await fleet(["env", "list"]);
    const flagged = await here(["env", "list", "--server", url, "--token", TOKEN]);
    for (const r of [listed, flagged]) {
      expect(r.code).toBe(0);
      expect(r.stdout).toStartWith(`the fleet of ${url} (this machine's envs: gpulayer env list --local)\n`);
      expect(r.stdout).toContain("w1 (idle): 1 env(s)");
      expect(r.stdout).toContain(key.slice(0, 12));
      expect(r.stdout).toMatch(/server artifacts: 1 /);
    }
    expect((await fleet(["env", "list", "--local"])).stdout).toBe("no environments yet (gpulayer env prepare REQ_FILE builds one)\n");
    expect(envsIn(boxes.client.home)).toEqual([]);
    const both = await fleet(["env", "list", "--local", "--server", url]);
    expect([both.code, both.stderr]).toEqual([2, "error: --local and --server name two places: give one\n"]);

    const shown = v.parse(DOCUMENTS["env show --server"], JSON.parse((await fleet(["env", "show", key.slice(0, 10), "--json"])).stdout));
    expect(shown).toMatchObject({ server: url, key, summary: expect.stringContaining("gl-base==1"), workers: [{ worker: "w1", state: "ready" }] });
    expect(shown.artifacts.map((a) => a.built_by)).toEqual(["w1"]);
    expect((await fleet(["env", "show", key.slice(0, 10)])).stdout).toContain("on worker    w1: ready");
    const notHere = await fleet(["env", "show", key.slice(0, 10), "--local"]);
    expect([notHere.code, notHere.stderr]).toEqual([1, expect.stringMatching(/^error: no environment/)]);
    // A prefix is checked as this machine checks it: not hex (or empty) is a usage error, never "no environment", nor every env.
    for (const args of [["env", "show", "zz"], ["env", "show", "zz", "--local"], ["env", "show", ""]]) {
      const bad = await fleet(args);
      expect([bad.code, bad.stderr]).toEqual([2, `error: not an environment key: ${args[2]}\n`]);
    }

    // gc: the fleet's view, removing nothing; trimming needs the place said.
    const dry = await fleet(["gc", "--dry-run"]);
    expect(dry.code).toBe(0);
    expect(dry.stdout).toContain(`would remove 0 env artifact(s) of ${url}`);
    expect(dry.stdout).toContain("  w1: 1 env(s)");
    expect(v.parse(DOCUMENTS["gc --server"], JSON.parse((await fleet(["gc", "--dry-run", "--json"])).stdout)).workers).toEqual([{ worker: "w1", entries: 1, bytes: expect.any(Number) }]);
    const trim = await fleet(["gc", "--max-size", "0"]);
    expect([trim.code, trim.stderr]).toEqual([2, "error: a server is configured (GPULAYER_SERVER): gc --local trims this machine's cache, gc --server URL the server's artifacts (each worker trims its own cache); gc --dry-run shows the fleet's\n"]);
    expect((await fleet(["gc", "--local", "--dry-run"])).stdout).toStartWith("nothing to remove: 0 entries");
    expect(JSON.parse((await fleet(["env", "list", "--json"])).stdout).artifacts.length).toBe(1);
    const rm = await fleet(["env", "rm", key]);
    expect([rm.code, rm.stderr]).toEqual([2, expect.stringContaining("error: a server is configured (GPULAYER_SERVER): env rm --local removes")]);
    expect(readyKeys(boxes.w1.home)).toEqual([key]);
    // --dry-run resolves here: with a configured server it says which setting named one, and how to stay here.
    for (const [args, line] of [
      [["job", "run", "--dry-run", "--", "true"], "error: --dry-run resolves the job on this machine; it does not go with a server (GPULAYER_SERVER names one; --local runs here; each worker keys its own env)\n"],
      [["env", "prepare", "--dry-run", "-p", "gl-base"], "error: --dry-run shows a local request's key; it does not go with a server (GPULAYER_SERVER names one; --local prepares here)\n"],
    ] as const) {
      const refused = await fleet([...args]);
      expect([refused.code, refused.stderr]).toEqual([2, line]);
    }

    // The job commands choose the same way: --local is this machine's store.
    expect((await fleet(["job", "run", "--local", "--", "true"])).code).toBe(0);
    expect((JSON.parse((await fleet(["job", "list", "--local", "--json"])).stdout) as unknown[]).length).toBe(1);
    expect(JSON.parse((await fleet(["job", "list", "--json"])).stdout)).toEqual([]);
  }, T);
});
