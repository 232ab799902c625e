import { afterAll, describe, expect, setDefaultTimeout, test } from "bun:test";
import { existsSync, mkdirSync, readdirSync, readFileSync, rmSync, statSync, symlinkSync, utimesSync, writeFileSync } from "node:fs";
import { join } from "node:path";
import { folderDigest } from "../src/env/request/content-digest.ts";
import { treeDigest } from "../src/env/request/tree-digest.ts";
import { fileContentHash } from "../src/core/hashing.ts";
import { tempDir } from "./helpers.ts";
import { UsageError } from "../src/errors.ts";

// Real processes and real builds take seconds; a file that sets none gets 5 s, whatever another file set.
setDefaultTimeout(120_000);

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

/**
 * Longer than a kernel's coarsest file-time tick (10 ms at HZ=100): a change made
 * this long after a digest has a new mtime on any kernel. The later clock says
 * the files settled long ago; on a kernel without fine-grained file times a
 * change in the same tick would go unseen, as it would in a real run within
 * RACY_MS, which is why a real run keeps nothing that recent.
 */
const TICK_MS = 20;

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
    const summary = join(cacheDir, readdirSync(cacheDir).find((n) => n.endsWith(".tree"))!);
    const kept = statSync(summary).ino;
    expect(treeDigest(root, { editable: false, cacheDir, now: later })).toEqual(first);
    // Taken as it was: a walk would have written it again (a new file, renamed into place).
    expect(statSync(summary).ino).toBe(kept);
    // And it is what a digest with no cache at all says.
    expect(treeDigest(root, { editable: false, cacheDir: null })).toEqual(first);
  });

  test("is checked from inside the project, and the caller's working folder is its own again afterwards; a working folder that is gone changes nothing", () => {
    const root = project("cwd");
    const cacheDir = join(world, "cache-cwd");
    const here = process.cwd();
    const first = treeDigest(root, { editable: false, cacheDir, now: later });
    expect(treeDigest(root, { editable: false, cacheDir, now: later })).toEqual(first);
    expect(process.cwd()).toBe(here);
    // A change is seen the same way, and the walk it leads to starts from the caller's folder too.
    writeFileSync(join(root, "pkg", "data", "new.txt"), "new\n");
    const changed = treeDigest(root, { editable: false, cacheDir, now: later });
    expect(changed.files).toBe(first.files + 1);
    expect(process.cwd()).toBe(here);
    // With no working folder to come back to, the check goes by absolute paths: the same answers.
    const gone = join(world, "gone");
    mkdirSync(gone);
    process.chdir(gone);
    try {
      rmSync(gone, { recursive: true });
      expect(treeDigest(root, { editable: false, cacheDir, now: later })).toEqual(changed);
      rmSync(join(root, "pkg", "data", "new.txt"));
      expect(treeDigest(root, { editable: false, cacheDir, now: later })).toEqual(first);
    } finally {
      process.chdir(here);
    }
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
      Bun.sleepSync(TICK_MS);
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
    writeFileSync(join(root, "pkg", "core.py"), "X = 1\n");
    const cacheDir = join(world, "cache-editable");
    const before = treeDigest(root, { editable: true, cacheDir, now: later });
    writeFileSync(join(root, "pkg", "core.py"), "X = 3\n");
    expect(treeDigest(root, { editable: true, cacheDir, now: later }).digest).toBe(before.digest);
    writeFileSync(join(root, "pyproject.toml"), '[project]\nname = "pkg"\nversion = "1.1"\n');
    expect(treeDigest(root, { editable: true, cacheDir, now: later }).digest).not.toBe(before.digest);
    // Editable and not are kept apart: the same folder as a plain project counts the module by content.
    expect(treeDigest(root, { editable: false, cacheDir, now: later }).digest).not.toBe(treeDigest(root, { editable: true, cacheDir, now: later }).digest);
  });
});

