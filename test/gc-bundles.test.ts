import { afterAll, describe, expect, test } from "bun:test";
import { existsSync, mkdirSync, readdirSync, utimesSync, writeFileSync } from "node:fs";
import { join } from "node:path";
import { diskUsage } from "../src/env/store/store.ts";
import { cli, ROOT, sandbox } from "./helpers.ts";

/**
 * A worker's kept bundle copies (cluster/bundles/<hash>.tar.gz and <hash>/,
 * as worker/tasks.ts fetchBundle and sharedCopy leave them) are gc entries:
 * counted, removed least recently used first, never while a task leases one.
 */
type Sandbox = ReturnType<typeof sandbox>;
const sandboxes: Sandbox[] = [];
afterAll(() => {
  for (const sb of sandboxes) sb.cleanup();
});

const DAY = 86_400_000;
const hash = (c: string) => c.repeat(64);
const bundles = (home: string) => join(home, "cluster", "bundles");

/** One kept copy: the tar.gz, its unpacked folder, and its last use `daysAgo` days back. */
function fakeCopy(home: string, h: string, kb: number, daysAgo: number): void {
  const root = bundles(home);
  mkdirSync(join(root, h, "src"), { recursive: true });
  writeFileSync(join(root, `${h}.tar.gz`), Buffer.alloc(kb * 1024, 7));
  writeFileSync(join(root, h, "src", "train.py"), Buffer.alloc(kb * 2048, 1));
  writeFileSync(join(root, h, "requirements.txt"), "numpy\n");
  const when = new Date(Date.now() - daysAgo * DAY);
  for (const p of [join(root, `${h}.tar.gz`), join(root, h)]) utimesSync(p, when, when);
  writeFileSync(join(root, `${h}.last-used`), when.toISOString());
  utimesSync(join(root, `${h}.last-used`), when, when);
}

const sizeOf = (home: string, h: string) => diskUsage(join(bundles(home), `${h}.tar.gz`)) + diskUsage(join(bundles(home), h)) + diskUsage(join(bundles(home), `${h}.last-used`));
const present = (home: string, h: string) => existsSync(join(bundles(home), `${h}.tar.gz`)) || existsSync(join(bundles(home), h));

/** Oldest first: d (leased by a running task), a, b, c; sizes differ. */
function world() {
  const sb = sandbox();
  sandboxes.push(sb);
  const [a, b, c, d] = ["a", "b", "c", "d"].map(hash) as [string, string, string, string];
  fakeCopy(sb.home, d, 64, 40);
  fakeCopy(sb.home, a, 300, 30);
  fakeCopy(sb.home, b, 120, 20);
  fakeCopy(sb.home, c, 40, 1);
  // A task's fetch in progress is its own: never an entry, never touched.
  writeFileSync(join(bundles(sb.home), `${hash("e")}.tar.gz.123.x.tmp`), "partial");
  return { sb, a, b, c, d };
}

/** A separate process holding a bundle lease (a running task) until killed. */
async function leaseHolder(sb: Sandbox, h: string) {
  const proc = Bun.spawn([process.execPath, "-e", `import { homeLayout } from "${ROOT}/src/config/paths.ts"; import { takeLease } from "${ROOT}/src/core/lease.ts"; takeLease(homeLayout(process.env.GPULAYER_HOME), "bundle", "${h}", "task t-1 (job j-1)"); console.log("held"); setInterval(() => {}, 1000);`], { env: sb.env, stdout: "pipe", stderr: "inherit" });
  const { value } = await proc.stdout.getReader().read();
  expect(new TextDecoder().decode(value)).toContain("held");
  return proc;
}

async function gc(sb: Sandbox, args: string[]) {
  const r = await cli(["gc", ...args, "--json"], { env: sb.env });
  if (r.code !== 0) throw new Error(`gc failed (${r.code}): ${r.stderr}`);
  return JSON.parse(r.stdout);
}

const ids = (items: { id: string }[]) => items.map((e) => e.id);

