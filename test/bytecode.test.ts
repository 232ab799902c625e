import { describe, expect, setDefaultTimeout, test } from "bun:test";
import { existsSync, mkdirSync, readdirSync, readFileSync, rmSync, statSync, symlinkSync, writeFileSync } from "node:fs";
import { join, relative } from "node:path";
import { compileBytecode, startCompiler } from "../src/env/build/bytecode.ts";
import { run, tempDir } from "./helpers.ts";

/**
 * The build's bytecode compiler against the reference nobody here wrote:
 * `python -m compileall`, run by the same interpreter over the same files,
 * must leave the same .pyc files, byte for byte.
 */

setDefaultTimeout(120_000);

const PYENV_ROOT = process.env.PYENV_ROOT ?? join(process.env.HOME ?? "/root", ".pyenv");
const pyenvPython = (minor: string) => {
  const versions = existsSync(join(PYENV_ROOT, "versions")) ? readdirSync(join(PYENV_ROOT, "versions")).filter((v) => v.startsWith(`3.${minor}.`)) : [];
  return versions.length ? join(PYENV_ROOT, "versions", versions.at(-1)!, "bin", "python3") : null;
};

/** A package tree with what compileall meets in real site-packages. */
function tree(root: string): string {
  const site = join(root, "site-packages");
  mkdirSync(join(site, "pkg", "sub", "deeper"), { recursive: true });
  writeFileSync(join(site, "pkg", "__init__.py"), "VALUE = 1\n");
  writeFileSync(join(site, "pkg", "sub", "__init__.py"), "");
  writeFileSync(join(site, "pkg", "sub", "deeper", "mod.py"), "def f(x):\n    return [i * x for i in range(10)]\n".repeat(200));
  // A declared encoding (PEP 263), read from the bytes.
  writeFileSync(join(site, "pkg", "latin.py"), Buffer.concat([Buffer.from("# -*- coding: latin-1 -*-\nNAME = '"), Buffer.from([0xe9]), Buffer.from("'\n")]));
  // A Python 2 file in a package's tests: not compiled, the rest is.
  writeFileSync(join(site, "pkg", "py2.py"), "print 'hello'\n");
  writeFileSync(join(site, "top.py"), "import pkg\n");
  writeFileSync(join(site, "notes.txt"), "not python\n");
  // A symlinked module is compiled; a symlinked folder is not walked (compileall's own rule).
  writeFileSync(join(root, "outside.py"), "OUTSIDE = True\n");
  symlinkSync(join(root, "outside.py"), join(site, "linked.py"));
  mkdirSync(join(root, "elsewhere"));
  writeFileSync(join(root, "elsewhere", "hidden.py"), "HIDDEN = True\n");
  symlinkSync(join(root, "elsewhere"), join(site, "linkdir"));
  for (let i = 0; i < 40; i++) writeFileSync(join(site, "pkg", `m${i}.py`), `X${i} = ${i}\n`.repeat(i + 1));
  return site;
}

/** Every .pyc under `dir` with its bytes (base64), by path. */
function pycs(dir: string): Record<string, string> {
  const out: Record<string, string> = {};
  const walk = (d: string) => {
    for (const e of readdirSync(d, { withFileTypes: true })) {
      const p = join(d, e.name);
      if (e.isDirectory()) walk(p);
      else if (e.name.endsWith(".pyc")) out[relative(dir, p)] = readFileSync(p).toString("base64");
    }
  };
  walk(dir);
  return out;
}

const dropPycs = (dir: string) => {
  for (const e of readdirSync(dir, { withFileTypes: true })) {
    const p = join(dir, e.name);
    if (e.isDirectory() && e.name === "__pycache__") rmSync(p, { recursive: true });
    else if (e.isDirectory()) dropPycs(p);
  }
};

const hooks = {};
/** Whether two .pyc files hold the same header and equal code objects (what Python 3.6's marshal can differ in: its reference flags follow refcounts). */
async function sameCode(python: string, a: Record<string, string>, b: Record<string, string>, header = 12): Promise<boolean> {
  const script = `import json, marshal, sys\nfrom base64 import b64decode as d\na, b = json.load(sys.stdin)\nprint(sorted(a) == sorted(b) and all(d(a[k])[:${header}] == d(b[k])[:${header}] and marshal.loads(d(a[k])[${header}:]) == marshal.loads(d(b[k])[${header}:]) for k in a))`;
  const p = Bun.spawn([python, "-c", script], { stdin: new Blob([JSON.stringify([a, b])]), stdout: "pipe" });
  return (await new Response(p.stdout).text()).trim() === "True";
}

