import { afterAll, beforeAll, describe, expect, setDefaultTimeout, test } from "bun:test";

// Real pip builds and real containers on a busy 2-core machine: seconds, not milliseconds.
setDefaultTimeout(120_000);
import { existsSync, readdirSync, readFileSync, writeFileSync, mkdirSync } from "node:fs";
import { join } from "node:path";
import { PackageIndex } from "./fixtures/index.ts";
import { CLI_ARGV, cli, sandbox, startCli } from "./helpers.ts";

const box = sandbox();
const index = new PackageIndex(join(box.root, "index"));
const work = join(box.root, "work");

beforeAll(() => {
  mkdirSync(work);
  index.start();
  index.wheel({ name: "greet", version: "1.0", files: { "greet/hello.py": "def hello():\n    return 'hello from greet'\n" } });
});
afterAll(() => {
  index.stop();
  box.cleanup();
});

const env = () => box.env;

/** Alive and not a zombie (an orphan killed here may wait for a reaper that never comes). */
function isRunning(pid: number): boolean {
  try {
    const stat = readFileSync(`/proc/${pid}/stat`, "utf8");
    return stat.slice(stat.lastIndexOf(")") + 2, stat.lastIndexOf(")") + 3) !== "Z";
  } catch {
    return false;
  }
}
const json = <T = any>(text: string): T => JSON.parse(text) as T;

async function lastJob(): Promise<any> {
  const list = await cli(["job", "list", "--json"], { env: env() });
  return json(list.stdout)[0];
}

