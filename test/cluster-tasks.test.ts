import { afterAll, beforeAll, describe, expect, test } from "bun:test";
import { mkdirSync, writeFileSync } from "node:fs";
import { join } from "node:path";
import { PackageIndex } from "./fixtures/index.ts";
import { cli, makeWorkerVenv, sandbox, startCli, tempDir } from "./helpers.ts";
import { keepOutput, stopAll, waitFor } from "./fixtures/processes.ts";
import { makeCondaRoot, pyenvPython } from "./fixtures/conda.ts";

/**
 * A job of tasks through a server with two workers (one slot each), all
 * real processes on 127.0.0.1: each task is matched on its own, so the two
 * tasks that need the first run at once, one on each worker, each in its own
 * env with its own pin of one package.
 */

const TOKEN = "cluster-tasks-token-0123456789";
const FAST = { GPULAYER_HEARTBEAT_SECONDS: "0.5", GPULAYER_WORKER_LOST_SECONDS: "3", GPULAYER_WORKER_ENGINE: "none", GPULAYER_CANCEL_GRACE: "2", GPULAYER_WORKER_DRAIN_SECONDS: "2", GPULAYER_WORKER_SLOTS: "1" };
const T = 120_000;
const boxes = { server: sandbox(), w1: sandbox(), w2: sandbox(), client: sandbox() };
const index = new PackageIndex(join(boxes.client.root, "index"));
const procs: { proc: ReturnType<typeof startCli>; out: () => string }[] = [];
/** Shared by the tasks on both workers (one machine here): how each knows the other runs too. */
const meeting = tempDir("gpl-meet-");
let url = "";

const clientEnv = () => ({ ...boxes.client.env, GPULAYER_SERVER: url, GPULAYER_TOKEN: TOKEN });
const gpl = (args: string[], cwd?: string) => cli(args, { env: clientEnv(), cwd: cwd ?? boxes.client.root });

beforeAll(async () => {
  index.start();
  index.wheel({ name: "gl-base", version: "1.0" });
  index.wheel({ name: "gl-base", version: "2.0" });
  const server = keepOutput(startCli(["server", "--listen", "127.0.0.1:0", "--json"], { env: { GPULAYER_TOKEN: TOKEN, ...boxes.server.env, ...FAST } }), procs);
  url = (await waitFor("the server", async () => /"url": "([^"]+)"/.exec(server.out())?.[1])) as string;
  // w2 has a conda environment (laid out as conda leaves it; see test/fixtures/conda.ts), w1 none.
  const conda = pyenvPython() ? makeCondaRoot(join(boxes.w2.root, "miniconda3"), { envs: { ml: {} } }).root : null;
  for (const name of ["w1", "w2"] as const) {
    const venv = await makeWorkerVenv(join(boxes[name].root, "venv"), { env: boxes[name].env });
    const extra: Record<string, string> = name === "w2" && conda ? { CONDA_ROOT: conda } : {};
    keepOutput(startCli(["join", url, "--name", name, "--python", venv], { env: { ...boxes[name].env, ...FAST, GPULAYER_TOKEN: TOKEN, ...extra } }), procs);
  }
  await waitFor("two workers", async () => (JSON.parse((await gpl(["workers", "--json"])).stdout) as unknown[]).length === 2);
}, T);

afterAll(async () => {
  await stopAll(procs);
  index.stop();
  for (const b of Object.values(boxes)) b.cleanup();
}, 30_000);

function jobDir(name: string, yaml: string): string {
  const dir = join(boxes.client.root, name);
  mkdirSync(dir, { recursive: true });
  writeFileSync(join(dir, "job.yaml"), yaml);
  return dir;
}

const meets = (me: string, other: string) =>
  JSON.stringify(
    `python -c "import gl_base, pathlib, time; d = pathlib.Path('${meeting}'); print('${me}', gl_base.__version__); (d / '${me}').touch(); t = time.time()\nwhile not (d / '${other}').exists():\n    time.sleep(0.05)\n    assert time.time() - t < 30, 'never ran at the same time'\nprint('${me} met ${other}')"`,
  );

interface TaskDoc {
  name: string;
  id: string;
  state: string;
  exit_code: number | null;
  env_key: string | null;
  worker?: string | null;
  error: string | null;
}

