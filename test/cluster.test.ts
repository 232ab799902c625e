import { afterAll, beforeAll, describe, expect, test } from "bun:test";
import { chmodSync, mkdirSync, readdirSync, writeFileSync } from "node:fs";
import { join } from "node:path";
import { homeLayout } from "../src/config/paths.ts";
import { JobStore } from "../src/jobs/store.ts";
import { makeDist, PackageIndex } from "./fixtures/index.ts";
import { cli, makeWorkerVenv, run, sandbox, startCli } from "./helpers.ts";
import { keepOutput, stopAll, waitFor } from "./fixtures/processes.ts";

/**
 * A server and three workers as separate processes on 127.0.0.1, each with
 * its own GPULAYER_HOME and pip/uv caches; the client is a fourth home.
 *   w1: a plain venv       w2: a venv with a torch-like dist (2.4.1, CUDA 12.1)
 *   w3: label zone=b, two GPUs from a fake nvidia-smi (one with N/A values)
 */

const TOKEN = "cluster-test-token-0123456789";
const FAST = { GPULAYER_HEARTBEAT_SECONDS: "0.5", GPULAYER_WORKER_LOST_SECONDS: "3", GPULAYER_WORKER_ENGINE: "none", GPULAYER_CANCEL_GRACE: "2", GPULAYER_WORKER_DRAIN_SECONDS: "2" };
/** bunfig's test timeout is not applied by this bun; each test names its own. */
const T = 90_000;
const boxes = { server: sandbox(), w1: sandbox(), w2: sandbox(), w3: sandbox(), client: sandbox() };
const index = new PackageIndex(join(boxes.client.root, "index"));
const procs: { proc: ReturnType<typeof startCli>; out: () => string }[] = [];
let url = "";

const json = <T = any>(text: string): T => JSON.parse(text) as T;

const keep = (proc: ReturnType<typeof startCli>) => keepOutput(proc, procs);


const clientEnv = () => ({ ...boxes.client.env, GPULAYER_SERVER: url, GPULAYER_TOKEN: TOKEN });
const gpl = (args: string[], cwd?: string) => cli(args, { env: clientEnv(), cwd: cwd ?? boxes.client.root });

async function sitePackages(venv: string): Promise<string> {
  const lib = join(venv, "lib");
  return join(lib, readdirSync(lib).find((d) => d.startsWith("python"))!, "site-packages");
}

beforeAll(async () => {
  index.start();
  index.wheel({ name: "greet", version: "1.0", files: { "greet/__init__.py": "def hello():\n    return 'hello from greet'\n" } });
  const server = keep(startCli(["server", "--listen", "127.0.0.1:0", "--json"], { env: { GPULAYER_TOKEN: TOKEN, ...boxes.server.env, ...FAST } }));
  url = (await waitFor("the server", async () => /"url": "([^"]+)"/.exec(server.out())?.[1])) as string;

  const venvs = await Promise.all(["w1", "w2", "w3"].map((n) => makeWorkerVenv(join(boxes[n as "w1"].root, "venv"), { env: boxes[n as "w1"].env })));
  const torchSite = await sitePackages(join(boxes.w2.root, "venv"));
  mkdirSync(join(torchSite, "torch"));
  writeFileSync(join(torchSite, "torch", "__init__.py"), "from .version import __version__\n");
  writeFileSync(join(torchSite, "torch", "version.py"), 'from typing import Optional\n__version__ = "2.4.1"\ncuda: Optional[str] = "12.1"\ngit_version = "abc"\n');
  mkdirSync(join(torchSite, "torch-2.4.1.dist-info"));
  writeFileSync(join(torchSite, "torch-2.4.1.dist-info", "METADATA"), "Metadata-Version: 2.1\nName: torch\nVersion: 2.4.1\n");
  const fakeBin = join(boxes.w3.root, "bin");
  mkdirSync(fakeBin);
  writeFileSync(join(fakeBin, "nvidia-smi"), "#!/bin/sh\necho '0, GPU-aaaa-1111, Fake H100, 81559, 550.54'\necho '1, GPU-bbbb-2222, Fake H100, [N/A], [N/A]'\n");
  chmodSync(join(fakeBin, "nvidia-smi"), 0o755);

  const join_ = (name: "w1" | "w2" | "w3", extra: string[] = [], env: Record<string, string> = {}) =>
    keep(startCli(["join", url, "--name", name, "--python", venvs[Number(name[1]) - 1]!, ...extra], { env: { ...boxes[name].env, ...FAST, GPULAYER_TOKEN: TOKEN, ...env } }));
  join_("w1");
  join_("w2");
  join_("w3", ["--label", "zone=b"], { PATH: `${fakeBin}:${boxes.w3.env.PATH}` });
  await waitFor("three workers", async () => (json((await gpl(["workers", "--json"])).stdout) as unknown[]).length === 3);
}, T);

