import { afterAll, beforeAll, describe, expect, test } from "bun:test";
import { existsSync, lstatSync, mkdirSync, readdirSync, readFileSync, rmSync, symlinkSync, utimesSync, writeFileSync } from "node:fs";
import { join } from "node:path";
import { homeLayout } from "../src/config/paths.ts";
import { cacheTarget, lruOrder, protectedBy, watermarkExcess } from "../src/gc/policy.ts";
import { runGc } from "../src/gc/run.ts";
import type { GcEntry } from "../src/gc/types.ts";
import { parseDuration, parseSize } from "../src/core/units.ts";
import { PackageIndex } from "./fixtures/index.ts";
import { cli, ROOT, run, sandbox, startCli } from "./helpers.ts";

const PKGS = ["pkga", "pkgb", "pkgc", "pkgd"];
let index: PackageIndex;
let world: ReturnType<typeof sandbox>;
const sandboxes: ReturnType<typeof sandbox>[] = [];

beforeAll(() => {
  world = sandbox();
  index = new PackageIndex(join(world.root, "index")).start();
  for (const name of PKGS) index.wheel({ name, version: "1.0", files: { [`${name}/__init__.py`]: "VALUE = 1\n" } });
});
afterAll(() => {
  index.stop();
  for (const sb of [world, ...sandboxes]) sb.cleanup();
}, 60_000); // thousands of files to delete, on a busy machine

function fresh() {
  const sb = sandbox();
  sandboxes.push(sb);
  return sb;
}

type Sandbox = ReturnType<typeof sandbox>;

async function prepare(sb: Sandbox, pkg: string): Promise<{ key: string; path: string; status: string }> {
  const r = await cli(["env", "prepare", "-p", pkg, "--index-url", index.url, "--json"], { env: sb.env });
  if (r.code !== 0) throw new Error(`prepare ${pkg} failed (${r.code}): ${r.stderr}`);
  return JSON.parse(r.stdout);
}

async function gc(sb: Sandbox, args: string[], env: Record<string, string> = {}) {
  const r = await cli(["gc", ...args, "--json"], { env: { ...sb.env, ...env } });
  return { ...r, report: r.stdout ? JSON.parse(r.stdout) : null };
}

const envSizes = async (sb: Sandbox): Promise<Record<string, number>> => Object.fromEntries(JSON.parse((await cli(["env", "list", "--json"], { env: sb.env })).stdout).map((e: { key: string; size_bytes: number }) => [e.key, e.size_bytes]));
const keysOf = (home: string) => (existsSync(join(home, "envs-v1")) ? readdirSync(join(home, "envs-v1")) : []);

/** A synthetic entry with the layout of a real one; `files` extra files make deleting it slow. */
function fakeEnv(home: string, key: string, opts: { ready?: boolean; files?: number; sizeBytes?: number; lastUsedMs?: number } = {}): string {
  const dir = join(home, "envs-v1", key);
  const site = join(dir, "lib", "python3.11", "site-packages");
  mkdirSync(join(dir, ".gpulayer"), { recursive: true });
  for (let d = 0; d * 1000 < (opts.files ?? 0); d++) {
    mkdirSync(join(site, `d${d}`), { recursive: true });
    for (let i = d * 1000; i < Math.min(opts.files!, (d + 1) * 1000); i++) writeFileSync(join(site, `d${d}`, `f${i}`), "x");
  }
  mkdirSync(site, { recursive: true });
  if (opts.ready === false) return dir;
  const created = new Date(Date.now() - 86_400_000).toISOString();
  writeFileSync(join(dir, ".gpulayer", "meta.json"), JSON.stringify({ key, path: dir, created, sizeBytes: opts.sizeBytes ?? 4096, summary: `fake ${key.slice(0, 4)}`, check: [] }));
  writeFileSync(join(dir, ".gpulayer", "last-used"), "");
  const used = new Date(opts.lastUsedMs ?? Date.now() - 86_400_000);
  utimesSync(join(dir, ".gpulayer", "last-used"), used, used);
  writeFileSync(join(dir, ".gpulayer", "ready"), `${key}\n`);
  return dir;
}

const hexKey = (c: string) => c.repeat(64);

