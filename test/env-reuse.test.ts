import { afterAll, beforeAll, describe, expect, setDefaultTimeout, test } from "bun:test";
import { existsSync, mkdirSync, readdirSync, readFileSync, rmSync, statSync, symlinkSync, writeFileSync } from "node:fs";
import { join } from "node:path";
import { makeDist, PackageIndex } from "./fixtures/index.ts";
import { cli, makeWorkerVenv, realUv, run, sandbox, tempDir } from "./helpers.ts";

/**
 * The cache hands back only what a fresh build would give. For each class of
 * input: build, change that one input, prepare again, and import from the env
 * handed back. Real pip and real uv (both installer paths), a real index on
 * 127.0.0.1, a real C compiler for the extension.
 */

setDefaultTimeout(180_000);

const world = tempDir("gpl-reuse-");
const index = new PackageIndex(join(world, "index"));
let py: string;

/** An in-tree PEP 517/660 backend like setuptools' for a project with a C library: dependencies read from requirements.txt, native/value.c compiled by gcc. */
const BACKEND = String.raw`
import base64, hashlib, io, os, subprocess, zipfile
NAME, VERSION = "proj", "0.1"
def _requires():
    return [l.strip() for l in open("requirements.txt") if l.strip() and not l.startswith("#")] if os.path.exists("requirements.txt") else []
def _compile(out):
    subprocess.check_call(["gcc", "-shared", "-fPIC", "-o", out, os.path.join("native", "value.c")])
def _wheel(wd, files, tag="py3-none-any"):
    dist = f"{NAME}-{VERSION}.dist-info"
    files[f"{dist}/METADATA"] = ("Metadata-Version: 2.1\nName: %s\nVersion: %s\n" % (NAME, VERSION) + "".join("Requires-Dist: %s\n" % r for r in _requires())).encode()
    files[f"{dist}/WHEEL"] = b"Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\nTag: py3-none-any\n"
    rec = []
    for p, d in files.items():
        rec.append("%s,sha256=%s,%d" % (p, base64.urlsafe_b64encode(hashlib.sha256(d).digest()).rstrip(b"=").decode(), len(d)))
    files[f"{dist}/RECORD"] = ("\n".join(rec + [f"{dist}/RECORD,,"]) + "\n").encode()
    name = f"{NAME}-{VERSION}-{tag}.whl"
    with zipfile.ZipFile(os.path.join(wd, name), "w") as z:
        for p, d in files.items():
            z.writestr(p, d)
    return name
def get_requires_for_build_wheel(config_settings=None):
    return []
get_requires_for_build_editable = get_requires_for_build_wheel
def build_wheel(wd, config_settings=None, metadata_directory=None):
    files = {}
    for root, dirs, names in os.walk(NAME, followlinks=True):
        dirs[:] = [d for d in dirs if d != "__pycache__"]
        for n in names:
            if not n.endswith((".pyc", ".so")):
                files[os.path.join(root, n)] = open(os.path.join(root, n), "rb").read()
    so = os.path.join(wd, "_libvalue.so")  # the wheel folder: pip removes it with the build
    _compile(so)
    files[f"{NAME}/libvalue.so"] = open(so, "rb").read()
    os.remove(so)
    return _wheel(wd, files)
def build_editable(wd, config_settings=None, metadata_directory=None):
    _compile(os.path.join(NAME, "libvalue.so"))  # in place, as build_ext --inplace does
    return _wheel(wd, {f"__editable__.{NAME}.pth": (os.path.abspath(".") + "\n").encode()})
`;

const INIT = `import ctypes, os\ndef native():\n    return ctypes.CDLL(os.path.join(os.path.dirname(__file__), "libvalue.so")).value()\n`;

function makeProject(dir: string): string {
  mkdirSync(join(dir, "proj"), { recursive: true });
  mkdirSync(join(dir, "native"), { recursive: true });
  writeFileSync(join(dir, "pyproject.toml"), '[build-system]\nrequires = []\nbuild-backend = "backend"\nbackend-path = ["."]\n');
  writeFileSync(join(dir, "backend.py"), BACKEND);
  writeFileSync(join(dir, ".gitignore"), "*.so\n");
  writeFileSync(join(dir, "requirements.txt"), "dep-a\n");
  writeFileSync(join(dir, "native", "value.c"), "int value(void) { return 1; }\n");
  writeFileSync(join(dir, "proj", "__init__.py"), INIT);
  writeFileSync(join(dir, "proj", "core.py"), "LIVE = 0\n");
  return dir;
}

