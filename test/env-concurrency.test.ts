import { afterAll, beforeAll, describe, expect, setDefaultTimeout, test } from "bun:test";
import { existsSync, mkdirSync, readdirSync, readFileSync, rmSync, utimesSync, writeFileSync } from "node:fs";
import { join } from "node:path";
import { processStartTime } from "../src/core/process-identity.ts";
import { isLocked, lockWhere, tryLock } from "../src/core/lock.ts";
import { PackageIndex } from "./fixtures/index.ts";
import { cli, makeWorkerVenv, readyKeys, sandbox, startCli, tempDir } from "./helpers.ts";

/**
 * One build per key across processes; a build killed with SIGKILL leaves
 * nothing that looks ready, and its lock does not block the next one.
 */

setDefaultTimeout(90_000);

const world = tempDir("gpl-conc-");
const index = new PackageIndex(join(world, "index"));
let python: string;

beforeAll(async () => {
  index.start();
  const s = sandbox();
  python = await makeWorkerVenv(join(world, "worker"), { env: s.env });
  s.cleanup();
}, 60_000);

afterAll(() => {
  index.stop();
  rmSync(world, { recursive: true, force: true });
});

const counted = (file: string) => (existsSync(file) ? readFileSync(file, "utf8").split("\n").filter(Boolean).length : 0);

async function until(what: string, cond: () => boolean, ms = 30_000): Promise<void> {
  const end = Date.now() + ms;
  while (!cond()) {
    if (Date.now() > end) throw new Error(`timed out waiting for ${what}`);
    await Bun.sleep(50);
  }
}

describe("env prepare, concurrently", () => {
  test("five processes asking for the same new env: one build, all get it", async () => {
    const s = sandbox();
    try {
      const counter = join(s.root, "builds");
      index.sdist({ name: "counted", version: "1.0", counter, sleep: 1 });
      const args = ["env", "prepare", "-p", "counted", "--index-url", index.url, "--python", python, "--json"];
      const results = await Promise.all(Array.from({ length: 5 }, () => cli(args, { env: s.env, cwd: s.root })));
      for (const r of results) expect(r.code).toBe(0);
      const docs = results.map((r) => JSON.parse(r.stdout));
      expect(counted(counter)).toBe(1);
      expect(docs.filter((d) => d.status === "built")).toHaveLength(1);
      expect(docs.filter((d) => d.status === "reused")).toHaveLength(4);
      expect(new Set(docs.map((d) => d.path)).size).toBe(1);
      expect(readyKeys(s.home)).toEqual([docs[0].key]);
    } finally {
      s.cleanup();
    }
  });

  test("SIGKILL mid-build leaves nothing ready; the next prepare breaks the lock, rebuilds and succeeds", async () => {
    const s = sandbox();
    try {
      const counter = join(s.root, "builds");
      index.sdist({ name: "slow-a", version: "1.0", counter, sleep: 120 });
      const args = ["env", "prepare", "-p", "slow-a", "--index-url", index.url, "--python", python, "--json"];
      const victim = startCli(args, { env: s.env, cwd: s.root, detached: true });
      await until("the build to start", () => counted(counter) === 1);
      process.kill(-victim.pid, "SIGKILL"); // gpulayer, pip and the build backend, all at once
      await victim.exited;

      expect(readyKeys(s.home)).toEqual([]);
      // The env's folder, and its installers' TMPDIR: both the next build's to remove.
      const [entry, ...others] = readdirSync(join(s.home, "envs-v1")).sort();
      expect(others).toEqual([`${entry}.tmp`]);
      const list = JSON.parse((await cli(["env", "list", "--json"], { env: s.env })).stdout);
      expect(list).toMatchObject([{ key: entry, state: "incomplete" }]);
      expect((await cli(["env", "show", entry!], { env: s.env })).code).toBe(1);

      // The same sdist, without the sleep: the key does not change.
      index.sdist({ name: "slow-a", version: "1.0", counter });
      const t = performance.now();
      const next = await cli(args, { env: s.env, cwd: s.root });
      expect(next.code).toBe(0);
      expect(JSON.parse(next.stdout)).toMatchObject({ key: entry, status: "built" });
      expect(performance.now() - t).toBeLessThan(20_000);
      expect(counted(counter)).toBe(2);
      expect(readyKeys(s.home)).toEqual([entry!]);
      expect(readdirSync(join(s.home, "envs-v1"))).toEqual([entry!]);
      expect(readdirSync(join(s.home, "locks")).filter((n) => n.startsWith(entry!))).toEqual([]);
      expect(existsSync(join(s.home, "trash")) ? readdirSync(join(s.home, "trash")) : []).toEqual([]);
    } finally {
      s.cleanup();
    }
  });

  test("a process waiting on a build that is killed takes over", async () => {
    const s = sandbox();
    try {
      const counter = join(s.root, "builds");
      index.sdist({ name: "slow-b", version: "1.0", counter, sleep: 120 });
      const args = ["env", "prepare", "-p", "slow-b", "--index-url", index.url, "--python", python, "--json"];
      const victim = startCli(args, { env: s.env, cwd: s.root, detached: true });
      await until("the build to start", () => counted(counter) === 1);
      const waiter = startCli(args, { env: s.env, cwd: s.root });
      const waiterErr = new Response(waiter.stderr).text();
      const waiterOut = new Response(waiter.stdout).text();
      await Bun.sleep(1500);
      index.sdist({ name: "slow-b", version: "1.0", counter });
      process.kill(-victim.pid, "SIGKILL");
      await victim.exited;
      expect(await waiter.exited).toBe(0);
      expect(JSON.parse(await waiterOut).status).toBe("built");
      // --json: stdout holds the one document; the build's progress goes to stderr (waiting, then taking over).
      expect(await waiterErr).toMatch(/^… another process is building [0-9a-f]{12}; waiting for it\n\[[^\]]+\] creating /);
      expect(counted(counter)).toBe(2);
      const again = await cli(args, { env: s.env, cwd: s.root });
      expect(JSON.parse(again.stdout).status).toBe("reused");
    } finally {
      s.cleanup();
    }
  });
});