describe("the kept answer: the paths a walk went by, stat'ed again, against a fresh walk", () => {
  /**
   * One project, changed step by step as users and builds change theirs; after
   * each step the answer from the kept summary (a stat per path, no listing) must
   * be what a walk with no cache at all gives, for a plain and an editable install.
   */
  const outside = join(world, "kept-outside");
  const hop = join(world, "kept-hop");
  const steps: [string, boolean, (root: string) => void][] = [
    ["nothing", false, () => {}],
    ["a file added two folders down", true, (root) => {
      mkdirSync(join(root, "pkg", "data", "deep", "er"), { recursive: true });
      writeFileSync(join(root, "pkg", "data", "deep", "er", "new.txt"), "new\n");
    }],
    ["a file added in an ignored folder outside packages", false, (root) => writeFileSync(join(root, "assets", "cache", "x.bin"), "x\n")],
    ["an ignored folder in a package made a package itself (setuptools installs it)", true, (root) => writeFileSync(join(root, "pkg", "cache", "__init__.py"), "")],
    ["a .gitignore edited: ignored files come back", true, (root) => writeFileSync(join(root, ".gitignore"), "cache/\n")],
    ["a dangling link's target made", true, () => writeFileSync(join(world, "kept-nowhere.txt"), "here\n")],
    ["a file added in a linked folder outside the project", true, () => writeFileSync(join(outside, "more.csv"), "3\n")],
    ["a folder replaced by a file of its name", true, (root) => {
      rmSync(join(root, "assets", "sub"), { recursive: true });
      writeFileSync(join(root, "assets", "sub"), "now a file\n");
    }],
    ["a link outside that a loop went through pointed at a folder with files", true, () => {
      rmSync(hop);
      symlinkSync(outside, hop);
    }],
    ["setuptools' build folder given a file of the user's", true, (root) => writeFileSync(join(root, "build", "notes.txt"), "n\n")],
    ["a file's content, its size and mtime kept", true, (root) => {
      const file = join(root, "pkg", "data", "f7.txt");
      writeFileSync(file, "FILE 7\n");
      utimesSync(file, SECOND, SECOND);
    }],
    ["a .gitignore that ignores itself, edited", true, (root) => {
      writeFileSync(join(root, "assets", ".gitignore"), ".gitignore\n*.tmp\n");
      Bun.sleepSync(TICK_MS);
      writeFileSync(join(root, "assets", ".gitignore"), ".gitignore\n");
    }],
  ];
  for (const editable of [false, true]) {
    test(`${editable ? "editable" : "plain"}: after every change the kept answer is the fresh one, and a change is seen`, () => {
      const root = project(`kept-${editable}`);
      rmSync(outside, { recursive: true, force: true });
      rmSync(join(world, "kept-nowhere.txt"), { force: true });
      mkdirSync(outside);
      writeFileSync(join(outside, "table.csv"), "1\n");
      writeFileSync(join(root, ".gitignore"), "cache/\n*.tmp\n");
      mkdirSync(join(root, "assets", "cache"), { recursive: true });
      mkdirSync(join(root, "assets", "sub"));
      writeFileSync(join(root, "assets", "sub", "a.txt"), "a\n");
      writeFileSync(join(root, "assets", "x.tmp"), "t\n");
      mkdirSync(join(root, "pkg", "cache"));
      writeFileSync(join(root, "pkg", "cache", "blob.py"), "B = 1\n");
      mkdirSync(join(root, "build", "lib"), { recursive: true });
      symlinkSync(join(world, "kept-nowhere.txt"), join(root, "pkg", "dangling.txt"));
      symlinkSync(outside, join(root, "pkg", "linked"));
      rmSync(hop, { force: true });
      symlinkSync(root, hop);
      symlinkSync(hop, join(root, "assets", "loop")); // a loop, through a link outside the project
      writeFileSync(join(root, "assets", ".gitignore"), ".gitignore\n*.tmp\n");
      const cacheDir = join(world, `cache-kept-${editable}`);
      const fresh = () => treeDigest(root, { editable, cacheDir: null });
      const kept = () => treeDigest(root, { editable, cacheDir, now: later });
      let before = kept();
      expect(before).toEqual(fresh());
      expect(readdirSync(cacheDir).length).toBe(2); // the per-file cache and the summary
      for (const [what, changes, change] of steps) {
        Bun.sleepSync(TICK_MS);
        change(root);
        const after = kept();
        expect({ what, after }).toEqual({ what, after: fresh() });
        if (changes) expect({ what, changed: after.digest !== before.digest }).toEqual({ what, changed: true });
        else expect({ what, digest: after.digest }).toEqual({ what, digest: before.digest });
        before = after;
      }
    });
  }
});

