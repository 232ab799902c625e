import { afterAll, beforeAll, describe, expect, test } from "bun:test";
import { existsSync, mkdirSync, readdirSync, readFileSync, writeFileSync } from "node:fs";
import { join } from "node:path";
import { packTemp } from "../src/cluster/upload.ts";
import { cli, sandbox, startCli } from "./helpers.ts";
import { keepOutput, stopAll, waitFor } from "./fixtures/processes.ts";

/**
 * A worker's credential is scoped to the worker's own tasks: a server and two
 * workers as separate processes on 127.0.0.1, a job only w2 can take (its
 * label). w1's credential gets the same 404 for that job's bundle as for one
 * that does not exist; w2's fetches it while the job runs, not after; once w2
 * has left, its credential is refused like a wrong token.
 */

const TOKEN = "scope-test-token-0123456789";
const FAST = { GPULAYER_HEARTBEAT_SECONDS: "0.5", GPULAYER_WORKER_LOST_SECONDS: "10", GPULAYER_WORKER_ENGINE: "none", GPULAYER_CANCEL_GRACE: "1", GPULAYER_WORKER_DRAIN_SECONDS: "1" };
const T = 90_000;
const box = sandbox();
const homeOf = (name: string) => join(box.root, `${name}-home`);
const procs: { proc: ReturnType<typeof startCli>; out: () => string }[] = [];
const workers = new Map<string, (typeof procs)[number]>();
let url = "";

const env = () => ({ ...box.env, GPULAYER_SERVER: url, GPULAYER_TOKEN: TOKEN });
const gpl = (args: string[], cwd = box.root) => cli(args, { env: env(), cwd });
const json = <T = any>(text: string): T => JSON.parse(text) as T;

function credentialOf(name: string): { id: string; credential: string } {
  const dir = join(homeOf(name), "cluster", "identity");
  const files = readdirSync(dir);
  expect(files.length).toBe(1);
  return json(readFileSync(join(dir, files[0]!), "utf8"));
}

const get = (path: string, credential: string, method = "GET") => fetch(`${url}${path}`, { method, headers: { authorization: `Bearer ${credential}` } });

beforeAll(async () => {
  const server = keepOutput(startCli(["server", "--listen", "127.0.0.1:0", "--json"], { env: { GPULAYER_TOKEN: TOKEN, ...box.env, ...FAST, GPULAYER_HOME: homeOf("server") } }), procs);
  url = await waitFor("the server", () => /"url": "([^"]+)"/.exec(server.out())?.[1]);
  for (const [name, label] of [["w1", "only=w1"], ["w2", "only=w2"]] as const) {
    workers.set(name, keepOutput(startCli(["join", url, "--name", name, "--python", "python3", "--label", label], { env: { ...box.env, ...FAST, GPULAYER_TOKEN: TOKEN, GPULAYER_HOME: homeOf(name) } }), procs));
  }
  await waitFor("two workers", async () => json<any[]>((await gpl(["workers", "--json"])).stdout).length === 2);
}, T);

afterAll(async () => {
  await stopAll(procs);
  box.cleanup();
}, 30_000);

describe("a worker's credential", () => {
  test("fetches only its own running tasks' bundles; another's, or one that does not exist, is the same 404", async () => {
    const dir = join(box.root, "project");
    mkdirSync(dir, { recursive: true });
    writeFileSync(join(dir, "data.txt"), "only for w2\n");
    const pack = packTemp(dir, { maxBytes: 200 * 1024 ** 2, maxUnpackedBytes: 2 * 1024 ** 3, maxEntries: 200_000 });
    pack.dispose();
    const hash = pack.hash;
    const marker = join(box.root, "release-job");

    const d = await gpl(["job", "run", "-d", "--label", "only=w2", "--workdir", ".", "--", "sh", "-c", `echo started; while [ ! -e ${marker} ]; do sleep 0.1; done`], dir);
    expect(d.code).toBe(0);
    const id = d.stdout.trim();
    await waitFor("the job to run on w2", async () => {
      const s = json((await gpl(["job", "status", id, "--json"])).stdout);
      return s.state === "running" && s.worker === "w2";
    });
    expect(existsSync(join(homeOf("server"), "server", "bundles", `${hash}.tar.gz`))).toBe(true);

    const w1 = credentialOf("w1").credential;
    const w2 = credentialOf("w2").credential;
    const madeUp = "ab".repeat(32);

    // w1: the job is w2's; its bundle looks exactly like one that does not exist.
    const other = await get(`/v1/bundles/${hash}`, w1);
    const missing = await get(`/v1/bundles/${madeUp}`, w1);
    expect(other.status).toBe(404);
    expect(missing.status).toBe(404);
    const body = await other.text();
    expect(body).toBe(await missing.text());
    expect(json(body)).toEqual({ error: "no such bundle" });
    expect((await get(`/v1/bundles/${hash}`, w1, "HEAD")).status).toBe(404);
    expect((await get(`/v1/bundles/${madeUp}`, w1, "HEAD")).status).toBe(404);

    // w2 holds the task: it gets the bytes. The server token still does.
    const mine = await get(`/v1/bundles/${hash}`, w2);
    expect(mine.status).toBe(200);
    expect(new Bun.CryptoHasher("sha256").update(await mine.arrayBuffer()).digest("hex")).toBe(hash);
    expect((await get(`/v1/bundles/${hash}`, w2, "HEAD")).status).toBe(200);
    expect((await get(`/v1/bundles/${madeUp}`, w2)).status).toBe(404);
    expect((await get(`/v1/bundles/${hash}`, TOKEN)).status).toBe(200);
    expect((await get(`/v1/bundles/${madeUp}`, TOKEN)).status).toBe(404);

    // Once the job has finished, the task is no longer w2's: the bundle is gone for it too.
    writeFileSync(marker, "");
    await waitFor("the job to finish", async () => json((await gpl(["job", "status", id, "--json"])).stdout).state === "succeeded");
    const after = await get(`/v1/bundles/${hash}`, w2);
    expect(after.status).toBe(404);
    expect(await after.text()).toBe(body);
    expect((await get(`/v1/bundles/${hash}`, TOKEN)).status).toBe(200);
  }, T);

  test("stops working on every route once its worker has left", async () => {
    const { id, credential } = credentialOf("w2");
    expect((await fetch(`${url}/v1/workers/${id}/heartbeat`, { method: "POST", headers: { authorization: `Bearer ${credential}`, "content-type": "application/json" }, body: JSON.stringify({ running: [] }) })).status).toBe(200);
    const w2 = workers.get("w2")!;
    w2.proc.kill("SIGTERM");
    expect(await w2.proc.exited).toBe(0);
    expect(w2.out()).toContain("left the server");

    const refused = [
      await get(`/v1/bundles/${"ab".repeat(32)}`, credential),
      await get(`/v1/workers/${id}/tasks?wait=0`, credential),
      await fetch(`${url}/v1/workers/${id}/heartbeat`, { method: "POST", headers: { authorization: `Bearer ${credential}`, "content-type": "application/json" }, body: JSON.stringify({ running: [] }) }),
      await get(`/v1/health`, credential),
    ];
    for (const res of refused) {
      expect(res.status).toBe(401);
      expect(await res.json()).toEqual({ error: "unauthorized" });
    }
    // w1 is untouched.
    expect((await get(`/v1/health`, credentialOf("w1").credential)).status).toBe(200);
  }, T);
});