afterAll(async () => {
  await stopAll(procs);
  index.stop();
  for (const b of Object.values(boxes)) b.cleanup();
}, 30_000);

async function jobFile(dir: string, yaml: string): Promise<string> {
  mkdirSync(dir, { recursive: true });
  writeFileSync(join(dir, "job.yaml"), yaml);
  return join(dir, "job.yaml");
}

describe("workers", () => {
  test("list each worker's probe: GPUs (N/A handled), torch and CUDA read without importing, labels, state", async () => {
    const r = await gpl(["workers", "--json"]);
    expect(r.code).toBe(0);
    const ws = json<any[]>(r.stdout);
    const by = Object.fromEntries(ws.map((w) => [w.name, w]));
    expect(by.w2.probe.frameworks.torch).toBe("2.4.1");
    expect(by.w2.probe.cuda).toBe("12.1");
    expect(by.w1.probe.frameworks.torch).toBeUndefined();
    expect(by.w3.labels).toEqual({ zone: "b" });
    expect(by.w3.probe.gpus).toEqual([
      { index: 0, uuid: "GPU-aaaa-1111", name: "Fake H100", memory_mib: 81559, driver: "550.54" },
      { index: 1, uuid: "GPU-bbbb-2222", name: "Fake H100", memory_mib: null, driver: null },
    ]);
    for (const w of ws) expect(w.state).toBe("idle");
    const human = await gpl(["workers"]);
    expect(human.stdout).toContain("2.4.1/12.1");
    expect(human.stdout).toMatch(/w3\s+2\/2 free Fake H100/);
  }, T);

  test("a wrong or missing token gets 401 and nothing else; tokens are never printed", async () => {
    for (const headers of [{ authorization: "Bearer wrong-token-wrong-token" }, {}] as Record<string, string>[]) {
      const res = await fetch(`${url}/v1/workers`, { headers });
      expect(res.status).toBe(401);
      expect(await res.json()).toEqual({ error: "unauthorized" });
    }
    const r = await cli(["workers", "--token", "wrong-token-wrong-token"], { env: { ...clientEnv() } });
    expect(r.code).toBe(1);
    expect(r.stderr).toContain("refused the token (401)");
    expect(r.stderr).not.toContain("wrong-token");
    const sub = await cli(["job", "run", "--", "echo", "never"], { env: { ...clientEnv(), GPULAYER_TOKEN: "wrong-token-wrong-token" } });
    expect(sub.code).toBe(1);
    expect(sub.stdout).not.toContain("never");
    for (const p of procs) expect(p.out()).not.toContain(TOKEN);
  }, T);

  test("a URL where something else answers (a web server, not gpulayer) is said so in one line, for clients and for join", async () => {
    const other = Bun.serve({ port: 0, hostname: "127.0.0.1", fetch: (req) => new Response("<h1>Not Found</h1>", { status: req.method === "GET" ? 404 : 501, headers: { "content-type": "text/html" } }) });
    try {
      const there = `http://127.0.0.1:${other.port}`;
      const env = { ...clientEnv(), GPULAYER_SERVER: there };
      for (const [args, answer] of [[["workers"], "GET /v1/workers with HTTP 404"], [["job", "status", "abc"], "GET /v1/jobs/abc with HTTP 404"], [["job", "run", "--", "true"], "POST /v1/jobs with HTTP 501"]] as const) {
        const r = await cli([...args], { env });
        expect(r.code).toBe(1);
        expect(r.stderr.trim().split("\n").at(-1)).toBe(`error: ${there} answered ${answer}, not as a gpulayer server does: is it the URL \`gpulayer server\` printed?`);
      }
      const j = await cli(["join", there, "--name", "wx", "--python", "python3"], { env: { ...boxes.w1.env, GPULAYER_TOKEN: TOKEN } });
      expect(j.code).not.toBe(0);
      expect(j.stderr).toContain("not as a gpulayer server does");
    } finally {
      await other.stop(true);
    }
  }, T);
});

