import { afterAll, describe, expect, setDefaultTimeout, test } from "bun:test";
import { existsSync, mkdirSync, readdirSync, readFileSync, writeFileSync } from "node:fs";
import { join } from "node:path";
import { cli, sandbox, startCli } from "./helpers.ts";
import { waitFor, watchdogs } from "./fixtures/processes.ts";

/**
 * A job's processes as a whole, with real processes: a child that leaves the
 * job's process group and session (`setsid`) and holds its output does not
 * keep the job running once its main process has ended, a cancel reaches it,
 * and a `job run` killed with SIGKILL takes its whole job along (the main
 * process at once, the rest through the job's watchdog); with the watchdog
 * gone too, the env stays leased (gc leaves it) as long as anything the job
 * started still runs.
 */

setDefaultTimeout(120_000);

const box = sandbox();
const work = join(box.root, "work");
mkdirSync(work);
const gpl = (args: string[]) => cli(args, { env: { ...box.env, GPULAYER_CANCEL_GRACE: "1" }, cwd: work });
const json = <T = any>(text: string): T => JSON.parse(text) as T;
const alive = (pid: number) => existsSync(`/proc/${pid}`) && !/^\S+ \(.*\) Z/.test(readFileSync(`/proc/${pid}/stat`, "utf8"));
const pidIn = async (file: string) => Number(await waitFor(`a pid in ${file}`, () => existsSync(file) && readFileSync(file, "utf8").trim()));
const leftovers: number[] = [];

afterAll(() => {
  for (const pid of leftovers) {
    try {
      process.kill(pid, "SIGKILL");
    } catch {
      // gone: as it should be
    }
  }
  box.cleanup();
});

describe("a job is over when its main process is", () => {
  test("a setsid child holding the job's output is ended with it: job run exits, the job succeeded, the child is gone", async () => {
    const pidFile = join(work, "setsid.pid");
    const r = await gpl(["job", "run", "--", "sh", "-c", `setsid sh -c 'echo $$ > ${pidFile}; exec sleep 300' & sleep 0.5; echo main-done`]);
    const child = Number(readFileSync(pidFile, "utf8"));
    leftovers.push(child);
    expect(r.code).toBe(0);
    expect(r.stdout).toContain("main-done");
    expect(alive(child)).toBe(false);
    const [job] = json<any[]>((await gpl(["job", "list", "--json", "--limit", "1"])).stdout);
    expect(job.state).toBe("succeeded");
  });

  test("job cancel ends a setsid child too", async () => {
    const pidFile = join(work, "cancel.pid");
    const d = await gpl(["job", "run", "-d", "--", "sh", "-c", `setsid sh -c 'echo $$ > ${pidFile}; exec sleep 300' & wait`]);
    const id = d.stdout.trim();
    const child = await pidIn(pidFile);
    leftovers.push(child);
    expect(alive(child)).toBe(true);
    const c = await gpl(["job", "cancel", id]);
    expect(c.code).toBe(0);
    await waitFor("the cancelled job to end", async () => json((await gpl(["job", "status", id, "--json"])).stdout).state === "cancelled");
    await waitFor("the setsid child to be gone", () => !alive(child));
  });
});