beforeAll(async () => {
  index.start();
  for (const name of ["dep-a", "dep-b"]) index.wheel({ name, version: "1.0" });
  const s = sandbox();
  py = await makeWorkerVenv(join(world, "worker"), { env: s.env });
  s.cleanup();
}, 120_000);

afterAll(() => {
  index.stop();
  rmSync(world, { recursive: true, force: true });
});

/** Python of the env, run from outside any project folder (so only the env's own links serve imports). */
async function inEnv(envPath: string, code: string): Promise<string> {
  const r = await run([join(envPath, "bin", "python"), "-c", code], { cwd: "/" });
  if (r.code !== 0) throw new Error(r.stderr);
  return r.stdout.trim();
}

for (const installer of ["pip", "auto"] as const) {
  describe(`reuse is never wrong (${installer === "pip" ? "pip path" : "fast path where it applies"})`, () => {
    const s = sandbox();
    afterAll(() => s.cleanup());
    const prepare = async (args: string[], env: Record<string, string> = {}) => {
      const r = await cli(["env", "prepare", ...args, "--python", py, "--json"], { env: { ...s.env, GPULAYER_INSTALLER: installer, ...env }, cwd: s.root });
      if (r.code !== 0) throw new Error(r.stderr);
      return JSON.parse(r.stdout) as { key: string; path: string; status: string };
    };

    test("-e ./proj: a dependency added to its requirements.txt, a changed C source rebuild; a pure-Python edit is served live", async () => {
      const proj = makeProject(join(s.root, "proj-e"));
      writeFileSync(join(s.root, "req-e.txt"), "-e ./proj-e\n");
      const idx = ["req-e.txt", "--index-url", index.url];
      const first = await prepare(idx);
      expect(first.status).toBe("built");
      expect(await inEnv(first.path, "import proj, dep_a; print(proj.native())")).toBe("1");
      expect((await prepare(idx)).status).toBe("reused");

      writeFileSync(join(proj, "requirements.txt"), "dep-a\ndep-b\n");
      const deps = await prepare(idx);
      expect(deps.status).toBe("built");
      expect(await inEnv(deps.path, "import dep_b; print(dep_b.__version__)")).toBe("1.0");

      writeFileSync(join(proj, "native", "value.c"), "int value(void) { return 2; }\n");
      const native = await prepare(idx);
      expect(native.status).toBe("built");
      expect(await inEnv(native.path, "import proj; print(proj.native())")).toBe("2");

      writeFileSync(join(proj, "proj", "core.py"), "LIVE = 7\n");
      const live = await prepare(idx);
      expect(live).toMatchObject({ status: "reused", key: native.key });
      expect(await inEnv(live.path, "import proj.core; print(proj.core.LIVE)")).toBe("7");
    });

    test("./proj (copied): a subpackage named build/ and a symlinked module count by content", async () => {
      const proj = makeProject(join(s.root, "proj-c"));
      mkdirSync(join(proj, "proj", "build"), { recursive: true });
      writeFileSync(join(proj, "proj", "build", "__init__.py"), "V = 1\n");
      mkdirSync(join(s.root, "shared"), { recursive: true });
      writeFileSync(join(s.root, "shared", "linked.py"), "L = 1\n");
      symlinkSync(join(s.root, "shared", "linked.py"), join(proj, "proj", "linked.py"));
      const args = ["-p", "./proj-c", "--index-url", index.url];
      const first = await prepare(args);
      expect(await inEnv(first.path, "import proj.build, proj.linked; print(proj.build.V, proj.linked.L)")).toBe("1 1");
      expect((await prepare(args)).status).toBe("reused");
      writeFileSync(join(proj, "proj", "build", "__init__.py"), "V = 2\n");
      const sub = await prepare(args);
      expect(sub.status).toBe("built");
      expect(await inEnv(sub.path, "import proj.build; print(proj.build.V)")).toBe("2");
      writeFileSync(join(s.root, "shared", "linked.py"), "L = 2\n");
      const linked = await prepare(args);
      expect(linked.status).toBe("built");
      expect(await inEnv(linked.path, "import proj.linked; print(proj.linked.L)")).toBe("2");
    });

    test("name @ file:///…/x.whl: a wheel rebuilt at the same path is picked up", async () => {
      const dir = join(s.root, "wheelhouse");
      const whl = makeDist("wheel", dir, { name: "atwheel", version: "1.0" });
      writeFileSync(join(s.root, "req-w.txt"), `atwheel @ file://${whl}\n`);
      const first = await prepare(["req-w.txt", "--index-url", index.url]);
      expect(await inEnv(first.path, "import atwheel, os; print(os.path.exists(os.path.join(os.path.dirname(atwheel.__file__), 'new.py')))")).toBe("False");
      rmSync(whl);
      makeDist("wheel", dir, { name: "atwheel", version: "1.0", files: { "atwheel/new.py": "N = 1\n" } });
      const again = await prepare(["req-w.txt", "--index-url", index.url]);
      expect(again.status).toBe("built");
      expect(await inEnv(again.path, "import atwheel.new; print(atwheel.new.N)")).toBe("1");
    });

    test("a local --find-links folder: a newer wheel dropped in it is what an unpinned request gets", async () => {
      const dir = join(s.root, "links");
      makeDist("wheel", dir, { name: "linked-pkg", version: "1.0" });
      writeFileSync(join(s.root, "req-f.txt"), "--no-index --find-links ./links\nlinked-pkg\n");
      const first = await prepare(["req-f.txt"]);
      expect(await inEnv(first.path, "import linked_pkg; print(linked_pkg.__version__)")).toBe("1.0");
      expect((await prepare(["req-f.txt"])).status).toBe("reused");
      makeDist("wheel", dir, { name: "linked-pkg", version: "2.0" });
      const newer = await prepare(["req-f.txt"]);
      expect(newer.status).toBe("built");
      expect(await inEnv(newer.path, "import linked_pkg; print(linked_pkg.__version__)")).toBe("2.0");
    });

    test("a local --find-links folder: a wheel rebuilt under the same file name is what the new env holds (flag, file, pip config)", async () => {
      const dir = join(s.root, "rebuilt");
      const whl = makeDist("wheel", dir, { name: "rebuilt-pkg", version: "1.0", files: { "rebuilt_pkg/which.py": "V = 'A1'\n" } });
      writeFileSync(join(s.root, "req-rb.txt"), "--no-index --find-links ./rebuilt\nrebuilt-pkg\n");
      writeFileSync(join(s.root, "req-rb-plain.txt"), "rebuilt-pkg\n");
      writeFileSync(join(s.root, "req-rb-noindex.txt"), "--no-index\nrebuilt-pkg\n");
      const conf = join(s.root, "pip-rb.conf");
      writeFileSync(conf, `[global]\nno-index = true\nfind-links = ${dir}\n`);
      // The same folder three ways: in the requirements file, as a flag, and from the machine's pip configuration.
      const ways: [string[], Record<string, string>][] = [[["req-rb.txt"], {}], [["req-rb-noindex.txt", "--find-links", dir], {}], [["req-rb-plain.txt"], { PIP_CONFIG_FILE: conf }]];
      for (const [args, env] of ways) expect(await inEnv((await prepare(args, env)).path, "import rebuilt_pkg.which as w; print(w.V)")).toBe("A1");
      rmSync(whl);
      makeDist("wheel", dir, { name: "rebuilt-pkg", version: "1.0", files: { "rebuilt_pkg/which.py": "V = 'A2'\n" } });
      for (const [args, env] of ways) {
        const again = await prepare(args, env);
        expect(again.status).toBe("built");
        expect(await inEnv(again.path, "import rebuilt_pkg.which as w; print(w.V)")).toBe("A2");
      }
    });

    test("a -r path holding '#' is the file pip reads (the whole name), not the one before the '#'", async () => {
      for (const v of ["1.0", "2.0"]) makeDist("wheel", join(s.root, "hash-links"), { name: "hashed-pkg", version: v });
      writeFileSync(join(s.root, "req-h.txt"), `--no-index --find-links ./hash-links\n-r sub-h.txt#frag\n`);
      writeFileSync(join(s.root, "sub-h.txt#frag"), "hashed-pkg<2\n");
      writeFileSync(join(s.root, "sub-h.txt"), "hashed-pkg>1\n");
      const first = await prepare(["req-h.txt"]);
      expect(await inEnv(first.path, "import hashed_pkg; print(hashed_pkg.__version__)")).toBe("1.0");
      writeFileSync(join(s.root, "sub-h.txt#frag"), "hashed-pkg>1\n");
      const again = await prepare(["req-h.txt"]);
      expect(again.status).toBe("built");
      expect(await inEnv(again.path, "import hashed_pkg; print(hashed_pkg.__version__)")).toBe("2.0");
    });

    test("an --index-url after another option on the same line is the index the build uses", async () => {
      writeFileSync(join(s.root, "req-i.txt"), `--pre --index-url ${index.url}\ndep-a\n`);
      // No index flag: without the file's own -i, pip would go to the machine's (here: none) and fail.
      const r = await prepare(["req-i.txt"]);
      expect(await inEnv(r.path, "import dep_a; print(dep_a.__version__)")).toBe("1.0");
    });
  });
}

