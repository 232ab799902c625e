import { afterAll, beforeAll, describe, expect, test } from "bun:test";
import { existsSync, mkdirSync, readFileSync, writeFileSync } from "node:fs";
import { join } from "node:path";
import { cli, sandbox, startCli } from "./helpers.ts";
import { type Kept, keepOutput, stopAll, waitFor } from "./fixtures/processes.ts";
import { TcpProxy } from "./fixtures/tcp-proxy.ts";

/**
 * A network cut between one worker and the server, both running on: worker
 * wa talks to the server through a TCP proxy the test cuts. A cut shorter
 * than the worker's lease costs nothing: the server sees wa lost, keeps its
 * job, and takes wa back with it. A longer one: wa stops its job itself
 * before the lease ends, and only then does the server give the job to wb.
 * At no moment do two attempts run (each records its start and end). A
 * worker frozen (SIGSTOP) past its lease with a job handed to it asks the
 * server before running it, awake, and runs nothing the server gave out again;
 * one frozen while its job ran stops that job at its first beat awake.
 */

const TOKEN = "partition-test-token-0123456789";
const FAST = { GPULAYER_HEARTBEAT_SECONDS: "0.3", GPULAYER_WORKER_LOST_SECONDS: "1.5", GPULAYER_WORKER_LEASE: "6", GPULAYER_WORKER_ENGINE: "none", GPULAYER_CANCEL_GRACE: "1", GPULAYER_WORKER_DRAIN_SECONDS: "1" };
const T = 120_000;
const box = sandbox();
const procs: Kept[] = [];
let url = "";
let proxy: TcpProxy;
let server: Kept;

const env = () => ({ ...box.env, GPULAYER_SERVER: url, GPULAYER_TOKEN: TOKEN });
const gpl = (args: string[]) => cli(args, { env: env(), cwd: box.root });
const json = <T = any>(text: string): T => JSON.parse(text) as T;
const worker = (name: string, serverUrl: string, label: string) =>
  keepOutput(startCli(["join", serverUrl, "--name", name, "--python", "python3", "--label", label], { env: { ...box.env, ...FAST, GPULAYER_HOME: join(box.root, `${name}-home`), GPULAYER_TOKEN: TOKEN } }), procs);
const status = async (id: string) => json((await gpl(["job", "status", id, "--json"])).stdout);
/** Given out once, then back in the queue (its worker's lease ran out). */
const queuedAgain = (id: string) =>
  waitFor("the job to be queued again", async () => {
    const s = await status(id);
    return s.state === "queued" && s.attempts === 1;
  }, 30_000);
const runs = (file: string) => (existsSync(file) ? readFileSync(file, "utf8").trim().split("\n").filter(Boolean) : []);

/** Records "start PID" and, when stopped, "end PID"; finishes once `release` exists. */
// The trap ignores a second TERM while it runs: the agent and the job's watchdog may both send one, and the shell
// would then run the trap twice, writing a second "end" that reads as a run of its own.
const job = (file: string, release: string) => ["--", "sh", "-c", `trap 'trap "" TERM; echo end $$ >> ${file}; exit 143' TERM; echo start $$ >> ${file}; while [ ! -e ${release} ]; do sleep 0.1; done; echo finished`];

beforeAll(async () => {
  server = keepOutput(startCli(["server", "--listen", "127.0.0.1:0", "--json"], { env: { ...box.env, ...FAST, GPULAYER_HOME: join(box.root, "server-home"), GPULAYER_TOKEN: TOKEN } }), procs);
  url = await waitFor("the server", () => /"url": "([^"]+)"/.exec(server.out())?.[1]);
  proxy = new TcpProxy(Number(new URL(url).port)).start();
  const wa = worker("wa", `http://127.0.0.1:${proxy.port}`, "pool=p");
  await waitFor("wa to join", () => wa.out().includes("as wa"));
}, T);

afterAll(async () => {
  proxy.cut();
  await stopAll(procs);
  box.cleanup();
}, 30_000);

