import { afterAll, describe, expect, setDefaultTimeout, test } from "bun:test";

// Real runners and real processes on a busy 2-core machine: seconds, not milliseconds.
setDefaultTimeout(120_000);
import { Database } from "bun:sqlite";
import { createHash } from "node:crypto";
import { existsSync, mkdirSync, readFileSync, statSync, symlinkSync } from "node:fs";
import { join } from "node:path";
import { homeLayout } from "../src/config/paths.ts";
import { bootId, liveness, processStartTime, readProcStat, signalRecorded } from "../src/core/process-identity.ts";
import { JobStore } from "../src/jobs/store.ts";
import { cli, sandbox } from "./helpers.ts";
import { watchdogs } from "./fixtures/processes.ts";

/**
 * "Reads never write": job status, list and logs report a job whose runner is
 * gone, but record nothing and signal nothing; and no command signals a
 * recorded pid whose start time is not the one recorded with it.
 */

const box = sandbox();
const work = join(box.root, "work");
mkdirSync(work);
const env = () => box.env;
const spawned: number[] = [];
afterAll(() => {
  for (const pid of spawned) {
    try {
      process.kill(-pid, "SIGKILL");
    } catch {
      try {
        process.kill(pid, "SIGKILL");
      } catch {
        // gone
      }
    }
  }
  box.cleanup();
});

const dbPath = () => join(box.home, "jobs", "jobs.db");
const json = <T = any>(text: string): T => JSON.parse(text) as T;

/** Alive and not a zombie. */
function isRunning(pid: number): boolean {
  try {
    const stat = readFileSync(`/proc/${pid}/stat`, "latin1");
    return !/^[ZX]$/.test(stat.slice(stat.lastIndexOf(")") + 2, stat.lastIndexOf(")") + 3));
  } catch {
    return false;
  }
}

async function until(what: string, check: () => boolean | Promise<boolean>, ms = 60_000): Promise<void> {
  const deadline = Date.now() + ms;
  while (!(await check())) {
    if (Date.now() > deadline) throw new Error(`timed out waiting for ${what}`);
    await Bun.sleep(50);
  }
}

/** Everything a read could change: the database file and its WAL, byte for byte, their mtimes, and every row. */
function snapshot(): string {
  const part = (p: string) => (existsSync(p) ? `${createHash("sha256").update(readFileSync(p)).digest("hex")} ${statSync(p).size} ${statSync(p).mtimeMs}` : "absent");
  const wal = `${dbPath()}-wal`;
  const db = new Database(dbPath(), { readonly: true });
  try {
    const rows = JSON.stringify([db.query("SELECT * FROM jobs ORDER BY id").all(), db.query("SELECT * FROM events ORDER BY seq").all()]);
    // A reader may create an empty WAL where none was: as good as none.
    const walPart = existsSync(wal) && statSync(wal).size > 0 ? part(wal) : "empty";
    return `${part(dbPath())}\n${walPart}\n${rows}`;
  } finally {
    db.close();
  }
}

function row(id: string): Record<string, any> {
  const db = new Database(dbPath(), { readonly: true });
  try {
    return db.query("SELECT * FROM jobs WHERE id = ?").get(id) as Record<string, any>;
  } finally {
    db.close();
  }
}

/** A process of the test's own that stands for "some other process that now has the pid": a process group of its own. */
function unrelated(): number {
  const p = Bun.spawn(["sleep", "120"], { stdin: "ignore", stdout: "ignore", stderr: "ignore", detached: true });
  spawned.push(p.pid);
  return p.pid;
}

/** A job record as if written by a runner, with the pids and start times given. */
function recordJob(fields: Parameters<JobStore["update"]>[1]): string {
  const store = new JobStore(homeLayout(box.home));
  try {
    const job = store.create({
      name: "planted",
      argv: ["sleep", "120"],
      commandText: "sleep 120",
      workdir: work,
      env: {},
      environment: { specs: [], extraIndexUrls: [], findLinks: [] },
      resources: { gpus: 0, frameworks: {} },
    } as never);
    store.update(job.id, { state: "running", ...fields });
    return job.id;
  } finally {
    store.close();
  }
}