const pythons = [
  ["the machine's python3", "python3", "bytes"],
  ["Python 3.13", pyenvPython("13"), "bytes"],
  ["Python 3.6 (no 3.7 import functions: py_compile)", pyenvPython("6"), "code"],
] as const;

for (const [name, python, same] of pythons) {
  describe(`compiled bytecode, ${name}`, () => {
    // Skipped only where pyenv lacks that Python; this machine and its CI have 3.6 to 3.13.
    test.skipIf(!python)("is what compileall writes (byte for byte from 3.7 on); a module that does not compile is left out, the rest compiled", async () => {
      const root = tempDir("gpl-pyc-");
      const site = tree(root);
      const env = { PATH: process.env.PATH ?? "/usr/bin:/bin" };
      const given = await compileBytecode(python!, site, { env, cwd: root, hooks });
      const ours = pycs(site);
      dropPycs(site);
      // compileall exits 1 for the Python 2 file; that is the reference's verdict too.
      const ref = await run([python!, "-m", "compileall", "-q", site], { env });
      expect(ref.code).toBe(1);
      const reference = pycs(site);
      expect(Object.keys(reference).length).toBeGreaterThan(40);
      if (same === "bytes") expect(ours).toEqual(reference);
      else expect(await sameCode(python!, ours, reference)).toBe(true);
      expect(Object.keys(ours).some((p) => p.includes("py2."))).toBe(false);
      expect(Object.keys(ours).some((p) => p.includes("hidden."))).toBe(false);
      expect(Object.keys(ours).some((p) => p.includes("linked."))).toBe(true);
      // Given to the compiler: every .py file found, the Python 2 one too.
      expect(given).toBe(47);
    });
  });
}

