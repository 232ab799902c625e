import { afterAll, beforeAll, describe, expect, setDefaultTimeout, test } from "bun:test";
import { existsSync, mkdirSync, readFileSync, rmSync, writeFileSync } from "node:fs";
import { join } from "node:path";
import { installedSet } from "../src/env/request/interpreter.ts";
import { eggInfoRequires } from "../src/env/build/worker-mirror.ts";
import { leftoverPlaceholders } from "../src/env/build/standins.ts";
import { makeDist, PackageIndex } from "./fixtures/index.ts";
import { cli, HAS_UV, makeWorkerVenv, pipInstall, run, sandbox, tempDir } from "./helpers.ts";

/**
 * The uv fast path against the pip path, request by request: each request is
 * built twice, on fresh homes, with GPULAYER_INSTALLER=uv and =pip; both
 * envs must hold the same `name==version` set in their own site-packages,
 * import the same things from the same places, and have the same key.
 */

setDefaultTimeout(120_000);

const world = tempDir("gpl-fast-");
const index = new PackageIndex(join(world, "index"));
let wB: string; // worker with pip and b 1.0
let wPlain: string; // worker without pip
let wEd: string; // worker with an editable project
let wEgg: string; // worker with b 1.0 and an egg-info distribution (as setup.py install leaves them)
let wBroken: string; // worker with needs-b2 but b 1.0 (installed without its dependencies)
let edSrc: string;
let sdistCounter: string;

const site = (venv: string) => join(venv, "lib", "python3.11", "site-packages");

beforeAll(async () => {
  index.start();
  index.wheel({ name: "tiny", version: "1.0" });
  index.wheel({ name: "b", version: "1.0" });
  index.wheel({ name: "b", version: "2.0" });
  index.wheel({ name: "needs-b1", version: "1.0", requires: ["b>=1"] });
  index.wheel({ name: "needs-b2", version: "1.0", requires: ["b>=2"] });
  index.wheel({ name: "extra-dep", version: "1.0" });
  index.wheel({ name: "withextra", version: "1.0", requires: ["tiny", 'extra-dep; extra == "fancy"'] });
  index.wheel({ name: "py2only", version: "1.0" });
  index.wheel({ name: "needs-edproj", version: "1.0", requires: ["edproj>=0.1"] });
  index.wheel({ name: "needs-eggy", version: "1.0", requires: ["eggy>=1"] });
  index.wheel({ name: "eggy", version: "2.0" });
  index.wheel({ name: "pre-pkg", version: "1.0" });
  index.wheel({ name: "pre-pkg", version: "2.0b1" });
  index.wheel({ name: "only-pre", version: "1.0b1" });
  sdistCounter = join(world, "sdist-builds");
  index.sdist({ name: "built-pkg", version: "1.0", requires: ["b>=1"], counter: sdistCounter });
  const s = sandbox();
  edSrc = makeDist("project", join(world, "src"), { name: "edproj", version: "0.1" });
  [wB, wPlain, wEd, wEgg, wBroken] = await Promise.all([
    makeWorkerVenv(join(world, "w-b"), { env: s.env, withPip: true, packages: ["b==1.0"], findLinks: index.dir }),
    makeWorkerVenv(join(world, "w-plain"), { env: s.env }),
    makeWorkerVenv(join(world, "w-ed"), { env: s.env, withPip: true, editable: edSrc }),
    makeWorkerVenv(join(world, "w-egg"), { env: s.env, withPip: true, packages: ["b==1.0"], findLinks: index.dir }),
    makeWorkerVenv(join(world, "w-broken"), { env: s.env, withPip: true, packages: ["b==1.0"], findLinks: index.dir }),
  ]);
  await pipInstall(wBroken, ["--no-deps", "--find-links", index.dir, "needs-b2"], s.env);
  // An egg-info folder, as `setup.py install` or Debian's python3-* packages leave them: requirements in requires.txt.
  const egg = join(site(join(world, "w-egg")), "eggy-1.0-py3.11.egg-info");
  mkdirSync(egg);
  writeFileSync(join(egg, "PKG-INFO"), "Metadata-Version: 1.2\nName: eggy\nVersion: 1.0\n\nAn egg-info distribution.\n");
  writeFileSync(join(egg, "requires.txt"), "b>=1\n\n[fancy]\nextra-dep\n");
  mkdirSync(join(site(join(world, "w-egg")), "eggy"));
  writeFileSync(join(site(join(world, "w-egg")), "eggy", "__init__.py"), '__version__ = "1.0"\n');
  s.cleanup();
}, 180_000);