describe("credentials and variables never stored", () => {
  test("-i https://alice:s3cr@tpw@host and ${TOKEN}: nothing under GPULAYER_HOME holds any part of them", async () => {
    const s = sandbox();
    try {
      const withCreds = index.url.replace("http://", "http://alice:s3cr@tpw@");
      writeFileSync(join(s.root, "req.txt"), `-i ${withCreds}\n--extra-index-url ${index.url.replace("http://", "http://bob:${TOKEN}@")}\ndep-a\n`);
      const r = await cli(["env", "prepare", "req.txt", "--python", py, "--json"], { env: { ...s.env, TOKEN: "tok-98765" }, cwd: s.root });
      expect(r.code).toBe(0);
      const dry = await cli(["env", "prepare", "req.txt", "--python", py, "--dry-run", "--json"], { env: { ...s.env, TOKEN: "tok-98765" }, cwd: s.root });
      expect(JSON.parse(dry.stdout).would).toBe("reuse");
      const found: string[] = [];
      const walk = (dir: string) => {
        for (const n of readdirSync(dir)) {
          const p = join(dir, n);
          const st = statSync(p);
          if (st.isDirectory()) walk(p);
          else if (st.isFile() && st.size < 4_000_000) {
            const text = readFileSync(p, "latin1");
            for (const secret of ["s3cr", "tpw@", "tok-98765"]) if (text.includes(secret)) found.push(`${p}: ${secret}`);
          }
        }
      };
      walk(s.home);
      expect(found).toEqual([]);
      expect(`${r.stdout}${r.stderr}${dry.stdout}${dry.stderr}`).not.toMatch(/s3cr|tpw@|tok-98765/);
    } finally {
      s.cleanup();
    }
  });
});

