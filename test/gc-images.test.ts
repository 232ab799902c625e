import { afterAll, describe, expect, setDefaultTimeout, test } from "bun:test";
import { copyFileSync, existsSync, mkdirSync, readFileSync, utimesSync, writeFileSync } from "node:fs";
import { join } from "node:path";
import { homeLayout } from "../src/config/paths.ts";
import { listImageRecords } from "../src/docker/index.ts";
import { recordPaths, writeRecord } from "../src/docker/inventory.ts";
import { busyboxTar, type EngineName, engineMatrix, engineTest, useRegistry, ENGINES } from "./fixtures/registry.ts";
import { cli, ROOT, run, sandbox, tempDir } from "./helpers.ts";

// Real processes and real builds take seconds; a file that sets none gets 5 s, whatever another file set.
setDefaultTimeout(120_000);

/**
 * gc over images, with real engines and a real registry on 127.0.0.1: only
 * images gpulayer pulled, least recently used first, through the engine's own
 * rmi, never one a container or a job uses. Every case runs against Docker and
 * Podman; an engine that does not answer is skipped with its reason, or fails
 * when GPULAYER_TEST_REQUIRE_ENGINES names it.
 */
const matrix = await engineMatrix("gc-images.test");
const { status, working } = matrix;

const registryOf = useRegistry(working);
const sandboxes: ReturnType<typeof sandbox>[] = [];
afterAll(() => {
  for (const sb of sandboxes) sb.cleanup();
});

async function must(argv: string[]): Promise<string> {
  const r = await run(argv);
  if (r.code !== 0) throw new Error(`${argv.join(" ")} failed (${r.code}):\n${r.stderr}${r.stdout}`);
  return r.stdout.trim();
}

let baseTar: Promise<string> | undefined;
/** Busybox with a file of its own, so that every repository is a different image (its own id and layer). */
async function pushDistinct(engine: EngineName, repo: string): Promise<string> {
  baseTar ??= busyboxTar();
  const dir = tempDir("gpl-img-");
  const tar = join(dir, "rootfs.tar");
  copyFileSync(await baseTar, tar);
  mkdirSync(join(dir, "add"));
  writeFileSync(join(dir, "add", "which-image"), `${repo}\n`);
  await must(["tar", "-C", join(dir, "add"), "-rf", tar, "./which-image"]);
  const ref = `${registryOf().host}/${repo}:1`;
  await must([engine, "import", tar, ref]);
  await must([engine, "push", ...(engine === "podman" ? ["--tls-verify=false"] : []), ref]);
  await must([engine, "rmi", ref]);
  return ref;
}

function sandboxFor(engine: EngineName) {
  const box = sandbox();
  box.env.GPULAYER_CONTAINER_ENGINE = engine;
  sandboxes.push(box);
  return box;
}

type Box = ReturnType<typeof sandbox>;
type Json = Record<string, any>;

async function prepare(box: Box, ref: string): Promise<Json> {
  const r = await cli(["env", "prepare", "--json", "--image", ref], { env: box.env });
  if (r.code !== 0) throw new Error(`prepare --image ${ref} failed (${r.code}): ${r.stderr}`);
  return JSON.parse(r.stdout);
}

async function gc(box: Box, args: string[], env: Record<string, string> = {}) {
  const r = await cli(["gc", "--min-age", "0", ...args], { env: { ...box.env, ...env } });
  return { ...r, report: args.includes("--json") && r.stdout ? (JSON.parse(r.stdout) as Json) : null };
}

/** The image's record: its id, and when it was last used (moved back `daysAgo`). */
function record(box: Box, ref: string, daysAgo?: number) {
  const rec = listImageRecords(homeLayout(box.home)).find((r) => r.ref === ref);
  if (!rec) throw new Error(`no record of ${ref}`);
  if (daysAgo !== undefined) {
    const when = new Date(Date.now() - daysAgo * 86_400_000);
    utimesSync(join(rec.dir, "last-used"), when, when);
  }
  return rec;
}