afterAll(() => {
  index.stop();
  rmSync(world, { recursive: true, force: true });
});

interface Built {
  code: number;
  stderr: string;
  key: string;
  path: string;
  installed: string[];
  meta: Record<string, any>;
  json: Record<string, any>;
}

/** One prepare on a fresh home with the installer forced. */
async function build(installer: "uv" | "pip" | "auto", args: string[], extraEnv: Record<string, string> = {}): Promise<Built> {
  const s = sandbox();
  try {
    const r = await cli(["env", "prepare", ...args, "--json"], { env: { ...s.env, GPULAYER_INSTALLER: installer, ...extraEnv }, cwd: s.root });
    if (r.code !== 0) return { code: r.code, stderr: r.stderr, key: "", path: "", installed: [], meta: {}, json: {} };
    const json = JSON.parse(r.stdout);
    const envSite = site(json.path);
    const meta = JSON.parse(readFileSync(join(json.path, ".gpulayer", "meta.json"), "utf8"));
    expect(leftoverPlaceholders(envSite)).toEqual([]);
    // Keep the env for the import checks: move it out of the sandbox that is removed below.
    const keep = join(world, "envs", `${installer}-${Math.random().toString(36).slice(2)}`);
    mkdirSync(join(world, "envs"), { recursive: true });
    await run(["mv", s.root, keep]);
    const path = json.path.replace(s.root, keep);
    return { code: 0, stderr: r.stderr, key: json.key, path, installed: installedSet([envSite.replace(s.root, keep)]), meta, json };
  } finally {
    if (existsSync(s.root)) s.cleanup();
  }
}

/** Both paths, side by side; they must agree on the key and the installed set. */
async function both(args: string[], opts: { warnings?: boolean } = {}): Promise<{ uv: Built; pip: Built }> {
  const [uv, pip] = await Promise.all([build("uv", args), build("pip", args)]);
  if (!opts.warnings) {
    // Progress lines go to stderr with --json too; no warning or error may.
    const said = (text: string) => text.split("\n").filter((l) => /^(warning|error|internal error):/.test(l));
    expect(said(uv.stderr)).toEqual([]);
    expect(said(pip.stderr)).toEqual([]);
  }
  expect(uv.code).toBe(0);
  expect(pip.code).toBe(0);
  expect(uv.key).toBe(pip.key);
  expect(uv.meta.installerPath).toBe("uv (fast path)");
  expect(uv.json.installer_path).toBe("uv (fast path)");
  expect(uv.meta.installer).toMatch(/^uv \d+\.\d+\.\d+ \(fast path\)$/);
  expect(pip.meta.installerPath).toBe("pip");
  expect(pip.meta.installer).toMatch(/^pip \d/);
  expect(uv.installed).toEqual(pip.installed);
  return { uv, pip };
}

/** What the env's python prints for a snippet, in both envs alike. */
async function sameImports(pair: { uv: Built; pip: Built }, code: string): Promise<string> {
  const [a, b] = await Promise.all([pair.uv, pair.pip].map((e) => run([join(e.path, "bin", "python"), "-c", code])));
  expect(a!.stderr).toBe("");
  expect(b!.stderr).toBe("");
  expect(a!.stdout.replace(pair.uv.path, "ENV")).toBe(b!.stdout.replace(pair.pip.path, "ENV"));
  return a!.stdout.trim().replace(pair.uv.path, "ENV");
}

const idx = () => ["--index-url", index.url];

