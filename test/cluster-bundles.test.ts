import { afterAll, beforeAll, describe, expect, test } from "bun:test";
import { existsSync, mkdirSync, readdirSync, statSync, utimesSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { packTemp } from "../src/cluster/upload.ts";
import { cli, sandbox, serversOnPostgres, startCli } from "./helpers.ts";
import { keepOutput, stopAll, waitFor } from "./fixtures/processes.ts";

/**
 * The server's uploaded bundles are cleaned up: a server and a worker as
 * separate processes on 127.0.0.1; the server is restarted on the same port
 * and home with other cleanup settings (it checks once when it starts, then
 * every few minutes), and the worker rides out the restarts.
 */

const TOKEN = "bundles-test-token-0123456789";
const FAST = { GPULAYER_HEARTBEAT_SECONDS: "0.3", GPULAYER_WORKER_LOST_SECONDS: "10", GPULAYER_WORKER_ENGINE: "none", GPULAYER_CANCEL_GRACE: "1", GPULAYER_WORKER_DRAIN_SECONDS: "1" };
const T = 90_000;
const box = sandbox();
const serverHome = join(box.root, "server-home");
const bundlesDir = join(serverHome, "server", "bundles");
const procs: { proc: ReturnType<typeof startCli>; out: () => string }[] = [];
let server: (typeof procs)[number];
let port = 0;
let url = "";

const keep = (proc: ReturnType<typeof startCli>) => keepOutput(proc, procs);


const env = () => ({ ...box.env, GPULAYER_SERVER: url, GPULAYER_TOKEN: TOKEN });
const gpl = (args: string[], cwd = box.root) => cli(args, { env: env(), cwd });
const json = <T = any>(text: string): T => JSON.parse(text) as T;

/** (Re)start the server on the same port and home with these settings; resolves once it answers. */
async function startServer(settings: Record<string, string> = {}): Promise<void> {
  server = keep(startCli(["server", "--listen", `127.0.0.1:${port}`, "--json"], { env: { GPULAYER_TOKEN: TOKEN, ...box.env, ...FAST, GPULAYER_HOME: serverHome, ...settings } }));
  const found = await waitFor("the server", () => /"url": "([^"]+)"/.exec(server.out())?.[1]);
  url = found;
}

async function restartServer(settings: Record<string, string>): Promise<string> {
  server.proc.kill("SIGTERM");
  expect(await server.proc.exited).toBe(0);
  await startServer(settings);
  return server.out();
}

/** A folder with one file; its bundle's hash, as the client will compute it. */
function project(name: string, content: string): { dir: string; hash: string } {
  const dir = join(box.root, name);
  mkdirSync(dir, { recursive: true });
  writeFileSync(join(dir, "data.txt"), content);
  const pack = packTemp(dir, { maxBytes: 200 * 1024 ** 2, maxUnpackedBytes: 2 * 1024 ** 3, maxEntries: 200_000 });
  pack.dispose();
  return { dir, hash: pack.hash };
}

const stored = () => (existsSync(bundlesDir) ? readdirSync(bundlesDir).sort() : []);
const file = (hash: string) => `${hash}.tar.gz`;

beforeAll(async () => {
  const probe = Bun.serve({ port: 0, hostname: "127.0.0.1", fetch: () => new Response() });
  port = probe.port!;
  await probe.stop(true);
  await startServer();
  keep(startCli(["join", url, "--name", "wk", "--python", "python3"], { env: { ...box.env, ...FAST, GPULAYER_TOKEN: TOKEN, GPULAYER_HOME: join(box.root, "worker-home") } }));
  await waitFor("the worker", async () => json<any[]>((await gpl(["workers", "--json"])).stdout).length === 1);
}, T);

afterAll(async () => {
  await stopAll(procs);
  box.cleanup();
}, 30_000);

