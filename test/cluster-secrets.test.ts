import { afterAll, beforeAll, describe, expect, test } from "bun:test";
import { mkdirSync, readdirSync, readFileSync, statSync, writeFileSync } from "node:fs";
import { join } from "node:path";
import { PackageIndex } from "./fixtures/index.ts";
import { cli, sandbox, serverDatabaseText, serversOnPostgres, startCli } from "./helpers.ts";
import { type Kept, keepOutput, stopAll, waitFor } from "./fixtures/processes.ts";

/**
 * Secrets never stored: a server and a worker as separate processes on
 * 127.0.0.1, a private index behind basic auth. A remote job builds with the
 * index password it was given, and afterwards no file under the server's or
 * the worker's home holds any part of it; a `-r /proc/self/environ` sends
 * nothing of the worker's environment back; and a server restarted while a
 * job with credentials waits fails that job with the reason instead of
 * building it without them.
 */

const TOKEN = "secrets-test-token-0123456789";
const PASSWORD = "s3cr@tpw-9731";
const FAST = { GPULAYER_HEARTBEAT_SECONDS: "0.3", GPULAYER_WORKER_LOST_SECONDS: "10", GPULAYER_WORKER_ENGINE: "none", GPULAYER_CANCEL_GRACE: "1", GPULAYER_WORKER_DRAIN_SECONDS: "1" };
const T = 120_000;
const box = sandbox();
const homeOf = (name: string) => join(box.root, `${name}-home`);
const procs: Kept[] = [];
const priv = new PackageIndex(join(box.root, "private"), { basicAuth: `alice:${PASSWORD}` });
let url = "";
let server: Kept;

const env = () => ({ ...box.env, GPULAYER_SERVER: url, GPULAYER_TOKEN: TOKEN });
const gpl = (args: string[], cwd = box.root) => cli(args, { env: env(), cwd });
const json = <T = any>(text: string): T => JSON.parse(text) as T;
const privateUrl = () => priv.url.replace("http://", `http://alice:${PASSWORD}@`);

/** Every file under the homes, as bytes read as latin1 (SQLite pages and WAL included), that holds one of the secrets. */
function filesHolding(secrets: string[]): string[] {
  const found: string[] = [];
  const walk = (dir: string) => {
    for (const n of readdirSync(dir)) {
      const p = join(dir, n);
      const st = statSync(p, { throwIfNoEntry: false });
      if (st?.isDirectory()) walk(p);
      else if (st?.isFile() && st.size < 64_000_000) {
        const text = readFileSync(p, "latin1");
        for (const s of secrets) if (text.includes(s)) found.push(`${p.slice(box.root.length)}: ${s}`);
      }
    }
  };
  for (const h of ["server", "w1"]) walk(homeOf(h));
  return found;
}

let port = 0;
async function startServer(): Promise<void> {
  server = keepOutput(startCli(["server", "--listen", `127.0.0.1:${port}`, "--json"], { env: { GPULAYER_TOKEN: TOKEN, ...box.env, ...FAST, GPULAYER_HOME: homeOf("server") } }), procs);
  url = await waitFor("the server", () => /"url": "([^"]+)"/.exec(server.out())?.[1]);
  port = Number(new URL(url).port);
}

beforeAll(async () => {
  priv.start();
  priv.wheel({ name: "priv-pkg", version: "2.0" });
  await startServer();
  // The worker holds a variable a `-r /proc/self/environ` would read.
  keepOutput(startCli(["join", url, "--name", "w1", "--python", "python3"], { env: { ...box.env, ...FAST, GPULAYER_TOKEN: TOKEN, GPULAYER_WORKER_SLOTS: "1", GPULAYER_HOME: homeOf("w1"), WORKER_ONLY_SECRET: "wv-5521-not-for-jobs" } }), procs);
  await waitFor("the worker", async () => json<any[]>((await gpl(["workers", "--json"])).stdout).length === 1).catch((e) => {
    throw new Error(`${e.message}: ${procs.map((p) => p.out()).join("\n")}`);
  });
}, T);

afterAll(async () => {
  await stopAll(procs);
  priv.stop();
  box.cleanup();
}, 30_000);

