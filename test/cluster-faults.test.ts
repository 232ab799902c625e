import { afterAll, beforeAll, describe, expect, test } from "bun:test";
import { existsSync, mkdirSync, readdirSync, readFileSync, writeFileSync } from "node:fs";
import { join } from "node:path";
import { cli, sandbox, startCli } from "./helpers.ts";
import { type Kept, keepOutput, stopAll, waitFor, watchdogs } from "./fixtures/processes.ts";

/**
 * A worker's agent killed alone (SIGKILL, what the OOM killer does) while its
 * job is quiet, then started again at once under the same name and home. The
 * job's main process dies with the agent, what it started in a session of
 * its own within a second (the job's watchdog); the restarted worker
 * settles the job's record (and would end any leftover) before it
 * registers; only then does the server give the job out again.
 */

const TOKEN = "faults-test-token-0123456789";
const FAST = { GPULAYER_HEARTBEAT_SECONDS: "0.3", GPULAYER_WORKER_LOST_SECONDS: "20", GPULAYER_WORKER_ENGINE: "none", GPULAYER_CANCEL_GRACE: "1", GPULAYER_WORKER_DRAIN_SECONDS: "1" };
const T = 120_000;
const box = sandbox();
const procs: Kept[] = [];
let url = "";

const env = () => ({ ...box.env, GPULAYER_SERVER: url, GPULAYER_TOKEN: TOKEN });
const gpl = (args: string[]) => cli(args, { env: env(), cwd: box.root });
const json = <T = any>(text: string): T => JSON.parse(text) as T;
const alive = (pid: number) => existsSync(`/proc/${pid}`) && !/^\S+ \(.*\) Z/.test(readFileSync(`/proc/${pid}/stat`, "utf8"));
const lines = (file: string) => (existsSync(file) ? readFileSync(file, "utf8").trim().split("\n").filter(Boolean).map(Number) : []);
const everyPid: number[] = [];

function startWorker(): Kept {
  return keepOutput(startCli(["join", url, "--name", "wa", "--python", "python3", "--label", "who=wa"], { env: { ...box.env, ...FAST, GPULAYER_HOME: join(box.root, "wa-home"), GPULAYER_TOKEN: TOKEN } }), procs);
}

beforeAll(async () => {
  const server = keepOutput(startCli(["server", "--listen", "127.0.0.1:0", "--json"], { env: { ...box.env, ...FAST, GPULAYER_HOME: join(box.root, "server-home"), GPULAYER_TOKEN: TOKEN } }), procs);
  url = await waitFor("the server", () => /"url": "([^"]+)"/.exec(server.out())?.[1]);
}, T);

afterAll(async () => {
  await stopAll(procs);
  for (const pid of everyPid) {
    try {
      process.kill(pid, "SIGKILL");
    } catch {
      // gone
    }
  }
  box.cleanup();
}, 30_000);

describe("the worker's agent SIGKILLed during a quiet job, then started again", () => {
  test("the job's processes end before its next attempt starts: never two at once", async () => {
    await run(false);
  }, T);

  test("with the job's watchdog gone too, the restarted worker ends what was left before it registers", async () => {
    await run(true);
  }, T);
});

/** The jobs' folders under a worker's work folder: all but its warm-up's. */
const jobFolders = (work: string) => readdirSync(work).filter((f) => f !== "warm-up");