describe("env prepare, a builder killed under waiters", () => {
  test("round after round, exactly one waiter takes over; the env it reports is there afterwards", async () => {
    const s = sandbox();
    try {
      for (let round = 0; round < 6; round++) {
        const counter = join(s.root, `builds-${round}`);
        index.sdist({ name: `heir-${round}`, version: "1.0", counter, sleep: 2 });
        const args = ["env", "prepare", "-p", `heir-${round}`, "--index-url", index.url, "--python", python, "--json"];
        const builder = startCli(args, { env: s.env, cwd: s.root, detached: true });
        await Bun.sleep(Math.random() * 300);
        const waiters = Array.from({ length: 4 }, () => startCli(args, { env: s.env, cwd: s.root }));
        // At a random moment: before the lock, while creating the env, while the installer runs (gpulayer alone, or its whole group).
        await Bun.sleep(Math.random() * 2500);
        try {
          process.kill(round % 2 ? builder.pid : -builder.pid, "SIGKILL");
        } catch {
          // it had finished: the waiters reuse its env
        }
        await builder.exited;
        const results = await Promise.all(waiters.map(async (w) => ({ code: await w.exited, out: await new Response(w.stdout).text(), err: await new Response(w.stderr).text() })));
        for (const r of results) expect({ code: r.code, err: r.code ? r.err : "" }).toEqual({ code: 0, err: "" });
        const docs = results.map((r) => JSON.parse(r.out) as { status: string; path: string; key: string });
        expect(docs.filter((d) => d.status === "built").length).toBeLessThanOrEqual(1);
        expect(new Set(docs.map((d) => d.path)).size).toBe(1);
        // What they all reported is there, ready, and reused by the next prepare.
        expect(existsSync(join(docs[0]!.path, ".gpulayer", "ready"))).toBe(true);
        expect(readyKeys(s.home)).toContain(docs[0]!.key);
        const again = await cli(args, { env: s.env, cwd: s.root });
        expect(JSON.parse(again.stdout)).toMatchObject({ status: "reused", path: docs[0]!.path });
        // The killed build (if it had begun) and at most one more: never two heirs building at once.
        expect(counted(counter)).toBeLessThanOrEqual(2);
      }
    } finally {
      s.cleanup();
    }
  }, 240_000);
});