describe("job run", () => {
  test("streams output, passes the exit code through, and records both phases", async () => {
    const r = await cli(["job", "run", "-p", "greet", "--index-url", index.url, "--", "python", "-c", "import greet.hello as h, sys; print(h.hello()); sys.exit(7)"], { env: env(), cwd: work });
    expect(r.stdout).toContain("hello from greet");
    expect(r.code).toBe(7);
    const first = await lastJob();
    expect(first.state).toBe("failed");
    expect(first.exit_code).toBe(7);

    const again = await cli(["job", "run", "-p", "greet", "--index-url", index.url, "--", "python", "-c", "print('second')"], { env: env(), cwd: work });
    expect(again.code).toBe(0);
    const second = await lastJob();
    const s1 = json((await cli(["job", "status", first.id, "--json"], { env: env() })).stdout);
    const s2 = json((await cli(["job", "status", second.id.slice(0, 6), "--json"], { env: env() })).stdout);
    const phase = (s: any, n: string) => s.phases.find((p: any) => p.name === n);
    expect(phase(s1, "task.prepare").cache).toBe("miss");
    expect(phase(s2, "task.prepare").cache).toBe("hit");
    expect(phase(s2, "task.prepare").env_key).toBe(phase(s1, "task.prepare").env_key);
    for (const s of [s1, s2]) {
      expect(typeof phase(s, "task.prepare").seconds).toBe("number");
      expect(typeof phase(s, "task.run").seconds).toBe("number");
    }
    expect(s2.events.map((e: any) => e.type)).toEqual(["job.submitted", "task.prepare.started", "task.prepare.finished", "task.run.started", "task.run.finished"]);
    const logs = await cli(["job", "logs", first.id], { env: env() });
    expect(logs.stdout).toContain("hello from greet");
  });

  test("--json prints the status document alone on stdout; the job's output goes to stderr", async () => {
    const r = await cli(["job", "run", "--json", "-p", "greet", "--index-url", index.url, "--", "sh", "-c", "echo to-stdout"], { env: env(), cwd: work });
    expect(r.code).toBe(0);
    const doc = json(r.stdout);
    expect(doc.state).toBe("succeeded");
    expect(doc.phases.map((p: any) => p.name)).toEqual(["task.prepare", "task.run"]);
    expect(r.stderr).toContain("to-stdout");
  });

  test("the job runs in its env: bin first on PATH, VIRTUAL_ENV set, env applied, in workdir", async () => {
    const dir = join(box.root, "wd");
    mkdirSync(dir);
    writeFileSync(join(dir, "job.yaml"), `name: probe\ncommand: ["python", "-c", "import os,sys; print(os.getcwd()); print(os.environ['VIRTUAL_ENV']); print(sys.prefix); print(os.environ['GREETING'])"]\nenv: {GREETING: hi-there}\nenvironment:\n  requirements: [greet]\n  index_url: ${index.url}\n`);
    const r = await cli(["job", "run", "-f", join(dir, "job.yaml")], { env: env(), cwd: work });
    expect(r.code).toBe(0);
    const [cwd, venv, prefix, greeting] = r.stdout.trim().split("\n");
    expect(cwd).toBe(dir);
    expect(venv).toBe(prefix);
    expect(venv).toContain(join(box.home, "envs-v1"));
    expect(greeting).toBe("hi-there");
  });

  test("a job whose requirement is missing never runs its command and fails in task.prepare", async () => {
    const marker = join(box.root, "must-not-exist");
    const r = await cli(["job", "run", "-p", "nosuchpkg-gpl", "--index-url", index.url, "--", "touch", marker], { env: env(), cwd: work });
    expect(r.code).not.toBe(0);
    expect(r.stderr).toContain("nosuchpkg-gpl");
    expect(existsSync(marker)).toBe(false);
    const s = json((await cli(["job", "status", (await lastJob()).id, "--json"], { env: env() })).stdout);
    expect(s.state).toBe("failed");
    const failed = s.events.find((e: any) => e.type === "task.prepare.failed");
    expect(failed.data.message).toContain("nosuchpkg-gpl");
    expect(s.events.some((e: any) => e.type === "task.run.started")).toBe(false);
  });

  test("cancel stops the whole process group, children included, and records cancelled", async () => {
    const pidFile = join(box.root, "child.pid");
    const r = await cli(["job", "run", "--detach", "-p", "greet", "--index-url", index.url, "--", "sh", "-c", `sleep 300 & echo $! > ${pidFile}; wait`], { env: env(), cwd: work });
    expect(r.code).toBe(0);
    const id = r.stdout.trim();
    expect(id).toMatch(/^[0-9a-f]{16}$/);
    // The shell makes the file before echo writes the pid into it: wait for the pid itself.
    const pidIn = () => (existsSync(pidFile) ? readFileSync(pidFile, "utf8").trim() : "");
    for (let i = 0; i < 200 && !pidIn(); i++) await Bun.sleep(50);
    const childPid = Number(pidIn());
    expect(isRunning(childPid)).toBe(true);
    // While it runs, the job holds a lease on its env.
    const leases = readdirSync(join(box.home, "leases", "env"));
    expect(leases.length).toBeGreaterThan(0);
    const c = await cli(["job", "cancel", id], { env: { ...env(), GPULAYER_CANCEL_GRACE: "2" } });
    expect(c.code).toBe(0);
    expect(c.stdout).toContain("cancelled");
    await Bun.sleep(200);
    expect(isRunning(childPid)).toBe(false);
    const s = json((await cli(["job", "status", id, "--json"], { env: env() })).stdout);
    expect(s.state).toBe("cancelled");
    expect(s.events.some((e: any) => e.type === "job.cancelled")).toBe(true);
  });

  test("Ctrl-C (SIGINT) on job run cancels the job and exits 130; the command's own code (143, the cancel's SIGTERM) is recorded", async () => {
    const proc = startCli(["job", "run", "-p", "greet", "--index-url", index.url, "--", "sh", "-c", "echo started; sleep 300"], { env: { ...env(), GPULAYER_CANCEL_GRACE: "1" }, cwd: work });
    const reader = proc.stdout.getReader();
    const { value } = await reader.read();
    expect(new TextDecoder().decode(value)).toContain("started");
    proc.kill("SIGINT");
    expect(await proc.exited).toBe(130);
    const s = json((await cli(["job", "status", (await lastJob()).id, "--json"], { env: env() })).stdout);
    expect([s.state, s.exit_code]).toEqual(["cancelled", 143]);
  });

  test("a reader that goes away (| head) cancels the job, never orphans it", async () => {
    const proc = startCli(["job", "run", "-p", "greet", "--index-url", index.url, "--", "sh", "-c", "while true; do echo tick; sleep 0.05; done"], { env: { ...env(), GPULAYER_CANCEL_GRACE: "1" }, cwd: work });
    const reader = proc.stdout.getReader();
    const { value } = await reader.read();
    expect(new TextDecoder().decode(value)).toContain("tick");
    await reader.cancel(); // closes our end of the pipe, as `head` does once it has its lines
    const code = await proc.exited;
    expect(code).not.toBe(0);
    const s = json((await cli(["job", "status", (await lastJob()).id, "--json"], { env: env() })).stdout);
    expect(s.state).toBe("cancelled");
    expect(s.events.find((e: any) => e.type === "job.cancelled").data.reason).toBe("stdout closed");
  });

  test("--detach and logs --follow", async () => {
    const r = await cli(["job", "run", "-d", "-p", "greet", "--index-url", index.url, "--", "sh", "-c", "echo one; sleep 1; echo two"], { env: env(), cwd: work });
    const id = r.stdout.trim();
    const logs = await cli(["job", "logs", id, "--follow"], { env: env() });
    expect(logs.stdout).toBe("one\ntwo\n");
    const s = json((await cli(["job", "status", id, "--json"], { env: env() })).stdout);
    expect(s.state).toBe("succeeded");
  });

  test("logs --follow exits with the job's own exit code, as job run does", async () => {
    const id = (await cli(["job", "run", "-d", "--", "sh", "-c", "echo before; sleep 0.5; exit 7"], { env: env(), cwd: work })).stdout.trim();
    const followed = await cli(["job", "logs", id, "--follow"], { env: env() });
    expect(followed.stdout).toBe("before\n");
    expect(followed.code).toBe(7);
    // Without --follow it prints what there is, and says nothing of the job's end.
    expect((await cli(["job", "logs", id], { env: env() })).code).toBe(0);
  });

  test("two jobs with the same new requirements at once build the environment once", async () => {
    const counter = join(box.root, "builds.txt");
    index.sdist({ name: "slowbuild", version: "1.0", counter });
    const args = ["job", "run", "-p", "slowbuild", "--index-url", index.url, "--", "python", "-c", "import slowbuild; print(slowbuild.__version__)"];
    const [a, b] = await Promise.all([cli(args, { env: env(), cwd: work }), cli(args, { env: env(), cwd: work })]);
    expect([a.code, b.code]).toEqual([0, 0]);
    expect(a.stdout.trim()).toBe("1.0");
    expect(b.stdout.trim()).toBe("1.0");
    expect(readFileSync(counter, "utf8").trim().split("\n")).toHaveLength(1);
  });

  // A job's record is written as its command starts (jobs/store.ts holdWrites): the command, and anyone asking, finds it there.
  test("a running job finds its own record: running, its prepare before its run", async () => {
    const seen = join(box.root, "self-status.json");
    const gpulayer = CLI_ARGV.map((a) => `'${a}'`).join(" ");
    const r = await cli(["job", "run", "--", "sh", "-c", `${gpulayer} job status "$GPULAYER_JOB_ID" --json > ${seen}`], { env: env(), cwd: work });
    expect(r.code).toBe(0);
    const s = json(readFileSync(seen, "utf8"));
    expect(s.state).toBe("running");
    const phases = s.events.map((e: any) => e.type).filter((t: string) => t !== "task.prepare.step");
    expect(phases).toEqual(["job.submitted", "task.prepare.started", "task.prepare.finished", "task.run.started"]);
    const after = json((await cli(["job", "status", s.id, "--json"], { env: env() })).stdout);
    expect(after.state).toBe("succeeded");
  });

  test("a job whose env is still building is listed as preparing", async () => {
    const counter = join(box.root, "long-build.txt");
    index.sdist({ name: "longbuild", version: "1.0", counter, sleep: 600 });
    const runner = startCli(["job", "run", "-p", "longbuild", "--index-url", index.url, "--", "true"], { env: env(), cwd: work });
    try {
      for (let i = 0; i < 600 && !existsSync(counter); i++) await Bun.sleep(50);
      expect(existsSync(counter)).toBe(true);
      const listed = json((await cli(["job", "list", "--json"], { env: env() })).stdout)[0];
      expect(listed.command).toContain("true");
      expect(listed.state).toBe("preparing");
    } finally {
      // Ctrl-C: the cancel ends the build's installer too (a SIGKILL would leave it building on, for the next prepare to end).
      runner.kill("SIGINT");
      expect(await runner.exited).toBe(130);
    }
  });
});

