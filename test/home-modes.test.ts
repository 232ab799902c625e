import { afterAll, beforeAll, describe, expect, test } from "bun:test";
import { chmodSync, lstatSync, mkdirSync, readdirSync, statSync, writeFileSync } from "node:fs";
import { join } from "node:path";
import { cli, sandbox, serversOnPostgres, startCli } from "./helpers.ts";
import { type Kept, keepOutput, stopAll, waitFor } from "./fixtures/processes.ts";

/**
 * One user's jobs are that user's: another local user (`gpl-other`, made
 * with useradd) tries to read every file under a client's, a worker's and a
 * server's home, each made by gpulayer started with umask 022, after jobs
 * with environment values and output, and reads none; every file there is
 * 0600 and every folder 0700, but the envs, opened to readers on purpose.
 * A job's own files keep the caller's umask. A token on `server`'s command
 * line is refused, and `join --run-as` refuses a Python its user cannot run.
 */

const TOKEN = "home-modes-test-token-0123456789";
const SECRET = "env-value-6f1d-not-for-others";
const OUTPUT = "job-output-93b2-not-for-others";
const FAST = { GPULAYER_HEARTBEAT_SECONDS: "0.3", GPULAYER_WORKER_LOST_SECONDS: "10", GPULAYER_WORKER_ENGINE: "none", GPULAYER_CANCEL_GRACE: "1", GPULAYER_WORKER_DRAIN_SECONDS: "1" };
const T = 180_000;
const IS_ROOT = process.getuid?.() === 0;
const OTHER = "gpl-other";
/** A Python every user can run (python3 on PATH may be under /root, as pyenv's is). */
const SYSTEM_PYTHON = "/usr/bin/python3";
const box = sandbox();
const homeOf = (name: string) => join(box.root, `${name}-home`);
const procs: Kept[] = [];
let url = "";

const gpl = (args: string[], cwd = box.root) => cli(args, { env: { ...box.env, GPULAYER_SERVER: url, GPULAYER_TOKEN: TOKEN }, cwd });

/** Every file under `dir`, links left out. */
function filesUnder(dir: string): string[] {
  const out: string[] = [];
  for (const n of readdirSync(dir)) {
    const p = join(dir, n);
    const st = lstatSync(p);
    if (st.isDirectory()) out.push(...filesUnder(p));
    else if (!st.isSymbolicLink()) out.push(p);
  }
  return out;
}

/** Folders and files under `home` that others may read, enter or write: none, but inside an env of the store (envs-v1/KEY). */
function openToOthers(home: string): string[] {
  const open: string[] = [];
  const walk = (p: string) => {
    const st = lstatSync(p);
    if (st.isSymbolicLink()) return;
    if (/\/envs-v1\/[^/]+/.test(p.slice(home.length))) return;
    // A --run-as user's own caches (users/<uid>, theirs and 0700), and the bytecode store (its files are the envs' own
    // .pyc files, linked, as readable as the envs): what is inside is closed by that folder.
    if (/^\/users\/\d+$|^\/bytecode-v1$/.test(p.slice(home.length))) {
      if (st.mode & 0o077) open.push(`${(st.mode & 0o777).toString(8)} ${p.slice(home.length)}`);
      return;
    }
    if (st.mode & 0o077) open.push(`${(st.mode & 0o777).toString(8)} ${p.slice(home.length)}`);
    if (st.isDirectory()) for (const n of readdirSync(p)) walk(join(p, n));
  };
  walk(home);
  return open;
}

/** The files of `files` that `user` can read (cat, as that user alone: no groups). */
function readableBy(user: string, files: string[]): string[] {
  const id = Bun.spawnSync(["id", "-u", user], { stdout: "pipe" }).stdout.toString().trim();
  const gid = Bun.spawnSync(["id", "-g", user], { stdout: "pipe" }).stdout.toString().trim();
  const r = Bun.spawnSync(["setpriv", `--reuid=${id}`, `--regid=${gid}`, "--clear-groups", "--", "sh", "-c", 'for f; do cat "$f" >/dev/null 2>&1 && echo "$f"; done; true', "sh", ...files], { stdout: "pipe", stderr: "pipe" });
  if (r.exitCode !== 0) throw new Error(r.stderr.toString());
  return r.stdout.toString().split("\n").filter(Boolean);
}