describe("a remote job with an index password", () => {
  test("builds with it on the worker; no record, event or file of the server or the worker keeps any of it", async () => {
    const r = await gpl(["job", "run", "-p", "priv-pkg", "--index-url", privateUrl(), "--", "python", "-c", "import priv_pkg; print(priv_pkg.__version__)"]);
    expect(r.stdout.trim()).toBe("2.0");
    expect(r.code).toBe(0);
    const [job] = json<any[]>((await gpl(["job", "list", "--json", "--limit", "1"])).stdout);
    const status = await gpl(["job", "status", job.id, "--json"]);
    expect(json(status.stdout).state).toBe("succeeded");
    for (const text of [r.stderr, status.stdout]) expect(text).not.toContain(PASSWORD);
    expect(filesHolding([PASSWORD, "tpw-9731"])).toEqual([]);
    // The record is there, with the URL it used, less the password.
    const db = serverDatabaseText(box.env, homeOf("server"));
    expect(db).not.toContain(PASSWORD);
    expect(db).toContain("***@127.0.0.1");
  }, T);

  test("env prepare through the server: built with it, kept nowhere", async () => {
    priv.wheel({ name: "priv-pkg", version: "2.2" });
    const r = await gpl(["env", "prepare", "-p", "priv-pkg==2.2", "--index-url", privateUrl(), "--json"]);
    expect(r.code).toBe(0);
    expect(r.stdout + r.stderr).not.toContain(PASSWORD);
    expect(filesHolding([PASSWORD, "tpw-9731"])).toEqual([]);
  }, T);

  test("an index that refuses the password: the error reaches the user without it", async () => {
    const wrong = priv.url.replace("http://", "http://alice:wrong-pass-4410@");
    const r = await gpl(["job", "run", "-p", "priv-pkg==9.9", "--index-url", wrong, "--", "true"]);
    expect(r.code).not.toBe(0);
    expect(r.stdout + r.stderr).not.toContain("wrong-pass-4410");
    expect(filesHolding(["wrong-pass-4410"])).toEqual([]);
  }, T);
});

describe("a remote job's requirements reaching outside its bundle", () => {
  test("-r /proc/self/environ is refused by its line, and nothing of the worker's environment comes back", async () => {
    const dir = join(box.root, "environ-job");
    mkdirSync(dir, { recursive: true });
    writeFileSync(join(dir, "requirements.txt"), "-r /proc/self/environ\n");
    const r = await gpl(["job", "run", "-r", "requirements.txt", "--workdir", ".", "--", "true"], dir);
    expect(r.code).not.toBe(0);
    expect(r.stdout + r.stderr).toContain("outside the job's bundle");
    for (const text of [r.stdout, r.stderr]) expect(text).not.toMatch(/wv-5521|secrets-test-token/);
    expect(filesHolding(["wv-5521-not-for-jobs"])).toEqual([]);
  }, T);
});

describe("a server restarted while a job with credentials waits", () => {
  test("one server: the job fails, saying why, instead of going to the index without them; replicas: it builds with them", async () => {
    const marker = join(box.root, "release");
    const blocker = await gpl(["job", "run", "-d", "--", "sh", "-c", `while [ ! -e ${marker} ]; do sleep 0.1; done`]);
    expect(blocker.code).toBe(0);
    await waitFor("the blocker to run", async () => json((await gpl(["job", "status", blocker.stdout.trim(), "--json"])).stdout).state === "running");
    // The worker has one slot: this one waits in the queue, its password only in the server's memory.
    const waiting = await gpl(["job", "run", "-d", "-p", "priv-pkg", "--index-url", privateUrl(), "--", "true"]);
    expect(waiting.code).toBe(0);
    const id = waiting.stdout.trim();
    expect(json((await gpl(["job", "status", id, "--json"])).stdout).state).toBe("queued");

    server.proc.kill("SIGKILL");
    await server.proc.exited;
    await startServer();
    writeFileSync(marker, "");
    const end = await waitFor("the waiting job to end", async () => {
      const s = json((await gpl(["job", "status", id, "--json"])).stdout);
      return s.state === "failed" || s.state === "succeeded" ? s : null;
    }, 60_000);
    if (serversOnPostgres) {
      // Replicas keep it sealed in the database (under a key from the servers' token) for any of them to hand out: it survives the restart.
      expect(end.state).toBe("succeeded");
      expect(serverDatabaseText(box.env, homeOf("server"))).not.toContain(PASSWORD);
    } else {
      expect(end.state).toBe("failed");
      expect(end.error).toContain("submit it again");
    }
    expect(filesHolding([PASSWORD])).toEqual([]);
  }, T);
});