describe("gc: a worker's bundle copies", () => {
  test("counted, removed oldest first down to the limit; a leased one survives; --dry-run removes nothing", async () => {
    const { sb, a, b, c, d } = world();
    const sizes = Object.fromEntries([a, b, c, d].map((h) => [h, sizeOf(sb.home, h)]));
    const total = Object.values(sizes).reduce((x, y) => x + y, 0);
    const limit = sizes[c]! + sizes[d]! + 1000;
    const task = await leaseHolder(sb, d);
    try {
      const dry = await gc(sb, ["--max-size", String(limit), "--min-age", "0", "--dry-run"]);
      expect(dry.entries).toBe(4);
      expect(dry.total_before_bytes).toBe(total);
      expect(ids(dry.removed)).toEqual([a, b]);
      expect(dry.removed.every((e: { kind: string }) => e.kind === "bundle")).toBe(true);
      expect(dry.skipped).toMatchObject([{ kind: "bundle", id: d, reasons: [{ code: "leased", message: "in use by task t-1 (job j-1)" }] }]);
      for (const h of [a, b, c, d]) expect(present(sb.home, h)).toBe(true);

      const real = await gc(sb, ["--max-size", String(limit), "--min-age", "0"]);
      expect(real.total_before_bytes).toBe(total);
      expect(ids(real.removed)).toEqual([a, b]);
      expect(real.removed.map((e: { size_bytes: number }) => e.size_bytes)).toEqual([sizes[a], sizes[b]]);
      expect(real.skipped).toMatchObject([{ id: d, reasons: [{ code: "leased" }] }]);
      expect(real.total_after_bytes).toBe(sizes[c]! + sizes[d]!);
      expect(real.limit_reached).toBe(true);
      expect(readdirSync(bundles(sb.home)).sort()).toEqual([c, `${c}.last-used`, `${c}.tar.gz`, d, `${d}.last-used`, `${d}.tar.gz`, `${hash("e")}.tar.gz.123.x.tmp`].sort());
      expect(readdirSync(join(sb.home, "trash"))).toEqual([]);
    } finally {
      task.kill();
      await task.exited;
    }
    // The task has ended: its lease no longer counts.
    const after = await gc(sb, ["--max-size", "0", "--min-age", "0"]);
    expect(ids(after.removed)).toEqual([d, c]);
    expect(readdirSync(bundles(sb.home))).toEqual([`${hash("e")}.tar.gz.123.x.tmp`]);
  }, 30_000);

  test("--keep protects a copy by hash prefix; a copy whose lock is held is skipped", async () => {
    const { sb, a, b, c, d } = world();
    const locker = Bun.spawn([process.execPath, "-e", `import { homeLayout } from "${ROOT}/src/config/paths.ts"; import { tryLock } from "${ROOT}/src/core/lock.ts"; const r = await tryLock(homeLayout(process.env.GPULAYER_HOME).locks + "/bundle-${b}"); if (!r) process.exit(2); console.log("held"); setInterval(() => {}, 1000);`], { env: sb.env, stdout: "pipe", stderr: "inherit" });
    const { value } = await locker.stdout.getReader().read();
    expect(new TextDecoder().decode(value)).toContain("held");
    try {
      const r = await gc(sb, ["--max-size", String(sizeOf(sb.home, c) + 1000), "--min-age", "0", "--keep", d.slice(0, 8)]);
      // Oldest first: d kept, a removed, b locked, so c (the newest) goes too.
      expect(ids(r.removed)).toEqual([a, c]);
      expect(r.skipped).toMatchObject([
        { id: d, reasons: [{ code: "keep" }] },
        { id: b, reasons: [{ code: "locked" }] },
      ]);
      expect(r.limit_reached).toBe(false);
      for (const h of [b, d]) expect(present(sb.home, h)).toBe(true);
      for (const h of [a, c]) expect(present(sb.home, h)).toBe(false);
    } finally {
      locker.kill();
      await locker.exited;
    }
  }, 30_000);
});
