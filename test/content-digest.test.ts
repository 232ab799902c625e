import { afterAll, describe, expect, test } from "bun:test";
import { existsSync, mkdirSync, readdirSync, rmSync, symlinkSync, utimesSync, writeFileSync } from "node:fs";
import { join } from "node:path";
import { treeDigest } from "../src/env/content-digest.ts";
import { tempDir } from "./helpers.ts";

/**
 * A project folder's digest on the warm path: a stat per file, then the kept
 * answer when nothing changed, with a clock that says the files have settled.
 * Every change a fresh install would see must change the digest, the kept
 * answer notwithstanding, including edits that keep a file's size and mtime.
 */

const world = tempDir("gpl-digest-");
afterAll(() => rmSync(world, { recursive: true, force: true }));

/** A whole second, which utimes sets exactly: an mtime put back as it was. */
const SECOND = 1_600_000_000;

/** A clock well past every file's last change: the kept answers are trusted (not "racily clean"). */
const later = () => Date.now() + 60_000;

function project(name: string): string {
  const root = join(world, name);
  mkdirSync(join(root, "pkg", "data"), { recursive: true });
  writeFileSync(join(root, "pyproject.toml"), '[project]\nname = "pkg"\nversion = "1.0"\n');
  writeFileSync(join(root, "pkg", "__init__.py"), "VALUE = 1\n");
  for (let i = 0; i < 50; i++) writeFileSync(join(root, "pkg", "data", `f${i}.txt`), `file ${i}\n`);
  utimesSync(join(root, "pkg", "data", "f7.txt"), SECOND, SECOND);
  return root;
}

describe("a project folder's digest, kept between runs", () => {
  test("is the same on a second run, and its kept answer is used", () => {
    const root = project("same");
    const cacheDir = join(world, "cache-same");
    const first = treeDigest(root, { editable: false, cacheDir, now: later });
    expect(first.files).toBe(52); // pyproject.toml, the module and 50 data files
    // The summary is one small file next to the per-file cache.
    expect(readdirSync(cacheDir).length).toBe(2);
    expect(treeDigest(root, { editable: false, cacheDir, now: later })).toEqual(first);
    // And it is what a digest with no cache at all says.
    expect(treeDigest(root, { editable: false, cacheDir: null })).toEqual(first);
  });

  const changes: [string, (root: string) => void][] = [
    ["a file's content, its size and mtime kept (only its ctime moves)", (root) => {
      const file = join(root, "pkg", "data", "f7.txt");
      utimesSync(file, SECOND, SECOND);
      writeFileSync(file, "FILE 7\n");
      utimesSync(file, SECOND, SECOND);
    }],
    ["a file added", (root) => writeFileSync(join(root, "pkg", "data", "new.txt"), "new\n")],
    ["a file removed", (root) => rmSync(join(root, "pkg", "data", "f3.txt"))],
    ["a file renamed", (root) => {
      writeFileSync(join(root, "pkg", "data", "g3.txt"), "file 3\n");
      rmSync(join(root, "pkg", "data", "f3.txt"));
    }],
    ["a symlink pointed elsewhere", (root) => {
      rmSync(join(root, "pkg", "link.txt"));
      symlinkSync("../b.txt", join(root, "pkg", "link.txt"));
    }],
  ];
  changes.forEach(([what, change], n) => {
    test(`changes with ${what}`, () => {
      const root = project(`change-${n}`);
      writeFileSync(join(root, "a.txt"), "a\n");
      writeFileSync(join(root, "b.txt"), "b\n");
      symlinkSync("../a.txt", join(root, "pkg", "link.txt"));
      const cacheDir = join(world, `cache-change-${n}`);
      const before = treeDigest(root, { editable: false, cacheDir, now: later });
      change(root);
      const after = treeDigest(root, { editable: false, cacheDir, now: later });
      expect(after.digest).not.toBe(before.digest);
      expect(after).toEqual(treeDigest(root, { editable: false, cacheDir: null }));
    });
  });

  test("files changed within the last moments are not kept as settled: an edit in the same clock tick is still seen", () => {
    const root = project("racy");
    const cacheDir = join(world, "cache-racy");
    const before = treeDigest(root, { editable: false, cacheDir });
    // Neither the per-file entries nor the summary were kept: the files are too new to be trusted by their stat.
    expect(existsSync(cacheDir)).toBe(false);
    const file = join(root, "pkg", "__init__.py");
    utimesSync(file, SECOND, SECOND);
    treeDigest(root, { editable: false, cacheDir });
    writeFileSync(file, "VALUE = 2\n");
    utimesSync(file, SECOND, SECOND);
    expect(treeDigest(root, { editable: false, cacheDir }).digest).not.toBe(before.digest);
  });

  test("an editable project: an edit to a module its live link serves keeps the digest, a build input changes it", () => {
    const root = project("editable");
    const cacheDir = join(world, "cache-editable");
    const before = treeDigest(root, { editable: true, cacheDir, now: later });
    writeFileSync(join(root, "pkg", "__init__.py"), "VALUE = 3\n");
    expect(treeDigest(root, { editable: true, cacheDir, now: later }).digest).toBe(before.digest);
    writeFileSync(join(root, "pyproject.toml"), '[project]\nname = "pkg"\nversion = "1.1"\n');
    expect(treeDigest(root, { editable: true, cacheDir, now: later }).digest).not.toBe(before.digest);
    // Editable and not are kept apart: the same folder as a plain project counts the module by content.
    expect(treeDigest(root, { editable: false, cacheDir, now: later }).digest).not.toBe(treeDigest(root, { editable: true, cacheDir, now: later }).digest);
  });
});
