import { afterAll, beforeAll, describe, expect, setDefaultTimeout, test } from "bun:test";
import { existsSync, mkdirSync, readFileSync, utimesSync, writeFileSync } from "node:fs";
import { join } from "node:path";
import { homeLayout } from "../src/config/paths.ts";
import { PackageIndex } from "./fixtures/index.ts";
import { cli, makeWorkerVenv, run, sandbox } from "./helpers.ts";

/**
 * Requirements built without build isolation (`--no-build-isolation-package`,
 * a job file's `environment.no_build_isolation`), against the worker's torch:
 * built after the rest of the env, kept in the home's wheelhouse by what the
 * build imported, taken from there by a later env whose torch is the same,
 * never by one whose torch is another. The sdist's in-tree backend imports
 * `torch` and counts each build with the version it saw; the wheel keeps that
 * version (kernels.BUILT_WITH).
 */

setDefaultTimeout(240_000);

const s = sandbox();
const index = new PackageIndex(join(s.root, "index"));
const counter = join(s.root, "kernels-builds");
let torch21: string;
let torch22: string;

beforeAll(async () => {
  index.start();
  index.wheel({ name: "torch", version: "2.1.0+cu121" });
  index.wheel({ name: "torch", version: "2.2.0" });
  index.wheel({ name: "alpha", version: "1.0" });
  index.wheel({ name: "beta", version: "1.0" });
  index.sdist({ name: "kernels", version: "1.0", counter, imports: "torch" });
  // Two workers on one machine: one home, one pip and one uv cache (the sandbox's), two torches.
  [torch21, torch22] = await Promise.all([
    makeWorkerVenv(join(s.root, "worker-cu121"), { env: s.env, packages: ["torch==2.1.0+cu121"], findLinks: index.dir }),
    makeWorkerVenv(join(s.root, "worker-22"), { env: s.env, packages: ["torch==2.2.0"], findLinks: index.dir }),
  ]);
});
afterAll(() => {
  index.stop();
  s.cleanup();
});

const builds = () => (existsSync(counter) ? readFileSync(counter, "utf8").trim().split("\n") : []);
const prepare = (python: string, ...specs: string[]) => cli(["env", "prepare", ...specs.flatMap((p) => ["-p", p]), "--no-build-isolation-package", "kernels", "--index-url", index.url, "--python", python, "--json"], { env: s.env, cwd: s.root });
const builtWith = async (envPython: string) => (await run([envPython, "-c", "import kernels; print(kernels.BUILT_WITH)"])).stdout.trim();