describe("the kept answer when a link's target changes kind (nothing in the project moves)", () => {
  /**
   * What an entry is (file, folder, FIFO, missing) decides whether it is skipped,
   * ignored, walked or counted: through a link, that can change with no folder
   * of the project moving. Each case: set up, digest (kept), change the target,
   * and the kept answer must be a fresh walk's.
   */
  const cases: [string, boolean, (root: string, out: string) => void, (root: string, out: string) => void][] = [
    ["a FIFO made a file", false, (root, out) => {
      expect(Bun.spawnSync(["mkfifo", join(out, "t")]).exitCode).toBe(0);
      symlinkSync(join(out, "t"), join(root, "data"));
    }, (_, out) => {
      rmSync(join(out, "t"));
      writeFileSync(join(out, "t"), "hello\n");
    }],
    ["a folder a folder-only ignore rule left out, made a file", false, (root, out) => {
      writeFileSync(join(root, ".gitignore"), "data/\n");
      mkdirSync(join(out, "d"));
      writeFileSync(join(out, "d", "f"), "a\n");
      symlinkSync(join(out, "d"), join(root, "data"));
    }, (_, out) => {
      rmSync(join(out, "d"), { recursive: true });
      writeFileSync(join(out, "d"), "file\n");
    }],
    ["a linked .git folder made a file", false, (root, out) => {
      mkdirSync(join(out, "g"));
      symlinkSync(join(out, "g"), join(root, ".git"));
    }, (_, out) => {
      rmSync(join(out, "g"), { recursive: true });
      writeFileSync(join(out, "g"), "file\n");
    }],
    ["a linked .pyc made a folder", false, (root, out) => {
      writeFileSync(join(out, "p"), "x\n");
      symlinkSync(join(out, "p"), join(root, "foo.pyc"));
    }, (_, out) => {
      rmSync(join(out, "p"));
      mkdirSync(join(out, "p"));
      writeFileSync(join(out, "p", "inner.txt"), "y\n");
    }],
    ["an editable's linked live module gone", true, (root, out) => {
      writeFileSync(join(out, "m.py"), "x = 1\n");
      symlinkSync(join(out, "m.py"), join(root, "pkg", "mod.py"));
    }, (_, out) => rmSync(join(out, "m.py"))],
    ["an editable's linked live module made a folder", true, (root, out) => {
      writeFileSync(join(out, "m.py"), "x = 1\n");
      symlinkSync(join(out, "m.py"), join(root, "pkg", "mod.py"));
    }, (_, out) => {
      rmSync(join(out, "m.py"));
      mkdirSync(join(out, "m.py"));
      writeFileSync(join(out, "m.py", "data.txt"), "q\n");
    }],
    ["an ignored native library in a package made a package", false, (root, out) => {
      writeFileSync(join(root, ".gitignore"), "*.so\n");
      writeFileSync(join(out, "l"), "bin\n");
      symlinkSync(join(out, "l"), join(root, "pkg", "lib.so"));
    }, (_, out) => {
      rmSync(join(out, "l"));
      mkdirSync(join(out, "l"));
      writeFileSync(join(out, "l", "__init__.py"), "x = 1\n");
    }],
    ["a link into an ignored folder of the project, its FIFO made a file", false, (root) => {
      writeFileSync(join(root, ".gitignore"), ".cache/\n");
      mkdirSync(join(root, ".cache"));
      expect(Bun.spawnSync(["mkfifo", join(root, ".cache", "t")]).exitCode).toBe(0);
      symlinkSync(".cache/t", join(root, "data"));
    }, (root) => {
      rmSync(join(root, ".cache", "t"));
      writeFileSync(join(root, ".cache", "t"), "hi\n");
    }],
  ];
  cases.forEach(([what, editable, setup, change], n) => {
    test(`${editable ? "editable" : "plain"}: ${what}`, () => {
      const root = project(`kind-${n}`);
      const out = join(world, `kind-out-${n}`);
      mkdirSync(out);
      setup(root, out);
      const cacheDir = join(world, `cache-kind-${n}`);
      const kept = () => treeDigest(root, { editable, cacheDir, now: later });
      const before = kept();
      expect(kept()).toEqual(before);
      Bun.sleepSync(TICK_MS);
      change(root, out);
      const after = kept();
      expect(after).toEqual(treeDigest(root, { editable, cacheDir: null }));
      expect(after.digest).not.toBe(before.digest);
    });
  });
});

