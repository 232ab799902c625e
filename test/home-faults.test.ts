import { expect, test } from "bun:test";
import { mkdirSync, readdirSync, writeFileSync } from "node:fs";
import { join } from "node:path";
import { writeFileAtomic } from "../src/core/atomic.ts";
import { cli, sandbox, tempDir } from "./helpers.ts";

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