/** A separate process holding a lease (a running job) or a lock (a build, another gc) until killed. */
async function holder(sb: Sandbox, code: string) {
  const proc = Bun.spawn([process.execPath, "-e", `import { homeLayout } from "${ROOT}/src/config/paths.ts"; import { takeLease } from "${ROOT}/src/core/lease.ts"; import { tryLock } from "${ROOT}/src/core/lock.ts"; const layout = homeLayout(process.env.GPULAYER_HOME); ${code}; console.log("held"); setInterval(() => {}, 1000);`], { env: sb.env, stdout: "pipe", stderr: "inherit" });
  const reader = proc.stdout.getReader();
  const { value } = await reader.read();
  expect(new TextDecoder().decode(value)).toContain("held");
  return proc;
}

describe("gc: the LRU policy on real environments", () => {
  test("removes the least recently used until under the limit; kept ones are reused, removed ones built again", async () => {
    const sb = fresh();
    const built = Object.fromEntries((await Promise.all(PKGS.map((p) => prepare(sb, p)))).map((r, i) => [PKGS[i]!, r]));
    // Last use, oldest first: b, a, d, c (set by using them again in that order).
    for (const p of ["pkgb", "pkga", "pkgd", "pkgc"]) {
      expect((await prepare(sb, p)).status).toBe("reused");
      await Bun.sleep(20);
    }
    const sizes = await envSizes(sb);
    const limit = sizes[built.pkgd!.key]! + sizes[built.pkgc!.key]! + 1000;
    const { code, report } = await gc(sb, ["--max-size", String(limit), "--min-age", "0"]);
    expect(code).toBe(0);
    // The bytecode store's bucket counts as one entry, last used by the first builds (a reuse compiles nothing): it goes first.
    expect(report.removed.map((e: { kind: string; id: string }) => (e.kind === "env" ? e.id : e.kind))).toEqual(["bytecode", built.pkgb!.key, built.pkga!.key]);
    expect(report.removed.every((e: { reason: string }) => e.reason === "lru")).toBe(true);
    expect(report.total_after_bytes).toBeLessThanOrEqual(limit);
    expect(report.limit_reached).toBe(true);
    expect(keysOf(sb.home).sort()).toEqual([built.pkgc!.key, built.pkgd!.key].sort());
    expect((await prepare(sb, "pkgc")).status).toBe("reused");
    expect((await prepare(sb, "pkgb")).status).toBe("built");
    const py = await run([join(built.pkgd!.path, "bin", "python"), "-c", "import pkgd; print(pkgd.VALUE)"], { env: sb.env });
    expect(py.stdout.trim()).toBe("1");
  }, 60_000);

  test("an environment leased by a running process survives even when oldest; --strict then fails", async () => {
    const sb = fresh();
    const [a, b] = await Promise.all([prepare(sb, "pkga"), prepare(sb, "pkgb")]);
    const old = new Date(Date.now() - 30 * 86_400_000);
    utimesSync(join(a!.path, ".gpulayer", "last-used"), old, old);
    const job = await holder(sb, `takeLease(layout, "env", "${a!.key}", "job test-1")`);
    try {
      const strict = await gc(sb, ["--max-size", "0", "--min-age", "0", "--strict"]);
      expect(strict.code).toBe(1);
      expect(strict.stderr).toContain("could not get the cache down to");
      expect(strict.report.removed.map((e: { kind: string; id: string }) => (e.kind === "env" ? e.id : e.kind))).toEqual(["bytecode", b!.key]);
      expect(strict.report.skipped).toMatchObject([{ id: a!.key, reasons: [{ code: "leased", message: "in use by job test-1" }] }]);
      expect(strict.report.limit_reached).toBe(false);
      const again = await gc(sb, ["--max-size", "0", "--min-age", "0"]);
      expect(again.code).toBe(0);
      expect(keysOf(sb.home)).toEqual([a!.key]);
      expect((await prepare(sb, "pkga")).status).toBe("reused");
    } finally {
      job.kill("SIGKILL");
      await job.exited;
    }
    // The holder is dead: its lease no longer counts.
    const after = await gc(sb, ["--max-size", "0", "--min-age", "0"]);
    expect(after.report.removed.map((e: { id: string }) => e.id)).toEqual([a!.key]);
  }, 60_000);

  test("--dry-run removes nothing; the default min age protects what was just built", async () => {
    const sb = fresh();
    const built = await Promise.all([prepare(sb, "pkga"), prepare(sb, "pkgb")]);
    const human = await cli(["gc", "--max-size", "0", "--min-age", "0", "--dry-run"], { env: sb.env });
    expect(human.code).toBe(0);
    expect(human.stdout).toMatch(/^would remove 3 of 3 entries, .* -> 0 B\n {2}bytecode [0-9a-f]{12} +\d.* +last used \S+ ago +modules compiled by cpython-\d+ 3\.\d+\.\d+ \(magic [0-9a-f]{8}\)\n {2}env [0-9a-f]{12} +\d.* +last used \S+ ago +pkg[ab]\n/);
    const young = await gc(sb, ["--max-size", "0"]);
    expect(young.code).toBe(0);
    expect(young.report.removed).toEqual([]);
    expect(young.report.skipped.map((e: { reasons: { code: string }[] }) => e.reasons[0]!.code)).toEqual(["min-age", "min-age", "min-age"]);
    expect(young.stderr).toContain("could not get the cache down to 0 B");
    expect(keysOf(sb.home).sort()).toEqual(built.map((b) => b.key).sort());
    for (const b of built) expect(existsSync(join(b.path, ".gpulayer", "ready"))).toBe(true);
  }, 60_000);
});