describe("what a project holds that leads nowhere, cannot be read, or would block a read", () => {
  test("a link to itself and a link through a file count by name, as a dangling link does, kept or fresh", () => {
    const root = project("nowhere");
    symlinkSync("self", join(root, "self"));
    symlinkSync("pyproject.toml/x", join(root, "through-a-file"));
    const cacheDir = join(world, "cache-nowhere");
    for (const editable of [false, true]) {
      const fresh = treeDigest(root, { editable, cacheDir: null });
      expect(treeDigest(root, { editable, cacheDir, now: later })).toEqual(fresh);
      expect(treeDigest(root, { editable, cacheDir, now: later })).toEqual(fresh);
    }
  });

  test("a FIFO as .gitignore, or as an editable's setup.cfg, is not read (the read would wait forever)", () => {
    const root = project("fifo-config");
    expect(Bun.spawnSync(["mkfifo", join(root, ".gitignore")]).exitCode).toBe(0);
    expect(Bun.spawnSync(["mkfifo", join(root, "setup.cfg")]).exitCode).toBe(0);
    expect(treeDigest(root, { editable: false, cacheDir: null }).files).toBe(52);
    expect(treeDigest(root, { editable: true, cacheDir: null }).files).toBeGreaterThan(0);
  });

  // A file the kernel will not read whole (a /proc file): the one everyday way to make a read fail as root.
  test.skipIf(!existsSync("/proc/sys/kernel/domainname"))("a file that cannot be read is one line naming it, not an internal error", () => {
    const root = project("unreadable");
    symlinkSync("/proc/sys/kernel/domainname", join(root, "name.txt"));
    let error: unknown;
    try {
      treeDigest(root, { editable: false, cacheDir: null });
    } catch (e) {
      error = e;
    }
    expect(error).toBeInstanceOf(UsageError);
    expect((error as Error).message).toStartWith(`local project ${root}: cannot read ${join(root, "name.txt")} (`);
  });
});

describe("a kept answer is for its own project and kind", () => {
  test("summaries swapped between the plain and the editable reading, or one's digest edited, are not taken", () => {
    const root = project("swapped");
    writeFileSync(join(root, "pkg", "core.py"), "X = 1\n");
    const cacheDir = join(world, "cache-swapped");
    const plain = treeDigest(root, { editable: false, cacheDir, now: later });
    const editable = treeDigest(root, { editable: true, cacheDir, now: later });
    expect(plain.digest).not.toBe(editable.digest);
    const [a, b] = readdirSync(cacheDir).filter((f) => f.endsWith(".tree")).map((f) => join(cacheDir, f));
    const [textA, textB] = [readFileSync(a!, "utf8"), readFileSync(b!, "utf8")];
    writeFileSync(a!, textB);
    writeFileSync(b!, textA);
    expect(treeDigest(root, { editable: false, cacheDir, now: later })).toEqual(plain);
    expect(treeDigest(root, { editable: true, cacheDir, now: later })).toEqual(editable);
    for (const file of [a!, b!]) writeFileSync(file, readFileSync(file, "utf8").replace(/"digest":"[0-9a-f]+"/, `"digest":"${"0".repeat(64)}"`));
    expect(treeDigest(root, { editable: false, cacheDir, now: later })).toEqual(plain);
    expect(treeDigest(root, { editable: true, cacheDir, now: later })).toEqual(editable);
  });
});