describe("bundle cleanup on the server", () => {
  test("unused past GPULAYER_BUNDLE_RETENTION: removed, but never one a running job needs; an unchanged folder is then uploaded again and runs", async () => {
    const a = project("proj-a", "from a\n");
    const b = project("proj-b", "from b\n");
    const c = project("proj-c", "from c\n");
    for (const p of [a, b]) {
      const r = await gpl(["job", "run", "--workdir", ".", "--", "cat", "data.txt"], p.dir);
      expect(r.code).toBe(0);
    }
    // c's job runs until told to stop: its bundle stays referenced across the restart.
    const stop = join(box.root, "stop-c");
    const running = await gpl(["job", "run", "-d", "--workdir", ".", "--", "sh", "-c", `cat data.txt; while [ ! -e ${stop} ]; do sleep 0.1; done`], c.dir);
    const id = running.stdout.trim();
    await waitFor("c's job to run", async () => json((await gpl(["job", "status", id, "--json"])).stdout).state === "running");
    expect(stored()).toEqual([a.hash, b.hash, c.hash].map(file).sort());

    const log = await restartServer({ GPULAYER_BUNDLE_RETENTION: "0" });
    expect(log).toContain("removed 2 bundle file(s) (2 unused past GPULAYER_BUNDLE_RETENTION (0 s))");
    expect(stored()).toEqual([file(c.hash)]);

    // c's job still finishes (its worker reports to the restarted server), with its output.
    writeFileSync(stop, "");
    const done = await waitFor("c's job to end", async () => {
      const s = json((await gpl(["job", "status", id, "--json"])).stdout);
      return s.state === "succeeded" && s;
    });
    expect(done.exit_code).toBe(0);
    expect((await gpl(["job", "logs", id])).stdout).toBe("from c\n");

    // a, unchanged: the server says it lacks the bundle, so it goes up again, and the job runs.
    const again = await gpl(["job", "run", "--verbose", "--workdir", ".", "--", "cat", "data.txt"], a.dir);
    expect(again.code).toBe(0);
    expect(again.stdout).toBe("from a\n");
    expect(again.stderr).toContain("uploading");
    expect(again.stderr).not.toContain("already on the server");
    expect(stored()).toContain(file(a.hash));
    // And the next time it is there.
    const third = await gpl(["job", "run", "--verbose", "--workdir", ".", "--", "cat", "data.txt"], a.dir);
    expect(third.stdout).toBe("from a\n");
    expect(third.stderr).toContain("already on the server");
  }, T);

  test("over GPULAYER_BUNDLE_MAX_SIZE: the least recently used go first, down to the cap", async () => {
    const a = project("proj-a", "from a\n");
    const b = project("proj-b", "from b\n");
    const c = project("proj-c", "from c\n");
    // Used in this order (c longest ago, by the previous test): b now, then a.
    for (const p of [b, a]) expect((await gpl(["job", "run", "--workdir", ".", "--", "cat", "data.txt"], p.dir)).code).toBe(0);
    expect(stored()).toEqual([a.hash, b.hash, c.hash].map(file).sort());
    const size = (p: { hash: string }) => statSync(join(bundlesDir, file(p.hash))).size;
    // Room for two: c, used longest ago, goes; then room for one: b goes too.
    let log = await restartServer({ GPULAYER_BUNDLE_MAX_SIZE: String(size(a) + size(b)) });
    expect(log).toContain("removed 1 bundle file(s) (1 over GPULAYER_BUNDLE_MAX_SIZE)");
    expect(stored()).toEqual([a.hash, b.hash].map(file).sort());
    log = await restartServer({ GPULAYER_BUNDLE_MAX_SIZE: String(size(a)) });
    expect(stored()).toEqual([file(a.hash)]);
    // Sizes as people write them; nothing over the cap, nothing to do.
    log = await restartServer({ GPULAYER_BUNDLE_MAX_SIZE: "1MiB", GPULAYER_BUNDLE_RETENTION: "2h" });
    expect(log).not.toContain("removed");
    expect(stored()).toEqual([file(a.hash)]);
    const r = await gpl(["job", "run", "--workdir", ".", "--", "cat", "data.txt"], b.dir);
    expect(r.stdout).toBe("from b\n");
  }, T);

  test("a stray temp file from an interrupted upload is removed; bad settings are refused naming the variable", async () => {
    const stray = join(bundlesDir, `${"e".repeat(64)}.tar.gz.123.456.tmp`);
    writeFileSync(stray, "partial");
    if (serversOnPostgres) {
      // Replicas share the folder: a fresh temp file may be another replica's upload in progress; only an hour-old one is a stray.
      expect(await restartServer({})).not.toContain("left from interrupted uploads");
      expect(existsSync(stray)).toBe(true);
      utimesSync(stray, new Date(Date.now() - 2 * 3_600_000), new Date(Date.now() - 2 * 3_600_000));
    }
    const log = await restartServer({});
    expect(log).toContain("1 left from interrupted uploads");
    expect(stored().some((f) => f.endsWith(".tmp"))).toBe(false);
    for (const [name, value] of [["GPULAYER_BUNDLE_RETENTION", "soon"], ["GPULAYER_BUNDLE_MAX_SIZE", "lots"]] as const) {
      const r = await cli(["server", "--listen", "127.0.0.1:0"], { env: { GPULAYER_TOKEN: TOKEN, ...box.env, GPULAYER_HOME: serverHome, [name]: value } });
      expect(r.code).toBe(2);
      expect(r.stderr).toStartWith(`error: ${name}=${value} (environment): not a`);
    }
  }, T);
});