describe("gc: safe deletion", () => {
  test("a SIGKILL in the middle of a deletion leaves nothing half-ready; the next gc finishes the job", async () => {
    const sb = fresh();
    const real = await Promise.all(["pkga", "pkgb"].map(async (pkg) => ({ pkg, ...(await prepare(sb, pkg)) })));
    const big = hexKey("b");
    fakeEnv(sb.home, big, { files: 20_000, sizeBytes: 400 * 2 ** 20, lastUsedMs: Date.now() - 40 * 86_400_000 });
    const trash = join(sb.home, "trash");
    const proc = startCli(["gc", "--max-size", "100M", "--min-age", "0"], { env: sb.env });
    const deadline = Date.now() + 20_000;
    while (!(existsSync(trash) && readdirSync(trash).length) && Date.now() < deadline) await Bun.sleep(2);
    proc.kill("SIGKILL");
    expect(await proc.exited).not.toBe(0);
    expect(readdirSync(trash).length).toBe(1); // killed mid-delete
    // Every entry left is whole and usable, or not there at all.
    expect(keysOf(sb.home).sort()).toEqual(real.map((r) => r.key).sort());
    for (const r of real) {
      expect(existsSync(join(r.path, ".gpulayer", "ready"))).toBe(true);
      expect((await run([join(r.path, "bin", "python"), "-c", `import ${r.pkg}`], { env: sb.env })).code).toBe(0);
    }
    expect((await prepare(sb, "pkga")).status).toBe("reused");
    // The dead gc's lock counts as held until it goes stale (a few seconds); then the next gc runs.
    let next = await gc(sb, []);
    for (let i = 0; !next.report.ran && i < 50; i++) next = await Bun.sleep(200).then(() => gc(sb, []));
    expect(next.code).toBe(0);
    // The deletion it was killed in, and the remains of a lock it may have been taking or giving back at that moment.
    expect(next.report.trash.finished).toBeGreaterThanOrEqual(1);
    expect(readdirSync(trash)).toEqual([]);
    expect(readdirSync(join(sb.home, "locks")).filter((n) => /\.lock\.\d+-[a-z0-9]+\.(tmp|stale|released)$/.test(n))).toEqual([]);
  }, 90_000);

  test("remains of dead builds are removed without any limit; a build in progress and a running gc are left alone", async () => {
    const sb = fresh();
    fakeEnv(sb.home, hexKey("d"), { ready: false, files: 10 });
    fakeEnv(sb.home, hexKey("e"), { ready: false, files: 10 });
    fakeEnv(sb.home, hexKey("f"));
    // The installers' TMPDIR of builds killed: one with its env folder (d), one before it made one (b), one still building (e).
    const tmpOf = (k: string, file: string) => {
      mkdirSync(join(sb.home, "envs-v1", `${k}.tmp`, "pip-unpack-x"), { recursive: true });
      writeFileSync(join(sb.home, "envs-v1", `${k}.tmp`, "pip-unpack-x", file), "partial download");
    };
    for (const k of ["d", "b", "e"]) tmpOf(hexKey(k), "torch.whl");
    const build = await holder(sb, `await tryLock(layout.locks + "/${hexKey("e")}")`);
    try {
      const { code, report, stderr } = await gc(sb, ["--verbose"]);
      expect(code).toBe(0);
      expect(stderr).toContain("no size limit given");
      expect(report.removed).toMatchObject([
        { id: hexKey("d"), reason: "incomplete", state: "incomplete" },
        { id: hexKey("b"), reason: "incomplete", state: "incomplete" },
      ]);
      expect(report.removed[0].size_bytes).toBeGreaterThan(0);
      expect(report.removed[1].size_bytes).toBeGreaterThan(0);
      expect(keysOf(sb.home).sort()).toEqual([hexKey("e"), `${hexKey("e")}.tmp`, hexKey("f")]);
      expect(existsSync(join(sb.home, "trash")) ? readdirSync(join(sb.home, "trash")) : []).toEqual([]);
      // Under a limit, the build in progress is said to be skipped, and why.
      const limited = await gc(sb, ["--max-size", "0", "--min-age", "0", "--dry-run"]);
      expect(limited.report.skipped.filter((s: any) => s.id === hexKey("e"))).toMatchObject([{ state: "building", reasons: [{ code: "locked", message: "being built now" }] }]);
    } finally {
      build.kill("SIGKILL");
    }
    const other = await holder(sb, `await tryLock(layout.locks + "/gc")`);
    try {
      const { code, report, stderr } = await gc(sb, ["--max-size", "0", "--min-age", "0", "--verbose"]);
      expect(code).toBe(0);
      expect(report.ran).toBe(false);
      expect(stderr).toContain("another gc is running");
      expect(keysOf(sb.home)).toContain(hexKey("f"));
    } finally {
      other.kill("SIGKILL");
    }
  }, 60_000);

  test("gc looping beside four processes preparing environments and a job holding leases: nothing fails", async () => {
    const sb = fresh();
    type Res = { code: number; stdout: string; stderr: string };
    const results: (Res & { what: string })[] = [];
    let preparing = true;
    const loop = async (what: string, step: (i: number) => Promise<Res>, rounds = Infinity, pause = 0) => {
      for (let i = 0; i < rounds && (rounds !== Infinity || preparing); i++) {
        results.push({ what, ...(await step(i)) });
        await Bun.sleep(pause);
      }
    };
    // Two pairs of processes ask for the same keys, so some wait on a build that gc may then remove.
    const preparer = (n: number) => (i: number) => cli(["env", "prepare", "-p", PKGS[(i + (n % 2)) % PKGS.length]!, "--index-url", index.url], { env: sb.env });
    // A job: lease, prepare, check the env is whole while leased, release.
    const jobScript = join(sb.root, "job.ts");
    writeFileSync(jobScript, `import { existsSync } from "node:fs"; import { homeLayout } from "${ROOT}/src/config/paths.ts"; import { prepareEnv } from "${ROOT}/src/env/prepare.ts";
const r = await prepareEnv(homeLayout(process.env.GPULAYER_HOME), { specs: [process.argv[2]], indexUrl: process.argv[3], extraIndexUrls: [], findLinks: [], cwd: process.cwd(), env: process.env }, { leaseHolder: "job " + process.pid });
for (let i = 0; i < 10; i++) { if (!existsSync(r.path + "/.gpulayer/ready") || !existsSync(r.python)) { console.error("env vanished under its lease"); process.exit(3); } await Bun.sleep(20); }
r.lease.release();`);
    const job = (i: number) => run([process.execPath, jobScript, PKGS[i % PKGS.length]!, index.url], { env: sb.env });
    const collector = (i: number) => cli(["gc", ...(i % 4 === 3 ? [] : ["--max-size", "0", "--min-age", "0"]), "--json"], { env: sb.env });
    const preparers = Promise.all([0, 1, 2, 3].map((n) => loop(`prepare ${n}`, preparer(n), 4, 400))).finally(() => (preparing = false));
    await Promise.all([preparers, loop("job", job), loop("gc 1", collector, Infinity, 100), loop("gc 2", collector, Infinity, 150)]);
    const failures = results.filter((r) => r.code !== 0);
    expect(failures).toEqual([]);
    const count = (what: string) => results.filter((r) => r.what.startsWith(what)).length;
    const removed = results.filter((r) => r.what.startsWith("gc")).reduce((n, r) => n + JSON.parse(r.stdout).removed.length, 0);
    expect(count("prepare")).toBe(16);
    expect(removed).toBeGreaterThanOrEqual(4);
    for (const key of keysOf(sb.home)) expect(existsSync(join(sb.home, "envs-v1", key, ".gpulayer", "ready"))).toBe(true);
  }, 150_000);
});