describe("a cancel's SIGTERM", () => {
  test("reaches the main process and a setsid child once each, then the grace", async () => {
    // Each counts the SIGTERMs it gets, then exits half a second after the first: a program that checkpoints on SIGTERM.
    const counting = (name: string) => `import signal, sys, time\nn = 0\ndef h(*a):\n    global n\n    n += 1\n    open("${name}.count", "a").write("x")\nsignal.signal(signal.SIGTERM, h)\nopen("${name}.ready", "w").close()\nwhile not n: time.sleep(0.05)\ntime.sleep(0.5)\nsys.exit(5)\n`;
    const dir = join(work, "signals");
    mkdirSync(dir);
    writeFileSync(join(dir, "child.py"), counting("child"));
    writeFileSync(join(dir, "main.py"), `import subprocess, sys\nsubprocess.Popen([sys.executable, "child.py"], start_new_session=True)\n${counting("main")}`);
    const d = await cli(["job", "run", "-d", "--workdir", dir, "--", "python3", "main.py"], { env: { ...box.env, GPULAYER_CANCEL_GRACE: "5" }, cwd: dir });
    const id = d.stdout.trim();
    await waitFor("both to be ready", () => existsSync(join(dir, "main.ready")) && existsSync(join(dir, "child.ready")));
    expect((await gpl(["job", "cancel", id])).code).toBe(0);
    await waitFor("the cancelled job to end", async () => json((await gpl(["job", "status", id, "--json"])).stdout).state === "cancelled");
    await Bun.sleep(300);
    expect({ main: readFileSync(join(dir, "main.count"), "utf8"), child: readFileSync(join(dir, "child.count"), "utf8") }).toEqual({ main: "x", child: "x" });
  });

  test("gives a program under a shell its grace: the shell dies at once, the program still checkpoints before SIGKILL", async () => {
    const dir = join(work, "wrapped");
    mkdirSync(dir);
    writeFileSync(join(dir, "ckpt.py"), 'import signal, sys, time\ndef h(*a):\n    time.sleep(1)\n    open("ckpt", "w").write("saved")\n    sys.exit(0)\nsignal.signal(signal.SIGTERM, h)\nopen("ready", "w").close()\nwhile True: time.sleep(0.1)\n');
    const d = await cli(["job", "run", "-d", "--workdir", dir, "--", "sh", "-c", "python3 ckpt.py; echo after"], { env: { ...box.env, GPULAYER_CANCEL_GRACE: "5" }, cwd: dir });
    const id = d.stdout.trim();
    await waitFor("the program to be ready", () => existsSync(join(dir, "ready")));
    expect((await gpl(["job", "cancel", id])).code).toBe(0);
    await waitFor("the cancelled job to end", async () => json((await gpl(["job", "status", id, "--json"])).stdout).state === "cancelled");
    expect(readFileSync(join(dir, "ckpt"), "utf8")).toBe("saved");
  });
});

describe("a SIGKILLed job run", () => {
  const start = async (tag: string) => {
    const mainFile = join(work, `${tag}-main.pid`);
    const childFile = join(work, `${tag}-child.pid`);
    // The main process starts a child in a session of its own, then waits: both live until someone ends them.
    const run = startCli(["job", "run", "--", "sh", "-c", `echo $$ > ${mainFile}; setsid sh -c 'echo $$ > ${childFile}; exec sleep 300' & wait`], { env: box.env, cwd: work });
    const main = await pidIn(mainFile);
    const child = await pidIn(childFile);
    leftovers.push(main, child);
    const [job] = json<any[]>((await gpl(["job", "list", "--json", "--limit", "1"])).stdout);
    return { run, main, child, id: job.id as string };
  };
  const envs = () => readdirSync(join(box.home, "envs-v1")).filter((n) => !n.startsWith("."));

  test("takes the whole job along: its main process at once, a setsid child within a second (its watchdog)", async () => {
    const { run, main, child } = await start("all");
    run.kill("SIGKILL");
    await run.exited;
    await waitFor("the job's main process to die with its runner", () => !alive(main));
    await waitFor("the setsid child to be ended by the job's watchdog", () => !alive(child), 10_000);
  });

  test("with its watchdog gone too, the env stays leased while a child of the job lives, and gc takes it after", async () => {
    const { run, main, child, id } = await start("lease");
    const [dog] = await waitFor("the job's watchdog", () => {
      const found = watchdogs({ job: id });
      return found.length ? found : null;
    });
    process.kill(dog!, "SIGKILL");
    run.kill("SIGKILL");
    await run.exited;
    await waitFor("the job's main process to die with its runner", () => !alive(main));
    expect(alive(child)).toBe(true);

    const before = envs();
    expect(before.length).toBeGreaterThan(0);
    const kept = await gpl(["gc", "--max-size", "0", "--min-age", "0", "--json"]);
    const report = json(kept.stdout);
    expect(report.removed).toEqual([]);
    expect(report.skipped.flatMap((s: any) => s.reasons.map((r: any) => r.code))).toContain("leased");
    expect(envs()).toEqual(before);

    process.kill(child, "SIGKILL");
    await waitFor("the child to be gone", () => !alive(child));
    const gone = await gpl(["gc", "--max-size", "0", "--min-age", "0", "--json"]);
    expect(json<{ removed: unknown[] }>(gone.stdout).removed.length).toBeGreaterThan(0);
  });
});