describe("join without a server", () => {
  test("saves the worker settings and prints the probe (--json too); a later join keeps them", async () => {
    const env = { ...boxes.w2.env, GPULAYER_HOME: join(boxes.w2.root, "solo-home"), GPULAYER_WORKER_ENGINE: "none" };
    const python = join(boxes.w2.root, "venv", "bin", "python");
    const r = await cli(["join", "--python", python, "--name", "solo", "--label", "zone=a", "--json"], { env });
    expect(r.code).toBe(0);
    const doc = json(r.stdout);
    expect(doc).toMatchObject({ name: "solo", python, labels: { zone: "a" } });
    expect(doc.probe.python.path).toBe(python);
    expect(doc.probe.frameworks.torch).toBe("2.4.1");
    expect(doc.probe.cuda).toBe("12.1");
    expect(doc.probe.gpus).toEqual([]);
    const again = await cli(["join"], { env });
    expect(again.code).toBe(0);
    expect(again.stdout).toContain("torch     2.4.1 (CUDA 12.1)");
    expect(again.stdout).toContain("labels    zone=a");
    expect(again.stdout).toContain(`python    ${python}`);
    // Read from files and a cached interpreter probe: milliseconds, not an import of torch.
    expect(json((await cli(["join", "--json"], { env })).stdout).probe.probe_ms).toBeLessThan(1000);
  }, T);
});