describe("gc: links never take it out of its home", () => {
  /** A folder outside the home holding a sentinel file (and, named like an entry, one more inside). */
  function outside(sb: Sandbox, name: string): string {
    const dir = join(sb.root, name);
    mkdirSync(join(dir, hexKey("a")), { recursive: true });
    writeFileSync(join(dir, "sentinel"), "mine");
    writeFileSync(join(dir, hexKey("a"), "sentinel"), "mine");
    return dir;
  }

  test("a home folder gc works in that is a link is refused in one line; nothing it points to is touched", async () => {
    for (const folder of ["trash", "envs-v1", "locks", "cluster/work", "cluster/bundles"]) {
      const sb = sandbox();
      try {
        fakeEnv(sb.home, hexKey("c"), { ready: false, files: 3 });
        const target = outside(sb, "theirs");
        mkdirSync(join(sb.home, folder, ".."), { recursive: true });
        if (folder !== "envs-v1") symlinkSync(target, join(sb.home, folder));
        else {
          // The store itself a link: its entries are the outside folder's.
          const store = join(sb.home, "envs-v1");
          rmSync(store, { recursive: true });
          symlinkSync(target, store);
        }
        for (const args of [["--max-size", "0", "--min-age", "0"], ["--dry-run"], []]) {
          const r = await cli(["gc", ...args], { env: sb.env });
          expect(r.code).toBe(1);
          expect(r.stderr.trim().split("\n")).toHaveLength(1);
          expect(r.stderr).toContain(`${join(sb.home, folder)} is a symbolic link (to ${target})`);
        }
        expect(readFileSync(join(target, "sentinel"), "utf8")).toBe("mine");
        expect(readFileSync(join(target, hexKey("a"), "sentinel"), "utf8")).toBe("mine");
      } finally {
        sb.cleanup();
      }
    }
  }, 60_000);

  test("an entry, a trash item or a workdir that is a link: only the link goes, nothing is read or written through it", async () => {
    const sb = fresh();
    // A link in the store dressed as a ready env (meta without a size: gc would measure it and write the size back).
    const env = outside(sb, "env-target");
    mkdirSync(join(env, ".gpulayer"));
    const meta = JSON.stringify({ key: hexKey("e"), created: new Date(Date.now() - 86_400_000).toISOString(), summary: "not ours", check: [] });
    writeFileSync(join(env, ".gpulayer", "meta.json"), meta);
    writeFileSync(join(env, ".gpulayer", "ready"), "");
    mkdirSync(join(sb.home, "envs-v1"), { recursive: true });
    symlinkSync(env, join(sb.home, "envs-v1", hexKey("e")));
    const trashed = outside(sb, "trash-target");
    mkdirSync(join(sb.home, "trash"));
    symlinkSync(trashed, join(sb.home, "trash", `${hexKey("f")}.1.1`));
    const work = outside(sb, "work-target");
    mkdirSync(join(sb.home, "cluster", "work"), { recursive: true });
    symlinkSync(work, join(sb.home, "cluster", "work", "job-1"));

    const r = await gc(sb, ["--max-size", "0", "--min-age", "0"]);
    expect(r.code).toBe(0);
    expect(r.report.removed.map((e: { id: string; state: string }) => [e.id, e.state])).toEqual([[hexKey("e"), "incomplete"]]);
    expect(existsSync(join(sb.home, "envs-v1", hexKey("e")))).toBe(false);
    expect(readdirSync(join(sb.home, "trash"))).toEqual([]);
    for (const dir of [env, trashed, work]) {
      expect(readFileSync(join(dir, "sentinel"), "utf8")).toBe("mine");
      expect(readFileSync(join(dir, hexKey("a"), "sentinel"), "utf8")).toBe("mine");
    }
    expect(readFileSync(join(env, ".gpulayer", "meta.json"), "utf8")).toBe(meta);
    expect(lstatSync(join(sb.home, "cluster", "work", "job-1")).isSymbolicLink()).toBe(true); // no job record names it: not gc's
  }, 60_000);
});

