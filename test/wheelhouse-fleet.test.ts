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
 * Envs needing the same compile at the same moment: one worker claims it at the server, the other waits for
 * its wheel (fused, whose build sleeps); the claim's holder killed mid-compile, the waiter compiles (slowk).
 */

setDefaultTimeout(120_000);

const TOKEN = "wheelhouse-fleet-token-0123456789";
const FAST = { GPULAYER_HEARTBEAT_SECONDS: "0.5", GPULAYER_WORKER_LOST_SECONDS: "10", GPULAYER_WORKER_ENGINE: "none", GPULAYER_WORKER_SLOTS: "1" };
const server = sandbox();
const client = sandbox();
const boxes = { w1: sandbox(), w2: sandbox(), w3: sandbox() };
const index = new PackageIndex(join(client.root, "index"));
const counter = join(client.root, "kernels-builds");
const fusedCounter = join(client.root, "fused-builds");
const slowCounter = join(client.root, "slowk-builds");
const kept: Kept[] = [];
let url = "";

const gpl = (args: string[]) => cli(args, { env: { ...client.env, GPULAYER_SERVER: url, GPULAYER_TOKEN: TOKEN }, cwd: client.root });
const builds = (file = counter) => (existsSync(file) ? readFileSync(file, "utf8").trim().split("\n") : []);
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
/** Submit a job on `worker` whose env is `pkg` (built without isolation) and `other`; its id. */
const submit = async (worker: string, pkg: string, other: string) => {
  const r = await gpl(["job", "run", "-d", "-p", pkg, "-p", other, "--no-build-isolation-package", pkg, "--index-url", index.url, "--label", `box=${worker}`, "--", "python", "-c", `import ${pkg}`]);
  expect(r.code, r.stderr).toBe(0);
  return r.stdout.trim();
};
/** A submitted job once it ended: its state, its prepare's steps and where its wheel came from. */
const ended = async (id: string) => {
  const doc = await waitFor(`job ${id} to end`, async () => {
    const d = JSON.parse((await gpl(["job", "status", id, "--json"])).stdout);
    return ["succeeded", "failed", "cancelled"].includes(d.state) ? d : null;
  }, 110_000);
  const events = doc.events as { type: string; data: Record<string, unknown> }[];
  const steps = events.filter((e) => e.type === "task.prepare.step").map((e) => `${e.data.step} ${e.data.detail}`);
  return { state: doc.state as string, steps, wheels: events.find((e) => e.type === "task.prepare.finished")?.data.wheels };
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
  index.sdist({ name: "fused", version: "1.0", counter: fusedCounter, imports: "torch", sleep: 4 });
  index.sdist({ name: "slowk", version: "1.0", counter: slowCounter, imports: "torch", sleep: 20 });
  const venvs = await Promise.all(Object.entries(boxes).map(([n, b]) => makeWorkerVenv(join(b.root, `venv-${n}`), { env: b.env, packages: ["torch==2.1.0+cu121"], findLinks: index.dir })));
  const srv = keepOutput(startCli(["server", "--listen", "127.0.0.1:0", "--json"], { env: { ...server.env, ...FAST, GPULAYER_TOKEN: TOKEN } }), kept);
  url = (await waitFor("the server", async () => /"url": "([^"]+)"/.exec(srv.out())?.[1])) as string;
  // Each worker leads its own process group: killed with its compile (SIGKILL), as a machine lost is.
  Object.entries(boxes).forEach(([n, b], i) => keepOutput(startCli(["join", url, "--name", n, "--label", `box=${n}`, "--python", venvs[i]!], { env: { ...b.env, ...FAST, GPULAYER_TOKEN: TOKEN }, detached: true }), kept));
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

  test("two workers preparing two different envs that need the same compile at once: one compiles under its claim, the other waits for its wheel and fetches it", async () => {
    const [a, b] = await Promise.all([submit("w1", "fused", "alpha"), submit("w2", "fused", "beta")]);
    const done = await Promise.all([ended(a!), ended(b!)]);
    expect(done.map((d) => d.state)).toEqual(["succeeded", "succeeded"]);
    expect(builds(fusedCounter)).toHaveLength(1);
    const from = done.map((d) => (d.wheels as { from: string }[])[0]!.from).sort();
    expect(from).toEqual(["compiled", "fleet"]);
    const waiter = done.find((d) => (d.wheels as { from: string }[])[0]!.from === "fleet")!;
    const compiler = waiter === done[0] ? "w2" : "w1";
    expect(waiter.steps).toContainEqual(`waiting for ${compiler}, which is compiling fused from the same sdist for this Python and these build variables`);
    expect(waiter.wheels).toEqual([expect.objectContaining({ name: "fused", from: "fleet", built_by: compiler })]);
  });

  test("the claim's holder killed (SIGKILL) mid-compile: the waiting worker claims once the holder is lost, and compiles", async () => {
    const first = await submit("w3", "slowk", "gamma");
    await waitFor("w3 compiling slowk", async () => (builds(slowCounter).length === 1 ? true : null), 60_000);
    const second = await submit("w1", "slowk", "beta");
    // w1 waits for w3's compile (its claim), then w3 and its compile go at once.
    await waitFor("w1 waiting for w3", async () => {
      const d = JSON.parse((await gpl(["job", "status", second, "--json"])).stdout);
      return (d.events as { type: string; data: Record<string, unknown> }[]).some((e) => e.type === "task.prepare.step" && e.data.step === "waiting" && String(e.data.detail).startsWith("for w3, which is compiling slowk")) ? true : null;
    });
    const w3 = kept[1 + Object.keys(boxes).indexOf("w3")]!;
    process.kill(-w3.proc.pid, "SIGKILL");
    const r = await ended(second);
    expect(r.state).toBe("succeeded");
    expect(r.wheels).toEqual([expect.objectContaining({ name: "slowk", from: "compiled" })]);
    expect(r.steps).toContainEqual("building here: w3 left no wheel of slowk that fits here");
    expect(builds(slowCounter)).toHaveLength(2);
    void first;
  }, 180_000);
});