describe("an editable project's listing (entry types from the folder, a stat only where one is needed)", () => {
  const digest = (root: string) => treeDigest(root, { editable: true, cacheDir: null }).digest;

  test("links are followed for their content; a new module, a dangling link and a linked folder count; a FIFO does not", () => {
    const root = project("editable-listing");
    const target = join(world, "editable-listing-target.txt");
    writeFileSync(target, "a\n");
    symlinkSync(target, join(root, "pkg", "linked.txt"));
    const seen = [digest(root)];
    writeFileSync(target, "b\n"); // the linked file's content
    seen.push(digest(root));
    writeFileSync(join(root, "pkg", "new_module.py"), ""); // a module the live link serves: by name
    seen.push(digest(root));
    symlinkSync(join(world, "nowhere"), join(root, "pkg", "dangling.py"));
    seen.push(digest(root));
    const outside = join(world, "editable-listing-sub");
    mkdirSync(outside);
    writeFileSync(join(outside, "__init__.py"), "");
    writeFileSync(join(outside, "table.csv"), "1\n");
    symlinkSync(outside, join(root, "pkg", "sub"));
    seen.push(digest(root));
    writeFileSync(join(outside, "table.csv"), "2\n"); // data in a linked folder: by content
    seen.push(digest(root));
    expect(new Set(seen).size).toBe(seen.length);
    expect(Bun.spawnSync(["mkfifo", join(root, "pkg", "pipe")]).exitCode).toBe(0);
    expect(digest(root)).toBe(seen.at(-1)!);
  });
});

describe("an editable project's modules a build reads for its metadata", () => {
  const digest = (root: string) => treeDigest(root, { editable: true, cacheDir: null }).digest;
  const cases: [string, string, Record<string, string>][] = [
    ["a package's __init__.py (flit's __version__, setuptools' attr: pkg.__version__)", "pkg/__init__.py", {}],
    ["a _version.py", "pkg/_version.py", {}],
    ["a module setuptools' attr: names", "pkg/meta.py", { "setup.cfg": "[metadata]\nversion = attr: pkg.meta.VERSION\n" }],
    ["hatch's version path", "pkg/consts.py", { "pyproject.toml": '[project]\nname = "pkg"\ndynamic = ["version"]\n[tool.hatch.version]\npath = "pkg/consts.py"\n' }],
    ["a module setup.py opens", "pkg/numbers.py", { "setup.py": 'exec(open("pkg/numbers.py").read())\n' }],
  ];
  for (const [what, module, config] of cases) {
    test(`${what}: an edit makes a new env`, () => {
      const root = project(`meta-${module.replace(/\W/g, "-")}`);
      for (const [file, text] of Object.entries(config)) writeFileSync(join(root, file), text);
      writeFileSync(join(root, module), "VERSION = '1.0'\n");
      const before = digest(root);
      writeFileSync(join(root, module), "VERSION = '2.0'\n");
      expect(digest(root)).not.toBe(before);
    });
  }
});

