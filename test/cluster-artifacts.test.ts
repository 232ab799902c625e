import { afterAll, beforeAll, describe, expect, test } from "bun:test";
import { Database } from "bun:sqlite";
import { existsSync, mkdirSync, readdirSync, readFileSync, renameSync, rmSync, writeFileSync } from "node:fs";
import { join } from "node:path";
import { craftArtifact, type CraftedEntry, escapes, metaEntry } from "./fixtures/crafted-tar.ts";
import { PackageIndex } from "./fixtures/index.ts";
import { pgProgram } from "./fixtures/postgres.ts";
import { CLI_ARGV, cli, makeWorkerVenv, sandbox, tempDir } from "./helpers.ts";
import { keepOutput, type Kept, stopAll, waitFor } from "./fixtures/processes.ts";
import { TcpProxy } from "./fixtures/tcp-proxy.ts";

/**
 * Build once, ship to identical workers: a real server and five workers on
 * 127.0.0.1, each in its own mount namespace where its own home is mounted at
 * one path (as identical machines of a fleet have it), with one worker venv.
 *   w1, w2, w3: identical        w4: another gamma in the same venv path (another base)
 *   w5: --offline
 * A local index counts what it is asked.
 */

const TOKEN = "artifact-test-token-0123456789";
// Lost after 10 s of silence, not 3: on a loaded box a 3 s stall of heartbeats can declare the builder lost, which drops its claim (the others then build too).
const FAST = { GPULAYER_HEARTBEAT_SECONDS: "0.5", GPULAYER_WORKER_LOST_SECONDS: "10", GPULAYER_WORKER_ENGINE: "none", GPULAYER_WORKER_DRAIN_SECONDS: "1" };
const T = 120_000;
const world = tempDir("gpl-fleet-");
const index = new PackageIndex(join(world, "index"));
const server = sandbox();
const client = sandbox();
const kept: Kept[] = [];
let url = "";
/** The one path every worker sees its home at, and its venv at. */
const HOME = join(world, "home");
const VENV = join(world, "venv");
const boxes: Record<string, ReturnType<typeof sandbox>> = {};

const gpl = (args: string[]) => cli(args, { env: { ...client.env, GPULAYER_SERVER: url, GPULAYER_TOKEN: TOKEN }, cwd: client.root });
const api = async <X = any>(path: string, init: RequestInit = {}): Promise<X> => (await fetch(`${url}${path}`, { ...init, headers: { authorization: `Bearer ${TOKEN}`, "content-type": "application/json" } })).json() as Promise<X>;
const prepare = async (args: string[], label: string) => {
  const r = await gpl(["env", "prepare", ...args, "--index-url", index.url, "--label", label, "--json"]);
  return { ...r, doc: r.stdout.trim() ? JSON.parse(r.stdout) : null };
};

/** A worker in its own mount namespace: its real home mounted at HOME, and `venv` (when given) at VENV. */
function startWorker(name: string, opts: { venv?: string; extra?: string[]; via?: string } = {}) {
  const box = boxes[name] ?? sandbox();
  boxes[name] = box;
  const mounts = [`mount --bind "${box.home}" "${HOME}"`, ...(opts.venv ? [`mount --bind "${opts.venv}" "${VENV}"`] : [])].join(" && ");
  const argv = [...CLI_ARGV, "join", opts.via ?? url, "--name", name, "--label", `box=${name}`, ...(["w1", "w2", "w3"].includes(name) ? ["--label", "fleet=a"] : []), "--python", join(VENV, "bin", "python"), ...(opts.extra ?? [])];
  const proc = Bun.spawn(["unshare", "-m", "sh", "-c", `${mounts} && exec "$@"`, "sh", ...argv], { env: { ...box.env, ...FAST, GPULAYER_HOME: HOME, GPULAYER_TOKEN: TOKEN }, stdout: "pipe", stderr: "pipe", stdin: "ignore" });
  return { ...keepOutput(proc, kept), proc };
}