/** One round: a quiet job on wa, wa SIGKILLed (its job's watchdog first, or not), wa started again. */
async function run(withoutWatchdog: boolean): Promise<void> {
  let wa = startWorker();
  await waitFor("wa to join", () => wa.out().includes("as wa"));
  const mains = join(box.root, `mains-${withoutWatchdog}`);
  const children = join(box.root, `children-${withoutWatchdog}`);
  const d = await gpl(["job", "run", "-d", "--label", "who=wa", "--", "sh", "-c", `echo $$ >> ${mains}; setsid sh -c 'echo $$ >> ${children}; exec sleep 300' & wait`]);
  const id = d.stdout.trim();
  await waitFor("attempt 1 to start its child", () => lines(children).length === 1);
  const [main1] = lines(mains);
  const [child1] = lines(children);
  everyPid.push(main1!, child1!);

  if (withoutWatchdog) for (const dog of watchdogs({ runner: wa.proc.pid })) process.kill(dog, "SIGKILL");
  const work = join(box.root, "wa-home", "cluster", "work");
  // The worker's warm-up (worker/warm.ts) builds in a folder of its own beside the poll: under load it may still be there.
  expect(jobFolders(work)).toEqual([`${id}-1`]);
  // A download a killed agent left half-done: its process is gone, so the next start removes it.
  const halfDone = join(box.root, "wa-home", "cluster", "bundles", `${"a".repeat(64)}.tar.gz.999999999.${crypto.randomUUID()}.tmp`);
  mkdirSync(join(halfDone, ".."), { recursive: true });
  writeFileSync(halfDone, "partial");
  wa.proc.kill("SIGKILL");
  await wa.proc.exited;
  await waitFor("attempt 1's main process to die with the agent", () => !alive(main1!));
  // Its setsid child too, within a second: the job's watchdog outlives the agent. Without it, the child lives on.
  if (withoutWatchdog) {
    await Bun.sleep(2000);
    expect(alive(child1!)).toBe(true);
  } else await waitFor("attempt 1's child to be ended", () => !alive(child1!), 10_000);

  wa = startWorker();
  await waitFor("attempt 2 to start", () => lines(mains).length === 2, 60_000);
  everyPid.push(...lines(mains), ...lines(children));
  expect(alive(child1!)).toBe(false);
  expect(wa.out()).toContain(`ended what 1 job(s) of a previous run of this worker left behind (${withoutWatchdog ? 1 : 0} process(es))`);
  // Attempt 1's workdir went with its job; attempt 2's is there while it runs.
  expect(jobFolders(work)).toEqual([`${id}-2`]);
  expect(existsSync(halfDone)).toBe(false);
  const s = json((await gpl(["job", "status", id, "--json"])).stdout);
  expect(s.attempts).toBe(2);
  expect(s.state).toBe("running");
  await gpl(["job", "cancel", id]);
  await waitFor("the job to end", async () => json((await gpl(["job", "status", id, "--json"])).stdout).state === "cancelled");
  wa.proc.kill("SIGTERM");
  await wa.proc.exited;
}

describe("a worker SIGKILLed and never started again", () => {
  test("gc leaves a live worker's workdir, and removes the dead one's (a dry run only says so)", async () => {
    const wa = startWorker();
    await waitFor("wa to join", () => wa.out().includes("as wa"));
    const mains = join(box.root, "mains-gc");
    const id = (await gpl(["job", "run", "-d", "--label", "who=wa", "--", "sh", "-c", `echo $$ >> ${mains}; exec sleep 300`])).stdout.trim();
    await waitFor("the job to start", () => lines(mains).length === 1);
    everyPid.push(...lines(mains));
    const home = join(box.root, "wa-home");
    const workdir = join(home, "cluster", "work", `${id}-1`);
    const gc = async (...args: string[]) => json((await cli(["gc", "--json", ...args], { env: { ...box.env, GPULAYER_HOME: home } })).stdout);
    expect((await gc()).trash.finished).toBe(0);
    expect(existsSync(workdir)).toBe(true);
    wa.proc.kill("SIGKILL");
    await wa.proc.exited;
    await waitFor("the job's process to die with the agent", () => !alive(lines(mains)[0]!));
    expect((await gc("--dry-run")).trash.finished).toBe(1);
    expect(existsSync(workdir)).toBe(true);
    expect((await gc()).trash.finished).toBe(1);
    expect(existsSync(workdir)).toBe(false);
    await gpl(["job", "cancel", id]);
  }, T);
});