describe("compiled bytecode", () => {
  test("under SOURCE_DATE_EPOCH is checked-hash bytecode, as compileall writes it then", async () => {
    const root = tempDir("gpl-pyc-");
    const site = tree(root);
    const env = { PATH: process.env.PATH ?? "/usr/bin:/bin", SOURCE_DATE_EPOCH: "1700000000" };
    await compileBytecode("python3", site, { env, cwd: root, hooks });
    const ours = pycs(site);
    dropPycs(site);
    await run(["python3", "-m", "compileall", "-q", site], { env });
    expect(ours).toEqual(pycs(site));
    // Flags word 3: a checked hash, not a timestamp.
    const first = Buffer.from(Object.values(ours)[0]!, "base64");
    expect(first.readUInt32LE(4)).toBe(3);
  });

  test("under PYTHONOPTIMIZE is the plain bytecode and that level's, each as compileall writes it (the env is keyed without it)", async () => {
    const root = tempDir("gpl-pyc-");
    const site = tree(root);
    writeFileSync(join(site, "asserts.py"), '"""doc"""\nassert False, "gone under -O"\n');
    const plain = { PATH: process.env.PATH ?? "/usr/bin:/bin" };
    for (const level of ["1", "2"]) {
      await compileBytecode("python3", site, { env: { ...plain, PYTHONOPTIMIZE: level }, cwd: root, hooks });
      const ours = pycs(site);
      expect(Object.keys(ours).some((p) => p.includes(`.opt-${level}.pyc`))).toBe(true);
      dropPycs(site);
      await run(["python3", "-m", "compileall", "-q", site], { env: plain });
      await run(["python3", "-m", "compileall", "-q", site], { env: { ...plain, PYTHONOPTIMIZE: level } });
      expect(ours).toEqual(pycs(site));
      dropPycs(site);
    }
    // A job under that level finds its bytecode: nothing is written into the folder.
    await compileBytecode("python3", site, { env: { ...plain, PYTHONOPTIMIZE: "1" }, cwd: root, hooks });
    const before = pycs(site);
    const job = await run(["python3", "-c", "import sys; sys.path.insert(0, sys.argv[1]); import asserts, top; print('ok')", site], { env: { ...plain, PYTHONOPTIMIZE: "1" } });
    expect(job.stdout.trim()).toBe("ok");
    expect(pycs(site)).toEqual(before);
  });

  test("leaves bytecode that is up to date alone (pip's own), rewrites what is stale", async () => {
    const root = tempDir("gpl-pyc-");
    const site = tree(root);
    const env = { PATH: process.env.PATH ?? "/usr/bin:/bin" };
    await run(["python3", "-m", "compileall", "-q", site], { env });
    const fresh = join(site, "pkg", "__pycache__", readdirSync(join(site, "pkg", "__pycache__")).find((f) => f.startsWith("__init__."))!);
    const stale = join(site, "top.py");
    const stalePyc = join(site, "__pycache__", readdirSync(join(site, "__pycache__")).find((f) => f.startsWith("top."))!);
    const before = { fresh: statSync(fresh).ino, stale: statSync(stalePyc).ino };
    writeFileSync(stale, "import pkg\nCHANGED = 1\n");
    const t = new Date(Date.now() + 5_000);
    Bun.spawnSync(["touch", "-d", t.toISOString(), stale]);
    await compileBytecode("python3", site, { env, cwd: root, hooks });
    expect(statSync(fresh).ino).toBe(before.fresh);
    expect(statSync(stalePyc).ino).not.toBe(before.stale);
    const loaded = await run(["python3", "-c", "import sys; sys.path.insert(0, sys.argv[1]); import top; print(top.CHANGED, top.__cached__ is not None)", site], { env: { ...env, PYTHONDONTWRITEBYTECODE: "1" } });
    expect(loaded.stdout.trim()).toBe("1 True");
  });

  test("workers started ahead (while an install runs) wait for their work: then compile as compileall does; cancelled, none is left running", async () => {
    const root = tempDir("gpl-pyc-");
    const site = tree(root);
    const env = { PATH: process.env.PATH ?? "/usr/bin:/bin" };
    const compilers = () => Bun.spawnSync(["pgrep", "-P", String(process.pid), "-f", "python3 -I -S"]).stdout.toString().split("\n").filter(Boolean);
    // Started before the files are there, as in a build: the tree is listed at compile(), not at the start.
    const ahead = startCompiler("python3", { env, cwd: root, hooks });
    await Bun.sleep(300);
    expect(compilers().length).toBeGreaterThan(0); // up and waiting on their stdin
    expect(pycs(site)).toEqual({});
    expect(await ahead.compile(site)).toBe(47);
    const ours = pycs(site);
    dropPycs(site);
    await run(["python3", "-m", "compileall", "-q", site], { env });
    expect(ours).toEqual(pycs(site));
    expect(compilers()).toEqual([]);

    // The install failed: no compile, and no worker outlives the build.
    dropPycs(site);
    const unused = startCompiler("python3", { env, cwd: root, hooks });
    await Bun.sleep(300);
    expect(compilers().length).toBeGreaterThan(0);
    await unused.cancel();
    expect(compilers()).toEqual([]);
    expect(pycs(site)).toEqual({});
  });

  test("a folder with no Python files starts no compiler; a missing interpreter is one clear failure", async () => {
    const root = tempDir("gpl-pyc-");
    mkdirSync(join(root, "empty"));
    expect(await compileBytecode(join(root, "no-such-python"), join(root, "empty"), { env: {}, cwd: root, hooks })).toBe(0);
    const site = tree(root);
    await expect(compileBytecode(join(root, "no-such-python"), site, { env: {}, cwd: root, hooks })).rejects.toThrow(/cannot run .*no-such-python/);
  });
});

