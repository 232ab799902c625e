import { afterAll, beforeAll, describe, expect, test } from "bun:test";
import { writeFileSync } from "node:fs";
import { join } from "node:path";
import { cli, sandbox, startCli } from "./helpers.ts";
import { type Kept, keepOutput, stopAll, waitFor } from "./fixtures/processes.ts";

/**
 * A name is the user's text: a job named with a line break and an escape
 * code must not forge a line, or paint one, in the logs of the server and
 * the worker that run it (both as separate processes on 127.0.0.1).
 */

const TOKEN = "log-escaping-token-0123456789";
const FAST = { GPULAYER_HEARTBEAT_SECONDS: "0.3", GPULAYER_WORKER_LOST_SECONDS: "10", GPULAYER_WORKER_ENGINE: "none", GPULAYER_CANCEL_GRACE: "1", GPULAYER_WORKER_DRAIN_SECONDS: "1" };
const T = 120_000;
const EVIL = "evil\n\x1b[31mFAKE line";
const box = sandbox();
const procs: Kept[] = [];
let server: Kept;
let worker: Kept;
let url = "";

const env = () => ({ ...box.env, GPULAYER_SERVER: url, GPULAYER_TOKEN: TOKEN });

beforeAll(async () => {
  const tokenFile = join(box.root, "token");
  writeFileSync(tokenFile, `${TOKEN}\n`, { mode: 0o600 });
  server = keepOutput(startCli(["server", "--listen", "127.0.0.1:0", "--token-file", tokenFile, "--json"], { env: { ...box.env, ...FAST, GPULAYER_HOME: join(box.root, "server-home") } }), procs);
  url = await waitFor("the server", () => /"url": "([^"]+)"/.exec(server.out())?.[1]);
  worker = keepOutput(startCli(["join", url, "--name", "w1", "--python", "python3"], { env: { ...box.env, ...FAST, GPULAYER_TOKEN: TOKEN, GPULAYER_HOME: join(box.root, "w1-home") } }), procs);
  await waitFor("the worker", async () => (JSON.parse((await cli(["workers", "--json"], { env: env() })).stdout) as unknown[]).length === 1).catch((e) => {
    throw new Error(`${e.message}: ${procs.map((p) => p.out()).join("\n")}`);
  });
}, T);

afterAll(async () => {
  await stopAll(procs);
  box.cleanup();
}, 30_000);

describe("names in the logs", () => {
  test("a job named with a line break and an escape code: one line each, escaped, in the worker's and the server's logs", async () => {
    const r = await cli(["job", "run", "--name", EVIL, "--", "true"], { env: env(), cwd: box.root });
    expect(r.code).toBe(0);
    await waitFor("the worker to log the job's end", () => worker.out().includes(": done"));
    for (const log of [worker.out(), server.out()]) {
      expect(log).not.toContain("\x1b");
      expect(log.split("\n").filter((line) => line.trimStart().startsWith("FAKE"))).toEqual([]);
    }
    // The name is there, escaped, on the line that names the job.
    expect(worker.out()).toContain("(evil\\n\\x1b[31mFAKE line): started");
  }, T);
});
