import { afterAll, beforeAll, describe, expect, setDefaultTimeout, test } from "bun:test";
import { existsSync, mkdirSync, readdirSync, readFileSync, rmSync, statfsSync, writeFileSync } from "node:fs";
import { join } from "node:path";
import { processStartTime } from "../src/core/process-identity.ts";
import { bigWheel, slowProxy } from "./fixtures/slow-index.ts";
import { makeDist, PackageIndex } from "./fixtures/index.ts";
import { keepOutput, type Kept, waitFor } from "./fixtures/processes.ts";
import { cli, HAS_UV, makeWorkerVenv, readyKeys, run, sandbox, startCli, tempDir } from "./helpers.ts";

/**
 * Builds meeting the faults around them, with real installers and a real
 * index on 127.0.0.1: gpulayer SIGKILLed alone while its installer runs on
 * (the next builder ends that installer before it builds), and a disk that
 * fills during a build (one line saying so, exit 1, nothing kept).
 */

setDefaultTimeout(120_000);

const world = tempDir("gpl-faults-");
const index = new PackageIndex(join(world, "index"));
let python: string;

beforeAll(async () => {
  index.start();
  const s = sandbox();
  python = await makeWorkerVenv(join(world, "worker"), { env: s.env });
  s.cleanup();
  await bigWheel(index, { name: "trickle", version: "1.0", data_bytes: 2_000_000 });
  await bigWheel(index, { name: "bigdata", version: "1.0", data_bytes: 30_000_000 });
  await bigWheel(index, { name: "bigsrc", version: "1.0", source_bytes: 6_000_000 });
}, 120_000);

afterAll(() => {
  index.stop();
  rmSync(world, { recursive: true, force: true });
});


/** The processes `parent` started whose command line has `word` in it, each with its start time. */
function childrenOf(parent: number, word: string): { pid: number; start: number }[] {
  const found: { pid: number; start: number }[] = [];
  for (const name of readdirSync("/proc").filter((n) => /^\d+$/.test(n))) {
    try {
      const stat = readFileSync(`/proc/${name}/stat`, "latin1");
      const ppid = Number(stat.slice(stat.lastIndexOf(")") + 2).split(" ")[1]);
      const cmd = readFileSync(`/proc/${name}/cmdline`, "latin1").split("\0").join(" ");
      const start = processStartTime(Number(name));
      if (ppid === parent && cmd.includes(word) && start !== null) found.push({ pid: Number(name), start });
    } catch {
      // ended while looked at
    }
  }
  return found;
}

const running = (p: { pid: number; start: number }) => processStartTime(p.pid) === p.start;

for (const installer of HAS_UV ? (["auto", "pip"] as const) : (["pip"] as const)) {
  describe(`gpulayer SIGKILLed alone during an install (${installer === "auto" ? "uv, the fast path" : "pip"})`, () => {
    test("the next prepare of the same key ends the orphaned installer, then builds and succeeds", async () => {
      const s = sandbox();
      const proxy = slowProxy(index);
      const kept: Kept[] = [];
      let orphan: { pid: number; start: number } | undefined;
      try {
        const env = { ...s.env, GPULAYER_INSTALLER: installer };
        const args = ["env", "prepare", "-p", "trickle", "--index-url", proxy.url, "--python", python, "--json"];
        const victim = keepOutput(startCli(args, { env, cwd: s.root }), kept);
        await waitFor("the installer's download to start", () => proxy.state.downloads > 0);
        const [tool, ...others] = await waitFor("the installer among gpulayer's children", () => {
          // The installer itself (`uv pip install`, `python -m pip install`), not the compile's workers waiting beside it.
          const found = childrenOf(victim.proc.pid, "pip install");
          return found.length ? found : null;
        });
        expect(others).toEqual([]);
        orphan = tool;
        process.kill(victim.proc.pid, "SIGKILL"); // gpulayer alone, as the OOM killer does
        await victim.proc.exited;
        await Bun.sleep(300);
        expect(running(orphan!)).toBe(true); // it outlives gpulayer, still installing

        proxy.state.slow = false;
        const next = startCli(args, { env, cwd: s.root });
        const [stdout, stderr] = [new Response(next.stdout).text(), new Response(next.stderr).text()];
        const code = await Promise.race([next.exited, Bun.sleep(60_000).then(() => (next.kill("SIGKILL"), "still running after 60 s"))]);
        expect({ code, stderr: code === 0 ? "" : await stderr }).toEqual({ code: 0, stderr: "" });
        const doc = JSON.parse(await stdout);
        expect(doc).toMatchObject({ status: "built" });
        expect(running(orphan!)).toBe(false);

        // The env is whole: its package imports, it alone is ready, and nothing of the first build is left.
        const imported = await run([doc.python, "-c", "import trickle, os; print(trickle.__version__, os.path.getsize(os.path.join(os.path.dirname(trickle.__file__), 'blob.bin')))"]);
        expect(imported.stdout.trim()).toBe("1.0 2000000");
        expect(readyKeys(s.home)).toEqual([doc.key]);
        expect(readdirSync(join(s.home, "envs-v1"))).toEqual([doc.key]);
        expect(existsSync(join(s.home, "trash")) ? readdirSync(join(s.home, "trash")) : []).toEqual([]);
        expect(readdirSync(join(s.home, "locks")).filter((n) => n.startsWith(doc.key))).toEqual([]);
      } finally {
        for (const k of kept) k.proc.kill("SIGKILL");
        if (orphan && running(orphan)) process.kill(orphan.pid, "SIGKILL"); // a failed run leaves none behind

        proxy.stop();
        s.cleanup();
      }
    });
  });
}

