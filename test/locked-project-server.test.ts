import { afterAll, beforeAll, describe, expect, test } from "bun:test";
import { appendFileSync, mkdirSync, readFileSync, writeFileSync } from "node:fs";
import { join } from "node:path";
import * as v from "valibot";
import { DOCUMENTS } from "../src/commands/_json.ts";
import { makeDist, PackageIndex } from "./fixtures/index.ts";
import { cli, HAS_UV, makeWorkerVenv, run, sandbox, startCli } from "./helpers.ts";
import { keepOutput, stopAll, waitFor } from "./fixtures/processes.ts";

/**
 * A uv project through a server (real processes on 127.0.0.1): the project and
 * its uv.lock travel in the job's bundle and the worker builds the locked env
 * from them: the job sees the locked version, not the newer one on the index.
 */

const TOKEN = "locked-project-server-token-0123";
const FAST = { GPULAYER_HEARTBEAT_SECONDS: "0.5", GPULAYER_WORKER_LOST_SECONDS: "5", GPULAYER_WORKER_ENGINE: "none", GPULAYER_CANCEL_GRACE: "1", GPULAYER_WORKER_DRAIN_SECONDS: "1", GPULAYER_WORKER_SLOTS: "1" };
const T = 180_000;
const boxes = { server: sandbox(), worker: sandbox(), client: sandbox() };
const index = new PackageIndex(join(boxes.client.root, "index"));
const procs: { proc: ReturnType<typeof startCli>; out: () => string }[] = [];
let url = "";
const fleet = (args: string[], cwd: string) => cli(args, { env: { ...boxes.client.env, GPULAYER_SERVER: url, GPULAYER_TOKEN: TOKEN }, cwd });

beforeAll(async () => {
  if (!HAS_UV) return;
  index.start();
  for (const version of ["1.0", "2.0"]) index.wheel({ name: "pinned", version, files: { "pinned/__init__.py": `__version__ = "${version}"\n` } });
  for (const version of ["1.0", "2.0"]) index.wheel({ name: "held", version, files: { "held/__init__.py": `__version__ = "${version}"\n` } });
  const server = keepOutput(startCli(["server", "--listen", "127.0.0.1:0", "--json"], { env: { GPULAYER_TOKEN: TOKEN, ...boxes.server.env, ...FAST } }), procs);
  url = (await waitFor("the server", async () => /"url": "([^"]+)"/.exec(server.out())?.[1])) as string;
  // The worker has held 2.0 (a lock below pins 1.0); no pinned at all.
  const venv = await makeWorkerVenv(join(boxes.worker.root, "venv"), { env: boxes.worker.env, packages: ["held==2.0"], findLinks: index.dir });
  keepOutput(startCli(["join", url, "--name", "w1", "--python", venv], { env: { ...boxes.worker.env, ...FAST, GPULAYER_TOKEN: TOKEN } }), procs);
  await waitFor("the worker", async () => (JSON.parse((await fleet(["workers", "--json"], boxes.client.root)).stdout) as unknown[]).length === 1);
}, T);

afterAll(async () => {
  await stopAll(procs);
  index.stop();
  for (const b of Object.values(boxes)) b.cleanup();
}, 30_000);