const refsOf = (box: Box) => listImageRecords(homeLayout(box.home)).map((r) => r.ref).sort();
const present = async (engine: EngineName, ref: string) => (await run([engine, "image", "inspect", ref])).code === 0;

/** A separate process holding a lease on an image record (a running job) until killed. */
async function leaseHolder(box: Box, recordId: string) {
  const proc = Bun.spawn([process.execPath, "-e", `import { homeLayout } from "${ROOT}/src/config/paths.ts"; import { takeLease } from "${ROOT}/src/core/lease.ts"; takeLease(homeLayout(process.env.GPULAYER_HOME), "image", "${recordId}", "job test-7"); console.log("held"); setInterval(() => {}, 1000);`], { env: box.env, stdout: "pipe", stderr: "inherit" });
  const { value } = await proc.stdout.getReader().read();
  expect(new TextDecoder().decode(value)).toContain("held");
  return proc;
}

const T = 60_000;

describe.each(ENGINES)("gc images: %s", (name) => {
  const it = engineTest(matrix, name);
  if (!it) return;

  it("the least recently used image goes through the engine's rmi, the other stays; --dry-run removes nothing; no engine: skipped, gc still works", async () => {
    const box = sandboxFor(name);
    const [a, b] = [await pushDistinct(name, `gc-lru-a-${name}`), await pushDistinct(name, `gc-lru-b-${name}`)];
    expect((await prepare(box, a)).status).toBe("pulled");
    expect((await prepare(box, b)).status).toBe("pulled");
    const ra = record(box, a, 2);
    const rb = record(box, b, 1);
    expect(ra.imageId).not.toBe(rb.imageId);
    const limit = String(Math.max(ra.sizeBytes, rb.sizeBytes));

    const dry = await gc(box, ["--max-size", limit, "--dry-run"]);
    expect(dry.code, dry.stderr).toBe(0);
    const esc = a.replace(/[.:/]/g, "\\$&");
    expect(dry.stdout).toMatch(new RegExp(`^would remove 1 of 2 entries, .* -> .*\\n {2}image ${esc} +\\d.* +last used 2 days ago +${name} ${ra.imageId.slice(7, 19)}\\n`));
    expect(await present(name, a)).toBe(true);
    expect(refsOf(box)).toEqual([a, b].sort());

    const real = await gc(box, ["--max-size", limit, "--json"]);
    expect(real.code, real.stderr).toBe(0);
    expect(real.report!.removed).toMatchObject([{ kind: "image", id: ra.imageId, size_bytes: ra.sizeBytes, reason: "lru", image: { engine: name, refs: [a] } }]);
    expect(real.report!.limit_reached).toBe(true);
    expect(await present(name, a)).toBe(false);
    expect(await present(name, ra.imageId.slice(7))).toBe(false);
    expect(await present(name, b)).toBe(true);
    expect(refsOf(box)).toEqual([b]);

    // The engine gone: the image is skipped with the reason, nothing else fails, nothing is removed.
    const noEngine = await gc(box, ["--max-size", "0", "--json"], { PATH: join(box.root, "no-such-dir") });
    expect(noEngine.code, noEngine.stderr).toBe(0);
    expect(noEngine.report!.removed).toEqual([]);
    expect(noEngine.report!.skipped).toMatchObject([{ id: rb.imageId, reasons: [{ code: "engine", message: `engine not available (${name}: not installed (not found on PATH))` }] }]);
    expect(refsOf(box)).toEqual([b]);
    expect(await present(name, b)).toBe(true);
  }, T);

  it("an image a running container or a job uses is skipped even when oldest; removed once they are done", async () => {
    const box = sandboxFor(name);
    const [b, c] = [await pushDistinct(name, `gc-busy-b-${name}`), await pushDistinct(name, `gc-busy-c-${name}`)];
    await prepare(box, b);
    await prepare(box, c);
    const rb = record(box, b, 3);
    const rc = record(box, c, 2);
    const container = await must([name, "run", "-d", "--rm", "--network", "host", b, "sleep", "60"]);
    const job = await leaseHolder(box, rc.id);
    try {
      const busy = await gc(box, ["--max-size", "0", "--json"]);
      expect(busy.code, busy.stderr).toBe(0);
      expect(busy.report!.removed).toEqual([]);
      expect(busy.report!.limit_reached).toBe(false);
      expect(busy.report!.skipped).toMatchObject([
        { id: rb.imageId, reasons: [{ code: "container", message: expect.stringMatching(/^used by running container \S+/) }] },
        { id: rc.imageId, reasons: [{ code: "leased", message: "in use by job test-7" }] },
      ]);
      expect(await present(name, b)).toBe(true);
      expect(await present(name, c)).toBe(true);
      expect(refsOf(box)).toEqual([b, c].sort());
    } finally {
      await run([name, "rm", "-f", ...(name === "podman" ? ["-t", "0"] : []), container]);
      job.kill();
      await job.exited;
    }
    const free = await gc(box, ["--max-size", "0", "--json"]);
    expect(free.code, free.stderr).toBe(0);
    expect(free.report!.removed.map((e: Json) => e.id)).toEqual([rb.imageId, rc.imageId]);
    expect(await present(name, b)).toBe(false);
    expect(await present(name, c)).toBe(false);
    expect(refsOf(box)).toEqual([]);
  }, T);

  it("a job that finds the image while gc holds its lock waits, and pulls it again when gc removed it", async () => {
    const box = sandboxFor(name);
    const e = await pushDistinct(name, `gc-race-${name}`);
    await prepare(box, e);
    const lock = recordPaths(homeLayout(box.home), name, e).lock;
    expect(record(box, e).pulledByGpulayer).toBe(true);
    // gc between its lease check and its rmi: the lock held, the image about to go.
    const gcAtWork = Bun.spawn([process.execPath, "-e", `import { tryLock } from "${ROOT}/src/core/lock.ts"; await tryLock(${JSON.stringify(lock)}); console.log("held"); setInterval(() => {}, 1000);`], { env: box.env, stdout: "pipe", stderr: "inherit" });
    try {
      expect(new TextDecoder().decode((await gcAtWork.stdout.getReader().read()).value)).toContain("held");
      const job = cli(["env", "prepare", "--json", "--image", e], { env: box.env });
      const early = await Promise.race([job.then(() => "finished"), Bun.sleep(1500).then(() => "waiting")]);
      expect(early).toBe("waiting");
      await must([name, "rmi", e]);
      gcAtWork.kill();
      const done = await job;
      expect(done.code, done.stderr).toBe(0);
      expect(JSON.parse(done.stdout)).toMatchObject({ status: "pulled", pulled_by_gpulayer: true });
      expect(await present(name, e)).toBe(true);
    } finally {
      gcAtWork.kill();
    }
  }, T);

  it("an image gpulayer did not pull is never touched, recorded or not, and not counted", async () => {
    const box = sandboxFor(name);
    const d = await pushDistinct(name, `gc-theirs-${name}`);
    await must([name, "pull", ...(name === "podman" ? ["--tls-verify=false"] : []), d]);
    const unrecorded = await gc(box, ["--max-size", "0", "--json"]);
    expect(unrecorded.code, unrecorded.stderr).toBe(0);
    expect(unrecorded.report).toMatchObject({ entries: 0, removed: [], skipped: [], total_before_bytes: 0 });
    expect(await present(name, d)).toBe(true);

    // Used through gpulayer, it is recorded, but as not gpulayer's pull.
    expect((await prepare(box, d)).status).toBe("reused");
    const rd = record(box, d, 5);
    expect(rd.pulledByGpulayer).toBe(false);
    const recorded = await gc(box, ["--max-size", "0", "--json"]);
    expect(recorded.code, recorded.stderr).toBe(0);
    expect(recorded.report).toMatchObject({ entries: 0, removed: [], total_before_bytes: 0, limit_reached: true });
    expect(recorded.report!.skipped).toMatchObject([{ kind: "image", id: rd.imageId, reasons: [{ code: "not-pulled", message: "not pulled by gpulayer" }] }]);
    const human = await gc(box, ["--max-size", "0"]);
    expect(human.code, human.stderr).toBe(0);
    expect(human.stdout).toContain("not counted, never removed: 1 image gpulayer did not pull:");
    expect(human.stdout).toMatch(new RegExp(`image ${d.replace(/[.:/]/g, "\\$&")} .*not pulled by gpulayer`));
    expect(await present(name, d)).toBe(true);
    expect(refsOf(box)).toEqual([d]);
  }, T);
});

