import { afterAll, describe, expect, setDefaultTimeout, test } from "bun:test";

setDefaultTimeout(120_000);
import { mkdirSync, writeFileSync } from "node:fs";
import { join } from "node:path";
import { printable } from "../src/ui/escape.ts";
import { parseJobYaml } from "../src/config/yaml.ts";
import { cli, sandbox } from "./helpers.ts";

/** Bad input at the edges: job files too big or not files at all, and names and commands that would forge lines. */

const box = sandbox();
const work = join(box.root, "work");
mkdirSync(work);
const env = () => box.env;
afterAll(() => box.cleanup());

describe("job files past the limit, or not regular files, are refused before reading", () => {
  test("a 2 MB job file: one line naming the file, its size and the limit; exit 2, at once", async () => {
    const path = join(work, "big.yaml");
    const head = "name: big\ncommand: echo hi\n# ";
    writeFileSync(path, `${head}${"x".repeat(2 * 1024 * 1024 - head.length - 1)}\n`); // 2 MiB exactly
    const started = performance.now();
    const r = await cli(["job", "run", "-f", path], { env: env(), cwd: work });
    const seconds = (performance.now() - started) / 1000;
    expect(r.code).toBe(2);
    const lines = r.stderr.trim().split("\n");
    expect(lines).toHaveLength(1);
    expect(lines[0]).toContain(path);
    expect(lines[0]).toContain("2.0 MiB (2097152 bytes)");
    expect(lines[0]).toContain("the limit is 1.0 MiB (1048576 bytes)");
    expect(seconds).toBeLessThan(15); // a CLI start on a busy machine; parsing 2 MB of YAML is what is not done
  });

  test("a file just under the limit is read", async () => {
    const path = join(work, "fits.yaml");
    writeFileSync(path, `name: fits\ncommand: [echo, fits]\n#${"y".repeat(1024 * 1024 - 40)}\n`);
    const r = await cli(["job", "run", "-f", path], { env: env(), cwd: work });
    expect(r.stderr).not.toContain("limit");
    expect(r.code).toBe(0);
    expect(r.stdout).toContain("fits");
  });

  test("a FIFO and /dev/zero are refused (never opened to wait or read forever); exit 2", async () => {
    const fifo = join(work, "pipe.yaml");
    expect(Bun.spawnSync(["mkfifo", fifo]).exitCode).toBe(0);
    for (const [path, kind] of [
      [fifo, "a FIFO"],
      ["/dev/zero", "a character device"],
      [work, "a directory"],
    ] as const) {
      const r = await cli(["job", "run", "-f", path], { env: env(), cwd: work });
      expect(r.code).toBe(2);
      expect(r.stderr).toContain(`job file ${path} is ${kind}, not a regular file`);
      expect(r.stderr.trim().split("\n")).toHaveLength(1);
    }
    const missing = await cli(["job", "run", "-f", join(work, "nope.yaml")], { env: env(), cwd: work });
    expect(missing.code).toBe(2);
    expect(missing.stderr).toContain("job file not found");
  });
});

describe("names and commands never forge lines or drive the terminal", () => {
  const name = "a\nerror: forged";
  const script = "printf '\\033[2J'; echo done";

  test("printable escapes control characters and leaves the rest", () => {
    expect(printable("a\nb\r\t\x1b[2J\x00\x7f\u009b\u202e ok \\n é 日本")).toBe("a\\nb\\r\\t\\x1b[2J\\x00\\x7f\\x9b\\u202e ok \\n é 日本");
  });

  test("job list and job status show them escaped; --json keeps them exactly", async () => {
    const command = ["sh", "-c", `: "\x1b[2J"; ${script}`];
    const r = await cli(["job", "run", "--name", name, "--", ...command], { env: env(), cwd: work });
    expect(r.code).toBe(0);
    const [job] = JSON.parse((await cli(["job", "list", "--json"], { env: env() })).stdout);
    expect(job.name).toBe(name);
    expect(job.command).toContain("\x1b[2J");

    const list = await cli(["job", "list"], { env: env() });
    const status = await cli(["job", "status", job.id], { env: env() });
    for (const out of [list, status]) {
      expect(out.code).toBe(0);
      expect(out.stdout).toContain("a\\nerror: forged");
      expect(out.stdout).not.toContain("\x1b");
      expect(out.stdout.split("\n").some((l) => l.startsWith("error: forged"))).toBe(false);
    }
    expect(status.stdout).toContain(`job ${job.id} a\\nerror: forged: succeeded, exit 0`);
    // The command as a shell line (each word quoted as it must be), its control characters escaped.
    expect(status.stdout).toContain(`  command  sh -c ': "\\x1b[2J"; printf '"'"'\\033[2J'"'"'; echo done'`);
    // The table stays a table: one line per job, its columns aligned.
    const lines = list.stdout.trimEnd().split("\n");
    const row = lines.find((l) => l.startsWith(job.id))!;
    expect(row.indexOf("succeeded")).toBe(lines[0]!.indexOf("STATE"));
  });
});

