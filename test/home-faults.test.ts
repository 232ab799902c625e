import { expect, test } from "bun:test";
import { chmodSync, existsSync, mkdirSync, readdirSync, writeFileSync } from "node:fs";
import { join } from "node:path";
import { writeFileAtomic } from "../src/core/atomic.ts";
import { CLI_ARGV, cli, sandbox, tempDir } from "./helpers.ts";

/**
 * A gpulayer home that is not as gpulayer left it: what it keeps only to save
 * later work (the interpreter probe) is not kept, and nothing is left behind
 * by a write that could not finish.
 */

test("a write that cannot end (a folder where the file goes) leaves no temp file behind", () => {
  const dir = tempDir("gpl-atomic-");
  mkdirSync(join(dir, "kept.json"));
  expect(() => writeFileAtomic(join(dir, "kept.json"), "{}")).toThrow();
  expect(() => writeFileAtomic(join(dir, "kept.json"), "{}")).toThrow();
  expect(readdirSync(dir)).toEqual(["kept.json"]);
});

test("a home where the interpreter probe cannot be kept: the key is still made (it was an internal error)", async () => {
  const s = sandbox();
  try {
    writeFileSync(join(s.home, "interpreters-v1"), "not a folder\n");
    const r = await cli(["env", "prepare", "-p", "tiny", "--index-url", "http://127.0.0.1:9/simple", "--python", "python3", "--dry-run", "--json"], { env: s.env, cwd: s.root });
    expect(r.stderr).not.toContain("internal error");
    expect(r.code).toBe(0);
    expect(JSON.parse(r.stdout).would).toBe("build");
  } finally {
    s.cleanup();
  }
});

test("a home that is a file, or under one: one line naming the setting and the file, exit 2, for every command", async () => {
  const s = sandbox();
  try {
    const file = join(s.root, "a-file");
    writeFileSync(file, "not a folder\n");
    const { GPULAYER_HOME: _home, XDG_CACHE_HOME: _xdg, ...base } = s.env;
    const cases: [Record<string, string>, string][] = [
      [{ GPULAYER_HOME: file }, `error: GPULAYER_HOME=${file} (environment): ${file} is not a folder`],
      [{ GPULAYER_HOME: join(file, "deeper") }, `error: GPULAYER_HOME=${join(file, "deeper")} (environment): ${file} is not a folder`],
      [{ XDG_CACHE_HOME: file }, `error: the home folder ${join(file, "gpulayer")} (the default; GPULAYER_HOME sets another): ${file} is not a folder`],
    ];
    for (const [vars, line] of cases) {
      for (const argv of [["env", "list"], ["gc", "--dry-run"], ["env", "prepare", "-p", "tiny", "--python", "python3", "--dry-run"]]) {
        const r = await cli(argv, { env: { ...base, ...vars }, cwd: s.root });
        expect({ argv, code: r.code, stderr: r.stderr.trim() }).toEqual({ argv, code: 2, stderr: line });
      }
    }
  } finally {
    s.cleanup();
  }
});

// Skipped when not root, or without Debian's own Python: it runs gpulayer as another user (setpriv), which only root may; CI runs as root.
test.skipIf(process.getuid?.() !== 0 || !existsSync("/usr/bin/python3"))("a home this user may not write or read: one line naming what was refused, exit 1; never an internal error, never an empty listing", async () => {
  const s = sandbox();
  try {
    chmodSync(s.root, 0o755);
    chmodSync(s.home, 0o755);
    // Made by root, the home's owner: a job store, and a store of envs closed to others.
    expect((await cli(["job", "run", "--python", "/usr/bin/python3", "--", "true"], { env: s.env, cwd: s.root })).code).toBe(0);
    chmodSync(join(s.home, "envs-v1"), 0o700);
    const asNobody = async (args: string[]) => {
      const p = Bun.spawn(["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", "--", ...CLI_ARGV, ...args], { env: { ...s.env, HOME: "/nonexistent" }, cwd: "/", stdout: "pipe", stderr: "pipe" });
      const [stderr, code] = await Promise.all([new Response(p.stderr).text(), p.exited]);
      return { args, code, stderr: stderr.trim() };
    };
    const closedStore = `error: permission denied: cannot list ${join(s.home, "envs-v1")} (scandir)`;
    for (const args of [["env", "list"], ["gc", "--dry-run"], ["env", "show", "12ab"]]) expect(await asNobody(args)).toEqual({ args, code: 1, stderr: closedStore });
    const jobs = await asNobody(["job", "list"]);
    // The job store's folder is its owner's alone (0700), whatever the umask: the path is named, as for the env store.
    expect(jobs).toEqual({ args: jobs.args, code: 1, stderr: `error: permission denied: cannot read ${join(s.home, "jobs", "jobs.db")} (stat)` });
    const prepare = await asNobody(["env", "prepare", "-p", "tiny", "--index-url", "http://127.0.0.1:9/simple", "--python", "/usr/bin/python3"]);
    expect(prepare.code).toBe(1);
    expect(prepare.stderr).toStartWith(`error: permission denied: cannot create ${join(s.home, "locks")}/`);
    expect(prepare.stderr).toEndWith("(mkdir)");
    expect(prepare.stderr.split("\n")).toHaveLength(1);
  } finally {
    s.cleanup();
  }
});