describe("credentials never in job records", () => {
  test("a private index: foreground and --detach jobs build with the credentials, and the job store holds none of them", async () => {
    const s = sandbox();
    const priv = new PackageIndex(join(s.root, "private"), { basicAuth: "alice:s3cr@tpw" }).start();
    try {
      priv.wheel({ name: "priv-pkg", version: "2.0" });
      const url = priv.url.replace("http://", "http://alice:s3cr@tpw@");
      const fg = await cli(["job", "run", "-p", "priv-pkg", "--index-url", url, "--python", py, "--", "python", "-c", "import priv_pkg; print(priv_pkg.__version__)"], { env: s.env, cwd: s.root });
      expect(fg.stderr).not.toMatch(/s3cr|tpw@/);
      expect(fg.stdout.trim()).toBe("2.0");
      // A new env (another version asked for): the detached runner must have the credentials to build it.
      priv.wheel({ name: "priv-pkg", version: "2.1" });
      const bg = await cli(["job", "run", "--detach", "-p", "priv-pkg==2.1", "--index-url", url, "--python", py, "--", "python", "-c", "import priv_pkg; print(priv_pkg.__version__)"], { env: s.env, cwd: s.root });
      expect(bg.code).toBe(0);
      const id = bg.stdout.trim();
      const logs = await cli(["job", "logs", id, "--follow"], { env: s.env });
      expect(logs.stdout.trim()).toBe("2.1");
      const status = await cli(["job", "status", id, "--json"], { env: s.env });
      expect(JSON.parse(status.stdout).state).toBe("succeeded");
      const list = await cli(["job", "list", "--json"], { env: s.env });
      for (const text of [status.stdout, list.stdout, logs.stdout, logs.stderr, bg.stderr]) expect(text).not.toMatch(/s3cr|tpw@/);
      const stored = readdirSync(join(s.home, "jobs")).map((n) => readFileSync(join(s.home, "jobs", n), "latin1")).join("");
      expect(stored.includes("***@127.0.0.1")).toBe(true); // the record is there, without the credentials
      expect(stored.match(/s3cr|tpw@/)?.[0] ?? null).toBeNull();
    } finally {
      priv.stop();
      s.cleanup();
    }
  });
});

