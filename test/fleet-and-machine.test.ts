import { afterAll, beforeAll, describe, expect, test } from "bun:test";
import { existsSync, mkdirSync, readdirSync, writeFileSync } from "node:fs";
import { join } from "node:path";
import { PackageIndex } from "./fixtures/index.ts";
import { cli, makeWorkerVenv, sandbox, startCli } from "./helpers.ts";
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
  const server = keepOutput(startCli(["server", "--listen", "127.0.0.1:0", "--token", TOKEN, "--json"], { env: { ...boxes.server.env, ...FAST } }), procs);
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