beforeAll(async () => {
  index.start();
  index.wheel({ name: "alpha", version: "1.0", requires: ["beta"], files: { "alpha/__init__.py": "import beta\nVALUE = 'alpha ok'\n" } });
  // Incompressible bytes: the artifact has a size worth counting.
  index.wheel({ name: "beta", version: "1.0", files: { "beta/__init__.py": "", "beta/a.txt": Buffer.from(crypto.getRandomValues(new Uint8Array(33_000))).toString("base64"), "beta/b.txt": Buffer.from(crypto.getRandomValues(new Uint8Array(33_000))).toString("base64") } });
  index.wheel({ name: "gamma", version: "1.0", files: { "gamma/__init__.py": "V = '1.0'\n" } });
  index.wheel({ name: "gamma", version: "2.0", files: { "gamma/__init__.py": "V = '2.0'\n" } });
  index.wheel({ name: "zeta", version: "1.0", files: { "zeta/__init__.py": "" } });
  index.wheel({ name: "epsilon", version: "1.0", files: { "epsilon/__init__.py": "" } });
  index.wheel({ name: "eta", version: "1.0", files: { "eta/__init__.py": "" } });
  index.wheel({ name: "theta", version: "1.0", files: { "theta/__init__.py": "" } });
  index.wheel({ name: "iota", version: "1.0", files: { "iota/__init__.py": "" } });
  mkdirSync(HOME);
  await makeWorkerVenv(VENV, { env: server.env, withPip: true, packages: ["gamma==1.0"], findLinks: index.dir });
  const other = join(world, "venv-other");
  // The same venv again (same paths inside), then another gamma: another base at the same path.
  await makeWorkerVenv(other, { env: server.env, withPip: true, packages: ["gamma==1.0"], findLinks: index.dir });
  const s = Bun.spawn(["sh", "-c", `unshare -m sh -c 'mount --bind "${other}" "${VENV}" && "${VENV}/bin/python" -m pip install -q --no-index --find-links "${index.dir}" gamma==2.0'`], { env: server.env, stdout: "pipe", stderr: "pipe" });
  expect(await s.exited).toBe(0);
  const srv = keepOutput(Bun.spawn([...CLI_ARGV, "server", "--listen", "127.0.0.1:0", "--json"], { env: { GPULAYER_TOKEN: TOKEN, ...server.env, ...FAST }, stdout: "pipe", stderr: "pipe", stdin: "ignore" }), kept);
  url = (await waitFor("the server", async () => /"url": "([^"]+)"/.exec(srv.out())?.[1])) as string;
  for (const n of ["w1", "w2", "w3"]) startWorker(n);
  startWorker("w4", { venv: other });
  startWorker("w5", { extra: ["--offline"] });
  await waitFor("five workers", async () => ((await api<unknown[]>("/v1/workers")).length === 5 ? true : null));
}, T);

afterAll(async () => {
  await stopAll(kept);
  index.stop();
  for (const b of [server, client, ...Object.values(boxes)]) b.cleanup();
}, 30_000);

/** One statement on the server's database (SQLite or PostgreSQL), values inlined (the tests' own hex and numbers): what a test reads or plants behind the API. */
function serverSql(statement: string): string[][] {
  if (server.env.GPULAYER_DATABASE) {
    const r = Bun.spawnSync([pgProgram("psql"), server.env.GPULAYER_DATABASE, "-At", "-F", "\t", "-c", statement], { stdout: "pipe", stderr: "pipe" });
    if (r.exitCode !== 0) throw new Error(`psql: ${r.stderr.toString()}`);
    return r.stdout.toString().split("\n").filter(Boolean).map((l) => l.split("\t"));
  }
  const db = new Database(join(server.home, "server", "server.db"));
  try {
    db.exec("PRAGMA busy_timeout = 10000");
    return db.query(statement).values().map((row) => row.map(String));
  } finally {
    db.close();
  }
}

/** A worker's credential, as its home keeps it: what a hostile process with that worker's rights holds. */
function credentialOf(name: string): string {
  const dir = join(boxes[name]!.home, "cluster", "identity");
  return JSON.parse(readFileSync(join(dir, readdirSync(dir)[0]!), "utf8")).credential;
}

/** A job on one worker (detached) and the id of its task there, once it is running. */
async function jobOn(worker: string, command: string[]): Promise<{ job: string; task: string }> {
  const r = await gpl(["job", "run", "--detach", "--json", "--label", `box=${worker}`, "--", ...command]);
  expect(r.code).toBe(0);
  const job = JSON.parse(r.stdout).id as string;
  const task = await waitFor(`the task of ${job}`, async () => serverSql(`SELECT id FROM tasks WHERE job_id = '${job}' AND state = 'running'`)[0]?.[0] ?? null);
  return { job, task };
}