const PYENV_ROOT = process.env.PYENV_ROOT ?? join(process.env.HOME ?? "/root", ".pyenv");
const pyenvVersions = existsSync(join(PYENV_ROOT, "versions")) ? readdirSync(join(PYENV_ROOT, "versions")).filter((v) => /^3\.(1[0-9])\.\d+$/.test(v)) : [];
const PYENV_SHIM = join(PYENV_ROOT, "shims", "python3");
const noShimChoice = pyenvVersions.length < 2 || !existsSync(PYENV_SHIM);

describe("the interpreter behind a shim", () => {
  // Skipped only without pyenv holding two Pythons 3.1x: the case is one shim choosing between them. This machine and its CI have 3.6 to 3.13.
  test.skipIf(noShimChoice)("a pyenv shim with PYENV_VERSION=A, then B: two envs, each of its own Python", async () => {
    const s = sandbox();
    try {
      const [a, b] = pyenvVersions.slice(-2) as [string, string];
      const shim = PYENV_SHIM;
      // uv may itself be a pyenv shim (pip install uv under pyenv): a PYENV_VERSION without it would hide it.
      const uvDir = join(s.root, "uv-bin");
      mkdirSync(uvDir);
      const uv = realUv();
      if (uv) symlinkSync(uv, join(uvDir, "uv"));
      const PATH = `${uvDir}:${s.env.PATH}`;
      const prep = async (version: string) => {
        const r = await cli(["env", "prepare", "-p", "dep-a", "--index-url", index.url, "--python", shim, "--json"], { env: { ...s.env, PATH, PYENV_ROOT, PYENV_VERSION: version }, cwd: s.root });
        if (r.code !== 0) throw new Error(r.stderr);
        return JSON.parse(r.stdout) as { key: string; path: string; status: string };
      };
      const ea = await prep(a);
      const eb = await prep(b);
      expect(eb.key).not.toBe(ea.key);
      expect(await inEnv(eb.path, "import sys; print('%d.%d.%d' % sys.version_info[:3])")).toBe(b);
      expect(await inEnv(ea.path, "import sys; print('%d.%d.%d' % sys.version_info[:3])")).toBe(a);
      expect(await prep(a)).toMatchObject({ key: ea.key, status: "reused" });
    } finally {
      s.cleanup();
    }
  });

  // Skipped only without pyenv holding two Pythons 3.1x, as above.
  test.skipIf(noShimChoice)("a shim's answer an older gpulayer kept under the shim's path is not taken: the shim is resolved anew", async () => {
    const s = sandbox();
    try {
      const [a, b] = pyenvVersions.slice(-2) as [string, string];
      const shim = PYENV_SHIM;
      // What gpulayer kept before shims were resolved: the shim probed as if it were Python, under its own path.
      const interpreters = join(s.home, "interpreters-v1");
      const probe = `const { probeInterpreter } = await import(${JSON.stringify(join(import.meta.dir, "..", "src", "env", "request", "interpreter.ts"))}); console.log(probeInterpreter(${JSON.stringify(shim)}, ${JSON.stringify(interpreters)}).version);`;
      const probed = Bun.spawnSync([process.execPath, "-e", probe], { env: { ...s.env, PYENV_ROOT, PYENV_VERSION: a }, stdout: "pipe", stderr: "pipe" });
      expect(probed.stdout.toString().trim()).toBe(a);
      const [entry] = readdirSync(interpreters);
      const kept = JSON.parse(readFileSync(join(interpreters, entry!), "utf8")) as Record<string, unknown>;
      delete kept.shimFree;
      writeFileSync(join(interpreters, entry!), JSON.stringify(kept));
      const r = await cli(["env", "prepare", "-p", "dep-a", "--index-url", index.url, "--python", shim, "--json"], { env: { ...s.env, PYENV_ROOT, PYENV_VERSION: b, GPULAYER_INSTALLER: "pip" }, cwd: s.root });
      if (r.code !== 0) throw new Error(r.stderr);
      const env = JSON.parse(r.stdout) as { path: string };
      expect(await inEnv(env.path, "import sys; print('%d.%d.%d' % sys.version_info[:3])")).toBe(b);
    } finally {
      s.cleanup();
    }
  });
});