describe("locks", () => {
  const dir = tempDir("gpl-lock-");
  afterAll(() => rmSync(dir, { recursive: true, force: true }));

  test("one holder at a time; released, it can be taken again", async () => {
    const path = join(dir, "a");
    const release = await tryLock(path);
    expect(release).not.toBeNull();
    expect(await isLocked(path)).toBe(true);
    expect(await tryLock(path)).toBeNull();
    await release!();
    expect(await isLocked(path)).toBe(false);
    const again = await tryLock(path);
    expect(again).not.toBeNull();
    await again!();
    expect(readdirSync(dir)).toEqual([]);
  });

  test("a dead holder's lock is broken at once; a live one's is not", async () => {
    const path = join(dir, "b");
    const child = Bun.spawn(["sleep", "30"]);
    // An owner record of this machine: the kernel answers for its pid.
    mkdirSync(`${path}.lock`);
    writeFileSync(`${path}.lock/owner`, JSON.stringify({ pid: child.pid, start: processStartTime(child.pid), where: lockWhere(), token: "t" }));
    expect(await isLocked(path)).toBe(true);
    expect(await tryLock(path)).toBeNull();
    child.kill("SIGKILL");
    await child.exited;
    expect(await isLocked(path)).toBe(false);
    const release = await tryLock(path);
    expect(release).not.toBeNull();
    await release!();
  });

  test("a dead holder's lock has one heir: contenders polling while holders are SIGKILLed never hold it two at once", async () => {
    const contender = join(import.meta.dir, "fixtures", "lock-contender.ts");
    for (let round = 0; round < 12; round++) {
      const path = join(dir, `heirs-${round}`);
      const procs = Array.from({ length: 6 }, () => Bun.spawn([process.execPath, contender, path, "300"], { stdout: "pipe", stderr: "pipe" }));
      const holding = new Set<number>();
      for (const p of procs) void (async () => {
        for await (const _ of p.stdout) holding.add(p.pid);
      })();
      // Kill two holders in turn, each at a random moment of its hold: the others are polling all along.
      for (let kill = 0; kill < 2; kill++) {
        await until("a holder", () => procs.some((p) => holding.has(p.pid) && p.exitCode === null && p.signalCode === null));
        const victim = procs.find((p) => holding.has(p.pid) && p.exitCode === null && p.signalCode === null)!;
        await Bun.sleep(Math.random() * 100);
        victim.kill("SIGKILL");
        await victim.exited;
      }
      await Promise.all(procs.map((p) => p.exited));
      const stderr = await Promise.all(procs.map((p) => new Response(p.stderr).text()));
      expect(existsSync(`${path}.overlaps`) ? readFileSync(`${path}.overlaps`, "utf8") : "").toBe("");
      // Every contender held the lock once and exited cleanly, or was killed holding it (a slow machine may let a victim
      // finish first: the kill then finds it gone); at least one was, so a dead holder's lock was taken over. Nothing of the lock is left.
      const killed = procs.filter((p) => p.signalCode === "SIGKILL").length;
      expect(procs.filter((p) => p.exitCode === 0).length + killed).toBe(6);
      expect(killed).toBeGreaterThanOrEqual(1);
      expect(stderr.join("")).toBe("");
      expect(existsSync(`${path}.lock`)).toBe(false);
    }
  }, 120_000);

  test("a lock of another machine counts while its heartbeat is fresh", async () => {
    const path = join(dir, "c");
    mkdirSync(`${path}.lock`);
    writeFileSync(`${path}.lock/owner`, JSON.stringify({ pid: 1, start: "1", where: "other-host||", token: "x" }));
    expect(await isLocked(path)).toBe(true);
    const old = new Date(Date.now() - 120_000);
    utimesSync(`${path}.lock/owner`, old, old);
    expect(await isLocked(path)).toBe(false);
    const release = await tryLock(path);
    expect(release).not.toBeNull();
    await release!();
  });
});