/** A request with a worker's credential. */
async function asWorker(credential: string, method: string, path: string, body?: RequestInit["body"], headers: Record<string, string> = {}): Promise<{ status: number; doc: any }> {
  const res = await fetch(`${url}${path}`, { method, body, headers: { authorization: `Bearer ${credential}`, "content-type": "application/json", ...headers } });
  return { status: res.status, doc: await res.json() };
}

/** Replace the server's artifact `sha` by the bytes of `file` (as a server of an earlier version might have taken them): the row keeps its key and conditions. */
function plantArtifact(sha: string, file: string, newSha: string): void {
  const dir = join(server.home, "server", "artifacts");
  renameSync(file, join(dir, `${newSha}.tar.zst`));
  serverSql(`UPDATE artifacts SET sha = '${newSha}', bytes = ${Bun.file(join(dir, `${newSha}.tar.zst`)).size} WHERE sha = '${sha}'`);
  rmSync(join(dir, `${sha}.tar.zst`), { force: true });
}

const artifacts = () => api<{ count: number; bytes: number; artifacts: { sha256: string; key: string; built_by: string; bytes: number }[] }>("/v1/artifacts");

describe("env artifacts", () => {
  test("env prepare over three identical workers: one build, two fetches; the index is asked by one worker only; the fetched envs import", async () => {
    const r = await prepare(["-p", "alpha"], "box=w1");
    expect(r.code).toBe(0);
    const afterBuild = index.requests.length;
    // The same request on w2 and w3 at once: both fetch what w1 built.
    const both = await Promise.all([prepare(["-p", "alpha"], "box=w2"), prepare(["-p", "alpha"], "box=w3")]);
    const first = r.doc.workers[0];
    expect(first).toMatchObject({ worker: "w1", status: "built" });
    for (const b of both) {
      expect(b.code).toBe(0);
      expect(b.doc.workers[0]).toMatchObject({ status: "fetched", key: first.key, path: first.path });
      expect(b.doc.workers[0].fetched.built_by).toBe("w1");
      expect(b.doc.workers[0].fetched.bytes).toBeGreaterThan(50_000);
    }
    // One build's worth: each project page once, and nothing at all asked by the two that fetched.
    expect(index.asked("alpha")).toBe(1);
    expect(index.asked("beta")).toBe(1);
    expect(index.requests.slice(afterBuild)).toEqual([]);
    const a = await artifacts();
    expect(a.artifacts.filter((x) => x.key === first.key).map((x) => x.built_by)).toEqual(["w1"]);
    // The fetched env works on its worker: its own packages and the worker's (gamma) import; nothing is built again.
    for (const w of ["w2", "w3"]) {
      const job = await gpl(["job", "run", "-p", "alpha", "--index-url", index.url, "--label", `box=${w}`, "--", "python", "-c", "import alpha, gamma; print(alpha.VALUE, gamma.V)"]);
      expect({ w, out: job.stdout.trim(), code: job.code }).toEqual({ w, out: "alpha ok 1.0", code: 0 });
    }
    expect(index.asked("alpha")).toBe(1);
  }, T);

  test("fan-out: one env prepare over every identical worker makes one build; the others wait for it and fetch", async () => {
    const r = await prepare(["-p", "zeta"], "fleet=a");
    expect(r.code).toBe(0);
    const statuses = r.doc.workers.map((x: { status: string }) => x.status).sort();
    expect(statuses).toEqual(["built", "fetched", "fetched"]);
    expect(index.asked("zeta")).toBe(1);
    // Each line one sentence: who builds and why, who waits for whom, who fetches what; no step word twice.
    const lines = r.stderr.split("\n");
    expect(lines.filter((l) => /^\[w\d\] building here: no worker of the fleet has built env [0-9a-f]{12} yet$/.test(l))).toHaveLength(1);
    expect(lines.filter((l) => /^\[w\d\] waiting for w\d, which is building env [0-9a-f]{12} for this same path$/.test(l)).length).toBeGreaterThanOrEqual(1);
    expect(lines.filter((l) => /^\[w\d\] fetching env [0-9a-f]{12} from w\d \(artifact [0-9a-f]{12}, [\d.]+ MiB\)$/.test(l))).toHaveLength(2);
    expect(r.stderr).not.toMatch(/fetching (fetching|waiting|building)|from the fleet/);
  }, T);

  test("a worker with another base never receives the artifact: it builds its own", async () => {
    const r = await prepare(["-p", "alpha"], "box=w4");
    expect(r.code).toBe(0);
    expect(r.doc.workers[0].status).toBe("built");
    expect(index.asked("alpha")).toBe(2);
  }, T);

  test("an offline worker fetches what exists, and for what does not fails with one line naming who could build it", async () => {
    const ok = await prepare(["-p", "alpha"], "box=w5");
    expect(ok.code).toBe(0);
    expect(ok.doc.workers[0].status).toBe("fetched");
    const none = await prepare(["-p", "epsilon"], "box=w5");
    expect(none.code).toBe(1);
    const msg: string = none.doc.workers[0].message;
    expect(msg).toContain("offline");
    expect(msg).toContain("no worker has built it yet");
    expect(msg).toMatch(/can build it: .*w1/);
    expect(index.asked("epsilon")).toBe(0);
  }, T);

  test("a corrupted artifact (a byte flipped on the server's disk) is refused by its digest; the worker builds instead and says why", async () => {
    const r1 = await prepare(["-p", "gamma==2.0"], "box=w1");
    expect(r1.doc.workers[0].status).toBe("built");
    const key = r1.doc.workers[0].key;
    const sha = await waitFor("the artifact", async () => (await artifacts()).artifacts.find((a) => a.key === key)?.sha256);
    const file = join(server.home, "server", "artifacts", `${sha}.tar.zst`);
    const bytes = readFileSync(file);
    bytes[Math.floor(bytes.length / 2)]! ^= 0xff;
    writeFileSync(file, bytes);
    const r2 = await gpl(["env", "prepare", "-p", "gamma==2.0", "--index-url", index.url, "--label", "box=w2", "--json"]);
    expect(r2.code).toBe(0);
    expect(JSON.parse(r2.stdout).workers[0].status).toBe("built");
    expect(r2.stderr).toMatch(/\[w2\] refused artifact [0-9a-f]{12} from w1: its content does not match its sha256/);
    // Nothing half-unpacked is left beside the entry.
    expect(readdirSync(join(boxes.w2!.home, "envs-v1")).filter((n) => n.startsWith(".fetch-"))).toEqual([]);
    // The server checked what w2 reported, dropped it, and took w2's build in its place.
    expect(r2.stderr).toContain(`[w2] building here: the server dropped artifact ${sha.slice(0, 12)}, refused here\n`);
    const now = await waitFor("w2's artifact", async () => (await artifacts()).artifacts.find((a) => a.key === key && a.built_by === "w2") ?? null);
    expect((await artifacts()).artifacts.filter((a) => a.key === key)).toEqual([now]);
  }, T);

  test("an artifact whose bytes the server serves differ from its sha256 (another sound artifact of the env, or its first half) is unpacked as it streams and refused at its end: nothing of it is left, no fetch folder, and the worker builds", async () => {
    for (const [worker, pkg, damage] of [["w2", "theta", "another sound artifact"], ["w3", "iota", "its first half"]] as const) {
      const r1 = await prepare(["-p", pkg], "box=w1");
      expect(r1.doc.workers[0].status).toBe("built");
      const { key, path } = r1.doc.workers[0];
      const sha = await waitFor("the artifact", async () => (await artifacts()).artifacts.find((a) => a.key === key)?.sha256);
      const file = join(server.home, "server", "artifacts", `${sha}.tar.zst`);
      if (damage === "its first half") writeFileSync(file, readFileSync(file).subarray(0, Math.floor(Bun.file(file).size / 2)));
      // Every entry passes the unpacker's checks and its meta names this env: only the digest, known at the end, refuses it.
      else await craftArtifact(file, [{ name: ".gpulayer", type: "dir" }, metaEntry(key, path), { name: "planted.txt", type: "file", data: "not what w1 built" }]);
      const r2 = await prepare(["-p", pkg], `box=${worker}`);
      expect({ damage, code: r2.code, status: r2.doc.workers[0].status }).toEqual({ damage, code: 0, status: "built" });
      expect(r2.stderr).toMatch(new RegExp(`\\[${worker}\\] refused artifact ${sha.slice(0, 12)} from w1: its content does not match its sha256`));
      const envs = join(boxes[worker]!.home, "envs-v1");
      expect({ damage, left: readdirSync(envs).filter((n) => n.startsWith(".fetch-")) }).toEqual({ damage, left: [] });
      expect({ damage, planted: existsSync(join(envs, key, "planted.txt")), ready: existsSync(join(envs, key, ".gpulayer", "ready")) }).toEqual({ damage, planted: false, ready: true });
      expect(JSON.parse(readFileSync(join(envs, key, ".gpulayer", "meta.json"), "utf8")).fetched).toBeUndefined();
    }
  }, T);

  test("a worker's credential uploads nothing but its own task's claimed build: not for a task that ran `true` and ended, not while another worker holds the claim; a crafted tar under its own claim is refused", async () => {
    const key = "d".repeat(64);
    const path = join(HOME, "envs-v1", key);
    const conditions = Buffer.from(JSON.stringify({ env_path: path, platform: "linux-x86_64", interpreter: "/usr/bin/python3", python: "3.11.2", base: "b".repeat(64) })).toString("base64");
    const put = async (credential: string, task: string, entries: CraftedEntry[]) => {
      const file = join(world, `hostile-${crypto.randomUUID()}.tar.zst`);
      const sha = await craftArtifact(file, entries);
      return asWorker(credential, "PUT", `/v1/artifacts/${sha}?task=${task}&key=${key}`, Bun.file(file), { "x-gpulayer-conditions": conditions, "content-type": "application/zstd" });
    };
    const sound = [metaEntry(key, path), { name: "bin", type: "dir" as const }];
    const w3 = credentialOf("w3");
    const ran = await gpl(["job", "run", "--json", "--label", "box=w3", "--", "true"]);
    expect(ran.code).toBe(0);
    const ended = serverSql(`SELECT id FROM tasks WHERE job_id = '${JSON.parse(ran.stdout).id}'`)[0]![0]!;
    const late = await put(w3, ended, sound);
    expect(late.status).toBe(403);
    expect(late.doc.error).toBe(`artifact refused: env dddddddddddd at ${path} is taken only from the build a task of this worker claimed, while it holds the claim; no build claim of it is held`);
    expect((await asWorker(w3, "POST", "/v1/artifacts/claim", JSON.stringify({ key, path, task: ended }))).doc.error).toBe(`a build claim is taken only for a task this worker is running now (task ${ended} is not)`);
    // w1 holds the claim for a task it runs; w3, running a task of its own, may neither claim nor upload.
    const [a, b] = await Promise.all([jobOn("w1", ["sleep", "60"]), jobOn("w3", ["sleep", "60"])]);
    const w1 = credentialOf("w1");
    expect((await asWorker(w1, "POST", "/v1/artifacts/claim", JSON.stringify({ key, path, task: a.task }))).doc).toEqual({ granted: true });
    expect((await asWorker(w3, "POST", "/v1/artifacts/claim", JSON.stringify({ key, path, task: b.task }))).doc).toEqual({ granted: false, holder: "w1" });
    const hijack = await put(w3, b.task, sound);
    expect(hijack.status).toBe(403);
    expect(hijack.doc.error).toEndWith("; w1 holds its build claim");
    // Under its own claim, w1's crafted tars are refused for what they hold.
    for (const [name, entries] of Object.entries(escapes(join(world, "outside-server"), key, path))) {
      const r = await put(w1, a.task, entries);
      expect({ name, status: r.status, error: r.doc.error }).toEqual({ name, status: 400, error: expect.stringMatching(/^artifact refused: it holds an entry that may not be unpacked: /) });
    }
    const other = await put(w1, a.task, [metaEntry("e".repeat(64), path)]);
    expect(other.doc.error).toBe(`artifact refused: it holds env eeeeeeeeeeee at ${path}, not dddddddddddd at ${path}`);
    expect((await asWorker(w1, "GET", `/v1/artifacts?key=${key}&path=${encodeURIComponent(path)}`)).doc.artifacts).toEqual([]);
    for (const j of [a.job, b.job]) {
      expect((await gpl(["job", "cancel", j])).code).toBe(0);
      await waitFor(`${j} cancelled`, async () => ((await api<{ state: string }>(`/v1/jobs/${j}`)).state === "cancelled" ? true : null));
    }
  }, T);

  test("an artifact on the server that writes through a link, or names another key, is refused by the fetching worker, which writes nothing outside its env, builds, and replaces it", async () => {
    const r1 = await prepare(["-p", "eta"], "box=w1");
    expect(r1.doc.workers[0].status).toBe("built");
    const { key, path } = r1.doc.workers[0];
    const outside = join(world, "outside-worker");
    const cases: [string, CraftedEntry[], RegExp][] = [
      ["w2", escapes(outside, key, path)["a link named ./d, then d/x"]!, /refused artifact [0-9a-f]{12} from w\d: the artifact holds an entry that may not be unpacked: "d\/x" is under the symbolic link d/],
      ["w3", [metaEntry("e".repeat(64), path), { name: "bin", type: "dir" }], /refused artifact [0-9a-f]{12} from w\d: it holds env eeeeeeeeeeee at /],
    ];
    for (const [worker, entries, why] of cases) {
      const was = await waitFor("the artifact", async () => (await artifacts()).artifacts.find((a) => a.key === key) ?? null);
      const file = join(world, `planted-${worker}.tar.zst`);
      const sha = await craftArtifact(file, entries);
      plantArtifact(was.sha256, file, sha);
      const r = await prepare(["-p", "eta"], `box=${worker}`);
      expect({ worker, code: r.code, status: r.doc.workers[0].status }).toEqual({ worker, code: 0, status: "built" });
      expect(r.stderr).toMatch(why);
      expect(r.stderr).toContain(`building here: the server dropped artifact ${sha.slice(0, 12)}, refused here`);
      expect(existsSync(outside)).toBe(false);
      await waitFor(`${worker}'s artifact in its place`, async () => ((await artifacts()).artifacts.filter((a) => a.key === key).map((a) => a.built_by).join() === worker ? true : null));
    }
  }, T);

  test("a worker killed (SIGKILL) mid-download leaves nothing marked ready; its next prepare cleans the remains and gets the env", async () => {
    const proxy = new TcpProxy(Number(new URL(url).port)).start();
    proxy.stallAfter = "application/zstd";
    const w6 = startWorker("w6", { via: `http://127.0.0.1:${proxy.port}` });
    await waitFor("w6", async () => ((await api<{ name: string; state: string }[]>("/v1/workers")).some((w) => w.name === "w6" && w.state === "idle") ? true : null));
    const envs = join(boxes.w6!.home, "envs-v1");
    const asked = gpl(["env", "prepare", "-p", "alpha", "--index-url", index.url, "--label", "box=w6", "--json"]);
    await waitFor("the stalled download", () => proxy.stalled && readdirSync(envs).some((n) => n.startsWith(".fetch-")));
    w6.proc.kill("SIGKILL");
    await w6.proc.exited;
    const key = readdirSync(envs).find((n) => n.startsWith(".fetch-"))!.slice(".fetch-".length, ".fetch-".length + 64);
    expect(readdirSync(envs).filter((n) => /^[0-9a-f]{64}$/.test(n))).toEqual([]);
    proxy.cut();
    void asked;
    // Back, straight to the server: the same env is fetched whole, and nothing of the killed fetch is left.
    startWorker("w6");
    const again = await waitFor("w6's prepare", async () => {
      const r = await prepare(["-p", "alpha"], "box=w6");
      return r.code === 0 && r.doc.workers[0]?.status === "fetched" ? r : null;
    }, 60_000);
    expect(again.doc.workers[0].key).toBe(key);
    expect(readdirSync(envs).filter((n) => n.startsWith(".fetch-"))).toEqual([]);
    expect(readdirSync(join(envs, key, ".gpulayer"))).toContain("ready");
  }, T);

  test("gc --server trims the server's artifacts least recently used first, and workers shows them", async () => {
    const a = await artifacts();
    expect(a.count).toBeGreaterThanOrEqual(3);
    const dry = await gpl(["gc", "--server", url, "--max-size", "1", "--dry-run", "--json"]);
    expect(dry.code).toBe(0);
    const plan = JSON.parse(dry.stdout);
    expect(plan.removed.length).toBe(a.count);
    expect((await artifacts()).count).toBe(a.count);
    const keepBytes = a.bytes - a.artifacts[0]!.bytes;
    const real = await gpl(["gc", "--server", url, "--max-size", String(keepBytes), "--json"]);
    expect(real.code).toBe(0);
    const done = JSON.parse(real.stdout);
    // The least recently used (first in the server's list) went, and only it.
    expect(done.removed.map((x: { sha256: string }) => x.sha256)).toEqual([a.artifacts[0]!.sha256]);
    expect((await artifacts()).count).toBe(a.count - 1);
    const ws = await gpl(["workers"]);
    expect(ws.stdout).toMatch(/artifacts\s+\d+ \(/);
  }, T);
});