describe("job file errors name the key path, and nothing runs", () => {
  const cases: [string, string, string][] = [
    ["unknown key", "command: echo hi\nenvironmnt: {}\n", "environmnt: unknown key"],
    ["unknown nested key", "command: echo hi\nenvironment: {requirement: x}\n", "environment.requirement: unknown key"],
    ["wrong type", "command: echo hi\nresources: {gpus: two}\n", "resources.gpus"],
    ["missing requirements file", "command: echo hi\nenvironment: {requirements: req.txt}\n", "environment.requirements: file not found: req.txt"],
    ["a folder as the requirements file", "command: echo hi\nenvironment: {requirements: .}\n", "environment.requirements: . is a directory, not a requirements file"],
    ["a list where a mapping goes", "command: echo hi\nenvironment: [a]\n", "job.yaml: environment: expected a mapping, got a list"],
    ["bad env name", "command: echo hi\nenv: {'1X': y}\n", "env.1X"],
    ["bad framework specifier", "command: echo hi\nresources: {frameworks: {torch: '>>2'}}\n", "resources.frameworks.torch"],
    ["no command", "name: x\n", "command: is required"],
  ];
  for (const [label, yaml, message] of cases) {
    test(label, async () => {
      const dir = join(box.root, `bad-${label.replace(/\W+/g, "-")}`);
      mkdirSync(dir);
      writeFileSync(join(dir, "job.yaml"), yaml);
      const r = await cli(["job", "run", "-f", join(dir, "job.yaml")], { env: env(), cwd: dir });
      expect(r.code).toBe(2);
      expect(r.stderr).toContain(message);
      expect(r.stderr.trim().split("\n")).toHaveLength(1);
    });
  }

  test("a stray argument before -- is refused with a hint", async () => {
    const r = await cli(["job", "run", "-p", "greet", "python", "x.py"], { env: env(), cwd: work });
    expect(r.code).toBe(2);
    expect(r.stderr).toContain("after --");
  });
});
