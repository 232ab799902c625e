import { afterAll, beforeAll, expect, test } from "bun:test";
import { mkdirSync, writeFileSync } from "node:fs";
import { join } from "node:path";
import { PackageIndex } from "./fixtures/index.ts";
import { cli, makeWorkerVenv, sandbox, startCli } from "./helpers.ts";
import { keepOutput, stopAll, waitFor } from "./fixtures/processes.ts";

/**
 * One request, one env: the same requirements asked by `env prepare`, by a
 * local `job run`, by a job on a worker and by `env prepare --server` are one
 * key, because all of them go through the one prepare (jobs/prepare.ts). The
 * worker has the same Python (the key names its interpreter) and a home of its
 * own; the request names an index, so no machine's pip configuration is in it.
 */

const TOKEN = "prepare-one-token-0123456789";
const FAST = { GPULAYER_HEARTBEAT_SECONDS: "0.5", GPULAYER_WORKER_LOST_SECONDS: "3", GPULAYER_WORKER_ENGINE: "none" };
const T = 180_000;
const boxes = { server: sandbox(), worker: sandbox(), client: sandbox() };
const index = new PackageIndex(join(boxes.client.root, "index"));
const procs: ReturnType<typeof keepOutput>[] = [];
let url = "";
let python = "";
const project = join(boxes.client.root, "project");

beforeAll(async () => {
  index.start();
  index.wheel({ name: "greet", version: "1.0", files: { "greet/__init__.py": "def hello():\n    return 'hello from greet'\n" } });
  python = await makeWorkerVenv(join(boxes.client.root, "venv"), { env: boxes.client.env });
  mkdirSync(project);
  writeFileSync(join(project, "requirements.txt"), "greet\n");
  writeFileSync(join(project, "job.yaml"), `command: python -c "import greet; print(greet.hello())"\nenvironment: {requirements: requirements.txt, index_url: "${index.url}"}\n`);
  const server = keepOutput(startCli(["server", "--listen", "127.0.0.1:0", "--json"], { env: { ...boxes.server.env, GPULAYER_TOKEN: TOKEN, ...FAST } }), procs);
  url = (await waitFor("the server", async () => /"url": "([^"]+)"/.exec(server.out())?.[1])) as string;
  keepOutput(startCli(["join", url, "--name", "w1", "--python", python], { env: { ...boxes.worker.env, ...FAST, GPULAYER_TOKEN: TOKEN } }), procs);
  await waitFor("the worker", async () => (JSON.parse((await remote(["workers", "--json"])).stdout) as unknown[]).length === 1);
}, T);

afterAll(async () => {
  await stopAll(procs);
  index.stop();
  for (const b of Object.values(boxes)) b.cleanup();
}, 30_000);

const local = (args: string[]) => cli(args, { env: boxes.client.env, cwd: project });
const remote = (args: string[]) => cli(args, { env: { ...boxes.client.env, GPULAYER_SERVER: url, GPULAYER_TOKEN: TOKEN }, cwd: project });
const keyOfJob = (status: { events: { type: string; data: { env_key?: string } }[] }) => status.events.find((e) => e.type === "task.prepare.finished")?.data.env_key;

test("env prepare, a local job, a worker's job and env prepare --server key one request alike", async () => {
  const prepared = await local(["env", "prepare", "requirements.txt", "--index-url", index.url, "--python", python, "--json"]);
  expect(prepared.code).toBe(0);
  const key = JSON.parse(prepared.stdout).key as string;
  expect(key).toMatch(/^[0-9a-f]{64}$/);

  const localJob = await local(["job", "run", "-f", "job.yaml", "--python", python, "--json"]);
  expect([localJob.code, localJob.stderr]).toEqual([0, expect.stringContaining("hello from greet")]);
  const localStatus = JSON.parse(localJob.stdout);
  expect([localStatus.env_key, keyOfJob(localStatus), localStatus.phases[0].cache]).toEqual([key, key, "hit"]);

  const remoteJob = await remote(["job", "run", "-f", "job.yaml", "--json"]);
  expect([remoteJob.code, remoteJob.stderr]).toEqual([0, expect.stringContaining("hello from greet")]);
  const remoteStatus = JSON.parse(remoteJob.stdout);
  expect([remoteStatus.worker, keyOfJob(remoteStatus)]).toEqual(["w1", key]);

  // The worker's prepare task: the env its job built, by the same key.
  const remotePrepare = await remote(["env", "prepare", "requirements.txt", "--index-url", index.url, "--json"]);
  expect(remotePrepare.code).toBe(0);
  expect(JSON.parse(remotePrepare.stdout).workers.map((w: { worker: string; status: string; key: string }) => [w.worker, w.status, w.key])).toEqual([["w1", "reused", key]]);
}, T);