describe("a command that is not there", () => {
  test("is said in gpulayer's words (not setpriv's), exit 127, in the job's record too; a path and a name each get theirs", async () => {
    for (const [command, why] of [
      ["no-such-command-here", "not found on the job's PATH (the env's bin first), or not executable"],
      ["./no-such-file", "no such file, or not executable"],
    ]) {
      const r = await cli(["job", "run", "--python", "python3", "--", command!], { env: env(), cwd: work });
      expect(r.code).toBe(127);
      expect(r.stderr).toContain(`gpulayer: cannot start ${command}: ${why}\n`);
      expect(r.stderr).not.toContain("setpriv");
      const id = /^job ([0-9a-f]{16})/m.exec(r.stderr)![1]!;
      const status = JSON.parse((await cli(["job", "status", id, "--json"], { env: env(), cwd: work })).stdout);
      expect([status.state, status.exit_code]).toEqual(["failed", 127]);
    }
  });
});

describe("a job file's variables", () => {
  test("are passed as written: YAML's numbers and booleans are not read as numbers first (1.10 stays 1.10); a task's too", async () => {
    const dir = join(work, "vars");
    mkdirSync(dir);
    const show = "python3 -c 'import os; print(*(os.environ[k] for k in (\"V\", \"H\", \"Z\", \"B\", \"Q\")))'";
    writeFileSync(join(dir, "job.yaml"), `command: ${JSON.stringify(show)}\nenv:\n  V: 1.10\n  H: 0x1F\n  Z: 007\n  B: yes\n  Q: "1.10"\n`);
    const r = await cli(["job", "run", "-f", "job.yaml"], { env: env(), cwd: dir });
    expect(r.code, r.stderr).toBe(0);
    expect(r.stdout).toBe("1.10 0x1F 007 yes 1.10\n");
    writeFileSync(join(dir, "tasks.yaml"), `tasks:\n  one:\n    command: ${JSON.stringify("python3 -c 'import os; print(os.environ[\"T\"])'")}\n    env: {T: 2.50}\n`);
    const t = await cli(["job", "run", "-f", "tasks.yaml"], { env: env(), cwd: dir });
    expect(t.code, t.stderr).toBe(0);
    expect(t.stdout).toBe("[one] 2.50\n");
    // Through an alias too (an env, or one variable), whatever YAML reads the anchor as where it stands.
    expect(parseJobYaml("name: &v 1.10\nenv: {V: *v}\ntasks:\n  a: {command: x, env: &e {T: 2.50}}\n  b: {command: y, env: *e}\n")).toEqual({ name: 1.1, env: { V: "1.10" }, tasks: { a: { command: "x", env: { T: "2.50" } }, b: { command: "y", env: { T: "2.50" } } } });
    // An empty value is no value: refused, naming it, as before.
    writeFileSync(join(dir, "empty.yaml"), "command: 'true'\nenv:\n  E:\n");
    const e = await cli(["job", "run", "-f", "empty.yaml"], { env: env(), cwd: dir });
    expect(e.code).toBe(2);
    expect(e.stderr).toContain("env.E");
  });
});