describe("one server per home", () => {
  // Replicas on PostgreSQL may share a home (their state is the database's); the lock is for a server on SQLite.
  test.skipIf(serversOnPostgres)("a second server on a home in use is refused, naming the first; once the first is SIGKILLed, a new one starts there", async () => {
    const home = join(box.root, "lone-home");
    const start = () => keep(startCli(["server", "--listen", "127.0.0.1:0", "--json"], { env: { GPULAYER_TOKEN: TOKEN, ...box.env, ...FAST, GPULAYER_HOME: home } }));
    const first = start();
    await waitFor("the first server", () => /"url": "([^"]+)"/.exec(first.out())?.[1]);
    const second = await cli(["server", "--listen", "127.0.0.1:0"], { env: { GPULAYER_TOKEN: TOKEN, ...box.env, GPULAYER_HOME: home } });
    expect(second.code).toBe(1);
    expect(second.stderr.trim()).toStartWith(`error: another gpulayer server (pid ${first.proc.pid}) keeps its state in ${join(home, "server")}: one server per home on SQLite`);
    first.proc.kill("SIGKILL");
    await first.proc.exited;
    const third = start();
    await waitFor("a server where the killed one was", () => /"url": "([^"]+)"/.exec(third.out())?.[1]);
    third.proc.kill("SIGTERM");
    expect(await third.proc.exited).toBe(0);
  }, T);
});

describe("stopping the client while it packs", () => {
  test("Ctrl-C during packing: nothing runs, exit 130; a bundle a killed client left in the temp folder goes with the next", async () => {
    const dir = join(box.root, "big-folder");
    mkdirSync(dir, { recursive: true });
    // Incompressible: packing it takes a while, long enough for the signal to land during it.
    const noise = Buffer.alloc(120 * 1024 * 1024);
    for (let i = 0; i < noise.length; i += 65536) noise.set(crypto.getRandomValues(new Uint8Array(65536)), i);
    writeFileSync(join(dir, "noise.bin"), noise);
    const leftover = join(tmpdir(), "gpulayer-bundle-999999999-1-abc.tar.gz");
    writeFileSync(leftover, "what a SIGKILLed client left");
    const marker = join(box.root, "ran-after-ctrl-c");
    const client = startCli(["job", "run", "--workdir", ".", "--", "touch", marker], { env: env(), cwd: dir });
    const err = new Response(client.stderr).text();
    await Bun.sleep(400);
    client.kill("SIGINT");
    expect(await client.exited).toBe(130);
    expect(await err).toMatch(/SIGINT: (stopped before the job was submitted; nothing was sent|cancelling job)/);
    await Bun.sleep(1500);
    expect(existsSync(marker)).toBe(false);
    expect(existsSync(leftover)).toBe(false);
    expect(readdirSync(tmpdir()).filter((n) => n.startsWith(`gpulayer-bundle-${client.pid}-`))).toEqual([]);
  }, T);
});