describe("a network cut between a worker and the server", () => {
  test("shorter than the lease: the worker is lost, then back with its job, which finishes there, once", async () => {
    const file = join(box.root, "runs-short");
    const release = join(box.root, "release-short");
    const d = await gpl(["job", "run", "-d", "--label", "pool=p", ...job(file, release)]);
    const id = d.stdout.trim();
    await waitFor("the job to start", () => runs(file).length === 1);
    proxy.cut();
    await waitFor("wa to be seen lost", async () => json<any[]>((await gpl(["workers", "--all", "--json"])).stdout).find((w) => w.name === "wa")?.state === "lost");
    await Bun.sleep(1500);
    proxy.mend();
    await waitFor("wa to be back", async () => json<any[]>((await gpl(["workers", "--json"])).stdout).find((w) => w.name === "wa")?.state !== "lost");
    writeFileSync(release, "");
    const s = await waitFor("the job to end", async () => ((await status(id)).state === "succeeded" ? status(id) : null));
    expect(s.attempts).toBe(1);
    expect(s.worker).toBe("wa");
    expect(runs(file)).toHaveLength(1);
    expect((await gpl(["job", "logs", id])).stdout.trim()).toBe("finished");
  }, T);

  test("job cancel while the worker is cut off: said to wait for it, the job cancelled when its lease ends, and its run phase ended with it (not running on)", async () => {
    const file = join(box.root, "runs-cancel");
    const release = join(box.root, "release-cancel");
    const id = (await gpl(["job", "run", "-d", "--label", "pool=p", ...job(file, release)])).stdout.trim();
    await waitFor("the job to start", () => runs(file).length === 1);
    await waitFor("its run phase", async () => (await status(id)).phases.some((p: { name: string }) => p.name === "task.run"));
    proxy.cut();
    await waitFor("wa to be seen lost", async () => json<any[]>((await gpl(["workers", "--all", "--json"])).stdout).find((w) => w.name === "wa")?.state === "lost");
    const cancelled = await gpl(["job", "cancel", id]);
    expect(cancelled.code, cancelled.stderr).toBe(0);
    expect(cancelled.stderr).toContain("waiting for worker wa to stop it");
    expect(cancelled.stdout.trim()).toBe(`job ${id} cancelled`);
    const run = async () => (await status(id)).phases.find((p: { name: string }) => p.name === "task.run");
    const first = await run();
    await Bun.sleep(1200);
    expect(first.state).toBe("failed");
    expect(await run()).toEqual(first);
    proxy.mend();
    await waitFor("wa to be back", async () => json<any[]>((await gpl(["workers", "--json"])).stdout).find((w) => w.name === "wa")?.state !== "lost", 30_000);
  }, T);

  test("longer than the lease: the worker stops its job first, then the job runs elsewhere; never two at once", async () => {
    const file = join(box.root, "runs-long");
    const release = join(box.root, "release-long");
    const d = await gpl(["job", "run", "-d", "--label", "pool=p", ...job(file, release)]);
    const id = d.stdout.trim();
    await waitFor("the job to start on wa", () => runs(file).length === 1);
    // wb joins now (directly): the only place the job can go once wa has lost it.
    const wb = worker("wb", url, "pool=p");
    await waitFor("wb to join", () => wb.out().includes("as wb"));
    proxy.cut();
    await waitFor("the job to start again elsewhere", () => runs(file).length >= 3, 30_000);
    const [start1, end1, start2] = runs(file);
    expect(start1!.startsWith("start ")).toBe(true);
    expect(end1).toBe(`end ${start1!.split(" ")[1]}`);
    expect({ start2, runs: runs(file) }).toMatchObject({ start2: expect.stringMatching(/^start /) });
    proxy.mend();
    writeFileSync(release, "");
    const s = await waitFor("the job to end", async () => ((await status(id)).state === "succeeded" ? status(id) : null), 30_000);
    expect(s.worker).toBe("wb");
    expect(s.attempts).toBe(2);
    expect(runs(file)).toHaveLength(3);
    expect(procs.find((p) => p.out().includes("as wa"))!.out()).toContain("was out of touch with the server");
  }, T);

  test("a worker frozen past its lease with a job handed to it: awake, it asks the server first and does not run it; the job ran once, elsewhere", async () => {
    const file = join(box.root, "runs-frozen");
    // An empty workdir, so the job's bundle is the warm-up's, already on wf: awake, wf needs nothing from the server but the answer.
    const wd = join(box.root, "frozen-wd");
    mkdirSync(wd);
    const submit = (args: string[]) => cli(["job", "run", "--label", "pool=f", ...args], { env: env(), cwd: wd });
    const wf = worker("wf", url, "pool=f");
    await waitFor("wf to join", () => wf.out().includes("as wf"));
    expect((await submit(["--", "true"])).code).toBe(0);
    wf.proc.kill("SIGSTOP");
    const id = (await submit(["-d", "--", "sh", "-c", `echo ran $$ >> ${file}`])).stdout.trim();
    // Handed to wf (silent, not lost yet), then given out again once wf's lease is over.
    await queuedAgain(id);
    const wg = worker("wg", url, "pool=f");
    await waitFor("wg to join", () => wg.out().includes("as wg"));
    const s = await waitFor("the job to end on wg", async () => ((await status(id)).state === "succeeded" ? status(id) : null), 60_000);
    expect(s.worker).toBe("wg");
    expect(runs(file)).toHaveLength(1);
    // wf wakes to the old hand-out while the server cannot answer: it must not run the job on its own say-so.
    server.proc.kill("SIGSTOP");
    try {
      wf.proc.kill("SIGCONT");
      await waitFor("wf to ask before running", () => wf.out().includes("asking the server whether it is still ours"));
      await Bun.sleep(500);
      expect(runs(file)).toHaveLength(1);
    } finally {
      server.proc.kill("SIGCONT");
    }
    await waitFor("wf to be told the job is not its own", () => wf.out().includes("taken back by the server"));
    await Bun.sleep(500);
    expect(runs(file)).toHaveLength(1);
    expect(await status(id)).toMatchObject({ state: "succeeded", worker: "wg", attempts: 2 });
  }, T);

  test("a worker frozen past its lease while its job runs: the job runs again elsewhere, and the frozen one's copy is stopped by its first beat awake", async () => {
    const file = join(box.root, "runs-frozen-running");
    const release = join(box.root, "release-frozen-running");
    const wh = worker("wh", url, "pool=h");
    await waitFor("wh to join", () => wh.out().includes("as wh"));
    const id = (await gpl(["job", "run", "-d", "--label", "pool=h", ...job(file, release)])).stdout.trim();
    await waitFor("the job to start on wh", () => runs(file).length === 1);
    const first = runs(file)[0]!.split(" ")[1];
    // Frozen once the server has all wh reported (the start last): a report still on its way would tell wh on waking, before a beat's answer.
    await waitFor("the server to hear it started", async () => (await status(id)).state === "running");
    wh.proc.kill("SIGSTOP");
    await queuedAgain(id);
    const wi = worker("wi", url, "pool=h");
    await waitFor("wi to join", () => wi.out().includes("as wi"));
    await waitFor("the job to start again on wi", () => runs(file).length === 2);
    // The job is silent: no report of its own would tell wh. Its beats list it, and the answer says it is not wh's any more.
    wh.proc.kill("SIGCONT");
    await waitFor("wh to stop its copy", () => runs(file).includes(`end ${first}`), 5_000);
    expect(wh.out()).toContain("given out again while this worker went unheard");
    writeFileSync(release, "");
    const s = await waitFor("the job to end on wi", async () => ((await status(id)).state === "succeeded" ? status(id) : null), 30_000);
    expect(s).toMatchObject({ worker: "wi", attempts: 2 });
    expect(runs(file)).toHaveLength(3);
  }, T);
});
