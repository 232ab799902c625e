import { describe, expect, setDefaultTimeout, test } from "bun:test";
import { join } from "node:path";
import { ClusterClient } from "../src/cluster/client.ts";
import { homeLayout } from "../src/config/paths.ts";
import { InstallError } from "../src/errors.ts";
import { workerShipping } from "../src/worker/env-shipping.ts";
import { tempDir } from "./helpers.ts";

// Real processes and real builds take seconds; a file that sets none gets 5 s, whatever another file set.
setDefaultTimeout(120_000);

/**
 * A worker whose server cannot be asked when it needs an env (the server is
 * away: a real connection refused on 127.0.0.1): it builds, and says why; an
 * offline worker cannot build, and says that in one line.
 */

const KEY = "a".repeat(64);

async function closedPort(): Promise<number> {
  const s = Bun.serve({ hostname: "127.0.0.1", port: 0, fetch: () => new Response("") });
  const port = s.port!;
  await s.stop(true);
  return port;
}

describe("env shipping with the server away", () => {
  test("a worker with an index builds here, the step saying why; an offline one fails with one line", async () => {
    const root = tempDir("gpl-ship-");
    const client = new ClusterClient(`http://127.0.0.1:${await closedPort()}`, "token-token-token-token");
    const layout = homeLayout(join(root, "home"), undefined);
    const conditions = { env_path: join(root, "home", "envs-v1", KEY), platform: "linux-x86_64", interpreter: "/usr/bin/python3", python: "3.11.2", base: "b".repeat(64) };
    const steps: string[] = [];
    const base = { layout, client, share: true, log: () => {}, uploads: new Set<Promise<void>>() };
    const online = workerShipping({ ...base, offline: false }, "task-1")!;
    const got = await online.acquire({ key: KEY, conditions, into: join(root, "into"), onStep: (d) => steps.push(d) });
    expect("build" in got).toBe(true);
    expect(steps).toEqual([expect.stringMatching(/^building here: the server could not be asked for an artifact \(cannot reach the gpulayer server at http:\/\/127\.0\.0\.1:\d+/)]);
    const offline = workerShipping({ ...base, offline: true }, "task-2")!;
    const error = await offline.acquire({ key: KEY, conditions, into: join(root, "into2") }).catch((e: unknown) => e);
    expect(error).toBeInstanceOf(InstallError);
    expect((error as Error).message).toMatch(/^this worker is offline \(worker\.offline\) and builds no env, and the server could not be asked for an artifact of env aaaaaaaaaaaa: cannot reach the gpulayer server/);
    expect((error as Error).message).not.toContain("\n");
  });
});
