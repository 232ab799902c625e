import { afterAll, beforeAll, describe, expect, setDefaultTimeout, test } from "bun:test";
import { existsSync, readFileSync } from "node:fs";
import { join } from "node:path";
import { PackageIndex } from "./fixtures/index.ts";
import { cli, makeWorkerVenv, sandbox, startCli } from "./helpers.ts";
import { keepOutput, type Kept, stopAll, waitFor } from "./fixtures/processes.ts";

/**
 * An --offline worker (worker.offline: no package index) and a compiled wheel: a server on 127.0.0.1, w1 with an
 * index, w2 offline, each with its own home and a venv holding the same torch stand-in. No env artifact of w1 fits
 * w2 (another interpreter), so w2 builds its env itself, with no index: the sdist built without isolation comes from
 * the wheel w1 compiled, never compiled nor fetched from the index; a project no worker compiled fails in one line.
 */

setDefaultTimeout(120_000);

const TOKEN = "wheelhouse-offline-token-0123456789";
const FAST = { GPULAYER_HEARTBEAT_SECONDS: "0.5", GPULAYER_WORKER_LOST_SECONDS: "10", GPULAYER_WORKER_ENGINE: "none", GPULAYER_WORKER_SLOTS: "1" };
const server = sandbox();
const client = sandbox();
const boxes = { w1: sandbox(), w2: sandbox() };
const index = new PackageIndex(join(client.root, "index"));
const counter = join(client.root, "kernels-builds");
const kept: Kept[] = [];
let url = "";

const gpl = (args: string[]) => cli(args, { env: { ...client.env, GPULAYER_SERVER: url, GPULAYER_TOKEN: TOKEN }, cwd: client.root });
const builds = () => (existsSync(counter) ? readFileSync(counter, "utf8").trim().split("\n") : []);
const jobOn = async (worker: string, specs: string[], deferred: string) => {
  const r = await gpl(["job", "run", ...specs.flatMap((s) => ["-p", s]), "--no-build-isolation-package", deferred, "--index-url", index.url, "--label", `box=${worker}`, "--", "python", "-c", `import ${deferred.replace("-", "_")} as k; print('built with', k.BUILT_WITH)`]);
  const id = JSON.parse((await gpl(["job", "list", "--json"])).stdout)[0].id;
  const events = JSON.parse((await gpl(["job", "status", id, "--json"])).stdout).events as { type: string; data: Record<string, unknown> }[];
  const finished = events.find((e) => e.type === "task.prepare.finished");
  return { ...r, wheels: finished?.data.wheels };
};

beforeAll(async () => {
  index.start();
  index.wheel({ name: "torch", version: "2.1.0+cu121" });
  index.wheel({ name: "alpha", version: "1.0" });
  index.sdist({ name: "kernels", version: "1.0", counter, imports: "torch" });
  index.sdist({ name: "other-kernels", version: "1.0", counter, imports: "torch" });
  const venvs = await Promise.all(Object.entries(boxes).map(([n, b]) => makeWorkerVenv(join(b.root, `venv-${n}`), { env: b.env, packages: ["torch==2.1.0+cu121"], findLinks: index.dir })));
  const srv = keepOutput(startCli(["server", "--listen", "127.0.0.1:0", "--json"], { env: { ...server.env, ...FAST, GPULAYER_TOKEN: TOKEN } }), kept);
  url = (await waitFor("the server", async () => /"url": "([^"]+)"/.exec(srv.out())?.[1])) as string;
  Object.entries(boxes).forEach(([n, b], i) => keepOutput(startCli(["join", url, "--name", n, "--label", `box=${n}`, "--python", venvs[i]!, ...(n === "w2" ? ["--offline"] : [])], { env: { ...b.env, ...FAST, GPULAYER_TOKEN: TOKEN } }), kept));
  await waitFor("two workers", async () => ((JSON.parse((await gpl(["workers", "--json"])).stdout) as unknown[]).length === 2 ? true : null));
});

afterAll(async () => {
  await stopAll(kept);
  index.stop();
  for (const b of [server, client, ...Object.values(boxes)]) b.cleanup();
}, 30_000);

describe("an --offline worker and the fleet's compiled wheels", () => {
  test("it builds its env with no index, taking the wheel another worker compiled instead of compiling", async () => {
    const first = await jobOn("w1", ["kernels", "alpha"], "kernels");
    expect(first.code, first.stderr).toBe(0);
    expect(first.wheels).toEqual([expect.objectContaining({ name: "kernels", from: "compiled" })]);
    expect(builds()).toHaveLength(1);
    // The wheel reaches the server in the background, after the job.
    await waitFor("the shared wheel", async () => ((await gpl(["workers"])).stdout.match(/^wheels +1 \(/m) ? true : null));
    const asked = index.asked("kernels");

    const offline = await jobOn("w2", ["kernels"], "kernels");
    expect(offline.code, offline.stderr).toBe(0);
    expect(offline.stdout).toContain("built with 2.1.0+cu121");
    expect(offline.wheels).toEqual([expect.objectContaining({ name: "kernels", from: "fleet", built_by: "w1", built_against: expect.arrayContaining(["torch==2.1.0+cu121"]) })]);
    expect(builds()).toHaveLength(1);
    expect(index.asked("kernels")).toBe(asked);
  });

  test("a project no worker compiled fails on it in one line saying so, with nothing compiled", async () => {
    const r = await jobOn("w2", ["other-kernels"], "other-kernels");
    expect(r.code).not.toBe(0);
    const errors = r.stderr.split("\n").filter((l) => l.startsWith("error:"));
    expect(errors).toHaveLength(1);
    expect(errors[0]).toMatch(/^error: task\.prepare failed on w2: this worker is offline \(worker\.offline\) and compiles nothing; other-kernels is built without build isolation, and the fleet shares no wheel of it/);
    expect(builds()).toHaveLength(1);
    expect(index.asked("other-kernels")).toBe(0);
  });
});
