import { afterAll, beforeAll, describe, expect, test } from "bun:test";
import { chmodSync, mkdirSync, writeFileSync } from "node:fs";
import { join } from "node:path";
import { listWorkdir, type PackProgress } from "../src/cluster/bundle.ts";
import { cli, makeWorkerVenv, sandbox, startCli } from "./helpers.ts";
import { keepOutput, stopAll, waitFor } from "./fixtures/processes.ts";

/**
 * What travels with `job run` through a server is explicit: no folder unless
 * --workdir or a job file names one; owner-only files and gpulayer homes stay.
 * A server and one worker as separate processes, as in cluster.test.ts.
 */

const TOKEN = "cluster-send-token-0123456789";
const FAST = { GPULAYER_HEARTBEAT_SECONDS: "0.5", GPULAYER_WORKER_LOST_SECONDS: "3", GPULAYER_WORKER_ENGINE: "none", GPULAYER_CANCEL_GRACE: "2", GPULAYER_WORKER_DRAIN_SECONDS: "2" };
const T = 90_000;
const boxes = { server: sandbox(), w1: sandbox(), client: sandbox() };
const procs: { proc: ReturnType<typeof startCli>; out: () => string }[] = [];
let url = "";

const json = <T = any>(text: string): T => JSON.parse(text) as T;
const keep = (proc: ReturnType<typeof startCli>) => keepOutput(proc, procs);
const clientEnv = () => ({ ...boxes.client.env, GPULAYER_SERVER: url, GPULAYER_TOKEN: TOKEN });
const gpl = (args: string[], cwd?: string) => cli(args, { env: clientEnv(), cwd: cwd ?? boxes.client.root });

beforeAll(async () => {
  const server = keep(startCli(["server", "--listen", "127.0.0.1:0", "--json"], { env: { GPULAYER_TOKEN: TOKEN, ...boxes.server.env, ...FAST } }));
  url = (await waitFor("the server", async () => /"url": "([^"]+)"/.exec(server.out())?.[1])) as string;
  const venv = await makeWorkerVenv(join(boxes.w1.root, "venv"), { env: boxes.w1.env });
  keep(startCli(["join", url, "--name", "w1", "--python", venv], { env: { ...boxes.w1.env, ...FAST, GPULAYER_TOKEN: TOKEN } }));
  await waitFor("the worker", async () => (json((await gpl(["workers", "--json"])).stdout) as unknown[]).length === 1);
}, T);

afterAll(async () => {
  await stopAll(procs);
  for (const b of Object.values(boxes)) b.cleanup();
}, 30_000);