/** Every read command, human and JSON (and logs --follow, for a job shown ended): none may change anything. */
async function allReads(id: string, follow = true): Promise<{ status: any; human: string; list: any[] }> {
  const human = await cli(["job", "status", id], { env: env() });
  expect(human.code).toBe(0);
  const status = await cli(["job", "status", id, "--json"], { env: env() });
  expect(status.code).toBe(0);
  expect((await cli(["job", "list"], { env: env() })).code).toBe(0);
  const list = await cli(["job", "list", "--json"], { env: env() });
  expect(list.code).toBe(0);
  expect((await cli(["job", "logs", id], { env: env() })).code).toBe(0);
  const shown = json(status.stdout);
  // --follow ends at once: the job is shown ended, and its end is passed on (a lost job failed, with no code of its own: 1).
  if (follow) {
    const followed = await cli(["job", "logs", id, "--follow"], { env: env() });
    expect(followed.code).toBe(shown.exit_code ?? (shown.state === "succeeded" ? 0 : 1));
    // A job that did not succeed says how it ended, last, on stderr: its error, else its code.
    if (shown.state !== "succeeded") expect(followed.stderr.trim().split("\n").at(-1)).toBe(`job ${shown.id} ${shown.state}${shown.error ? `: ${shown.error}` : shown.exit_code !== null ? ` (exit ${shown.exit_code})` : ""}`);
  }
  return { status: shown, human: human.stdout, list: json(list.stdout) };
}

describe("process identity: pid and start time", () => {
  test("/proc/PID/stat is read right even when the command name holds spaces and parentheses", async () => {
    const odd = join(box.root, "x) y (z");
    symlinkSync(Bun.which("sleep")!, odd);
    const p = Bun.spawn([odd, "30"], { stdin: "ignore", stdout: "ignore", stderr: "ignore", detached: true });
    spawned.push(p.pid);
    await until("comm set", () => readFileSync(`/proc/${p.pid}/stat`, "latin1").includes("(x) y (z)"));
    const stat = readProcStat(p.pid)!;
    expect(stat.ppid).toBe(process.pid);
    expect(stat.pgrp).toBe(p.pid);
    expect(stat.session).toBe(p.pid);
    expect(processStartTime(p.pid)).toBe(stat.starttime);
    expect(liveness({ pid: p.pid, start: stat.starttime, boot: bootId() })).toBe("alive");
    expect(liveness({ pid: p.pid, start: stat.starttime + 1, boot: bootId() })).toBe("gone");
    expect(liveness({ pid: p.pid, start: stat.starttime, boot: "another-boot" })).toBe("gone");
    expect(liveness({ pid: p.pid, start: null })).toBe("unverifiable");
    expect(signalRecorded({ pid: p.pid, start: stat.starttime + 1 }, "SIGKILL", { group: true })).toBe("gone");
    expect(signalRecorded({ pid: p.pid, start: null }, "SIGKILL")).toBe("unverifiable");
    await Bun.sleep(100);
    expect(isRunning(p.pid)).toBe(true);
    expect(signalRecorded({ pid: p.pid, start: stat.starttime }, "SIGKILL", { group: true })).toBe("signalled");
    await p.exited;
    expect(liveness({ pid: p.pid, start: stat.starttime })).toBe("gone");
  });
});