// Skipped only without uv on PATH (these compare against or run uv itself); .ci/run installs uv, so CI runs them.
describe.if(HAS_UV)("the uv fast path gives what the pip path gives", () => {
  test("the worker has b 1.0 and a request needs b>=1: nothing of b in the env; pip list shows the worker's b", async () => {
    const pair = await both(["-p", "needs-b1", ...idx(), "--python", wB]);
    expect(pair.uv.installed).toEqual(["needs-b1==1.0"]);
    expect(await sameImports(pair, "import b, needs_b1; print(b.__version__, b.__file__)")).toBe(`1.0 ${join(site(join(world, "w-b")), "b", "__init__.py")}`);
    const list = await run([join(pair.uv.path, "bin", "python"), "-m", "pip", "list", "-v", "--format", "json", "--disable-pip-version-check"]);
    const b = JSON.parse(list.stdout).find((p: { name: string }) => p.name === "b");
    expect(b).toMatchObject({ version: "1.0", location: site(join(world, "w-b")) });
  });

  test("a request that needs b>=2: b 2.0 goes into the env and shadows the worker's", async () => {
    const pair = await both(["-p", "needs-b2", ...idx(), "--python", wB]);
    expect(pair.uv.installed).toEqual(["b==2.0", "needs-b2==1.0"]);
    expect(await sameImports(pair, "import b; print(b.__version__, b.__file__)")).toBe(`2.0 ${join("ENV", "lib", "python3.11", "site-packages", "b", "__init__.py")}`);
    expect((await run([wB, "-c", "import b; print(b.__version__)"])).stdout.trim()).toBe("1.0"); // the worker is untouched
  });

  test("extras: pkg[extra] brings its extra dependency", async () => {
    const pair = await both(["-p", "withextra[fancy]", ...idx(), "--python", wB]);
    expect(pair.uv.installed).toEqual(["extra-dep==1.0", "tiny==1.0", "withextra==1.0"]);
    await sameImports(pair, "import withextra, extra_dep, tiny");
  });

  test("markers: a requirement for another Python installs nothing", async () => {
    const pair = await both(["-p", 'py2only; python_version < "3"', ...idx(), "--python", wB]);
    expect(pair.uv.installed).toEqual([]);
  });

  test("--find-links DIR --no-index (in a requirements file)", async () => {
    const dir = tempDir("gpl-fast-fl-");
    try {
      writeFileSync(join(dir, "req.txt"), `--no-index\n--find-links ${index.dir}\nneeds-b2\n`);
      const pair = await both([join(dir, "req.txt"), "--python", wB]);
      expect(pair.uv.installed).toEqual(["b==2.0", "needs-b2==1.0"]);
      expect(pair.uv.meta.inputs.find_links).toMatchObject([{ origin: `${join(dir, "req.txt")}:2`, path: index.dir }]);
    } finally {
      rmSync(dir, { recursive: true, force: true });
    }
  });

  test("the worker's editable install is importable, and satisfies a request for it", async () => {
    const pair = await both(["-p", "needs-edproj", ...idx(), "--python", wEd]);
    expect(pair.uv.installed).toEqual(["needs-edproj==1.0"]);
    expect(await sameImports(pair, "import edproj, needs_edproj; print(edproj.SOURCE)")).toBe(join(edSrc, "edproj", "__init__.py"));
  });

  test("an sdist that needs building is built once by each path", async () => {
    const before = existsSync(sdistCounter) ? readFileSync(sdistCounter, "utf8").split("\n").filter(Boolean).length : 0;
    const pair = await both(["-p", "built-pkg", ...idx(), "--python", wB]);
    expect(pair.uv.installed).toEqual(["built-pkg==1.0"]);
    expect(readFileSync(sdistCounter, "utf8").split("\n").filter(Boolean).length).toBe(before + 2);
    await sameImports(pair, "import built_pkg, b; print(built_pkg.__version__, b.__version__)");
  });

  test("a worker without pip: the fast path needs none", async () => {
    const pair = await both(["-p", "needs-b2", ...idx(), "--python", wPlain]);
    expect(pair.uv.installed).toEqual(["b==2.0", "needs-b2==1.0"]);
    expect(pair.pip.meta.installer).toContain("bundled");
  });

  test("an egg-info distribution of the worker counts, with the requirements of its requires.txt", async () => {
    const kept = await both(["-p", "needs-eggy", ...idx(), "--python", wEgg]);
    expect(kept.uv.installed).toEqual(["needs-eggy==1.0"]);
    const extra = await both(["-p", "eggy[fancy]", ...idx(), "--python", wEgg]);
    expect(extra.uv.installed).toEqual(["extra-dep==1.0"]);
    const newer = await both(["-p", "eggy>=2", ...idx(), "--python", wEgg]);
    expect(newer.uv.installed).toEqual(["eggy==2.0"]);
    expect(await sameImports(newer, "import eggy; print(eggy.__version__)")).toBe("2.0");
  });

  test("both checks see the worker's packages: a broken worker is reported by either path", async () => {
    const pair = await both(["-p", "tiny", ...idx(), "--python", wBroken], { warnings: true });
    expect(pair.uv.json.check.join("\n")).toContain("needs-b2");
    expect(pair.pip.json.check.join("\n")).toContain("needs-b2");
    expect(pair.uv.stderr).toContain("needs-b2");
    expect(pair.pip.stderr).toContain("needs-b2");
  });
});