// Skipped only without uv: a uv project is built by uv alone. CI installs uv (.ci/run), so there it runs.
describe.skipIf(!HAS_UV)("a uv project through a server", () => {
  test("the project and its lock travel in the bundle; the worker's env holds the locked version", async () => {
    const dir = join(boxes.client.root, "job");
    mkdirSync(dir, { recursive: true });
    // A project locked at pinned 1.0 (the index also offers 2.0); the worker's base has no pinned at all.
    const app = makeDist("project", dir, { name: "app", version: "0.1", requires: ["pinned<2"] });
    appendFileSync(join(app, "pyproject.toml"), `\n[project]\nname = "app"\nversion = "0.1"\nrequires-python = ">=3.8"\ndependencies = ["pinned<2"]\n[[tool.uv.index]]\nurl = "${index.url}"\ndefault = true\n`);
    const locked = await run(["uv", "lock"], { cwd: app, env: boxes.client.env });
    expect(locked.code, locked.stderr).toBe(0);
    writeFileSync(join(dir, "job.yaml"), ["name: locked-remote", "command: python -c 'import pinned, app; print(\"pinned\", pinned.__version__)'", "environment:", "  project: app", ""].join("\n"));
    const r = await fleet(["job", "run", "-f", "job.yaml", "--json"], dir);
    expect(r.code, r.stderr).toBe(0);
    expect(r.stderr + r.stdout).toContain("pinned 1.0");

    // `env prepare --project` through the server: the project and its lock travel as for a job, and the worker builds from them.
    const warmed = await fleet(["env", "prepare", "--project", "app", "--json"], dir);
    expect(warmed.code, warmed.stderr).toBe(0);
    const [w] = (JSON.parse(warmed.stdout) as { workers: { worker: string; state: string; path: string }[] }).workers;
    expect(w).toMatchObject({ worker: "w1", state: "succeeded" });
    const inWorkerEnv = await run([join(w!.path, "bin", "python"), "-c", "import pinned; print(pinned.__version__)"], { env: boxes.worker.env });
    expect(inWorkerEnv.stdout.trim()).toBe("1.0");
    // Named by the project's own name on the worker, not by the bundle folder that holds it there.
    const listed = await cli(["env", "list", "--json"], { env: boxes.worker.env, cwd: boxes.worker.root });
    const summaries = (JSON.parse(listed.stdout) as { kind: string; summary: string }[]).filter((e) => e.kind === "env").map((e) => e.summary);
    expect(summaries.length).toBeGreaterThan(0);
    for (const summary of summaries) expect(summary).toBe("uv project app (uv.lock)");
  }, T);

  test("a fleet `env prepare` says what a local one says: the worker packages the lock shadows, and pip check's findings", async () => {
    const dir = join(boxes.client.root, "shadowing");
    mkdirSync(dir, { recursive: true });
    const app = makeDist("project", dir, { name: "shadowing", version: "0.1" });
    appendFileSync(join(app, "pyproject.toml"), `\n[project]\nname = "shadowing"\nversion = "0.1"\nrequires-python = ">=3.8"\ndependencies = ["held==1.0"]\n[[tool.uv.index]]\nurl = "${index.url}"\ndefault = true\n`);
    expect((await run(["uv", "lock"], { cwd: app, env: boxes.client.env })).code).toBe(0);
    const shadowed = [{ name: "held", worker: "2.0", locked: "1.0" }];
    const doc = await fleet(["env", "prepare", "--project", "shadowing", "--json"], dir);
    expect(doc.code, doc.stderr).toBe(0);
    const [w] = v.parse(DOCUMENTS["env prepare --server"], JSON.parse(doc.stdout)).workers;
    expect(w).toMatchObject({ worker: "w1", status: "built", check: [], shadowed, installer_path: "uv (fast path)" });
    // The worker's own record of the env says the same.
    const shown = await cli(["env", "show", w!.key!, "--json"], { env: boxes.worker.env, cwd: boxes.worker.root });
    expect(JSON.parse(shown.stdout || "{}").shadowed, shown.stderr + shown.stdout).toEqual(shadowed);
    // Reused: the same report, and the line people read.
    const again = await fleet(["env", "prepare", "--project", "shadowing"], dir);
    expect(again.code, again.stderr).toBe(0);
    expect(again.stdout).toMatch(/^w1 {2}reused .*\n {4}shadows held 2\.0 \(the worker's\) by 1\.0 \(the lock's\)\n$/);
  }, T);

  test("a lock's local package outside the folder that travels is refused before anything is sent, naming it", async () => {
    const dir = join(boxes.client.root, "outside");
    mkdirSync(dir, { recursive: true });
    const lib = makeDist("project", join(dir, "libs"), { name: "libx", version: "0.1" });
    appendFileSync(join(lib, "pyproject.toml"), '\n[project]\nname = "libx"\nversion = "0.1"\nrequires-python = ">=3.8"\ndependencies = []\n');
    const app = join(dir, "app");
    mkdirSync(app);
    writeFileSync(join(app, "pyproject.toml"), `[project]\nname = "app"\nversion = "0.1"\nrequires-python = ">=3.8"\ndependencies = ["libx"]\n\n[tool.uv]\npackage = false\n\n[tool.uv.sources]\nlibx = { path = "../libs/libx", editable = true }\n`);
    expect((await run(["uv", "lock"], { cwd: app, env: boxes.client.env })).code).toBe(0);
    const r = await fleet(["env", "prepare", "--project", "app"], dir);
    expect([r.code, r.stderr.trim().split("\n").at(-1)]).toEqual([2, `error: the lock's local package ${lib} is outside ${app}: with a server, what the job reads travels in the bundle of that folder; move it inside`]);
  }, T);

  test("a stale lock, or a group the project lacks, is refused before anything is sent, in the user's own paths, as without a server", async () => {
    const dir = join(boxes.client.root, "stale");
    mkdirSync(dir, { recursive: true });
    const app = makeDist("project", dir, { name: "stale", version: "0.1" });
    const table = `\n[project]\nname = "stale"\nversion = "0.1"\nrequires-python = ">=3.8"\ndependencies = []\n[[tool.uv.index]]\nurl = "${index.url}"\ndefault = true\n`;
    appendFileSync(join(app, "pyproject.toml"), table);
    expect((await run(["uv", "lock"], { cwd: app, env: boxes.client.env })).code).toBe(0);
    appendFileSync(join(app, "pyproject.toml"), '[dependency-groups]\nextra-tools = ["pinned"]\n');
    const jobs = async () => (JSON.parse((await fleet(["job", "list", "--json"], dir)).stdout) as unknown[]).length;
    const before = await jobs();
    const stale = `error: ${app}/uv.lock: the lockfile needs to be updated: run uv lock`;
    const job = await fleet(["job", "run", "--workdir", ".", "--project", "stale", "--", "true"], dir);
    expect([job.code, job.stderr.trim()]).toEqual([2, stale]);
    const prepared = await fleet(["env", "prepare", "--project", "stale"], dir);
    expect([prepared.code, prepared.stderr.trim()]).toEqual([2, stale]);
    expect((await run(["uv", "lock"], { cwd: app, env: boxes.client.env })).code).toBe(0);
    const unknown = await fleet(["job", "run", "--workdir", ".", "--project", "stale", "--group", "nope", "--", "true"], dir);
    expect(unknown.code).toBe(2);
    expect(unknown.stderr.trim()).toMatch(new RegExp(`^error: ${app}: Group \`nope\` is not defined`));
    expect(await jobs()).toBe(before);
    // A client without uv cannot check: the worker refuses the lock, and names the job's folder, not where it keeps it.
    writeFileSync(join(app, "pyproject.toml"), readFileSync(join(app, "pyproject.toml"), "utf8").replace('dependencies = []', 'dependencies = ["pinned"]'));
    const noUv = await cli(["job", "run", "--workdir", ".", "--project", "stale", "--", "true"], { env: { ...boxes.client.env, PATH: "/usr/bin:/bin", GPULAYER_SERVER: url, GPULAYER_TOKEN: TOKEN }, cwd: dir });
    expect(noUv.code).not.toBe(0);
    expect(noUv.stderr).toContain("[w1] checking ./stale/uv.lock is up to date");
    expect(noUv.stderr).toContain("error: task.prepare failed on w1: ./stale/uv.lock: the lockfile needs to be updated: run uv lock");
    expect(noUv.stderr).not.toContain(boxes.worker.root);
  }, T);
});