describe("reads never write", () => {
  test("a detached job whose runner is SIGKILLed is shown failed by status, list and logs; the database stays byte-identical and what the job left is not touched", async () => {
    const leftFile = join(work, "left.pid");
    const r = await cli(["job", "run", "--detach", "--", "sh", "-c", `echo started; sleep 300 & echo $! > ${leftFile}; wait`], { env: env(), cwd: work });
    expect(r.code).toBe(0);
    const id = r.stdout.trim();
    await until("the job running", () => existsSync(dbPath()) && row(id)?.state === "running" && row(id)?.child_pid > 0);
    const rec = row(id);
    spawned.push(rec.child_pid);
    // The runner recorded each pid with its start time.
    expect(rec.runner_start).toBe(processStartTime(rec.runner_pid));
    expect(rec.child_start).toBe(processStartTime(rec.child_pid));
    expect(rec.pid_boot).toBe(bootId());
    await until("the job's output", () => existsSync(join(box.home, "jobs", `${id}.log`)) && readFileSync(join(box.home, "jobs", `${id}.log`), "utf8").includes("started"));
    await until("the job's child", () => existsSync(leftFile) && readFileSync(leftFile, "utf8").trim() !== "");
    const left = Number(readFileSync(leftFile, "utf8"));
    spawned.push(left);

    // Its watchdog gone first (else it ends the child within a second): what a reader sees of a job's leftovers.
    const dogs = watchdogs({ job: id });
    expect(dogs).toHaveLength(1);
    process.kill(dogs[0]!, "SIGKILL");
    process.kill(rec.runner_pid, "SIGKILL");
    await until("the runner gone", () => !isRunning(rec.runner_pid));
    // The job's main process dies with its runner (its parent-death signal); the child it started lives on.
    await until("the main process gone", () => !isRunning(rec.child_pid));
    const before = snapshot();

    const { status, human, list } = await allReads(id);
    expect(status.state).toBe("failed");
    expect(status.lost).toBe(true);
    expect(status.error).toContain(`pid ${rec.runner_pid}) is gone`);
    expect(status.error).toContain(`1 process(es) it started still run: gpulayer job cancel ${id} stops them`);
    expect(human).toContain(`job ${id} sh: failed`);
    expect(human).toContain("is gone");
    expect(list.find((j: any) => j.id === id).state).toBe("failed");

    expect(snapshot()).toBe(before);
    expect(row(id).state).toBe("running"); // as the runner left it
    expect(status.events.some((e: any) => e.type === "job.lost")).toBe(false);
    // Reads signal nothing: the job's child lives on.
    expect(isRunning(left)).toBe(true);

    // job cancel acts: whatever carries the job's mark is ended, and the end recorded.
    const c = await cli(["job", "cancel", id], { env: env() });
    expect(c.code).toBe(0);
    expect(c.stdout).toContain("cancelled");
    await until("the child gone", () => !isRunning(left), 10_000);
    const after = json((await cli(["job", "status", id, "--json"], { env: env() })).stdout);
    expect(after.state).toBe("cancelled");
    expect(after.events.find((e: any) => e.type === "job.cancelled").data.leftovers).toBe(1);
  });

  test("pids that now belong to other processes (start times differ) are never signalled, by reads or by cancel", async () => {
    const runnerLookalike = unrelated();
    const childLookalike = unrelated();
    await until("both started", () => processStartTime(runnerLookalike) !== null && processStartTime(childLookalike) !== null);
    const id = recordJob({
      runnerPid: runnerLookalike,
      runnerStart: processStartTime(runnerLookalike)! - 7, // recorded for the process that had the pid before
      childPid: childLookalike,
      childStart: processStartTime(childLookalike)! - 7,
      pidBoot: bootId(),
    });
    const before = snapshot();
    const { status } = await allReads(id);
    expect(status.state).toBe("failed"); // the runner, as recorded, is gone
    expect(status.lost).toBe(true);
    expect(status.error).not.toContain("still runs"); // nor is the command the one recorded
    expect(snapshot()).toBe(before);

    const c = await cli(["job", "cancel", id], { env: env() });
    expect(c.code).toBe(0);
    await Bun.sleep(300);
    expect(isRunning(runnerLookalike)).toBe(true);
    expect(isRunning(childLookalike)).toBe(true);
    const after = json((await cli(["job", "status", id, "--json"], { env: env() })).stdout);
    expect(after.state).toBe("cancelled");
    expect(after.events.find((e: any) => e.type === "job.cancelled").data.child).toBe("gone");
  });

  test("a record without start times (written before they were kept) is shown as recorded and never signalled", async () => {
    const lookalike = unrelated();
    await until("started", () => processStartTime(lookalike) !== null);
    const id = recordJob({ runnerPid: lookalike, childPid: lookalike });
    const before = snapshot();
    const { status } = await allReads(id, false); // logs --follow would wait on a job shown running
    expect(status.state).toBe("running");
    expect(snapshot()).toBe(before);
    const c = await cli(["job", "cancel", id], { env: env() });
    expect(c.code).toBe(1);
    expect(c.stderr).toContain("without a start time");
    await Bun.sleep(300);
    expect(isRunning(lookalike)).toBe(true);
    expect(row(id).state).toBe("running");
  });
});