describe("a version pyenv resolves by its own rules", () => {
  // Skipped only without pyenv holding two Pythons 3.1x, as above.
  test.skipIf(noShimChoice)("a .python-version naming a prefix (uv init writes 3.11), no Python named: the one pyenv itself runs there, and the uv it has there", async () => {
    const s = sandbox();
    try {
      const [a] = pyenvVersions.slice(-2) as [string, string];
      const prefix = a.split(".").slice(0, 2).join(".");
      const dir = join(s.root, "project");
      mkdirSync(dir);
      writeFileSync(join(dir, ".python-version"), `${prefix}\n`);
      const env: Record<string, string> = { ...s.env, PYENV_ROOT, PATH: `${join(PYENV_ROOT, "shims")}:${s.env.PATH}` };
      delete env.PYENV_VERSION;
      // The reference: what pyenv's shim runs in that folder.
      const said = await run(["python3", "-c", "import sys; print('%d.%d.%d' % sys.version_info[:3])"], { env, cwd: dir });
      expect(said.stdout.trim()).toStartWith(`${prefix}.`);
      const r = await cli(["env", "prepare", "-p", "dep-a", "--index-url", index.url, "--json"], { env, cwd: dir });
      expect(r.code, r.stderr).toBe(0);
      const prepared = JSON.parse(r.stdout) as { path: string };
      expect(await inEnv(prepared.path, "import sys; print('%d.%d.%d' % sys.version_info[:3])")).toBe(said.stdout.trim());
      // uv behind its pyenv shim, as pyenv answers for that folder: its own uv where that version has one, else gpulayer's pinned one.
      const uvThere = (await run([join(PYENV_ROOT, "libexec", "pyenv"), "which", "uv"], { env, cwd: dir })).code === 0;
      expect(readdirSync(join(s.home, "tools")).some((f) => f.startsWith("uv-"))).toBe(!uvThere);
      // A version pyenv does not have at all: what its shim runs there (pyenv 2.6 falls back to the system's).
      writeFileSync(join(dir, ".python-version"), "3.99\n");
      const fallback = await run(["python3", "-c", "import sys; print(sys.version)"], { env, cwd: dir });
      const other = await cli(["env", "prepare", "-p", "dep-a", "--index-url", index.url, "--json"], { env, cwd: dir });
      expect(other.code, other.stderr).toBe(0);
      expect(await inEnv((JSON.parse(other.stdout) as { path: string }).path, "import sys; print(sys.version)")).toBe(fallback.stdout.trim());
      // An installed version without python3 (a shim of a root of its own): no Python named, none is blamed on --python.
      const root = join(s.root, "pyenv-root");
      mkdirSync(join(root, "versions", "3.42.0"), { recursive: true });
      mkdirSync(join(root, "shims"));
      writeFileSync(join(root, "shims", "python3"), readFileSync(PYENV_SHIM, "utf8").replaceAll(PYENV_ROOT, root), { mode: 0o755 });
      writeFileSync(join(dir, ".python-version"), "3.42.0\n");
      const none = await cli(["env", "prepare", "-p", "dep-a", "--index-url", index.url], { env: { ...env, PYENV_ROOT: root, PATH: `${join(root, "shims")}:${s.env.PATH}` }, cwd: dir });
      expect(none.code).toBe(2);
      expect(none.stderr.trim().split("\n").at(-1)).toBe(`error: python3 on PATH (no Python named): ${join(root, "shims", "python3")} is a pyenv shim, and the Python version pyenv picks here (${join(dir, ".python-version")}) has no python3`);
    } finally {
      s.cleanup();
    }
  });
});

