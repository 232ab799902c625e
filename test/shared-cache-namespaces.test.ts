/**
 * A cache on a filesystem the nodes share builds each env once: two `gpulayer
 * env prepare` for the same request, each in a mount namespace of its own where
 * one folder (the shared filesystem) is bind-mounted as GPULAYER_HOME, as two
 * nodes mount one NFS export. With a pid namespace each too (`unshare -p`), the
 * other's pids mean nothing here, as on another machine: the lock must then
 * rest on its heartbeat, not on the pid (src/core/lock.ts).
 *
 * Needs root (unshare, mount); a machine that cannot skips with its reason.
 * CI, where the Slurm tests run as root, requires it (GPULAYER_TEST_REQUIRE_SLURM).
 */
import { afterAll, beforeAll, describe, expect, setDefaultTimeout, test } from "bun:test";
import { existsSync, mkdirSync, readdirSync, readFileSync, utimesSync, writeFileSync } from "node:fs";
import { join } from "node:path";
import { PackageIndex } from "./fixtures/index.ts";
import { CLI_ARGV, cli, readyKeys, run, sandbox, tempDir } from "./helpers.ts";

setDefaultTimeout(120_000);

const sh = (s: string) => `'${s.replace(/'/g, `'\\''`)}'`;

async function namespacesMissing(): Promise<string | null> {
  if (process.getuid?.() !== 0) return "mount namespaces (unshare -m, mount --bind) need root";
  if (!Bun.which("unshare")) return "no unshare (util-linux)";
  const probe = tempDir("gpl-ns-probe-");
  const r = await run(["unshare", "-p", "-f", "-m", "--mount-proc", "--propagation", "private", "sh", "-c", `mount --bind ${sh(probe)} ${sh(probe)}`]);
  return r.code === 0 ? null : `unshare -p -f -m does not work here: ${r.stderr.trim()}`;
}

const missing = await namespacesMissing();
if (missing && process.env.GPULAYER_TEST_REQUIRE_SLURM === "1") {
  test("mount and pid namespaces are required (GPULAYER_TEST_REQUIRE_SLURM) and work here", () => {
    throw new Error(missing);
  });
} else if (missing) console.warn(`[shared-cache-namespaces.test] skipping: ${missing}`);

// Skipped (its reason printed above) only where mount and pid namespaces cannot be made; CI requires them, and fails instead.
(missing ? describe.skip : describe)("one cache folder shared by two mount namespaces", () => {
  let box: ReturnType<typeof sandbox>;
  let index: PackageIndex;

  beforeAll(() => {
    box = sandbox();
    index = new PackageIndex(join(box.root, "index")).start();
  });
  afterAll(() => index?.stop());

  /**
   * Two `env prepare` at once, each a "node": its own namespaces, the shared folder mounted at
   * `mountpoint` (the same path on both, as a cluster mounts its shared filesystem).
   */
  async function twoNodes(name: string, unshare: string[]) {
    const shared = join(box.root, name, "shared");
    const mountpoint = join(box.root, name, "mnt");
    mkdirSync(shared, { recursive: true });
    mkdirSync(mountpoint, { recursive: true });
    const counter = join(box.root, name, "builds");
    index.sdist({ name, version: "1.0", counter, sleep: 3 });
    const prepare = [...CLI_ARGV, "env", "prepare", "-p", name, "--index-url", index.url, "--json"].map(sh).join(" ");
    const node = () =>
      run(["unshare", ...unshare, "--propagation", "private", "sh", "-c", `mount --bind ${sh(shared)} ${sh(mountpoint)} && exec ${prepare}`], {
        env: { ...box.env, GPULAYER_HOME: join(mountpoint, "home") },
        cwd: box.root,
      });
    const results = await Promise.all([node(), node()]);
    for (const r of results) expect({ code: r.code, stderr: r.code ? r.stderr : "" }).toEqual({ code: 0, stderr: "" });
    // The mounts were the namespaces' own: nothing of them shows here.
    expect(readdirSync(mountpoint)).toEqual([]);
    const docs = results.map((r) => JSON.parse(r.stdout) as { status: string; key: string; path: string });
    const home = join(shared, "home");
    return { results, docs, home, builds: readFileSync(counter, "utf8").trim().split("\n").length };
  }

  const checkOneBuild = (t: Awaited<ReturnType<typeof twoNodes>>) => {
    expect(t.docs.map((d) => d.status).sort()).toEqual(["built", "reused"]);
    expect(t.builds).toBe(1);
    // The second found the first building and waited for it, rather than building beside it.
    expect(t.results.filter((r) => r.stderr.includes(`another process is building ${t.docs[0]!.key.slice(0, 12)}; waiting for it`))).toHaveLength(1);
    expect(readyKeys(t.home)).toEqual([t.docs[0]!.key]);
    expect(readdirSync(join(t.home, "envs-v1"))).toEqual([t.docs[0]!.key]);
    expect(existsSync(join(t.home, "envs-v1", t.docs[0]!.key, ".gpulayer", "ready"))).toBe(true);
    expect(readdirSync(join(t.home, "locks")).filter((n) => n.startsWith(t.docs[0]!.key))).toEqual([]);
  };

  test("mount namespaces (unshare -m): one build, the other waits and reuses it", async () => {
    checkOneBuild(await twoNodes("nsmount", ["-m"]));
  });

  test("mount and pid namespaces (unshare -p -f -m --mount-proc): the builder's pid means nothing to the other, and still one build", async () => {
    checkOneBuild(await twoNodes("nspid", ["-p", "-f", "-m", "--mount-proc"]));
  });
});

describe("a lease taken on another machine sharing the cache", () => {
  test("gc here keeps the env while the lease's heartbeat goes on, and removes it once that stops", async () => {
    const box = sandbox();
    const index = new PackageIndex(join(box.root, "index")).start();
    try {
      index.wheel({ name: "leased-elsewhere", version: "1.0" });
      const prepared = await cli(["env", "prepare", "-p", "leased-elsewhere", "--index-url", index.url, "--json"], { env: box.env });
      expect(prepared.code).toBe(0);
      const { key } = JSON.parse(prepared.stdout) as { key: string };
      // A job on another node runs in it: its lease names a pid, start and boot of that machine (as takeLease writes it there).
      const leases = join(box.home, "leases", "env", key);
      mkdirSync(leases, { recursive: true });
      const lease = join(leases, "4242-abcdef");
      writeFileSync(lease, JSON.stringify({ pid: 4242, start: 123, boot: "b00710d0-0000-4000-8000-000000000000", where: "node2|b00710d0-0000-4000-8000-000000000000|pid:[4026531836]", holder: "job 0123456789abcdef", since: new Date().toISOString(), job: "0123456789abcdef" }));
      const gc = () => cli(["gc", "--local", "--max-size", "0", "--min-age", "0"], { env: box.env });
      const kept = await gc();
      expect(kept.stdout + kept.stderr).toContain("in use by job 0123456789abcdef");
      expect(readyKeys(box.home)).toEqual([key]);
      // Its heartbeat stopped two minutes ago (the node died): the lease is swept, the env removed.
      const past = new Date(Date.now() - 120_000);
      utimesSync(lease, past, past);
      const removed = await gc();
      expect(removed.code).toBe(0);
      expect(readyKeys(box.home)).toEqual([]);
      expect(existsSync(lease)).toBe(false);
    } finally {
      index.stop();
      box.cleanup();
    }
  });
});
