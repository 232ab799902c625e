import { afterAll, beforeAll, describe, expect, setDefaultTimeout, test } from "bun:test";
import { existsSync, readdirSync, readFileSync, statSync, writeFileSync } from "node:fs";
import { join } from "node:path";
import { PackageIndex } from "./fixtures/index.ts";
import { cli, makeWorkerVenv, run, sandbox, startCli } from "./helpers.ts";
import { keepOutput, type Kept, stopAll, waitFor } from "./fixtures/processes.ts";

/**
 * A wheel compiled without build isolation, shared with the fleet: a server and three workers on 127.0.0.1,
 * each with its own home and a venv holding the same torch stand-in. Envs that differ (alpha, beta, gamma
 * beside kernels) each need the sdist compiled against that torch: the first worker compiles it and uploads
 * the wheel, the second fetches it; a wheel whose bytes changed on the server is refused by its digest, and
 * the third worker compiles instead. The sdist's build counts itself in one file all the workers write.
 */

setDefaultTimeout(120_000);

const TOKEN = "wheelhouse-fleet-token-0123456789";
const FAST = { GPULAYER_HEARTBEAT_SECONDS: "0.5", GPULAYER_WORKER_LOST_SECONDS: "10", GPULAYER_WORKER_ENGINE: "none", GPULAYER_WORKER_SLOTS: "1" };
const server = sandbox();
const client = sandbox();
const boxes = { w1: sandbox(), w2: sandbox(), w3: sandbox() };
const index = new PackageIndex(join(client.root, "index"));
const counter = join(client.root, "kernels-builds");
const kept: Kept[] = [];
let url = "";

const gpl = (args: string[]) => cli(args, { env: { ...client.env, GPULAYER_SERVER: url, GPULAYER_TOKEN: TOKEN }, cwd: client.root });
const builds = () => (existsSync(counter) ? readFileSync(counter, "utf8").trim().split("\n") : []);
/** A job on `worker` whose env is kernels (built without isolation) and `other`: what it printed, its env's key, and where its wheel came from (task.prepare.finished). */
const jobOn = async (worker: string, other: string) => {
  const r = await gpl(["job", "run", "-p", "kernels", "-p", other, "--no-build-isolation-package", "kernels", "--index-url", index.url, "--label", `box=${worker}`, "--", "python", "-c", "import kernels; print('built with', kernels.BUILT_WITH)"]);
  expect(r.code, r.stderr).toBe(0);
  const id = JSON.parse((await gpl(["job", "list", "--json"])).stdout)[0].id;
  const events = JSON.parse((await gpl(["job", "status", id, "--json"])).stdout).events as { type: string; data: Record<string, unknown> }[];
  const finished = events.find((e) => e.type === "task.prepare.finished")!;
  const steps = events.filter((e) => e.type === "task.prepare.step").map((e) => `${e.data.step} ${e.data.detail}`);
  return { stdout: r.stdout, steps, key: finished.data.env_key as string, wheels: finished.data.wheels };
};
/** The wheels the server keeps, as files under its home. */
function serverWheels(dir = server.root): string[] {
  const found: string[] = [];
  for (const n of readdirSync(dir)) {
    const p = join(dir, n);
    if (statSync(p).isDirectory()) found.push(...serverWheels(p));
    else if (/\/wheels\/[0-9a-f]{64}\.whl$/.test(p)) found.push(p);
  }
  return found;
}

beforeAll(async () => {
  index.start();
  index.wheel({ name: "torch", version: "2.1.0+cu121" });
  for (const n of ["alpha", "beta", "gamma"]) index.wheel({ name: n, version: "1.0" });
  index.sdist({ name: "kernels", version: "1.0", counter, imports: "torch" });
  const venvs = await Promise.all(Object.entries(boxes).map(([n, b]) => makeWorkerVenv(join(b.root, `venv-${n}`), { env: b.env, packages: ["torch==2.1.0+cu121"], findLinks: index.dir })));
  const srv = keepOutput(startCli(["server", "--listen", "127.0.0.1:0", "--json"], { env: { ...server.env, ...FAST, GPULAYER_TOKEN: TOKEN } }), kept);
  url = (await waitFor("the server", async () => /"url": "([^"]+)"/.exec(srv.out())?.[1])) as string;
  Object.entries(boxes).forEach(([n, b], i) => keepOutput(startCli(["join", url, "--name", n, "--label", `box=${n}`, "--python", venvs[i]!], { env: { ...b.env, ...FAST, GPULAYER_TOKEN: TOKEN } }), kept));
  await waitFor("three workers", async () => ((JSON.parse((await gpl(["workers", "--json"])).stdout) as unknown[]).length === 3 ? true : null));
});

afterAll(async () => {
  await stopAll(kept);
  index.stop();
  for (const b of [server, client, ...Object.values(boxes)]) b.cleanup();
}, 30_000);

describe("a wheel compiled without isolation, shared with the fleet", () => {
  test("compiled on one worker for one env, fetched by another worker for another env: one compile in all", async () => {
    const first = await jobOn("w1", "alpha");
    expect(first.stdout).toContain("built with 2.1.0+cu121");
    expect(first.wheels).toEqual([expect.objectContaining({ name: "kernels", from: "compiled", built_against: expect.arrayContaining(["torch==2.1.0+cu121"]) })]);
    expect(builds()).toHaveLength(1);
    await waitFor("the wheel on the server", async () => (serverWheels().length === 1 ? true : null));

    const second = await jobOn("w2", "beta");
    expect(second.stdout).toContain("built with 2.1.0+cu121");
    expect(second.key).not.toBe(first.key);
    expect(second.wheels).toEqual([expect.objectContaining({ name: "kernels", from: "fleet", built_by: "w1", built_against: expect.arrayContaining(["torch==2.1.0+cu121"]) })]);
    expect(builds()).toHaveLength(1);
  });

  test("a wheel whose bytes changed on the server is refused by its digest: the worker compiles instead", async () => {
    const [file] = serverWheels();
    const bytes = readFileSync(file!);
    bytes[bytes.length - 1] = bytes[bytes.length - 1]! ^ 0xff;
    writeFileSync(file!, bytes);
    const r = await jobOn("w3", "gamma");
    expect(r.stdout).toContain("built with 2.1.0+cu121");
    expect(r.wheels).toEqual([expect.objectContaining({ name: "kernels", from: "compiled" })]);
    expect(builds()).toHaveLength(2);
    expect(r.steps).toContainEqual(expect.stringMatching(/^refused wheel kernels-1\.0-py3-none-any\.whl from w1 .*does not match its sha256/));
    // The server found the same and dropped it; the new compile's wheel took its place, unchanged.
    await waitFor("the new wheel on the server", async () => (serverWheels().length === 1 && serverWheels()[0] !== file ? true : null));
    // gpulayer workers counts the shared wheels.
    expect((await gpl(["workers"])).stdout).toMatch(/^wheels +1 \(/m);
    expect(await run(["sha256sum", serverWheels()[0]!]).then((x) => x.stdout.split(" ")[0])).toBe(serverWheels()[0]!.match(/([0-9a-f]{64})\.whl$/)![1]);
  });
});