// Skipped only without uv on PATH (these compare against or run uv itself); .ci/run installs uv, so CI runs them.
describe.if(HAS_UV)("what the fast path leaves to pip", () => {
  test("auto takes the fast path where it can", async () => {
    const r = await build("auto", ["-p", "needs-b1", ...idx(), "--python", wB]);
    expect(r.meta).toMatchObject({ installerPath: "uv (fast path)", installerFallback: null });
  });

  test("an option uv does not take: auto builds with pip and records why; uv forced is a usage error", async () => {
    const dir = tempDir("gpl-fast-req-");
    try {
      writeFileSync(join(dir, "req.txt"), "--prefer-binary\nneeds-b1\n");
      const auto = await build("auto", [join(dir, "req.txt"), ...idx(), "--python", wB]);
      expect(auto.meta).toMatchObject({ installerPath: "pip", installerFallback: `${join(dir, "req.txt")}:1: --prefer-binary is left to pip` });
      expect(auto.json.installer_path).toBe("pip");
      expect(auto.installed).toEqual(["needs-b1==1.0"]);
      const forced = await build("uv", [join(dir, "req.txt"), ...idx(), "--python", wB]);
      expect(forced.code).toBe(2);
      expect(forced.stderr.split("\n").filter((l) => l.startsWith("error:"))).toEqual([`error: GPULAYER_INSTALLER=uv, but the fast path cannot build this request: ${join(dir, "req.txt")}:1: --prefer-binary is left to pip`]);
    } finally {
      rmSync(dir, { recursive: true, force: true });
    }
  });

  test("uv fails: auto builds with pip and records uv's words; uv forced fails with them", async () => {
    const dir = tempDir("gpl-fast-broken-uv-");
    try {
      // A cache uv cannot use: the venv module makes the env, uv fails on the install.
      const broken = { UV_CACHE_DIR: join(dir, "not-a-dir"), GPULAYER_VENV_CREATOR: "venv" };
      writeFileSync(broken.UV_CACHE_DIR, "");
      const [auto, forced] = await Promise.all([build("auto", ["-p", "needs-b2", ...idx(), "--python", wB], broken), build("uv", ["-p", "needs-b2", ...idx(), "--python", wB], broken)]);
      expect(auto.code).toBe(0);
      expect(auto.installed).toEqual(["b==2.0", "needs-b2==1.0"]);
      expect(auto.meta).toMatchObject({ installerPath: "pip", installerFallback: expect.stringMatching(/^uv failed: .*cache/i) });
      expect(forced.code).toBe(1);
      expect(forced.stderr).toMatch(/^error: installing the requirements with uv failed: error: Failed to initialize cache/m);
    } finally {
      rmSync(dir, { recursive: true, force: true });
    }
  });

  test("pre-releases: uv takes one where pip would not; auto leaves any to pip and ends where pip ends", async () => {
    const [auto, pip, forced, autoOnly, pipOnly] = await Promise.all([
      build("auto", ["-p", "pre-pkg>1", ...idx(), "--python", wB]),
      build("pip", ["-p", "pre-pkg>1", ...idx(), "--python", wB]),
      build("uv", ["-p", "pre-pkg>1", ...idx(), "--python", wB]),
      build("auto", ["-p", "only-pre", ...idx(), "--python", wB]),
      build("pip", ["-p", "only-pre", ...idx(), "--python", wB]),
    ]);
    // pip: no version above 1 but a pre-release, and the specifier names none: no match.
    expect(pip.code).toBe(1);
    expect(pip.stderr).toContain("No matching distribution found for pre-pkg>1");
    expect(auto.code).toBe(1);
    // The same failure, in pip's words (progress lines aside: auto's say it tried uv first).
    const failure = (text: string) => text.slice(text.indexOf("\nerror: ") + 1);
    expect(failure(auto.stderr)).toBe(failure(pip.stderr));
    // Forced, uv's own choice stands (the one difference uv forced is allowed).
    expect(forced.installed).toEqual(["pre-pkg==2.0b1"]);
    // A name with nothing but pre-releases and no specifier: pip takes it; so does auto, through pip.
    expect(pipOnly.installed).toEqual(["only-pre==1.0b1"]);
    expect(autoOnly.installed).toEqual(pipOnly.installed);
    expect(autoOnly.meta).toMatchObject({ installerPath: "pip", installerFallback: "uv chose a pre-release (only-pre==1.0b1) without --pre; pip decides when one counts" });
  });

  test("a local wheel of the version the worker has: pip keeps the worker's, so auto leaves it to pip", async () => {
    const wheel = join(index.dir, "b-1.0-py3-none-any.whl");
    const [auto, pip] = await Promise.all([build("auto", ["-p", wheel, ...idx(), "--python", wB]), build("pip", ["-p", wheel, ...idx(), "--python", wB])]);
    expect(pip.installed).toEqual([]);
    expect(auto.installed).toEqual([]);
    expect(auto.meta.installerFallback).toMatch(/names b, which the worker has \(1\.0\)/);
    // Another version of the same name: both install it, so the fast path takes it.
    const other = await both(["-p", join(index.dir, "b-2.0-py3-none-any.whl"), ...idx(), "--python", wB]);
    expect(other.uv.installed).toEqual(["b==2.0"]);
  });

  test("no index given and the machine's pip config applies: uv is given what pip reads there (pip-config.test.ts has each setting)", async () => {
    const dir = tempDir("gpl-fast-conf-");
    try {
      writeFileSync(join(dir, "pip.conf"), `[global]\nindex-url = ${index.url}\n`);
      const r = await build("auto", ["-p", "needs-b1", "--python", wB], { PIP_CONFIG_FILE: join(dir, "pip.conf") });
      expect(r.meta.installerPath).toBe("uv (fast path)");
      expect(r.meta.installerFallback).toBeNull();
      expect(r.installed).toEqual(["needs-b1==1.0"]);
    } finally {
      rmSync(dir, { recursive: true, force: true });
    }
  });

  test("a user whose own uv cache cannot be made (HOME a file, as /nonexistent is to a service user): uv gets one in gpulayer's tools, and the build stays on the fast path", async () => {
    const s = sandbox();
    try {
      const homeFile = join(s.root, "home-is-a-file");
      writeFileSync(homeFile, "");
      const { UV_CACHE_DIR: _uv, XDG_CACHE_HOME: _xdg, ...env } = s.env;
      // pyenv's shims (uv on this PATH, maybe) find their root from HOME unless told.
      const pyenv = { PYENV_ROOT: process.env.PYENV_ROOT ?? join(process.env.HOME ?? "/root", ".pyenv") };
      const r = await cli(["env", "prepare", "-p", "tiny", ...idx(), "--python", wB, "--json"], { env: { ...env, ...pyenv, HOME: homeFile, GPULAYER_INSTALLER: "auto" }, cwd: s.root });
      expect(r.code).toBe(0);
      const meta = JSON.parse(readFileSync(join(JSON.parse(r.stdout).path, ".gpulayer", "meta.json"), "utf8"));
      expect([meta.installerPath, meta.installerFallback]).toEqual(["uv (fast path)", null]);
      expect(r.stderr).not.toContain("with venv");
      expect(existsSync(join(s.home, "tools", "uv-cache"))).toBe(true);
    } finally {
      s.cleanup();
    }
  });

  test("the index is looked at beside the build, not before it: a root page that answers late delays nothing", async () => {
    // In front of the index: its root page (what gpulayer looks at) is held until a project page (what uv asks) has
    // been asked for, or until the look is dropped. A look made before the build would wait the whole 10 s and lose it.
    const events: string[] = [];
    let projectAsked: () => void = () => undefined;
    const asked = new Promise<void>((r) => (projectAsked = r));
    const upstream = index.url.replace(/\/simple$/, "");
    const front = Bun.serve({
      hostname: "127.0.0.1",
      port: 0,
      idleTimeout: 30,
      fetch: async (req) => {
        const path = new URL(req.url).pathname;
        if (/^\/simple\/?$/.test(path)) {
          events.push("root asked");
          const dropped = new Promise<"dropped">((r) => req.signal.addEventListener("abort", () => r("dropped")));
          const how = await Promise.race([asked.then(() => "answered" as const), dropped]);
          events.push(`root ${how}`);
          return new Response("<!DOCTYPE html><html><body></body></html>", { headers: { "content-type": "text/html" } });
        }
        if (path.startsWith("/simple/")) {
          events.push(`project asked (root ${events.includes("root asked") && !events.some((e) => /^root (answered|dropped)/.test(e)) ? "still held" : "not held"})`);
          projectAsked();
        }
        const answer = await fetch(upstream + path);
        return new Response(await answer.arrayBuffer(), { status: answer.status, headers: { "content-type": answer.headers.get("content-type") ?? "application/octet-stream" } });
      },
    });
    try {
      const r = await build("uv", ["-p", "tiny", "--index-url", `http://127.0.0.1:${front.port}/simple`, "--python", wB]);
      expect(r.code).toBe(0);
      expect(r.installed).toContain("tiny==1.0");
      expect(events[0]).toBe("root asked");
      expect(events).toContain("project asked (root still held)");
    } finally {
      front.stop(true);
    }
  });

  test("a -r inside a -c file: pip installs what it names (it reads requirements there), and so does the fast path", async () => {
    const dir = tempDir("gpl-fast-rinc-");
    try {
      writeFileSync(join(dir, "req.txt"), "-c c.txt\ntiny\n");
      writeFileSync(join(dir, "c.txt"), "-r inner.txt\n");
      writeFileSync(join(dir, "inner.txt"), "extra-dep\n");
      const pair = await both([join(dir, "req.txt"), ...idx(), "--python", wB]);
      expect(pair.pip.installed).toEqual(["extra-dep==1.0", "tiny==1.0"]);
    } finally {
      rmSync(dir, { recursive: true, force: true });
    }
  });

  test("what pip refuses and uv would build is refused on both installers, in one line naming the file and line", async () => {
    const dir = tempDir("gpl-fast-refused-");
    try {
      const forms: [string, Record<string, string>, RegExp][] = [
        ["tab", { "req.txt": "tiny\nb==1.0\t--hash=sha256:00\n" }, /req\.txt:2: Invalid requirement: 'b==1\.0\\t--hash=sha256:00'/],
        ["comma", { "req.txt": "tiny>=1.0,\n" }, /req\.txt:1: Invalid requirement: 'tiny>=1\.0,'/],
        ["extras", { "req.txt": "-c c.txt\nwithextra\n", "c.txt": "withextra[fancy]==1.0\n" }, /c\.txt:1: Constraints cannot have extras/],
      ];
      for (const [name, files, said] of forms) {
        mkdirSync(join(dir, name));
        for (const [file, text] of Object.entries(files)) writeFileSync(join(dir, name, file), text);
        const runs = await Promise.all((["auto", "uv", "pip"] as const).map((installer) => build(installer, [join(dir, name, "req.txt"), ...idx(), "--python", wB])));
        for (const r of runs) {
          expect({ name, code: r.code, lines: r.stderr.trim().split("\n") }).toMatchObject({ code: 2, lines: [expect.stringMatching(said)] });
        }
      }
    } finally {
      rmSync(dir, { recursive: true, force: true });
    }
  });

  test("a typo both installers refuse (b>>2): one line naming the user's file and line, exit 1, no second run by pip", async () => {
    const dir = tempDir("gpl-fast-typo-");
    try {
      writeFileSync(join(dir, "req.txt"), "tiny\n# why\nb>>2\n");
      const [inFile, asSpec] = await Promise.all([build("auto", [join(dir, "req.txt"), ...idx(), "--python", wB]), build("auto", ["-p", "tiny", "-p", "b>>2", ...idx(), "--python", wB])]);
      expect(inFile.code).toBe(1);
      expect(inFile.stderr).toEndWith(`error: ${join(dir, "req.txt")}:3: invalid requirement 'b>>2': no such comparison operator ">>", must be one of ~= == != <= >= < > ===\n`);
      expect(asSpec.code).toBe(1);
      expect(asSpec.stderr).toEndWith(`error: -p b>>2: invalid requirement 'b>>2': no such comparison operator ">>", must be one of ~= == != <= >= < > ===\n`);
      for (const r of [inFile, asSpec]) {
        expect(r.stderr).not.toContain("request.txt");
        expect(r.stderr).not.toMatch(/with pip/);
      }
      // A list in a job file is named by its key there, by either installer, not as -p.
      writeFileSync(join(dir, "job.yaml"), `command: "true"\nenvironment:\n  requirements: [tiny, "this is not a requirement"]\n  index_url: ${index.url}\n  python: ${wB}\n`);
      for (const installer of ["auto", "pip"]) {
        const s = sandbox();
        try {
          const r = await cli(["job", "run", "-f", join(dir, "job.yaml")], { env: { ...s.env, GPULAYER_INSTALLER: installer }, cwd: s.root });
          expect(r.code).toBe(1);
          const last = r.stderr.trim().split("\n").at(-1)!;
          expect(last).toStartWith("error: task.prepare failed: ");
          expect(last).toContain("job.yaml: environment.requirements[1]");
          expect(last).toContain("this is not a requirement");
          expect(last).not.toContain("request.txt");
        } finally {
          s.cleanup();
        }
      }
    } finally {
      rmSync(dir, { recursive: true, force: true });
    }
  });

  test("a request nothing satisfies: uv's short explanation in one line, exit 1, no second run by pip", async () => {
    const r = await build("auto", ["-p", "tiny==9", ...idx(), "--python", wB]);
    expect(r.code).toBe(1);
    const errors = r.stderr.split("\n").filter((l) => l.startsWith("error:"));
    expect(errors).toEqual(["error: no solution found when resolving dependencies: Because there is no version of tiny==9 and you require tiny==9, we can conclude that your requirements are unsatisfiable."]);
    expect(r.stderr).toEndWith(`${errors[0]}\n`);
    expect(r.stderr).not.toMatch(/with pip/);
  });

  test("GPULAYER_INSTALLER takes auto, uv or pip", async () => {
    const r = await build("bogus" as "auto", ["-p", "tiny", ...idx(), "--python", wB]);
    expect(r.code).toBe(2);
    expect(r.stderr).toBe("error: GPULAYER_INSTALLER=bogus (environment): must be auto, uv or pip\n");
  });
});

test("requires.txt sections become markers, as pip reads them", () => {
  expect(eggInfoRequires("a>=1\n\n[X_Y]\nb\n[:python_version < \"3.12\"]\nc\n[y:sys_platform == \"linux\"]\nd @ https://h/d.whl\n")).toEqual({
    requires: ["a>=1", 'b ; extra == "x_y"', 'c ; python_version < "3.12"', 'd @ https://h/d.whl ; (sys_platform == "linux") and extra == "y"'],
    extras: ["X_Y", "y"],
  });
});