describe("pyenv's names, kept", () => {
  // Skipped only without pyenv holding two Pythons 3.1x, as above (its shim's text is the model).
  test.skipIf(noShimChoice)("a version pyenv resolves by its own rules is asked of pyenv once, then again only when the versions installed change", async () => {
    const s = sandbox();
    try {
      const [a] = pyenvVersions.slice(-2) as [string, string];
      // A pyenv root of its own, whose pyenv logs each call and names 3.42.0 for the prefix 3.42; its 3.42.0 is a real Python.
      const root = join(s.root, "pyenv-root");
      const log = join(s.root, "pyenv-calls");
      mkdirSync(join(root, "versions", "3.42.0", "bin"), { recursive: true });
      symlinkSync(join(PYENV_ROOT, "versions", a, "bin", "python3"), join(root, "versions", "3.42.0", "bin", "python3"));
      mkdirSync(join(root, "libexec"));
      writeFileSync(join(root, "libexec", "pyenv"), `#!/bin/sh\necho "$*" >> '${log}'\n[ "$1" = version-name ] && echo 3.42.0 && exit 0\nexit 1\n`, { mode: 0o755 });
      mkdirSync(join(root, "shims"));
      writeFileSync(join(root, "shims", "python3"), readFileSync(PYENV_SHIM, "utf8").replaceAll(PYENV_ROOT, root), { mode: 0o755 });
      writeFileSync(join(s.root, ".python-version"), "3.42\n");
      const env: Record<string, string> = { ...s.env, PYENV_ROOT: root, PATH: `${join(root, "shims")}:${s.env.PATH}` };
      delete env.PYENV_VERSION;
      const prep = async () => {
        const r = await cli(["env", "prepare", "-p", "dep-a", "--index-url", index.url, "--json"], { env, cwd: s.root });
        expect(r.code, r.stderr).toBe(0);
        return JSON.parse(r.stdout) as { path: string; status: string };
      };
      const calls = () => readFileSync(log, "utf8").trim().split("\n");
      const first = await prep();
      expect(await inEnv(first.path, "import sys; print('%d.%d.%d' % sys.version_info[:3])")).toBe(a);
      expect(calls()).toEqual(["version-name"]);
      expect(await prep()).toMatchObject({ path: first.path, status: "reused" });
      expect(calls()).toEqual(["version-name"]);
      // Another version installed: pyenv's answer may change, so it is asked again.
      mkdirSync(join(root, "versions", "3.42.1"));
      await prep();
      expect(calls()).toEqual(["version-name", "version-name"]);
    } finally {
      s.cleanup();
    }
  });
});

describe("one default Python", () => {
  test("join --python, then env prepare, then job run: the job's task.prepare is a cache hit", async () => {
    const s = sandbox();
    try {
      const joined = await cli(["join", "--python", py, "--json"], { env: s.env, cwd: s.root });
      expect(joined.code).toBe(0);
      writeFileSync(join(s.root, "requirements.txt"), "dep-a\n");
      const warm = await cli(["env", "prepare", "requirements.txt", "--index-url", index.url, "--json"], { env: s.env, cwd: s.root });
      expect(warm.code).toBe(0);
      expect(JSON.parse(warm.stdout).status).toBe("built");
      const job = await cli(["job", "run", "-r", "requirements.txt", "--index-url", index.url, "--json", "--", "python", "-c", "import sys, dep_a; print(sys.prefix)"], { env: s.env, cwd: s.root });
      expect(job.code).toBe(0);
      const doc = JSON.parse(job.stdout);
      expect(doc.phases.find((p: { name: string }) => p.name === "task.prepare").cache).toBe("hit");
      // And warm again, by the warm lane: the saved Python is its default too, and the key is the one built.
      const again = await cli(["env", "prepare", "requirements.txt", "--index-url", index.url, "--json", "--verbose"], { env: s.env, cwd: s.root });
      expect(again.code, again.stderr).toBe(0);
      expect(JSON.parse(again.stdout)).toMatchObject({ status: "reused", key: JSON.parse(warm.stdout).key });
      expect(again.stderr).toContain("answered by env prepare's warm lane");
    } finally {
      s.cleanup();
    }
  });

  test("join --python with a path that is no Python 3 saves nothing and exits 2", async () => {
    const s = sandbox();
    try {
      for (const bad of ["/nope/python", "/bin/false"]) {
        const r = await cli(["join", "--python", bad], { env: s.env, cwd: s.root });
        expect(r.code).toBe(2);
        expect(r.stderr).toMatch(/^error: --python: /);
        expect(r.stderr.trim().split("\n")).toHaveLength(1);
      }
      expect(readdirSync(s.home).filter((n) => n.includes("worker"))).toEqual([]);
    } finally {
      s.cleanup();
    }
  });
});