describe("what travels", () => {
  test("without --workdir or a job file, no folder is sent: the job runs in an empty folder, and says so", async () => {
    const dir = join(boxes.client.root, "cwd-with-files");
    mkdirSync(dir);
    writeFileSync(join(dir, "a.txt"), "a\n");
    writeFileSync(join(dir, "b.txt"), "b\n");
    const r = await gpl(["job", "run", "--", "sh", "-c", "ls -A | wc -l"], dir);
    expect(r.code).toBe(0);
    expect(r.stdout.trim()).toBe("0");
    expect(r.stderr).toContain("no --workdir or job file: the job runs in an empty folder on the worker; give --workdir . to send this folder");
    writeFileSync(join(dir, "requirements.txt"), "greet\n");
    const req = await gpl(["job", "run", "-r", "requirements.txt", "--", "true"], dir);
    expect(req.code).toBe(2);
    // One line: the refusal, not first the notice that the job would run in an empty folder.
    expect(req.stderr.trim()).toBe("error: -r needs its folder sent: give --workdir (the folder that holds the requirements file, e.g. --workdir .)");
    const sent = await gpl(["job", "run", "--workdir", ".", "--", "sh", "-c", "ls -A | wc -l"], dir);
    expect(sent.code).toBe(0);
    expect(sent.stdout.trim()).toBe("3");
  }, T);

  test("files only their owner may read are left out with a warning, unless .gpulayerignore names them with !", async () => {
    const dir = join(boxes.client.root, "with-secret");
    mkdirSync(dir);
    writeFileSync(join(dir, "plain.txt"), "plain\n");
    writeFileSync(join(dir, "secret.txt"), "secret\n");
    chmodSync(join(dir, "plain.txt"), 0o644);
    chmodSync(join(dir, "secret.txt"), 0o600);
    const r = await gpl(["job", "run", "--workdir", dir, "--", "ls"]);
    expect(r.code).toBe(0);
    expect(r.stdout).toBe("plain.txt\n");
    expect(r.stderr).toMatch(/not sent: 1 file only their owner may read: secret\.txt/);
    writeFileSync(join(dir, ".gpulayerignore"), "!secret.txt\n");
    const again = await gpl(["job", "run", "--workdir", dir, "--", "cat", "secret.txt"]);
    expect(again.code).toBe(0);
    expect(again.stdout).toBe("secret\n");
    expect(again.stderr).not.toContain("only their owner may read");
  }, T);

  test("env prepare --server packs the requirements' folder the same way: the owner-only file left out, said so", async () => {
    const dir = join(boxes.client.root, "prepare-secret");
    mkdirSync(dir);
    writeFileSync(join(dir, "requirements.txt"), "# nothing to install\n");
    writeFileSync(join(dir, "key.pem"), "secret\n");
    chmodSync(join(dir, "key.pem"), 0o600);
    const r = await gpl(["env", "prepare", join(dir, "requirements.txt")]);
    expect(r.code, r.stderr).toBe(0);
    expect(r.stderr).toMatch(/not sent: 1 file only their owner may read: key\.pem/);
  }, T);

  test("a folder that holds a gpulayer home is refused, naming it", async () => {
    const dir = join(boxes.client.root, "holds-home");
    mkdirSync(join(dir, "dot-gpulayer", "envs-v1"), { recursive: true });
    mkdirSync(join(dir, "dot-gpulayer", "jobs"), { recursive: true });
    writeFileSync(join(dir, "main.py"), "print(1)\n");
    const r = await gpl(["job", "run", "--workdir", dir, "--", "true"]);
    expect(r.code).toBe(2);
    expect(r.stderr).toContain("gpulayer home at dot-gpulayer");
    expect(r.stderr.trim().split("\n")).toHaveLength(1);
  }, T);
});

describe("packing", () => {
  test("a big folder reports entries and bytes as it goes", () => {
    const dir = join(boxes.client.root, "many");
    mkdirSync(dir);
    for (let i = 0; i < 2500; i++) writeFileSync(join(dir, `f${i}.txt`), "x");
    const seen: PackProgress[] = [];
    const list = listWorkdir(dir, (p) => seen.push(p));
    expect(list.entries).toHaveLength(2500);
    expect(seen.map((p) => p.entries)).toEqual([1000, 2000]);
    expect(seen[1]!.bytes).toBeGreaterThanOrEqual(1999);
  }, 60_000); // 2,500 files written and walked: seconds on a loaded machine, not the default 5

  test("a gpulayer home at the root, or by its token, is refused; one left out by .gpulayerignore is not", () => {
    const home = join(boxes.client.root, "a-home");
    mkdirSync(join(home, "server"), { recursive: true });
    writeFileSync(join(home, "server", "token"), "t");
    expect(() => listWorkdir(home)).toThrow(/gpulayer home at \. \(it has server\/token\)/);
    const outer = join(boxes.client.root, "outer");
    mkdirSync(join(outer, "h", "cluster"), { recursive: true });
    writeFileSync(join(outer, "h", "cluster", "identity"), "i");
    expect(() => listWorkdir(outer)).toThrow(/gpulayer home at h /);
    writeFileSync(join(outer, ".gpulayerignore"), "h/\n");
    expect(listWorkdir(outer).entries).toEqual([".gpulayerignore"]);
    // A server's home without a token file (started with --token), a worker's with its outbox but no identity yet.
    for (const mark of ["server/server.db", "cluster/outbox.db"]) {
      const other = join(boxes.client.root, `home-by-${mark.replace("/", "-")}`);
      mkdirSync(join(other, "x", mark, ".."), { recursive: true });
      writeFileSync(join(other, "x", mark), "db");
      expect(() => listWorkdir(other)).toThrow(new RegExp(`gpulayer home at x \\(it has ${mark.replace(".", "\\.")}\\)`));
    }
  });
});