describe("matching", () => {
  test("a job asking torch>=2 lands on the torch worker and nowhere else; the second one waits for it", async () => {
    const file = await jobFile(join(boxes.client.root, "torchjob"), `command: python -c "import torch.version as v; print('torch', v.__version__, v.cuda)"\nresources: {frameworks: {torch: ">=2"}}\n`);
    const [a, b] = await Promise.all([gpl(["job", "run", "-f", file]), gpl(["job", "run", "-f", file])]);
    for (const r of [a, b]) {
      expect(r.code).toBe(0);
      expect(r.stdout).toBe("torch 2.4.1 12.1\n");
      expect(r.stderr).toContain("assigned to worker w2");
    }
    expect(a.stderr + b.stderr).toContain("waiting for room on a worker (w2: its slot is busy)");
    const refused = await gpl(["job", "run", "-f", await jobFile(join(boxes.client.root, "torch3"), `command: echo x\nresources: {frameworks: {torch: ">=3"}}\n`)]);
    expect(refused.code).toBe(1);
    expect(refused.stderr).toContain("job refused: no worker can run it");
    expect(refused.stderr).toContain("w2: torch 2.4.1 does not satisfy >=3");
    // Workers that give one reason are named together.
    expect(refused.stderr).toContain("w1, w3: torch is not installed");
  }, T);

  test("a job with a label lands on the labelled worker; GPUs are given by the server", async () => {
    const r = await gpl(["job", "run", "--label", "zone=b", "--json", "--", "sh", "-c", "echo on zone b"]);
    expect(r.code).toBe(0);
    const status = json(r.stdout);
    expect(status.worker).toBe("w3");
    expect(r.stderr).toContain("on zone b");
    const gpuJob = await jobFile(join(boxes.client.root, "gpujob"), `command: echo "visible=$CUDA_VISIBLE_DEVICES"\nresources: {gpus: 1}\n`);
    const g = await gpl(["job", "run", "-f", gpuJob]);
    expect(g.stdout).toBe("visible=GPU-aaaa-1111\n");
    const plain = await gpl(["job", "run", "--label", "zone=b", "--", "sh", "-c", 'echo "visible=[$CUDA_VISIBLE_DEVICES]"']);
    expect(plain.stdout).toBe("visible=[]\n");
    const nowhere = await gpl(["job", "run", "--label", "zone=c", "--", "true"]);
    expect(nowhere.code).toBe(1);
    expect(nowhere.stderr).toContain("w3: label zone=b, not c");
    const tooMany = await gpl(["job", "run", "-f", await jobFile(join(boxes.client.root, "gpu3"), "command: echo x\nresources: {gpus: 3}\n")]);
    expect(tooMany.stderr).toContain("error: job refused: it needs 3 GPUs; no machine it can run on has more than 2\n");
    const image = await gpl(["job", "run", "--image", "busybox", "--", "true"]);
    expect(image.stderr).toContain("no working container engine");
  }, T);

  test("job run --gpus N overrides resources.gpus, remotely (matching, GPUs given) and locally", async () => {
    const file = await jobFile(join(boxes.client.root, "gpuflag"), `command: echo "visible=$CUDA_VISIBLE_DEVICES"\nresources: {gpus: 1}\n`);
    const two = await gpl(["job", "run", "--gpus", "2", "--json", "-f", file]);
    const s = json(two.stdout);
    expect([two.code, s.worker, s.events.find((e: any) => e.type === "job.assigned").data.gpus]).toEqual([0, "w3", [0, 1]]);
    expect(two.stderr).toContain("visible=GPU-aaaa-1111,GPU-bbbb-2222\n");
    // --gpus 0 over the file's 1: none of w3's GPUs are visible.
    expect((await gpl(["job", "run", "--gpus", "0", "--label", "zone=b", "-f", file])).stdout).toBe("visible=\n");
    // Two one-GPU jobs at once on the two-GPU worker: one GPU each, each job given to a worker once.
    const cmd = ["job", "run", "--gpus", "1", "--", "sh", "-c", 'sleep 1; echo "$CUDA_VISIBLE_DEVICES"'];
    const pair = await Promise.all([gpl(cmd), gpl(cmd)]);
    expect(pair.map((r) => r.stdout.trim()).sort()).toEqual(["GPU-aaaa-1111", "GPU-bbbb-2222"]);
    for (const r of pair) expect(r.stderr).toContain("assigned to worker w3");
    for (const j of json<any[]>((await gpl(["job", "list", "--json", "--limit", "2"])).stdout)) expect(j.attempts).toBe(1);
    const tooMany = await gpl(["job", "run", "--gpus", "3", "--", "true"]);
    // The one rule for resources: the same line as on one machine (test/fleet-and-machine.test.ts).
    expect([tooMany.code, tooMany.stderr]).toEqual([1, expect.stringContaining("error: job refused: it needs 3 GPUs; no machine it can run on has more than 2\n")]);
    const bad = await gpl(["job", "run", "--gpus", "two", "--", "true"]);
    expect([bad.code, bad.stderr]).toEqual([2, expect.stringContaining("--gpus two: expected a whole number of GPUs")]);
    // Locally, on a machine with GPUs (w3's stand-in nvidia-smi): the job's spec carries it (what a container job's --gpus is made from).
    const local = await cli(["job", "run", "--gpus", "1", "--json", "-f", file], { env: { ...boxes.client.env, PATH: `${join(boxes.w3.root, "bin")}:${boxes.client.env.PATH}` } });
    const store = new JobStore(homeLayout(boxes.client.home));
    expect(store.get(json(local.stdout).id)!.spec.resources.gpus).toBe(1);
    // And it sees that one GPU, as it would on a worker: not every GPU of the machine.
    expect(local.stderr).toContain("visible=GPU-aaaa-1111\n");
    store.close();
  }, T);
});