describe("the bytecode store: each module compiled once per home", () => {
  const env = { PATH: process.env.PATH ?? "/usr/bin:/bin" };
  /** Two envs' site folders holding the same sources, written at different times (as two installs write them); the first compiled with a store. */
  async function firstEnvCompiled() {
    const root = tempDir("gpl-pyc-store-");
    mkdirSync(join(root, "a"));
    mkdirSync(join(root, "b"));
    const a = tree(join(root, "a"));
    await Bun.sleep(1100); // another second: the second tree's headers differ from the first's
    const b = tree(join(root, "b"));
    const store = join(root, "store");
    await compileBytecode("python3", a, { env, cwd: root, hooks, store });
    return { root, a, b, store };
  }
  /** A tree, and envs whose sources are its very files (cp -al: uv links them from its cache), without its bytecode. */
  function linkedTrees() {
    const root = tempDir("gpl-pyc-store-");
    mkdirSync(join(root, "a"));
    const a = tree(join(root, "a"));
    const linked = (name: string) => {
      mkdirSync(join(root, name));
      expect(Bun.spawnSync(["cp", "-al", a, join(root, name, "site-packages")]).exitCode).toBe(0);
      const site = join(root, name, "site-packages");
      dropPycs(site);
      return site;
    };
    return { root, a, linked, store: join(root, "store") };
  }
  const pycOf = (site: string, mod: string) => {
    const dir = join(site, ...mod.split("/").slice(0, -1), "__pycache__");
    const name = mod.split("/").at(-1)!;
    return join(dir, readdirSync(dir).find((f) => f.startsWith(`${name}.`) && f.endsWith(".pyc"))!);
  };

  /** `ours` against what compileall writes in `site`: the same files, the same headers, equal code (the path inside may differ). */
  async function likeCompileall(site: string, ours: Record<string, string>) {
    dropPycs(site);
    await run(["python3", "-m", "compileall", "-q", site], { env });
    const reference = pycs(site);
    expect(Object.keys(ours).sort()).toEqual(Object.keys(reference).sort());
    for (const k of Object.keys(reference)) expect(Buffer.from(ours[k]!, "base64").subarray(0, 16)).toEqual(Buffer.from(reference[k]!, "base64").subarray(0, 16));
    expect(await sameCode("python3", ours, reference, 16)).toBe(true);
  }

  /** The store's pycs put back in `site`, then an import: Python takes them as valid (none rewritten), and the code names its own file. */
  async function importTakesThem(site: string, store: string, root: string) {
    dropPycs(site);
    await compileBytecode("python3", site, { env, cwd: root, hooks, store });
    const before = statSync(pycOf(site, "pkg/sub/deeper/mod"));
    const job = await run(["python3", "-c", "import sys; sys.path.insert(0, sys.argv[1])\nimport pkg.sub.deeper.mod as m\nprint(m.f.__code__.co_filename)", site], { env });
    expect(job.stdout.trim()).toBe(join(site, "pkg", "sub", "deeper", "mod.py"));
    const after = statSync(pycOf(site, "pkg/sub/deeper/mod"));
    expect([after.ino, after.mtimeMs]).toEqual([before.ino, before.mtimeMs]);
  }

  test("the second env takes the first's code under its own header: what compileall writes there, and imports with its own paths", async () => {
    const { root, a, b, store } = await firstEnvCompiled();
    // The first env is compiled as without a store: byte for byte compileall's.
    const first = pycs(a);
    dropPycs(a);
    await run(["python3", "-m", "compileall", "-q", a], { env });
    expect(first).toEqual(pycs(a));
    const buckets = readdirSync(store);
    expect(buckets).toHaveLength(1);
    expect(existsSync(join(store, buckets[0]!, "last-used"))).toBe(true);

    await compileBytecode("python3", b, { env, cwd: root, hooks, store });
    const second = pycs(b);
    // Taken from the store: the code names the env that compiled it...
    expect(readFileSync(pycOf(b, "pkg/sub/deeper/mod")).includes(Buffer.from(a))).toBe(true);
    // ...under the header compileall writes for this env's own files (its mtimes differ from the first env's), with equal code.
    await likeCompileall(b, second);
    await importTakesThem(b, store, root);
  });

  test("sources that are the same files (uv links them from its cache): the pyc itself is linked, no copy, and Python takes it as this env's", async () => {
    const { root, a, linked, store } = linkedTrees();
    const b = linked("b");
    await compileBytecode("python3", a, { env, cwd: root, hooks, store });
    await compileBytecode("python3", b, { env, cwd: root, hooks, store });
    const [pa, pb] = [pycOf(a, "pkg/sub/deeper/mod"), pycOf(b, "pkg/sub/deeper/mod")];
    // One file: the first env's pyc, the store's entry and the second env's pyc (the store holds no copy).
    expect(statSync(pb).ino).toBe(statSync(pa).ino);
    expect(statSync(pa).nlink).toBe(3);
    // Byte for byte compileall's for this env too (the same header: the same source file), apart from the path inside.
    await likeCompileall(b, pycs(b));
    await importTakesThem(b, store, root);
  });

  test("a torn or altered entry is compiled again, never loaded, and written whole again", async () => {
    const { root, a, b, store } = await firstEnvCompiled();
    const entries: string[] = [];
    const walk = (d: string) => {
      for (const e of readdirSync(d, { withFileTypes: true })) {
        const p = join(d, e.name);
        if (e.isDirectory()) walk(p);
        else if (e.name !== "last-used") entries.push(p);
      }
    };
    walk(store);
    expect(entries.length).toBeGreaterThan(40);
    expect(entries.some((e) => e.endsWith(".tmp"))).toBe(false);
    // Every entry damaged: half of them cut short, the other half with one byte of their code changed.
    entries.forEach((e, i) => {
      const bytes = readFileSync(e);
      if (i % 2) writeFileSync(e, bytes.subarray(0, bytes.length - 3));
      else {
        bytes[bytes.length - 1] = bytes[bytes.length - 1]! ^ 0xff;
        writeFileSync(e, bytes);
      }
    });
    await compileBytecode("python3", b, { env, cwd: root, hooks, store });
    const ours = pycs(b);
    // Nothing of the first env's in the second: every module compiled here.
    expect(Object.values(ours).some((p) => Buffer.from(p, "base64").includes(Buffer.from(a)))).toBe(false);
    dropPycs(b);
    await run(["python3", "-m", "compileall", "-q", b], { env });
    expect(ours).toEqual(pycs(b));
    // And the store holds whole entries again: a third env takes them.
    mkdirSync(join(root, "c"));
    const c = tree(join(root, "c"));
    await compileBytecode("python3", c, { env, cwd: root, hooks, store });
    expect(readFileSync(pycOf(c, "pkg/sub/deeper/mod")).includes(Buffer.from(b))).toBe(true);
  });

  test("a source uv links into every env is hashed once a boot: edited in place (its mtime moves), it is read again and its own code compiled", async () => {
    const { root, a, linked, store } = linkedTrees();
    const b = linked("b");
    await compileBytecode("python3", a, { env, cwd: root, hooks, store });
    await Bun.sleep(20);
    // The same inode in both trees, as uv's cache links it: rewritten in place, the same size.
    writeFileSync(join(b, "pkg", "__init__.py"), "VALUE = 7\n");
    dropPycs(b);
    await compileBytecode("python3", b, { env, cwd: root, hooks, store });
    const job = await run(["python3", "-c", "import sys; sys.path.insert(0, sys.argv[1])\nimport pkg; print(pkg.VALUE)", b], { env: { ...env, PYTHONDONTWRITEBYTECODE: "1" } });
    expect(job.stdout.trim()).toBe("7");
    await likeCompileall(b, pycs(b));
  });

  /** `file` rewritten in place, the same size, its mtime put back to the nanosecond: a write whose stat says nothing (mmap, cp -p, coarse clocks). */
  const rewriteUnseen = async (file: string, text: string) => {
    const r = await run(["python3", "-c", "import os, sys\np, t = sys.argv[1], sys.argv[2].encode(); st = os.stat(p); assert len(t) == st.st_size\nwith open(p, 'r+b') as f: f.write(t)\nos.utime(p, ns=(st.st_atime_ns, st.st_mtime_ns))", file, text], { env });
    expect(r.code).toBe(0);
  };
  const valueIn = async (site: string) => (await run(["python3", "-c", "import sys; sys.path.insert(0, sys.argv[1])\nimport pkg; print(pkg.VALUE)", site], { env: { ...env, PYTHONDONTWRITEBYTECODE: "1" } })).stdout.trim();

  test("a memo that outlived its source's bytes never files code under its digest: a compile keys what it read, and the store stays right for other envs", async () => {
    const { root, a, linked, store } = linkedTrees();
    const b = linked("b");
    await compileBytecode("python3", a, { env, cwd: root, hooks, store });
    // The store emptied (gc), then the shared source changed unseen: b's compile must read it, and file it by what it read.
    rmSync(store, { recursive: true });
    await rewriteUnseen(join(b, "pkg", "__init__.py"), "VALUE = 7\n");
    await compileBytecode("python3", b, { env, cwd: root, hooks, store });
    expect(await valueIn(b)).toBe("7");
    // Another env whose own file holds the first text (its own inode), after a reboot: its own code, not b's.
    mkdirSync(join(root, "c"));
    const c = tree(join(root, "c"));
    await compileBytecode("python3", c, { env, cwd: root, hooks, store, boot: "00010203-0405-0607-0809-0a0b0c0d0e0f" });
    expect(await valueIn(c)).toBe("1");
  });

  test("checked-hash bytecode (SOURCE_DATE_EPOCH) takes no memo: a source changed unseen gets its own code under its own hash", async () => {
    const { root, a, linked, store } = linkedTrees();
    const b = linked("b");
    await compileBytecode("python3", a, { env, cwd: root, hooks, store });
    await rewriteUnseen(join(b, "pkg", "__init__.py"), "VALUE = 7\n");
    await compileBytecode("python3", b, { env: { ...env, SOURCE_DATE_EPOCH: "1700000000" }, cwd: root, hooks, store });
    expect(await valueIn(b)).toBe("7");
  });

  test("something not a file at an entry's path (a FIFO) is looked at, never waited on: the module is compiled", async () => {
    const { root, a, linked, store } = linkedTrees();
    await compileBytecode("python3", a, { env, cwd: root, hooks, store });
    const bucket = join(store, readdirSync(store).find((d) => d !== "last-used")!);
    const shard = readdirSync(bucket, { withFileTypes: true }).find((e) => e.isDirectory())!.name;
    const entry = join(bucket, shard, readdirSync(join(bucket, shard))[0]!);
    rmSync(entry);
    expect(Bun.spawnSync(["mkfifo", entry]).exitCode).toBe(0);
    const b = linked("b");
    await compileBytecode("python3", b, { env, cwd: root, hooks, store });
    const ours = pycs(b);
    dropPycs(b);
    await run(["python3", "-m", "compileall", "-q", b], { env });
    expect(await sameCode("python3", ours, pycs(b), 16)).toBe(true);
  }, 30_000);

  test("after a reboot every entry is checked in full again: one altered with its mtime put back is compiled again, not loaded", async () => {
    // Envs whose sources are the same files (uv's links): each takes the entries themselves.
    const { root, a, linked, store } = linkedTrees();
    await compileBytecode("python3", a, { env, cwd: root, hooks, store });
    // A second env reads (and so checks) the entries in this boot.
    await compileBytecode("python3", linked("b"), { env, cwd: root, hooks, store, boot: "0f0e0d0c-0b0a-0908-0706-050403020100" });
    const entry = (() => {
      const found: string[] = [];
      const walk = (d: string) => {
        for (const e of readdirSync(d, { withFileTypes: true })) (e.isDirectory() ? walk(join(d, e.name)) : e.name.endsWith(".0") && found.push(join(d, e.name)));
      };
      walk(store);
      return found.find((f) => readFileSync(f).includes(Buffer.from("range")))!;
    })();
    // One byte of its code changed, its size and mtime (to the nanosecond) as they were.
    const altered = await run(["python3", "-c", "import os, sys\np = sys.argv[1]; st = os.stat(p); d = bytearray(open(p, 'rb').read()); d[-1] ^= 0xff\nwith open(p, 'r+b') as f: f.write(d)\nos.utime(p, ns=(st.st_atime_ns, st.st_mtime_ns))", entry], { env });
    expect(altered.code).toBe(0);
    const c = linked("c");
    await compileBytecode("python3", c, { env, cwd: root, hooks, store, boot: "00010203-0405-0607-0809-0a0b0c0d0e0f" });
    const ours = pycs(c);
    dropPycs(c);
    await run(["python3", "-m", "compileall", "-q", c], { env });
    expect(await sameCode("python3", ours, pycs(c), 16)).toBe(true);
  });

  const py313 = pyenvPython("13");
  // Skipped only where pyenv lacks Python 3.13 (a second interpreter is the point); this machine and its CI have it.
  test.skipIf(!py313)("another interpreter has a bucket of its own; SOURCE_DATE_EPOCH's checked hashes are written over kept code", async () => {
    const { root, a, b, store } = await firstEnvCompiled();
    await compileBytecode(py313!, b, { env, cwd: root, hooks, store });
    expect(readdirSync(store)).toHaveLength(2);
    const ours = pycs(b);
    dropPycs(b);
    await run([py313!, "-m", "compileall", "-q", b], { env });
    expect(ours).toEqual(pycs(b));

    // Checked hashes (reproducible builds) from the store: compileall's header, equal code.
    const hashed = { ...env, SOURCE_DATE_EPOCH: "1700000000" };
    dropPycs(a);
    await compileBytecode("python3", a, { env: hashed, cwd: root, hooks, store });
    const fromStore = pycs(a);
    dropPycs(a);
    await run(["python3", "-m", "compileall", "-q", a], { env: hashed });
    const reference = pycs(a);
    for (const k of Object.keys(reference)) expect(Buffer.from(fromStore[k]!, "base64").subarray(0, 16)).toEqual(Buffer.from(reference[k]!, "base64").subarray(0, 16));
    expect(await sameCode("python3", fromStore, reference, 16)).toBe(true);
  });
});