describe("ignore rules, as git and setuptools read them", () => {
  const digest = (root: string) => treeDigest(root, { editable: false, cacheDir: null }).digest;

  test("inside a package folder nothing is excluded: a gitignored module, data folder, prebuilt library, egg-info or node_modules there is what a backend installs", () => {
    const root = project("ignored-in-package");
    writeFileSync(join(root, ".gitignore"), "_gen.py\n*.dat\n*.so\ndata/\nnode_modules/\n");
    writeFileSync(join(root, "pkg", "_gen.py"), "G = 1\n");
    writeFileSync(join(root, "pkg", "keep.dat"), "one\n");
    writeFileSync(join(root, "pkg", "_kernels.so"), "\x7fELF 1");
    mkdirSync(join(root, "pkg", "extra.egg-info"), { recursive: true });
    writeFileSync(join(root, "pkg", "extra.egg-info", "info.txt"), "one\n");
    mkdirSync(join(root, "pkg", "node_modules", "x"), { recursive: true });
    writeFileSync(join(root, "pkg", "node_modules", "x", "index.js"), "module.exports = 1\n");
    const changes: [string, string][] = [
      ["pkg/_gen.py", "G = 2\n"],
      ["pkg/keep.dat", "two\n"],
      ["pkg/data/f3.txt", "changed\n"], // pkg/data: ignored by data/
      ["pkg/_kernels.so", "\x7fELF 2"],
      ["pkg/extra.egg-info/info.txt", "two\n"],
      ["pkg/node_modules/x/index.js", "module.exports = 2\n"],
    ];
    let before = digest(root);
    for (const [file, text] of changes) {
      writeFileSync(join(root, file), text);
      const after = digest(root);
      expect({ file, changed: after !== before }).toEqual({ file, changed: true });
      before = after;
    }
    // Outside packages the same rules leave out what they name: a build's own egg-info, ignored data.
    mkdirSync(join(root, "pkg.egg-info"));
    writeFileSync(join(root, "pkg.egg-info", "PKG-INFO"), "Name: pkg\n");
    mkdirSync(join(root, "data"));
    writeFileSync(join(root, "data", "big.bin"), "1");
    writeFileSync(join(root, "top.so"), "1");
    expect(digest(root)).toBe(before);
  });

  test("an editable project: an ignored native library in a package is an in-place build's output, served live; plain, it counts", () => {
    const root = project("in-place-output");
    writeFileSync(join(root, ".gitignore"), "*.so\n");
    const editable = () => treeDigest(root, { editable: true, cacheDir: null }).digest;
    const [e, p] = [editable(), digest(root)];
    writeFileSync(join(root, "pkg", "_ext.cpython-311-x86_64-linux-gnu.so"), "\x7fELF");
    expect(editable()).toBe(e);
    expect(digest(root)).not.toBe(p);
  });

  test("outside packages: ignored files are left out, and a deeper .gitignore's !pattern brings one back (git's precedence)", () => {
    const root = project("nested-negation");
    mkdirSync(join(root, "assets", "sub"), { recursive: true });
    writeFileSync(join(root, ".gitignore"), "*.dat\n");
    writeFileSync(join(root, "assets", "sub", ".gitignore"), "!s.dat\n");
    writeFileSync(join(root, "assets", "other.dat"), "x\n");
    writeFileSync(join(root, "assets", "sub", "s.dat"), "one\n");
    const before = digest(root);
    writeFileSync(join(root, "assets", "other.dat"), "y\n");
    expect(digest(root)).toBe(before); // ignored: not what an install reads
    writeFileSync(join(root, "assets", "sub", "s.dat"), "two\n");
    expect(digest(root)).not.toBe(before); // re-included below: it counts
  });
});