describe("jobs", () => {
  test("output and exit code reach the client; status, list and logs work as locally", async () => {
    const dir = join(boxes.client.root, "exitjob");
    mkdirSync(dir);
    writeFileSync(join(dir, "main.py"), "import sys\nprint('hello from the worker', flush=True)\nprint('to stderr', file=sys.stderr)\nsys.exit(7)\n");
    const r = await gpl(["job", "run", "--label", "zone=b", "--workdir", ".", "--", "python", "main.py"], dir);
    expect(r.code).toBe(7);
    expect(r.stdout).toBe("hello from the worker\n");
    expect(r.stderr).toContain("to stderr");
    const list = json<any[]>((await gpl(["job", "list", "--json"])).stdout);
    const id = list[0].id;
    expect(list[0]).toMatchObject({ state: "failed", exit_code: 7, worker: "w3" });
    const s = json((await gpl(["job", "status", id.slice(0, 8), "--json"])).stdout);
    expect(Object.keys(s)).toEqual(expect.arrayContaining(["id", "name", "state", "exit_code", "command", "workdir", "created", "env_key", "error", "phases", "events"]));
    expect(s.phases.map((p: any) => p.name)).toEqual(["task.prepare", "task.run"]);
    // The build's progress steps are relayed as they happen (and shown on the client's stderr), between start and finish.
    const kinds = s.events.map((e: any) => e.type as string);
    expect(kinds.filter((t: string) => !/^task\.prepare\.(step|quiet)$/.test(t))).toEqual(["job.submitted", "job.assigned", "task.prepare.started", "task.prepare.finished", "task.run.started", "task.run.finished"]);
    if (s.events.find((e: any) => e.type === "task.prepare.finished")?.data?.status === "built") expect(r.stderr).toMatch(/^\[w3\] installing /m);
    expect((await gpl(["job", "logs", id])).stdout).toBe("hello from the worker\nto stderr\n");
  }, T);

  test("an unchanged workdir is not uploaded twice", async () => {
    const dir = join(boxes.client.root, "upload-once");
    mkdirSync(dir);
    writeFileSync(join(dir, "data.txt"), "one\n");
    const first = await gpl(["job", "run", "--verbose", "--workdir", ".", "--", "cat", "data.txt"], dir);
    expect(first.stdout).toBe("one\n");
    expect(first.stderr).toContain("uploading");
    const again = await gpl(["job", "run", "--verbose", "--workdir", ".", "--", "cat", "data.txt"], dir);
    expect(again.stdout).toBe("one\n");
    expect(again.stderr).not.toContain("uploading");
    expect(again.stderr).toContain("already on the server");
    writeFileSync(join(dir, "data.txt"), "two\n");
    const changed = await gpl(["job", "run", "--workdir", ".", "--", "cat", "data.txt"], dir);
    expect(changed.stdout).toBe("two\n");
    expect(changed.stderr).toContain("uploading");
  }, T);

  test("cancel reaches the job on its worker", async () => {
    const d = await gpl(["job", "run", "-d", "--", "sh", "-c", "echo started; sleep 60"]);
    const id = d.stdout.trim();
    await waitFor("the job to run", async () => json((await gpl(["job", "status", id, "--json"])).stdout).state === "running");
    const c = await gpl(["job", "cancel", id]);
    expect(c.stdout).toContain(`job ${id} cancelled`);
    expect((await gpl(["job", "logs", id, "--follow"])).stdout).toBe("started\n");
  }, T);

  test("a malicious bundle is refused by the server and nothing is stored", async () => {
    const file = join(boxes.client.root, "evil.tar.gz");
    const r = await run(["python3", "-c", `import io,tarfile\nwith tarfile.open('${file}','w:gz') as t:\n  ti=tarfile.TarInfo('../../evil'); ti.size=1; t.addfile(ti, io.BytesIO(b'x'))`]);
    expect(r.code).toBe(0);
    const data = await Bun.file(file).bytes();
    const hash = new Bun.CryptoHasher("sha256").update(data).digest("hex");
    const res = await fetch(`${url}/v1/bundles/${hash}`, { method: "PUT", headers: { authorization: `Bearer ${TOKEN}` }, body: data });
    expect(res.status).toBe(400);
    expect(((await res.json()) as { error: string }).error).toContain("climbs out with ..");
    expect((await fetch(`${url}/v1/bundles/${hash}`, { method: "HEAD", headers: { authorization: `Bearer ${TOKEN}` } })).status).toBe(404);
    const wrongHash = await fetch(`${url}/v1/bundles/${"0".repeat(64)}`, { method: "PUT", headers: { authorization: `Bearer ${TOKEN}` }, body: data });
    expect(wrongHash.status).toBe(400);
    const huge = await fetch(`${url}/v1/jobs`, { method: "POST", headers: { authorization: `Bearer ${TOKEN}`, "content-type": "application/json" }, body: JSON.stringify({ pad: "x".repeat(9 * 1024 * 1024) }) });
    expect(huge.status).toBe(413);
  }, T);
});