describe("bad input through a server: the same line and exit code as here", () => {
  test("an empty or malformed job id, for every command that takes one", async () => {
    const local = (args: string[]) => cli(args, { env: boxes.client.env, cwd: boxes.client.root });
    for (const id of ["", "zz", "../x"]) {
      for (const command of [["status"], ["logs"], ["cancel"], ["outputs", "-o", "out"]]) {
        const args = ["job", command[0]!, id, ...command.slice(1)];
        const [remote, here] = [await gpl(args), await local(args)];
        expect({ code: remote.code, stderr: remote.stderr, stdout: remote.stdout }).toEqual({ code: 2, stderr: here.stderr, stdout: "" });
        expect(remote.stderr).toMatch(/^error: (no job id given|not a job id: )/);
      }
    }
  }, T);

  test("a requirements file that is not there", async () => {
    const local = await cli(["env", "prepare", "nope.txt"], { env: boxes.client.env, cwd: boxes.client.root });
    const remote = await gpl(["env", "prepare", "nope.txt"]);
    expect({ code: remote.code, stderr: remote.stderr }).toEqual({ code: 2, stderr: "error: requirements file not found: nope.txt\n" });
    expect(local.stderr).toBe(remote.stderr);
  }, T);

  test("a malformed image reference, before a job is recorded or sent", async () => {
    const local = (args: string[]) => cli(args, { env: boxes.client.env, cwd: boxes.client.root });
    const jobs = async (run: typeof gpl) => (JSON.parse((await run(["job", "list", "--json"])).stdout) as unknown[]).length;
    const before = [await jobs(gpl), await jobs(local)];
    const args = ["job", "run", "--image", "Bad Ref!!", "--", "true"];
    const [remote, here] = [await gpl(args), await local(args)];
    expect({ code: remote.code, stderr: remote.stderr }).toEqual({ code: 2, stderr: 'error: not an image reference: "Bad Ref!!" (expected [registry/]name[:tag][@sha256:digest])\n' });
    expect(here.stderr).toBe(remote.stderr);
    expect([await jobs(gpl), await jobs(local)]).toEqual(before);
  }, T);

  test("an invalid requirement in a job file's list is named by its key there, on the worker as here", async () => {
    const dir = join(boxes.client.root, "bad-requirement");
    mkdirSync(dir, { recursive: true });
    writeFileSync(join(dir, "job.yaml"), 'command: "true"\nenvironment:\n  requirements: [six, "this is not a requirement"]\n');
    const remote = await gpl(["job", "run", "-f", "job.yaml"], dir);
    expect(remote.code).toBe(1);
    expect(remote.stderr.trim().split("\n").at(-1)).toMatch(/^error: task\.prepare failed on w1: job\.yaml: environment\.requirements\[1\]: invalid requirement 'this is not a requirement'/);
  }, T);

  test("job list --limit that is not a whole number of at least 1", async () => {
    const local = (args: string[]) => cli(args, { env: boxes.client.env, cwd: boxes.client.root });
    for (const limit of ["1.5", "abc", "0"]) {
      const [remote, here] = [await gpl(["job", "list", "--limit", limit]), await local(["job", "list", "--limit", limit])];
      expect({ code: remote.code, stderr: remote.stderr }).toEqual({ code: 2, stderr: `error: --limit takes a whole number of at least 1, not ${JSON.stringify(limit)}\n` });
      expect(here.stderr).toBe(remote.stderr);
    }
  }, T);
});