/** A small tmpfs for GPULAYER_HOME; null and the reason when it cannot be mounted (not root, no mount). */
function mountTmpfs(dir: string, size: string): string | null {
  mkdirSync(dir, { recursive: true });
  const r = Bun.spawnSync(["mount", "-t", "tmpfs", "-o", `size=${size}`, "tmpfs", dir], { stdout: "pipe", stderr: "pipe" });
  return r.exitCode === 0 ? null : `cannot mount a tmpfs (${r.stderr.toString().trim() || `exit ${r.exitCode}`})`;
}

const disk = tempDir("gpl-disk-");
const cannotMount = mountTmpfs(disk, "48m");
if (cannotMount) {
  console.warn(`skipping the full-disk tests: ${cannotMount}`);
  rmSync(disk, { recursive: true, force: true });
}
// At the file's end, whichever of its tests ran (a -t filter may run none of the full-disk ones).
afterAll(() => {
  if (!cannotMount) Bun.spawnSync(["umount", disk]);
});

// Skipped only where a tmpfs cannot be mounted (not root): a full disk needs a small filesystem of its own. CI runs as root, so there it runs.
describe.skipIf(Boolean(cannotMount))("a disk that fills during a build", () => {

  const freeMiB = () => {
    const f = statfsSync(disk);
    return Math.floor((f.bavail * f.bsize) / 2 ** 20);
  };

  // A ballast file leaves about 10 MiB of the 48 free; deleting it is how the user frees space.
  const cases = [
    { what: "a wheel bigger than what is left", spec: "bigdata", writing: /^the env \(installing the requirements( with uv)?\)$/ },
    { what: "bytecode that does not fit after the install did (the last writes)", spec: "bigsrc", writing: /^the env \(compiling the env's bytecode\)$|^\$GPULAYER_HOME\/envs-v1\/[0-9a-f]{64}\/\.gpulayer\/[\w.-]+$/ },
  ];
  for (const c of cases) {
    test(`${c.what}: one line, exit 1, nothing ready, no build folder; with space freed, the same prepare succeeds`, async () => {
      const s = sandbox();
      const home = join(disk, "home");
      const ballast = join(disk, "ballast");
      try {
        mkdirSync(home);
        writeFileSync(ballast, Buffer.alloc((freeMiB() - 10) * 2 ** 20));
        const env = { ...s.env, GPULAYER_HOME: home };
        const args = ["env", "prepare", "-p", c.spec, "--index-url", index.url, "--python", python];

        const full = await cli(args, { env, cwd: s.root });
        const lines = full.stderr.trimEnd().split("\n");
        expect({ code: full.code, last: lines.at(-1) }).toMatchObject({ code: 1, last: expect.stringMatching(/^error: no space left on device while writing .+, \d+ MiB free under GPULAYER_HOME$/) });
        expect(lines.filter((l) => /error/i.test(l))).toHaveLength(1);
        const [, writing, mib] = /^error: no space left on device while writing (.+), (\d+) MiB free under GPULAYER_HOME$/.exec(lines.at(-1)!)!;
        expect(writing).toMatch(c.writing);
        expect(Math.abs(Number(mib) - freeMiB())).toBeLessThanOrEqual(1);
        expect(full.stdout).toBe("");

        const list = await cli(["env", "list", "--json"], { env });
        expect(list.code).toBe(0);
        expect(JSON.parse(list.stdout).filter((e: { state?: string }) => e.state === "ready")).toEqual([]);
        expect(readyKeys(home)).toEqual([]);
        expect(readdirSync(join(home, "envs-v1"))).toEqual([]);
        expect(existsSync(join(home, "trash")) ? readdirSync(join(home, "trash")) : []).toEqual([]);

        rmSync(ballast);
        const freed = await cli([...args, "--json"], { env, cwd: s.root });
        expect(freed.code).toBe(0);
        const doc = JSON.parse(freed.stdout);
        expect(doc.status).toBe("built");
        expect(readyKeys(home)).toEqual([doc.key]);
      } finally {
        rmSync(ballast, { force: true });
        rmSync(home, { recursive: true, force: true });
        s.cleanup();
      }
    });
  }
});

// Skipped only where a tmpfs cannot be mounted (not root): a full disk needs a small filesystem of its own. CI runs as root, so there it runs.
describe.skipIf(Boolean(cannotMount))("a disk already full", () => {
  test("job run: one line, exit 1, no half-made lock or job store; reads still work; freed, it runs; gc clears a dead maker's lock remains", async () => {
    const s = sandbox();
    const home = join(disk, "home-full");
    const ballast = join(disk, "ballast-full");
    try {
      mkdirSync(home);
      // Every block taken: the job store, a lock, anything gpulayer writes fails.
      Bun.spawnSync(["sh", "-c", `dd if=/dev/zero of=${ballast} bs=1M 2>/dev/null; dd if=/dev/zero of=${ballast}.tail bs=4k 2>/dev/null; true`]);
      const env = { ...s.env, GPULAYER_HOME: home };
      const args = ["job", "run", "-p", "trickle", "--index-url", index.url, "--python", python, "--", "python", "-c", "print('ran')"];
      const full = await cli(args, { env, cwd: s.root });
      expect(full.code, full.stderr).toBe(1);
      expect(full.stderr.trimEnd().split("\n").at(-1)).toMatch(/^error: no space left on device while writing /);
      expect(full.stderr).not.toContain("internal error");
      const locks = join(home, "locks");
      expect(existsSync(locks) ? readdirSync(locks).filter((n) => n.endsWith(".tmp")) : []).toEqual([]);
      for (const read of [["job", "list", "--json"], ["env", "list", "--json"]]) {
        const r = await cli(read, { env });
        expect([read.join(" "), r.code, r.stderr]).toEqual([read.join(" "), 0, ""]);
        expect(JSON.parse(r.stdout)).toEqual([]);
      }
      rmSync(ballast);
      rmSync(`${ballast}.tail`);
      const freed = await cli(args, { env, cwd: s.root });
      expect(freed.code, freed.stderr).toBe(0);
      expect(freed.stdout).toBe("ran\n");
      // What a lock's maker leaves when it is killed between making and placing it: gc clears it, never a live one's.
      mkdirSync(join(locks, "x.lock.999999999-abcd1234.tmp"), { recursive: true });
      mkdirSync(join(locks, `y.lock.${process.pid}1-abcd1234.tmp`), { recursive: true });
      const live = join(locks, `z.lock.${process.ppid}-abcd1234.tmp`);
      mkdirSync(live, { recursive: true });
      const gc = await cli(["gc", "--json"], { env });
      expect(gc.code, gc.stderr).toBe(0);
      expect(readdirSync(locks).filter((n) => n.endsWith(".tmp"))).toEqual([`z.lock.${process.ppid}-abcd1234.tmp`]);
    } finally {
      rmSync(ballast, { force: true });
      rmSync(`${ballast}.tail`, { force: true });
      rmSync(home, { recursive: true, force: true });
      s.cleanup();
    }
  });
});

describe("an installer that says nothing", () => {
  test("is told of while it stays silent: its name (a module run with -m by the module) and how long it has been silent, growing", async () => {
    const { runTool } = await import("../src/env/build/run-tool.ts");
    const told: [string, number][] = [];
    const script = "import sys, time; print('started', flush=True); time.sleep(1.3)";
    const r = await runTool([python, "-c", script], { env: process.env as Record<string, string>, cwd: "/", hooks: { onQuiet: (tool, s) => told.push([tool, s]) }, quietMs: 400 });
    expect(r.code).toBe(0);
    expect(told.length).toBeGreaterThanOrEqual(2);
    expect(told.every(([tool]) => tool === "python")).toBe(true);
    expect(told[0]![1]).toBeGreaterThanOrEqual(0.4);
    expect(told[1]![1]).toBeGreaterThan(told[0]![1] + 0.3); // the silence so far, not the interval again
    const named: string[] = [];
    await runTool([python, "-m", "timeit", "-n", "1", "import time; time.sleep(0.7)"], { env: process.env as Record<string, string>, cwd: "/", hooks: { onQuiet: (tool) => named.push(tool) }, quietMs: 300 });
    expect(named[0]).toBe("timeit");
  });
});

describe("what pip says it did, on the pip path", () => {
  test("packages pip takes from a local folder (its 'Processing' lines, not 'Collecting') are counted as collected", async () => {
    const links = join(world, "local-links");
    mkdirSync(links, { recursive: true });
    makeDist("wheel", links, { name: "fromfolder", version: "1.0", requires: ["slowbuild"] });
    // A build that takes longer than the 2 s between progress lines: the line after it shows what was counted.
    makeDist("sdist", links, { name: "slowbuild", version: "1.0", sleep: 3 });
    const s = sandbox();
    try {
      writeFileSync(join(s.root, "req.txt"), `--no-index\n--find-links ${links}\nfromfolder\n`);
      const r = await cli(["env", "prepare", "req.txt", "--python", python], { env: { ...s.env, GPULAYER_INSTALLER: "pip" }, cwd: s.root });
      expect(r.code, r.stderr).toBe(0);
      expect(r.stderr).toMatch(/^\[[^\]]+\] {3}2 collected\b/m);
    } finally {
      s.cleanup();
    }
  });
});