describe("gc images: the engine is asked only when needed", () => {
  test("no image records, or none the limit reaches: no engine call; an engine that does not answer: skipped with its message", async () => {
    const box = sandbox();
    sandboxes.push(box);
    const bin = join(box.root, "bin");
    const log = join(box.root, "engine-calls.log");
    mkdirSync(bin);
    for (const engine of ENGINES) {
      writeFileSync(join(bin, engine), `#!/bin/sh\necho "${engine} $*" >> "${log}"\necho "Cannot connect to the ${engine} daemon" >&2\nexit 1\n`, { mode: 0o755 });
    }
    const env = { PATH: bin };
    const calls = () => (existsSync(log) ? readFileSync(log, "utf8").trim().split("\n") : []);

    const empty = await gc(box, ["--max-size", "0", "--json"], env);
    expect(empty.code, empty.stderr).toBe(0);
    expect(empty.report).toMatchObject({ entries: 0, removed: [], skipped: [] });
    expect(calls()).toEqual([]);

    const layout = homeLayout(box.home);
    const ref = "registry.example/team/img:1";
    const imageId = `sha256:${"ab".repeat(32)}`;
    writeRecord(recordPaths(layout, "docker", ref), { schema: 1, engine: "docker", ref, digest: `sha256:${"cd".repeat(32)}`, imageId, repoDigests: [], sizeBytes: 5_000_000, firstSeen: new Date(Date.now() - 86_400_000).toISOString(), pulledByGpulayer: true });
    const under = await gc(box, ["--max-size", "1G", "--json"], env);
    expect(under.code, under.stderr).toBe(0);
    expect(under.report).toMatchObject({ entries: 1, total_before_bytes: 5_000_000, removed: [], skipped: [], limit_reached: true });
    expect(calls()).toEqual([]);

    // --keep by reference or by id: decided before any engine call.
    for (const keep of ["registry.example/team/", "sha256:abab", "abab"]) {
      const kept = await gc(box, ["--max-size", "0", "--json", "--keep", keep], env);
      expect(kept.report!.skipped).toMatchObject([{ id: imageId, reasons: [{ code: "keep" }] }]);
    }
    expect(calls()).toEqual([]);

    for (const args of [["--dry-run"], []]) {
      const over = await gc(box, ["--max-size", "1M", "--json", ...args], env);
      expect(over.code, over.stderr).toBe(0);
      expect(over.report).toMatchObject({ removed: [], skipped: [{ kind: "image", id: imageId, reasons: [{ code: "engine", message: "engine not available (docker: Cannot connect to the docker daemon)" }] }], limit_reached: false });
    }
    // One call per run: the engine that did not answer is not asked again for other images.
    expect(calls()).toHaveLength(2);
    expect(calls()[0]).toStartWith(`docker ps -a --filter ancestor=${"ab".repeat(32)}`);
    expect(listImageRecords(layout).map((r) => r.ref)).toEqual([ref]);
  });
});