describe("a job of tasks through a server", () => {
  test("each task matched on its own: the two after the first run at once on two workers, with conflicting pins", async () => {
    const dir = jobDir(
      "pipeline",
      [
        "name: pipeline",
        "environment:",
        `  index_url: ${index.url}`,
        "  requirements: [gl-base==1.0]",
        "tasks:",
        "  prepare: {command: echo prepared}",
        `  train-a: {command: ${meets("a", "b")}, needs: [prepare]}`,
        `  train-b: {command: ${meets("b", "a")}, needs: [prepare], environment: {requirements: [gl-base==2.0]}}`,
        "",
      ].join("\n"),
    );
    const r = await gpl(["job", "run", "-f", "job.yaml", "--json"], dir);
    expect(r.code).toBe(0);
    const status = JSON.parse(r.stdout) as { id: string; state: string; tasks: TaskDoc[] };
    expect(status.state).toBe("succeeded");
    expect(status.tasks.map((t) => [t.name, t.state])).toEqual([
      ["prepare", "succeeded"],
      ["train-a", "succeeded"],
      ["train-b", "succeeded"],
    ]);
    const [, a, b] = status.tasks;
    // One slot each: running at the same time means one on each worker.
    expect(new Set([a!.worker, b!.worker])).toEqual(new Set(["w1", "w2"]));
    expect(a!.env_key).not.toBe(b!.env_key);
    expect(r.stderr).toContain("[train-a] a 1.0");
    expect(r.stderr).toContain("[train-b] b 2.0");
    expect(r.stderr).toContain("[train-b] b met a");
    expect(r.stderr).toContain("[prepare] prepared");
    // Each task's log from the server; the job is one entry of the list, its tasks in its status.
    const logs = await gpl(["job", "logs", status.id, "--task", "train-b"]);
    expect(logs.stdout).toBe("b 2.0\nb met a\n");
    const list = JSON.parse((await gpl(["job", "list", "--json"])).stdout) as { id: string }[];
    expect(list.map((j) => j.id)).toEqual([status.id]);
    const shown = await gpl(["job", "status", status.id]);
    expect(shown.stdout).toMatch(/\n {4}train-a {2}succeeded, exit 0; prepare .+; needs prepare\n/);
  }, T);

  test("a failed task fails the job with its exit code; what needs it is skipped, never sent to a worker", async () => {
    const dir = jobDir("failing", ["tasks:", "  breaks: {command: exit 5}", "  after: {command: echo never, needs: [breaks]}", "  last: {command: echo never, needs: [after]}", ""].join("\n"));
    const r = await gpl(["job", "run", "-f", "job.yaml", "--json"], dir);
    expect(r.code).toBe(5);
    const status = JSON.parse(r.stdout) as { state: string; exit_code: number; tasks: TaskDoc[]; events: { type: string }[] };
    expect(status).toMatchObject({ state: "failed", exit_code: 5 });
    expect(status.tasks.map((t) => [t.name, t.state, t.worker])).toEqual([
      ["breaks", "failed", expect.stringMatching(/^w[12]$/)],
      ["after", "skipped", null],
      ["last", "skipped", null],
    ]);
    expect(status.tasks[1]!.error).toBe("not started: breaks, which it needs, failed");
    // Their output would be on stderr under --json, each line with its task: there is none.
    expect(r.stderr).not.toMatch(/^\[(after|last)\] never$/m);
  }, T);

  test("each task's output streams back as it comes, with [name], not at the job's end", async () => {
    const gate = join(meeting, "gate");
    const dir = jobDir("live", ["tasks:", `  a: {command: "echo a-waiting; while [ ! -e ${gate} ]; do sleep 0.05; done; echo a-through"}`, "  b: {command: echo b-after, needs: [a]}", ""].join("\n"));
    const proc = startCli(["job", "run", "-f", "job.yaml"], { env: { ...boxes.client.env, GPULAYER_SERVER: url, GPULAYER_TOKEN: TOKEN }, cwd: dir });
    let out = "";
    const reading = (async () => {
      for await (const c of proc.stdout as ReadableStream<Uint8Array>) out += new TextDecoder().decode(c);
    })();
    // a's first line arrives while a still runs (it waits for the gate, which only this test opens).
    await waitFor("a's first line, live", async () => out.includes("[a] a-waiting\n"));
    expect(out).not.toContain("a-through");
    writeFileSync(gate, "");
    expect(await proc.exited).toBe(0);
    await reading;
    expect(out).toBe("[a] a-waiting\n[a] a-through\n[b] b-after\n");
  }, T);

  // Skipped only without a pyenv Python to copy into the conda fixture; this machine and CI have pyenv's.
  test.skipIf(!pyenvPython())("a worker's conda environments reach the server; a job naming one goes to that worker", async () => {
    const workers = JSON.parse((await gpl(["workers", "--json"])).stdout) as { name: string; probe: { conda: { name: string | null }[] } }[];
    expect(workers.find((w) => w.name === "w2")!.probe.conda.map((c) => c.name).sort()).toEqual(["base", "ml"]);
    expect(workers.find((w) => w.name === "w1")!.probe.conda).toEqual([]);
    const dir = jobDir("conda", ["command: python -c \"import os; print(os.environ['CONDA_DEFAULT_ENV'])\"", "environment: {conda: ml}", ""].join("\n"));
    const r = await gpl(["job", "run", "-f", "job.yaml", "--json"], dir);
    expect(r.code).toBe(0);
    const status = JSON.parse(r.stdout) as { worker: string };
    expect(status.worker).toBe("w2");
    expect(r.stderr).toContain("ml\n");
  }, T);

  test("job cancel ends the running task on its worker and every task not started", async () => {
    const dir = jobDir("cancel", ["tasks:", "  long: {command: sleep 300}", "  later: {command: echo never, needs: [long]}", ""].join("\n"));
    const started = await gpl(["job", "run", "-f", "job.yaml", "--detach", "--json"], dir);
    expect(started.code).toBe(0);
    const { id } = JSON.parse(started.stdout) as { id: string };
    const status = async () => JSON.parse((await gpl(["job", "status", id, "--json"])).stdout) as { state: string; tasks: TaskDoc[] };
    await waitFor("the long task to run", async () => (await status()).tasks[0]!.state === "running");
    const cancel = await gpl(["job", "cancel", id, "--json"]);
    expect(cancel.code).toBe(0);
    expect(JSON.parse(cancel.stdout).state).toBe("cancelled");
    const after = await status();
    expect(after.tasks.map((t) => [t.name, t.state])).toEqual([
      ["long", "cancelled"],
      ["later", "cancelled"],
    ]);
  }, T);
});
