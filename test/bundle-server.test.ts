import { afterAll, beforeAll, describe, expect, test } from "bun:test";
import { readdirSync, readFileSync } from "node:fs";
import { join } from "node:path";
import { trailingZerosBundle, zerosBundle } from "./fixtures/bombs.ts";
import { type Kept, keepOutput, stopAll, waitFor } from "./fixtures/processes.ts";
import { cli, sandbox, startCli } from "./helpers.ts";

/**
 * Checking an upload never stalls the server: a real server process, a worker
 * running a job, and uploads built to hurt (a tiny archive followed by 64 MiB
 * of zeros; one claiming 2.1 GB of zeros; the largest that is accepted, 1.9
 * GiB of zeros in 2 MB). While each is checked, `/v1/health` keeps answering,
 * the worker's heartbeats keep it alive (its job is not re-queued), and the
 * server's peak memory barely moves. The 100 ms aim is measured in
 * bench/cluster.ts; here the bound is loose enough for a loaded CI machine.
 */

const TOKEN = "bundle-server-token-0123456789";
const FAST = { GPULAYER_HEARTBEAT_SECONDS: "0.2", GPULAYER_WORKER_LOST_SECONDS: "1.5", GPULAYER_WORKER_ENGINE: "none", GPULAYER_CANCEL_GRACE: "1", GPULAYER_WORKER_DRAIN_SECONDS: "1" };
const T = 120_000;
const box = sandbox();
const procs: Kept[] = [];
let url = "";
let server: Kept;

const env = () => ({ ...box.env, GPULAYER_SERVER: url, GPULAYER_TOKEN: TOKEN });
const gpl = (args: string[]) => cli(args, { env: env(), cwd: box.root });
const json = <T = any>(text: string): T => JSON.parse(text) as T;

/** The server's peak resident memory so far (kB), from the kernel. */
const peakKb = () => Number(/VmHWM:\s+(\d+)/.exec(readFileSync(`/proc/${server.proc.pid}/status`, "utf8"))?.[1]);

/** PUT the file as a bundle while probing /v1/health every 10 ms; the response and the slowest probe. */
async function uploadProbing(file: string, hash: string): Promise<{ status: number; body: any; slowestMs: number; probes: number }> {
  let done = false;
  let slowestMs = 0;
  let probes = 0;
  const probing = (async () => {
    while (!done) {
      const t = performance.now();
      const r = await fetch(`${url}/v1/health`, { headers: { authorization: `Bearer ${TOKEN}` } });
      await r.arrayBuffer();
      slowestMs = Math.max(slowestMs, performance.now() - t);
      probes++;
      await Bun.sleep(10);
    }
  })();
  const res = await fetch(`${url}/v1/bundles/${hash}`, { method: "PUT", headers: { authorization: `Bearer ${TOKEN}` }, body: Bun.file(file) });
  const body = await res.json();
  done = true;
  await probing;
  return { status: res.status, body, slowestMs, probes };
}

let jobId = "";
beforeAll(async () => {
  server = keepOutput(startCli(["server", "--listen", "127.0.0.1:0", "--json"], { env: { GPULAYER_TOKEN: TOKEN, ...box.env, ...FAST, GPULAYER_HOME: join(box.root, "server-home") } }), procs);
  url = await waitFor("the server", () => /"url": "([^"]+)"/.exec(server.out())?.[1]);
  keepOutput(startCli(["join", url, "--name", "w1", "--python", "python3"], { env: { ...box.env, ...FAST, GPULAYER_TOKEN: TOKEN, GPULAYER_HOME: join(box.root, "w1-home") } }), procs);
  await waitFor("the worker", async () => json<any[]>((await gpl(["workers", "--json"])).stdout).length === 1);
  const d = await gpl(["job", "run", "-d", "--", "sleep", "60"]);
  jobId = d.stdout.trim();
  await waitFor("the job to run", async () => json((await gpl(["job", "status", jobId, "--json"])).stdout).state === "running");
}, T);

afterAll(async () => {
  await gpl(["job", "cancel", jobId]);
  await stopAll(procs);
  box.cleanup();
}, 30_000);

describe("uploads built to hurt", () => {
  const cases = [
    { label: "a tiny archive and 64 MiB of zeros after its end", make: (f: string) => trailingZerosBundle(f, 1), status: 400, message: /data after the archive's end/ },
    { label: "an entry claiming 2.1 GB of zeros", make: (f: string) => zerosBundle(f, 33), status: 400, message: /more than 2GB unpacked/ },
    { label: "the largest accepted: 1.9 GiB of zeros in 2 MB", make: (f: string) => zerosBundle(f, 31), status: 201, message: null },
  ];
  for (const c of cases) {
    test(`${c.label}: answered, health answering throughout, the worker alive, memory flat`, async () => {
      const before = peakKb();
      const file = join(box.root, "upload.tar.gz");
      const { hash } = c.make(file);
      const r = await uploadProbing(file, hash);
      expect(r.status).toBe(c.status);
      if (c.message) expect(r.body.error).toMatch(c.message);
      else expect(r.body.stored).toBe(true);
      expect(r.probes).toBeGreaterThan(0);
      expect(r.slowestMs).toBeLessThan(1000);
      // Peak memory of the whole server process: the check streams, whatever the archive claims.
      expect((peakKb() - before) / 1024).toBeLessThan(64);
      const s = json((await gpl(["job", "status", jobId, "--json"])).stdout);
      expect(s.state).toBe("running");
      expect(s.attempts).toBe(1);
      // Nothing of a refused upload stays behind.
      const left = readdirSync(join(box.root, "server-home", "server", "bundles"));
      expect(left.filter((n) => n.endsWith(".tmp"))).toEqual([]);
      expect(left.includes(`${hash}.tar.gz`)).toBe(c.status === 201);
    }, T);
  }
});