beforeAll(async () => {
  // Whatever the test runner had: gpulayer is started with the usual 022 and must close its files itself.
  process.umask(0o022);
  // Others may enter the sandbox: only the homes' own modes keep them out.
  chmodSync(box.root, 0o755);
  if (IS_ROOT && Bun.spawnSync(["id", OTHER], { stdout: "ignore", stderr: "ignore" }).exitCode !== 0) {
    const made = Bun.spawnSync(["useradd", "--system", "--no-create-home", "--shell", "/usr/sbin/nologin", OTHER], { stderr: "pipe" });
    if (made.exitCode !== 0) throw new Error(`useradd ${OTHER}: ${made.stderr.toString()}`);
  }
  const server = keepOutput(startCli(["server", "--listen", "127.0.0.1:0", "--json"], { env: { ...box.env, ...FAST, GPULAYER_TOKEN: TOKEN, GPULAYER_HOME: homeOf("server") } }), procs);
  url = await waitFor("the server", () => /"url": "([^"]+)"/.exec(server.out())?.[1]);
}, T);

afterAll(async () => {
  await stopAll(procs);
  box.cleanup();
}, 30_000);

// Skipped only when not root: another local user is made with useradd, and files are read as that user (setpriv); CI runs as root.
describe.skipIf(!IS_ROOT)("another local user", () => {
  test("reads nothing under a client's home after a job with an environment value and output; the job's own file keeps the caller's umask", async () => {
    const env = { ...box.env, GPULAYER_HOME: homeOf("client") };
    const work = join(box.root, "client-work");
    mkdirSync(work);
    const r = await cli(["job", "run", "--python", "python3", "-e", `SECRET=${SECRET}`, "--", "sh", "-c", `echo "$SECRET ${OUTPUT}"; echo made > made-by-the-job; umask`], { env, cwd: work });
    expect(r.code, r.stderr).toBe(0);
    expect(r.stdout).toContain(`${SECRET} ${OUTPUT}`);
    expect(r.stdout).toContain("0022");
    expect((statSync(join(work, "made-by-the-job")).mode & 0o777).toString(8)).toBe("644");
    expect(openToOthers(homeOf("client"))).toEqual([]);
    const files = filesUnder(homeOf("client"));
    expect(files.some((f) => f.endsWith("/jobs/jobs.db"))).toBe(true);
    expect(files.some((f) => f.endsWith(".log"))).toBe(true);
    expect(readableBy(OTHER, files)).toEqual([]);
  }, T);

  // Not on PostgreSQL: what is read here is the server's SQLite database and WAL under its home; on PostgreSQL they are the database server's.
  test.skipIf(serversOnPostgres)("reads nothing under a server's home (its database and WAL) nor a worker's, after a remote job", async () => {
    const w = keepOutput(startCli(["join", url, "--name", "w1", "--python", "python3", "--label", "who=w1"], { env: { ...box.env, ...FAST, GPULAYER_TOKEN: TOKEN, GPULAYER_HOME: homeOf("w1") } }), procs);
    await waitFor("w1 to join", () => w.out().includes("as w1"));
    const r = await gpl(["job", "run", "--label", "who=w1", "-e", `SECRET=${SECRET}`, "--", "sh", "-c", `echo "$SECRET ${OUTPUT}"`]);
    expect(r.code, r.stderr).toBe(0);
    expect(r.stdout).toContain(`${SECRET} ${OUTPUT}`);
    for (const home of [homeOf("server"), homeOf("w1")]) {
      expect(openToOthers(home)).toEqual([]);
      const files = filesUnder(home);
      expect(files.length).toBeGreaterThan(0);
      expect(readableBy(OTHER, files)).toEqual([]);
    }
    const serverFiles = filesUnder(homeOf("server")).map((f) => f.slice(homeOf("server").length));
    expect(serverFiles).toContain("/server/server.db");
    expect(serverFiles).toContain("/server/server.db-wal");
  }, T);

  test("with --run-as, reads nothing under the worker's home but its envs; the job's user runs the env's Python", async () => {
    const home = homeOf("w2");
    const w = keepOutput(startCli(["join", url, "--name", "w2", "--python", SYSTEM_PYTHON, "--label", "who=w2", "--run-as", "nobody"], { env: { ...box.env, ...FAST, GPULAYER_TOKEN: TOKEN, GPULAYER_HOME: home } }), procs);
    await waitFor("w2 to join", () => w.out().includes("as w2")).catch((e) => {
      throw new Error(`${e.message}: ${w.out()}`);
    });
    const r = await gpl(["job", "run", "--label", "who=w2", "-e", `SECRET=${SECRET}`, "--", "python", "-c", `import os, sys; print(os.getuid(), sys.prefix, os.environ["SECRET"], "${OUTPUT}")`]);
    expect(r.code, r.stderr).toBe(0);
    expect(r.stdout).toContain(`65534 ${join(home, "envs-v1")}`);
    // Opened on purpose, and only these: the way to the env store and to the job workdirs (each its job user's).
    expect(openToOthers(home).sort()).toEqual(["711 ", "711 /cluster", "711 /users", "755 /cluster/work", "755 /envs-v1"]);
    const files = filesUnder(home);
    expect(files.some((f) => f.includes("/envs-v1/"))).toBe(true);
    expect(readableBy(OTHER, files).filter((f) => !f.startsWith(join(home, "envs-v1")))).toEqual([]);
  }, T);
});