describe("gc: limits, sizes and errors", () => {
  test("sizes parse as people write them (powers of 1024); nonsense is refused", () => {
    expect(parseSize("50G")).toBe(50 * 2 ** 30);
    expect(parseSize("50GB")).toBe(50 * 2 ** 30);
    expect(parseSize("500MiB")).toBe(500 * 2 ** 20);
    expect(parseSize("1.5T")).toBe(1.5 * 2 ** 40);
    expect(parseSize("12345")).toBe(12345);
    expect(parseSize("0")).toBe(0);
    for (const bad of ["lots", "", "-5G", "5X", "G", "1e9"]) expect(parseSize(bad)).toBeNull();
    expect(parseDuration("10m")).toBe(600_000);
    expect(parseDuration("0")).toBe(0);
    expect(parseDuration("2h")).toBe(7_200_000);
    expect(parseDuration("soon")).toBeNull();
  });

  test("bad flags, variables and config are clear errors with exit code 2", async () => {
    const sb = fresh();
    const lots = await cli(["gc", "--max-size", "lots"], { env: sb.env });
    expect(lots.code).toBe(2);
    expect(lots.stderr).toBe("error: --max-size lots: not a size (expected a size such as 50G, 500MiB, 1.5T or a number of bytes)\n");
    expect((await cli(["gc"], { env: { ...sb.env, GPULAYER_CACHE_MAX_SIZE: "huge" } })).stderr).toContain("GPULAYER_CACHE_MAX_SIZE=huge (environment): not a size");
    expect((await cli(["gc", "--min-age", "soon"], { env: sb.env })).code).toBe(2);
    expect((await cli(["gc", "--high-watermark", "80", "--low-watermark", "90"], { env: sb.env })).code).toBe(2);
    expect((await cli(["gc", "--max-sise", "5G"], { env: sb.env })).code).toBe(2);
    writeFileSync(join(sb.home, "config.yaml"), "cache:\n  max_size: lots\n");
    const badConfig = await cli(["gc"], { env: sb.env });
    expect(badConfig.code).toBe(2);
    expect(badConfig.stderr).toContain("cache.max_size: lots (in ");
    writeFileSync(join(sb.home, "config.yaml"), "cache:\n  max_sizes: 5G\n");
    expect((await cli(["gc"], { env: sb.env })).stderr).toContain("cache.max_sizes: unknown key");
  });

  test("the limit comes from the flag, else GPULAYER_CACHE_MAX_SIZE, else config.yaml", async () => {
    const sb = fresh();
    writeFileSync(join(sb.home, "config.yaml"), "cache:\n  max_size: 3G\n");
    const limit = async (args: string[], env: Record<string, string> = {}) => (await gc(sb, args, env)).report.limit;
    expect(await limit([])).toMatchObject({ max_size_bytes: 3 * 2 ** 30, origin: "cache.max_size in $GPULAYER_HOME/config.yaml" });
    expect(await limit([], { GPULAYER_CACHE_MAX_SIZE: "2G" })).toMatchObject({ max_size_bytes: 2 * 2 ** 30, origin: "GPULAYER_CACHE_MAX_SIZE" });
    expect(await limit(["--max-size", "1G"], { GPULAYER_CACHE_MAX_SIZE: "2G" })).toMatchObject({ max_size_bytes: 2 ** 30, origin: "--max-size" });
  });

  test("--keep, refreshed sizes, and the free-space watermark", async () => {
    const sb = fresh();
    const day = 86_400_000;
    for (const [c, age] of [["1", 9], ["2", 8], ["3", 7], ["4", 6]] as const) fakeEnv(sb.home, hexKey(c), { sizeBytes: 100 * 2 ** 20, lastUsedMs: Date.now() - age * day });
    const keep = await gc(sb, ["--max-size", "250M", "--keep", "111", "--dry-run"]);
    expect(keep.report.removed.map((e: { id: string }) => e.id)).toEqual([hexKey("2"), hexKey("3")]);
    expect(keep.report.skipped).toMatchObject([{ id: hexKey("1"), reasons: [{ code: "keep" }] }]);
    // 90% used of 1000 MiB, high 85 / low 80: 100 MiB must go, least recently used first.
    const fsUsage = (path: string) => ({ path, usedBytes: 900 * 2 ** 20, availBytes: 100 * 2 ** 20 });
    const wm = await runGc(homeLayout(sb.home), { minAgeMs: 0, keep: [], dryRun: false, refreshSizes: false, watermark: { high: 85, low: 80 }, fsUsage, engineEnv: process.env });
    expect(wm.removed.map((e) => e.id)).toEqual([hexKey("1")]);
    expect(wm.limit.watermark).toMatchObject({ usedPercent: 90, excessBytes: 100 * 2 ** 20 });
    // A file added after the size was recorded is noticed (site-packages changed) and measured; --dry-run records nothing.
    writeFileSync(join(sb.home, "envs-v1", hexKey("4"), "lib", "python3.11", "site-packages", "big.bin"), Buffer.alloc(2 ** 20));
    expect((await gc(sb, ["--max-size", "1T", "--dry-run"])).report.sizes_refreshed).toBe(1);
    expect((await gc(sb, ["--max-size", "1T"])).report.sizes_refreshed).toBe(1);
    expect(JSON.parse(readFileSync(join(sb.home, "envs-v1", hexKey("4"), ".gpulayer", "meta.json"), "utf8")).sizeBytes).toBeGreaterThan(2 ** 20);
    expect((await gc(sb, ["--max-size", "1T"])).report.sizes_refreshed).toBe(0);
    expect((await gc(sb, ["--max-size", "1T", "--refresh-sizes"])).report.sizes_refreshed).toBe(3);
  });

  test("policy: targets and order", () => {
    const fs = { path: "/", usedBytes: 860, availBytes: 140 };
    expect(watermarkExcess(fs, { high: 85, low: 80 })).toBe(60);
    expect(watermarkExcess({ ...fs, usedBytes: 850, availBytes: 150 }, { high: 85, low: 80 })).toBe(0);
    expect(cacheTarget(500, undefined, 0)).toBeNull();
    expect(cacheTarget(500, 400, 60)).toBe(400);
    expect(cacheTarget(500, 480, 60)).toBe(440);
    const entry = (id: string, lastUsedMs: number, createdMs = 1): GcEntry => ({ kind: "env", id, state: "ready", sizeBytes: 1, lastUsedMs, createdMs, summary: "", inUse: async () => [], remove: async () => ({ removed: true, freedBytes: 1 }) });
    expect(lruOrder([entry("b", 30), entry("a", 10), entry("c", 0, 20)]).map((e) => e.id)).toEqual(["a", "c", "b"]);
    expect(protectedBy(entry("abc", 1, 1000), { now: 2000, minAgeMs: 5000, keep: ["AB"] }).map((r) => r.code)).toEqual(["keep", "min-age"]);
    // The minimum is said as --min-age takes it, beside the entry's age.
    const young = (minAgeMs: number) => protectedBy(entry("abc", 1, 1000), { now: 65_000, minAgeMs, keep: [] })[0]!.message;
    expect([young(600_000), young(7_200_000), young(86_400_000), young(90_000)]).toEqual([
      "younger than the minimum age of 10m (64s old; --min-age sets it)",
      "younger than the minimum age of 2h (64s old; --min-age sets it)",
      "younger than the minimum age of 1d (64s old; --min-age sets it)",
      "younger than the minimum age of 90s (64s old; --min-age sets it)",
    ]);
  });
});