describe("a setup.py that computes a path: the whole project counts", () => {
  const digests = (root: string) => [false, true].map((editable) => treeDigest(root, { editable, cacheDir: null }).digest);
  /** A project whose setup.py is `setup`, with an ignored file outside packages and a module its editable's live link serves. */
  const withSetup = (name: string, setup: string) => {
    const root = project(name);
    writeFileSync(join(root, "setup.py"), setup);
    writeFileSync(join(root, ".gitignore"), "notes/\n.venv/\n");
    mkdirSync(join(root, "notes"));
    writeFileSync(join(root, "notes", "VERSION"), "0.1\n");
    writeFileSync(join(root, "pkg", "meta.py"), "VERSION = '0.1'\n");
    mkdirSync(join(root, ".venv", "lib"), { recursive: true });
    writeFileSync(join(root, ".venv", "pyvenv.cfg"), "home = /usr\n");
    return root;
  };
  const computed: [string, string][] = [
    ["os.path.join", 'import os\nfrom setuptools import setup\nsetup(version=open(os.path.join("pkg", "meta.py")).read()[11:14])\n'],
    ["pathlib's / join", 'from pathlib import Path\nfrom setuptools import setup\nsetup(version=(Path("pkg") / "meta.py").read_text()[11:14])\n'],
    ["open() of a name made in code", 'from setuptools import setup\nname = "pkg" + "/meta.py"\nsetup(version=open(name).read()[11:14])\n'],
    ["a path from its own location", 'import os\nfrom setuptools import setup\nhere = os.path.dirname(__file__)\nsetup()\n'],
  ];
  for (const [what, setup] of computed) {
    test(`${what}: an ignored file and an editable's live module count by content; an ignored virtual environment, .git and caches do not`, () => {
      const root = withSetup(`setup-${what.replace(/\W/g, "-")}`, setup);
      let before = digests(root);
      for (const [file, text] of [["notes/VERSION", "0.2\n"], ["pkg/meta.py", "VERSION = '0.2'\n"]]) {
        writeFileSync(join(root, file!), text!);
        const after = digests(root);
        expect({ file, plain: after[0] !== before[0], editable: after[1] !== before[1] }).toEqual({ file, plain: true, editable: true });
        before = after;
      }
      writeFileSync(join(root, ".venv", "lib", "site.py"), "x\n");
      mkdirSync(join(root, ".git"), { recursive: true });
      writeFileSync(join(root, ".git", "HEAD"), "ref\n");
      mkdirSync(join(root, "pkg", "__pycache__"), { recursive: true });
      writeFileSync(join(root, "pkg", "__pycache__", "meta.cpython-311.pyc"), "x");
      expect(digests(root)).toEqual(before);
    });
  }

  test("a setup.py of plain strings keeps the ignore rules and the live link; one importing a module makes it count", () => {
    const root = withSetup("setup-static", 'from setuptools import setup\nsetup(name="pkg", version="0.1", packages=["pkg"])\n');
    const before = digests(root);
    writeFileSync(join(root, "notes", "VERSION"), "0.2\n");
    expect(digests(root)).toEqual(before);
    writeFileSync(join(root, "pkg", "meta.py"), "VERSION = '0.2'\n");
    expect(digests(root)[1]).toBe(before[1]);
    writeFileSync(join(root, "setup.py"), 'from setuptools import setup\nfrom pkg.meta import VERSION\nsetup(name="pkg", version=VERSION, packages=["pkg"])\n');
    const importing = treeDigest(root, { editable: true, cacheDir: null }).digest;
    writeFileSync(join(root, "pkg", "meta.py"), "VERSION = '0.3'\n");
    expect(treeDigest(root, { editable: true, cacheDir: null }).digest).not.toBe(importing);
  });
});

describe("a big file in a find-links folder", () => {
  test("is told of before it is hashed, once: the next run goes by its stat; its digest is its bytes'", async () => {
    const dir = join(world, "wheelhouse");
    mkdirSync(dir, { recursive: true });
    const big = join(dir, "huge-1.0-py3-none-any.whl");
    writeFileSync(big, "");
    Bun.spawnSync(["truncate", "-s", "70M", big]);
    await Bun.sleep(2_100); // settled: a file changed in the last 2 s is hashed every time (git's "racily clean")
    const cacheDir = join(world, "cache-wheelhouse");
    const told: [string, number][] = [];
    const first = folderDigest(dir, cacheDir, (p, b) => told.push([p, b]));
    expect(told).toEqual([[big, 70 * 1024 * 1024]]);
    expect(folderDigest(dir, cacheDir, (p, b) => told.push([p, b]))).toBe(first);
    expect(told.length).toBe(1);
    // Read in pieces, the same sha256 as sha256sum's of the whole file.
    expect(fileContentHash(big)).toBe(Bun.spawnSync(["sha256sum", big], { stdout: "pipe" }).stdout.toString().split(" ")[0]!);
    expect(folderDigest(dir, null)).toBe(first);
  });
});