describe("env prepare against the server", () => {
  test("builds on every matching worker, then reports reused; --label narrows; a job then hits the cache", async () => {
    const args = ["env", "prepare", "-p", "greet", "--index-url", index.url];
    const first = await gpl([...args, "--json"]);
    expect(first.code).toBe(0);
    const doc = json(first.stdout);
    expect(doc.workers.map((w: any) => [w.worker, w.status]).sort()).toEqual([["w1", "built"], ["w2", "built"], ["w3", "built"]]);
    for (const w of doc.workers) expect(typeof w.seconds).toBe("number");
    // Each worker's build steps, relayed as they happen, on stderr (with --json too).
    for (const w of ["w1", "w2", "w3"]) expect(first.stderr).toMatch(new RegExp(`\\[${w}\\] (creating virtual environment|installing)`));
    const again = await gpl(args);
    expect(again.code).toBe(0);
    expect(again.stdout.trim().split("\n").map((l) => l.split(/\s+/).slice(0, 2).join(" ")).sort()).toEqual(["w1 reused", "w2 reused", "w3 reused"]);
    const narrowed = await gpl([...args, "--label", "zone=b"]);
    expect(narrowed.stdout.trim().split("\n")).toHaveLength(1);
    expect(narrowed.stdout).toMatch(/^w3\s+reused/);
    const job = await gpl(["job", "run", "--json", "-p", "greet", "--index-url", index.url, "--", "python", "-c", "import greet; print(greet.hello())"]);
    expect(job.code).toBe(0);
    expect(job.stderr).toContain("hello from greet");
    expect(json(job.stdout).phases[0]).toMatchObject({ name: "task.prepare", cache: "hit" });
    // A requirements file travels with its folder (includes too); the key is by content, so a job's copy hits the same env.
    const reqDir = join(boxes.client.root, "reqs");
    mkdirSync(reqDir);
    writeFileSync(join(reqDir, "base.txt"), "greet\n");
    writeFileSync(join(reqDir, "requirements.txt"), "-r base.txt\n");
    const viaFile = await gpl(["env", "prepare", join(reqDir, "requirements.txt"), "--index-url", index.url, "--label", "zone=b"]);
    expect(viaFile.code).toBe(0);
    expect(viaFile.stdout).toMatch(/^w3\s+(built|reused)/);
    const file = await jobFile(reqDir, `command: python -c "import greet; print(greet.hello())"\nenvironment: {requirements: requirements.txt, index_url: "${index.url}"}\n`);
    const fromFile = await gpl(["job", "run", "--json", "--label", "zone=b", "-f", file]);
    expect(fromFile.code).toBe(0);
    expect(json(fromFile.stdout).phases[0]).toMatchObject({ name: "task.prepare", cache: "hit" });
    const failed = await gpl(["env", "prepare", "-p", "nosuchpkg-gpl", "--index-url", index.url, "--label", "zone=b"]);
    expect(failed.code).toBe(1);
    expect(failed.stdout).toMatch(/^w3\s+failed\s+.*nosuchpkg-gpl/);
  }, T);

  test("a local and an editable project in the job's folder build on the worker from its bundle; env prepare --server of the folder warms the job's env", async () => {
    const dir = join(boxes.client.root, "local-projects");
    makeDist("project", dir, { name: "fastpkg", version: "1.0" });
    writeFileSync(join(dir, "req.txt"), "./fastpkg\n");
    writeFileSync(join(dir, "req-e.txt"), "-e ./fastpkg\n");
    for (const req of ["req.txt", "req-e.txt"]) {
      const warm = await gpl(["env", "prepare", req, "--index-url", index.url, "--label", "zone=b"], dir);
      expect(warm.code, warm.stderr).toBe(0);
      expect(warm.stdout).toMatch(/^w3\s+built/);
      const code = "import fastpkg; print(fastpkg.__version__, fastpkg.__file__)";
      const job = await gpl(["job", "run", "--json", "--label", "zone=b", "--workdir", ".", "-r", req, "--index-url", index.url, "--", "python", "-c", code], dir);
      expect(job.code, job.stderr).toBe(0);
      expect(job.stderr).toContain("1.0 ");
      // The editable link goes to the worker's copy of the bundle, named by its content: the same for every job of it.
      if (req === "req-e.txt") expect(job.stderr).toMatch(/1\.0 \S*\/cluster\/bundles\/[0-9a-f]{64}\/fastpkg\/fastpkg\/__init__\.py/);
      expect(json(job.stdout).phases[0]).toMatchObject({ name: "task.prepare", cache: "hit" });
    }
    // A build that fails on the worker is said once, naming the worker, with the exit code it gives.
    const failed = await gpl(["job", "run", "--label", "zone=b", "-p", "nosuchpkg-gpl", "--index-url", index.url, "--", "true"], dir);
    expect(failed.code).not.toBe(0);
    const errors = failed.stderr.split("\n").filter((l) => l.startsWith("error:"));
    expect(errors).toHaveLength(1);
    expect(errors[0]).toStartWith("error: task.prepare failed on w3: ");
  }, T);
});