describe("tokens and the job user", () => {
  test("server --token is refused: the token would be in /proc/PID/cmdline", async () => {
    const r = await cli(["server", "--listen", "127.0.0.1:0", "--token", TOKEN], { env: { ...box.env, GPULAYER_HOME: homeOf("refused") } });
    expect(r.code).toBe(2);
    expect(r.stderr.trim().split("\n")).toEqual(["error: server --token: a token on the command line can be read by every process on this machine (/proc/PID/cmdline), jobs included; use --token-file FILE, --token-file - (standard input) or GPULAYER_TOKEN"]);
  });

  test("a worker whose jobs run as its own user says they can read its token file", async () => {
    const tokenFile = join(box.root, "w3.token");
    writeFileSync(tokenFile, `${TOKEN}\n`, { mode: 0o600 });
    const w = keepOutput(startCli(["join", url, "--token-file", tokenFile, "--name", "w3", "--python", "python3"], { env: { ...box.env, ...FAST, GPULAYER_HOME: homeOf("w3") } }), procs);
    await waitFor("w3 to join", () => w.out().includes("as w3"));
    expect(w.out()).toContain(`jobs run as this worker's own user, who can read ${tokenFile}: any job can read the join token there`);
  }, T);

  // Skipped only when not root: --run-as needs the worker as root; CI runs as root.
  test.skipIf(!IS_ROOT)("join --run-as refuses a Python under a folder its user cannot enter, naming the folder", async () => {
    const closed = join(box.root, "closed");
    mkdirSync(closed);
    chmodSync(closed, 0o700);
    // A venv of a Python nobody may run, inside a folder nobody may enter.
    const made = Bun.spawnSync([SYSTEM_PYTHON, "-m", "venv", "--without-pip", join(closed, "venv")], { stderr: "pipe" });
    expect(made.exitCode, made.stderr.toString()).toBe(0);
    const python = join(closed, "venv", "bin", "python");
    const r = await cli(["join", url, "--name", "w4", "--python", python, "--run-as", "nobody"], { env: { ...box.env, ...FAST, GPULAYER_TOKEN: TOKEN, GPULAYER_HOME: homeOf("w4") } });
    expect(r.code).toBe(2);
    expect(r.stderr).toContain(`error: worker.run_as nobody: nobody cannot enter ${closed}, on the way to the worker's Python ${python}`);
    expect(r.stderr.trim().split("\n")).toHaveLength(1);
  }, T);
});