describe("the job store's schema", () => {
  test("a database from before start times gets the columns on the first write, keeping its jobs; reads leave it as it is", async () => {
    const home = join(box.root, "old-home");
    mkdirSync(join(home, "jobs"), { recursive: true });
    const path = join(home, "jobs", "jobs.db");
    const old = new Database(path, { create: true });
    old.exec("PRAGMA journal_mode = WAL");
    old.exec(`CREATE TABLE jobs (
      id TEXT PRIMARY KEY, name TEXT NOT NULL, state TEXT NOT NULL, created REAL NOT NULL, updated REAL NOT NULL,
      spec TEXT NOT NULL, exit_code INTEGER, runner_pid INTEGER, child_pid INTEGER, env_key TEXT, error TEXT);
      CREATE TABLE events (seq INTEGER PRIMARY KEY AUTOINCREMENT, job_id TEXT NOT NULL, ts REAL NOT NULL, type TEXT NOT NULL, data TEXT NOT NULL);`);
    const spec = { name: "old", argv: ["true"], commandText: "true", workdir: work, env: {}, environment: { specs: [], extraIndexUrls: [], findLinks: [] }, resources: { gpus: 0, frameworks: {} } };
    old.query("INSERT INTO jobs (id, name, state, created, updated, spec, exit_code) VALUES ('00000000000000aa', 'old', 'succeeded', ?, ?, ?, 0)").run(Date.now(), Date.now(), JSON.stringify(spec));
    old.close();
    const columns = () => {
      const db = new Database(path, { readonly: true });
      const names = (db.query("PRAGMA table_info(jobs)").all() as { name: string }[]).map((c) => c.name);
      db.close();
      return names;
    };
    const oldEnv = { ...env(), GPULAYER_HOME: home };
    const list = await cli(["job", "list", "--json"], { env: oldEnv });
    expect(list.code).toBe(0);
    expect(json(list.stdout).map((j: any) => j.id)).toEqual(["00000000000000aa"]);
    expect(columns()).not.toContain("runner_start");

    const r = await cli(["job", "run", "--", "true"], { env: oldEnv, cwd: work });
    expect(r.code).toBe(0);
    expect(columns()).toEqual(expect.arrayContaining(["runner_start", "child_start", "pid_boot"]));
    const after = json((await cli(["job", "list", "--json"], { env: oldEnv })).stdout);
    expect(after.map((j: any) => j.state)).toEqual(["succeeded", "succeeded"]);
  });

  test("reads on a home with no jobs yet create nothing", async () => {
    const home = join(box.root, "empty-home");
    mkdirSync(home);
    const list = await cli(["job", "list"], { env: { ...env(), GPULAYER_HOME: home } });
    expect(list.code).toBe(0);
    expect(list.stdout).toContain("no jobs yet");
    const status = await cli(["job", "status", "abc123"], { env: { ...env(), GPULAYER_HOME: home } });
    expect(status.code).toBe(1);
    expect(existsSync(join(home, "jobs"))).toBe(false);
  });
});