describe("a requirement built without isolation", () => {
  test("is compiled once against the worker's torch; a second env on the worker takes its wheel from the wheelhouse", async () => {
    const first = await prepare(torch21, "kernels", "alpha");
    expect(first.code, first.stderr).toBe(0);
    const doc = JSON.parse(first.stdout);
    expect(builds()).toEqual([expect.stringMatching(/against torch 2\.1\.0\+cu121$/)]);
    expect(doc.wheels).toEqual([{ name: "kernels", wheel: "kernels-1.0-py3-none-any.whl", from: "compiled", seconds: expect.any(Number), built_against: expect.arrayContaining(["torch==2.1.0+cu121"]) }]);
    expect(await builtWith(doc.python)).toBe("2.1.0+cu121");

    // Another env (beta, not alpha) needing the same build: no compile.
    const second = await prepare(torch21, "kernels", "beta");
    expect(second.code, second.stderr).toBe(0);
    const doc2 = JSON.parse(second.stdout);
    expect(doc2.key).not.toBe(doc.key);
    expect(builds()).toHaveLength(1);
    expect(doc2.wheels).toEqual([expect.objectContaining({ name: "kernels", from: "wheelhouse", built_against: expect.arrayContaining(["torch==2.1.0+cu121"]) })]);
    expect(await builtWith(doc2.python)).toBe("2.1.0+cu121");

    // env show says which wheel was compiled against what.
    const shown = await cli(["env", "show", doc.key.slice(0, 12), "--json"], { env: s.env, cwd: s.root });
    expect(shown.code, shown.stderr).toBe(0);
    expect(JSON.parse(shown.stdout).wheels).toEqual(doc.wheels);
    expect(JSON.parse(shown.stdout).request.no_build_isolation).toEqual(["kernels"]);
  });

  test("a worker with another torch on the same machine, home and caches compiles its own, never the first one's wheel", async () => {
    const r = await prepare(torch22, "kernels", "alpha");
    expect(r.code, r.stderr).toBe(0);
    const doc = JSON.parse(r.stdout);
    expect(builds()).toHaveLength(2);
    expect(builds()[1]).toMatch(/against torch 2\.2\.0$/);
    expect(doc.wheels).toEqual([expect.objectContaining({ from: "compiled", built_against: expect.arrayContaining(["torch==2.2.0"]) })]);
    expect(await builtWith(doc.python)).toBe("2.2.0");
    // Each torch's wheel is kept: the first worker still takes its own, the second now too.
    const again21 = await prepare(torch21, "kernels");
    const again22 = await prepare(torch22, "kernels");
    expect(builds()).toHaveLength(2);
    expect(await builtWith(JSON.parse(again21.stdout).python)).toBe("2.1.0+cu121");
    expect(await builtWith(JSON.parse(again22.stdout).python)).toBe("2.2.0");
  });

  test("a CUDA build variable that differs is another build", async () => {
    const before = builds().length;
    const r = await cli(["env", "prepare", "-p", "kernels", "--no-build-isolation-package", "kernels", "--index-url", index.url, "--python", torch21, "--json"], { env: { ...s.env, TORCH_CUDA_ARCH_LIST: "9.0" }, cwd: s.root });
    expect(r.code, r.stderr).toBe(0);
    expect(builds()).toHaveLength(before + 1);
    expect(JSON.parse(r.stdout).wheels[0].from).toBe("compiled");
  });

  test("a name that is not one of the requirements is refused in one line", async () => {
    const r = await cli(["env", "prepare", "-p", "alpha", "--no-build-isolation-package", "kernels", "--index-url", index.url, "--python", torch21], { env: s.env, cwd: s.root });
    expect(r.code).toBe(2);
    expect(r.stderr.trim()).toMatch(/^error: --no-build-isolation-package kernels: not one of the requirements given by name/);
    expect(r.stderr.trim().split("\n")).toHaveLength(1);
  });

  test("a requirements file cannot ask for it (pip reads no such option there): the line is refused in one line naming the option", async () => {
    for (const line of ["--no-build-isolation", "kernels --no-build-isolation-package kernels", "--no-build-isolation-package=kernels"]) {
      writeFileSync(join(s.root, "isolation.txt"), `${line}\nkernels\n`);
      const r = await cli(["env", "prepare", "isolation.txt", "--index-url", index.url, "--python", torch21], { env: s.env, cwd: s.root });
      expect(r.code).toBe(2);
      const option = line.match(/(--no-build-isolation(-package)?)/)![1];
      expect(r.stderr.trim()).toBe(`error: isolation.txt:1: pip does not accept ${option} in a requirements file; name the package with --no-build-isolation-package NAME beside -p NAME, or in a job file's environment.no_build_isolation`);
    }
  });

  test("a job file's environment.no_build_isolation: the job runs with the wheel built against its worker's torch", async () => {
    const job = join(s.root, "job.yaml");
    writeFileSync(job, `command: python -c "import kernels; print('built with', kernels.BUILT_WITH)"\nenvironment:\n  requirements: [kernels, beta]\n  no_build_isolation: [kernels]\n  python: ${torch22}\n  index_url: ${index.url}\n`);
    const r = await cli(["job", "run", "-f", job], { env: s.env, cwd: s.root });
    expect(r.code, r.stderr).toBe(0);
    expect(r.stdout).toContain("built with 2.2.0");
    // task.prepare.finished says where the wheel came from and what it was built against.
    const id = JSON.parse((await cli(["job", "list", "--json"], { env: s.env })).stdout)[0].id;
    const status = JSON.parse((await cli(["job", "status", id, "--json"], { env: s.env })).stdout);
    const finished = status.events.find((e: { type: string }) => e.type === "task.prepare.finished");
    expect(finished.data.wheels).toEqual([expect.objectContaining({ name: "kernels", from: expect.stringMatching(/^(compiled|wheelhouse)$/), built_against: expect.arrayContaining(["torch==2.2.0"]) })]);
  });

  test("gc counts the wheelhouse and removes its wheels by the cache's rules; the next env compiles again", async () => {
    const first = await prepare(torch21, "kernels", "alpha");
    expect(first.code, first.stderr).toBe(0);
    const dry = JSON.parse((await cli(["gc", "--max-size", "0", "--min-age", "0", "--dry-run", "--json"], { env: s.env })).stdout);
    const wheels = dry.removed.filter((e: { kind: string }) => e.kind === "wheel");
    expect(wheels.length).toBeGreaterThan(0);
    expect(wheels.some((e: { summary: string }) => /kernels-1\.0-py3-none-any\.whl built against .*torch==2\.1\.0\+cu121/.test(e.summary))).toBe(true);
    expect(wheels.every((e: { size_bytes: number }) => e.size_bytes > 0)).toBe(true);
    // --min-age protects them as it protects envs.
    const young = JSON.parse((await cli(["gc", "--max-size", "0", "--dry-run", "--json"], { env: s.env })).stdout);
    expect(young.removed.filter((e: { kind: string }) => e.kind === "wheel")).toEqual([]);

    const real = JSON.parse((await cli(["gc", "--max-size", "0", "--min-age", "0", "--json"], { env: s.env })).stdout);
    expect(real.removed.filter((e: { kind: string }) => e.kind === "wheel").length).toBe(wheels.length);
    const before = builds().length;
    const again = await prepare(torch21, "kernels", "alpha");
    expect(again.code, again.stderr).toBe(0);
    expect(builds()).toHaveLength(before + 1);
    expect(JSON.parse(again.stdout).wheels[0].from).toBe("compiled");
  });

  test("a half-written wheel entry of a process not running here is left while it may be a build on another node sharing the home, removed once quiet", async () => {
    const gone = Bun.spawnSync(["true"]).pid; // a pid that has ended
    const dir = join(homeLayout(s.home).wheelhouse, "f".repeat(64), "cond", `1-abc.${gone}.tmp`);
    mkdirSync(dir, { recursive: true });
    writeFileSync(join(dir, "kernels-1.0-py3-none-any.whl"), "half");
    const incomplete = async () => JSON.parse((await cli(["gc", "--min-age", "0", "--json"], { env: s.env })).stdout).removed.filter((e: { kind: string; state: string }) => e.kind === "wheel" && e.state === "incomplete");
    expect(await incomplete()).toEqual([]);
    expect(existsSync(dir)).toBe(true);
    const quiet = new Date(Date.now() - 2 * 60_000);
    utimesSync(dir, quiet, quiet);
    expect((await incomplete()).length).toBe(1);
    expect(existsSync(dir)).toBe(false);
  });
});
