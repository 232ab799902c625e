import { afterAll, beforeAll, describe, expect, setDefaultTimeout, test } from "bun:test";
import { appendFileSync, mkdirSync, readFileSync, rmSync, writeFileSync } from "node:fs";
import { join } from "node:path";
import { installedSet } from "../src/env/request/interpreter.ts";
import { makeDist, PackageIndex } from "./fixtures/index.ts";
import { cli, HAS_UV, makeWorkerVenv, readyKeys, run, sandbox, tempDir } from "./helpers.ts";

/**
 * A uv project (pyproject.toml + uv.lock, made by a real `uv lock` against a
 * local index) as a job's environment: what gpulayer's env holds, with the
 * worker's packages it reuses, is what `uv sync --frozen` installs in a fresh
 * venv of the same interpreter; the lock is the key; a stale lock is refused.
 */

setDefaultTimeout(180_000);

const world = tempDir("gpl-lock-");
const index = new PackageIndex(join(world, "index"));
const s = sandbox();
let worker: string; // python of a worker venv with a 1.0 (as locked), d 2.0 and torchy 2.1.0+cu1 (the lock pins d 1.0, torchy 2.1.0)
let project: string;

const site = (venv: string) => join(venv, "lib", "python3.11", "site-packages");
const uv = (args: string[], cwd: string, env: Record<string, string> = s.env) => run(["uv", ...args], { cwd, env });

/** A folder uv takes as a project: make_dist's in-tree backend, with the [project] table uv reads. */
function uvProject(dir: string, name: string, table: string, requires: string[] = []): string {
  const path = makeDist("project", dir, { name, version: "0.1", requires });
  appendFileSync(join(path, "pyproject.toml"), `\n[project]\nname = "${name}"\nversion = "0.1"\nrequires-python = ">=3.8"\n${table}`);
  return path;
}

async function lock(dir: string): Promise<void> {
  const r = await uv(["lock"], dir);
  if (r.code !== 0) throw new Error(r.stderr);
}

/** `name==version` of every distribution a job in the env sees: the env's own, and the worker's it does not shadow. */
function seenByJob(envDir: string): string[] {
  const own = installedSet([site(envDir)]);
  const names = new Set(own.map((d) => d.split("==")[0]));
  return [...own, ...installedSet([site(join(worker, "..", ".."))]).filter((d) => !names.has(d.split("==")[0]))].sort();
}

/** What `uv sync --frozen` installs for the selection in a fresh venv of the worker's interpreter. */
async function freshSync(selection: string[]): Promise<string[]> {
  const venv = join(tempDir("gpl-lock-fresh-"), "venv");
  expect((await uv(["venv", "--no-config", "--quiet", "--python", "python3", venv], world)).code).toBe(0);
  const r = await uv(["sync", "--frozen", "--project", project, ...selection], world, { ...s.env, UV_PROJECT_ENVIRONMENT: venv });
  if (r.code !== 0) throw new Error(r.stderr);
  return installedSet([site(venv)]);
}

async function prepare(args: string[]) {
  const r = await cli(["env", "prepare", "--python", worker, "--project", project, "--json", ...args], { env: s.env, cwd: world });
  if (r.code !== 0) throw new Error(`env prepare exited ${r.code}: ${r.stderr}`);
  return JSON.parse(r.stdout) as { key: string; path: string; status: string; shadowed?: { name: string; worker: string; locked: string }[] };
}

beforeAll(async () => {
  index.start();
  for (const [name, version] of [["a", "1.0"], ["a", "2.0"], ["b", "1.0"], ["c", "1.0"], ["d", "1.0"], ["d", "2.0"], ["torchy", "2.1.0"]] as const) index.wheel({ name, version });
  // The worker's torchy is a local build (as a CUDA wheel is): not on the index, so the lock pins the plain 2.1.0.
  const own = join(world, "worker-wheels");
  for (const [name, version] of [["a", "1.0"], ["d", "2.0"], ["torchy", "2.1.0+cu1"]] as const) makeDist("wheel", own, { name, version });
  worker = await makeWorkerVenv(join(world, "worker"), { env: s.env, packages: ["a==1.0", "d==2.0", "torchy==2.1.0+cu1"], findLinks: own });
  // A local project dependency, and the project itself (editable, as uv installs it).
  uvProject(join(world, "libs"), "libproj", "dependencies = []\n");
  const deps = ["a==1.0", "d==1.0", "torchy==2.1.0", "libproj"];
  project = uvProject(
    join(world, "app"),
    "app",
    [
      `dependencies = ${JSON.stringify(deps)}`,
      `[project.optional-dependencies]\nfancy = ["b"]`,
      `[dependency-groups]\ntools = ["c"]`,
      `[tool.uv.sources]\nlibproj = { path = "../../libs/libproj" }`,
      `[[tool.uv.index]]\nurl = "${index.url}"\ndefault = true`,
      "",
    ].join("\n"),
    deps,
  );
  await lock(project);
});

afterAll(() => {
  index.stop();
  s.cleanup();
});

// Skipped only without uv: a uv project and a pylock.toml are built by uv alone. CI installs uv (.ci/run), so there it runs.
describe.skipIf(!HAS_UV)("a uv project as the environment", () => {
  test("the env plus the worker's reused packages is what uv sync --frozen installs, for each selection", async () => {
    for (const selection of [[], ["--group", "tools", "--extra", "fancy"]]) {
      const got = await prepare(selection);
      expect(got.status).toBe("built");
      expect(seenByJob(got.path)).toEqual(await freshSync(selection));
    }
  });

  test("groups and extras are keyed as uv reads them: another spelling of the same names is the same env", async () => {
    const first = await prepare(["--group", "tools", "--extra", "fancy"]);
    const again = await prepare(["--extra", "Fancy", "--group", "TOOLS", "--group", "tools"]);
    expect({ key: again.key, status: again.status }).toEqual({ key: first.key, status: "reused" });
  });

  test("a workspace's member given as the project: one line naming the workspace root whose lock covers it", async () => {
    const root = join(world, "ws");
    mkdirSync(join(root, "packages", "b"), { recursive: true });
    writeFileSync(join(root, "pyproject.toml"), '[project]\nname = "ws"\nversion = "0.1"\nrequires-python = ">=3.8"\ndependencies = []\n\n[tool.uv]\npackage = false\n\n[tool.uv.workspace]\nmembers = ["packages/*"]\n');
    writeFileSync(join(root, "packages", "b", "pyproject.toml"), '[project]\nname = "b"\nversion = "0.1"\nrequires-python = ">=3.8"\ndependencies = []\n');
    await lock(root);
    const r = await cli(["env", "prepare", "--python", worker, "--project", join("packages", "b")], { env: s.env, cwd: root });
    expect([r.code, r.stderr]).toEqual([2, `error: --project ${join(root, "packages", "b")}: no uv.lock in it; it is a member of the workspace at ${root}, whose uv.lock covers it: give --project ${root} (a member alone is not selected yet)\n`]);
    // A project beside the members, no member itself, is its own: uv lock there makes its lock.
    mkdirSync(join(root, "tools"), { recursive: true });
    writeFileSync(join(root, "tools", "pyproject.toml"), '[project]\nname = "tools"\nversion = "0.1"\n');
    const own = await cli(["env", "prepare", "--python", worker, "--project", "tools"], { env: s.env, cwd: root });
    expect([own.code, own.stderr]).toEqual([2, `error: --project ${join(root, "tools")}: no uv.lock in it (run uv lock)\n`]);
  });

  test("a uv.lock given as a requirements file is refused in one line pointing to --project, before a job is recorded", async () => {
    const rel = join("app", "uv.lock");
    const here = join(project, "..");
    const prepared = await cli(["env", "prepare", "--python", worker, rel], { env: s.env, cwd: here });
    expect([prepared.code, prepared.stderr]).toEqual([2, `error: ${join(here, rel)}: a uv.lock is read with its project: give --project with the project's folder (${project})\n`]);
    const jobs = async () => (JSON.parse((await cli(["job", "list", "--json"], { env: s.env, cwd: here })).stdout) as unknown[]).length;
    const before = await jobs();
    const byFlag = await cli(["job", "run", "--python", worker, "-r", rel, "--", "true"], { env: s.env, cwd: here });
    expect([byFlag.code, byFlag.stderr]).toEqual([2, `error: -r: ${rel} is a uv.lock, read with its project: give --project with the project's folder\n`]);
    writeFileSync(join(here, "lock-as-reqs.yaml"), `command: "true"\nenvironment:\n  requirements: ${rel}\n`);
    const byFile = await cli(["job", "run", "-f", "lock-as-reqs.yaml"], { env: s.env, cwd: here });
    expect([byFile.code, byFile.stderr]).toEqual([2, `error: lock-as-reqs.yaml: environment.requirements: ${rel} is a uv.lock, read with its project: give environment.project with the project's folder\n`]);
    expect(await jobs()).toBe(before);
  });

  test("a changed module of a local path dependency (not editable) is in the new env, not uv's cached build of it", async () => {
    const root = join(world, "nonedit");
    // A package whose backend copies its module into the wheel (as setuptools or hatchling do): a built copy, not a link.
    const lib = join(root, "libb");
    mkdirSync(join(lib, "libb"), { recursive: true });
    writeFileSync(join(lib, "pyproject.toml"), '[build-system]\nrequires = []\nbuild-backend = "backend"\nbackend-path = ["."]\n\n[project]\nname = "libb"\nversion = "0.1"\nrequires-python = ">=3.8"\n');
    writeFileSync(
      join(lib, "backend.py"),
      [
        "import os, zipfile",
        "def get_requires_for_build_wheel(config_settings=None):\n    return []",
        "def build_wheel(wheel_directory, config_settings=None, metadata_directory=None):",
        "    dist = 'libb-0.1.dist-info'",
        "    files = {'libb/__init__.py': open(os.path.join(os.path.dirname(os.path.abspath(__file__)), 'libb', '__init__.py'), 'rb').read()}",
        "    files[dist + '/METADATA'] = b'Metadata-Version: 2.1\\nName: libb\\nVersion: 0.1\\n'",
        "    files[dist + '/WHEEL'] = b'Wheel-Version: 1.0\\nGenerator: test\\nRoot-Is-Purelib: true\\nTag: py3-none-any\\n'",
        "    files[dist + '/RECORD'] = ('\\n'.join(p + ',,' for p in files) + '\\n' + dist + '/RECORD,,\\n').encode()",
        "    with zipfile.ZipFile(os.path.join(wheel_directory, 'libb-0.1-py3-none-any.whl'), 'w') as z:",
        "        for p, d in files.items():\n            z.writestr(p, d)",
        "    return 'libb-0.1-py3-none-any.whl'",
        "",
      ].join("\n"),
    );
    writeFileSync(join(lib, "libb", "__init__.py"), 'X = "v1"\n');
    const app = join(root, "nep");
    mkdirSync(app, { recursive: true });
    writeFileSync(join(app, "pyproject.toml"), `[project]\nname = "nep"\nversion = "0.1"\nrequires-python = ">=3.8"\ndependencies = ["libb"]\n\n[tool.uv]\npackage = false\n\n[tool.uv.sources]\nlibb = { path = "../libb" }\n`);
    await lock(app);
    const x = async () => {
      const r = await cli(["env", "prepare", "--python", worker, "--project", app, "--json"], { env: s.env, cwd: world });
      expect(r.code, r.stderr).toBe(0);
      const env = JSON.parse(r.stdout) as { path: string; status: string };
      return { status: env.status, x: (await run([join(env.path, "bin", "python"), "-c", "import libb; print(libb.X)"], { env: s.env })).stdout.trim() };
    };
    expect(await x()).toEqual({ status: "built", x: "v1" });
    writeFileSync(join(lib, "libb", "__init__.py"), 'X = "v2"\n');
    expect(await x()).toEqual({ status: "built", x: "v2" });
    expect(await x()).toEqual({ status: "reused", x: "v2" });
  });

  test("a worker package is reused only at exactly the locked version; the others are shadowed and reported", async () => {
    const got = await prepare([]);
    const own = installedSet([site(got.path)]);
    expect(own).not.toContain("a==1.0"); // the worker's, reused
    expect(own).toContain("d==1.0");
    expect(own).toContain("torchy==2.1.0"); // a local label is another version
    expect(got.shadowed).toEqual([
      { name: "d", worker: "2.0", locked: "1.0" },
      { name: "torchy", worker: "2.1.0+cu1", locked: "2.1.0" },
    ]);
    const shown = await cli(["env", "show", got.key, "--json"], { env: s.env, cwd: world });
    expect(JSON.parse(shown.stdout).shadowed).toEqual(got.shadowed);
    const reused = await prepare([]);
    expect(reused.status).toBe("reused");
    expect(reused.shadowed).toEqual(got.shadowed);
    // Without --json, said on stderr in one line, as a fleet prepare says it of each worker.
    const said = await cli(["env", "prepare", "--python", worker, "--project", project], { env: s.env, cwd: world });
    expect(said.stderr).toContain("shadows d 2.0 (the worker's) by 1.0 (the lock's), torchy 2.1.0+cu1 (the worker's) by 2.1.0 (the lock's)\n");
    const imported = await run([join(got.path, "bin", "python"), "-c", "import d, torchy, a, app, libproj; print(d.__file__.startswith(r'" + got.path + "'), a.__file__.startswith(r'" + got.path + "'))"], { env: s.env });
    expect(imported.stdout.trim()).toBe("True False");
  });

  test("a worker package the lock pins only in a group or extra left out stays the worker's, and the env's check finds nothing missing", async () => {
    // The lock holds b 1.0 for the extra `fancy`; this worker has b 0.9 and a package that needs b.
    const own = join(world, "worker-b-wheels");
    makeDist("wheel", own, { name: "b", version: "0.9" });
    makeDist("wheel", own, { name: "needsb", version: "1.0", requires: ["b"] });
    const other = await makeWorkerVenv(join(world, "worker-b"), { env: s.env, packages: ["b==0.9", "needsb==1.0"], findLinks: own });
    const r = await cli(["env", "prepare", "--python", other, "--project", project, "--json"], { env: s.env, cwd: world });
    expect(r.code, r.stderr).toBe(0);
    const got = JSON.parse(r.stdout);
    expect(got.check ?? []).toEqual([]);
    expect(r.stderr).not.toContain("warning");
    expect(got.shadowed?.map((x: { name: string }) => x.name) ?? []).not.toContain("b");
    const imported = await run([join(got.path, "bin", "python"), "-c", "import b, needsb; print(b.__version__)"], { env: s.env });
    expect(imported.stdout.trim()).toBe("0.9");
    // With the extra, the locked b is installed over the worker's, and said.
    const fancy = JSON.parse((await cli(["env", "prepare", "--python", other, "--project", project, "--extra", "fancy", "--json"], { env: s.env, cwd: world })).stdout);
    expect(fancy.shadowed).toContainEqual({ name: "b", worker: "0.9", locked: "1.0" });
  });

  test("a lock that shadows a worker package leaves the worker's findings as they are: a later build is not warned of what the lock hid", async () => {
    // A worker whose dneed needs d (it has d 2.0); the lock pins d 1.0, so the build drops the worker's d for the locked one.
    const home = sandbox();
    try {
      const own = join(world, "worker-wheels-dneed");
      makeDist("wheel", own, { name: "d", version: "2.0" });
      makeDist("wheel", own, { name: "dneed", version: "1.0", requires: ["d"] });
      const py = await makeWorkerVenv(join(home.root, "worker"), { env: home.env, packages: ["d==2.0", "dneed==1.0"], findLinks: own });
      const pinned = uvProject(join(home.root, "pins"), "pins", `dependencies = ["d==1.0"]\n[[tool.uv.index]]\nurl = "${index.url}"\ndefault = true\n`, ["d==1.0"]);
      await lock(pinned);
      const locked = await cli(["env", "prepare", "--python", py, "--project", pinned, "--json"], { env: home.env, cwd: world });
      expect(locked.code, locked.stderr).toBe(0);
      expect(locked.stderr).not.toContain("warning: pip check");
      // The first build of the home was the lock's; the next, of something else, checks against the worker's own d.
      const plain = await cli(["env", "prepare", "--python", py, "-p", "b", "--index-url", index.url, "--json"], { env: home.env, cwd: world });
      expect(plain.code, plain.stderr).toBe(0);
      expect(plain.stderr).not.toContain("warning: pip check");
    } finally {
      home.cleanup();
    }
  });

  test("an unchanged lock reuses the env; a changed lock builds another", async () => {
    const first = await prepare([]);
    const again = await prepare([]);
    expect(again.status).toBe("reused");
    expect(again.key).toBe(first.key);
    const py = join(project, "pyproject.toml");
    const before = readFileSync(py, "utf8");
    try {
      writeFileSync(py, before.replace('"a==1.0"', '"a==2.0"'));
      await lock(project);
      const changed = await prepare([]);
      expect(changed.status).toBe("built");
      expect(changed.key).not.toBe(first.key);
      expect(installedSet([site(changed.path)])).toContain("a==2.0");
    } finally {
      writeFileSync(py, before);
      await lock(project);
    }
  });

  test("a job file's environment.project, with its groups and extras, runs the job in the locked env", async () => {
    const jobDir = join(project, "..");
    writeFileSync(join(jobDir, "job.yaml"), ["name: locked", "command: python -c 'import app, b, c, d; print(d.__file__)'", "environment:", "  project: app", "  groups: [tools]", "  extras: [fancy]", ""].join("\n"));
    const r = await cli(["job", "run", "--python", worker, "-f", "job.yaml"], { env: s.env, cwd: jobDir });
    expect(r.stderr).not.toContain("error");
    expect(r.code).toBe(0);
    const got = await prepare(["--group", "tools", "--extra", "fancy"]);
    expect(got.status).toBe("reused");
    expect(r.stdout.trim()).toStartWith(got.path);
  });

  test("what to install is one choice: a flag's project replaces a file's requirements, a flag's requirements a file's project", async () => {
    const jobDir = join(project, "..");
    writeFileSync(join(jobDir, "reqs.yaml"), ["command: python -c pass", "environment:", "  requirements: [b]", ""].join("\n"));
    writeFileSync(join(jobDir, "proj.yaml"), ["command: python -c pass", "environment:", "  project: app", ""].join("\n"));
    const summary = async (args: string[]) => {
      const r = await cli(["job", "run", "--python", worker, "--dry-run", "--json", ...args], { env: s.env, cwd: jobDir });
      expect(r.code, r.stderr).toBe(0);
      return (JSON.parse(r.stdout) as { tasks: { environment: { summary: string } }[] }).tasks[0]!.environment.summary;
    };
    expect(await summary(["-f", "reqs.yaml", "--project", "app"])).toStartWith("uv project app");
    expect(await summary(["-f", "proj.yaml", "-p", "c"])).toBe("c");
    // --group and --extra select from the file's project, replacing its own selection; with nothing to select from, refused.
    const selected = await cli(["job", "run", "--python", worker, "--dry-run", "--json", "-f", "proj.yaml", "--group", "tools", "--extra", "fancy"], { env: s.env, cwd: jobDir });
    expect(selected.code, selected.stderr).toBe(0);
    expect((JSON.parse(selected.stdout) as { tasks: { environment: { key: string } }[] }).tasks[0]!.environment.key).toBe((await prepare(["--group", "tools", "--extra", "fancy"])).key);
    for (const [args, line] of [
      [["-f", "reqs.yaml", "--group", "tools"], "error: --group selects from a uv project's lock: give --project DIR, or environment.project in reqs.yaml"],
      [["-f", "proj.yaml", "-p", "c", "--extra", "fancy"], "error: --extra selects from a uv project's lock, and -p replaces proj.yaml's project: give --project DIR with it"],
    ] as const) {
      const r = await cli(["job", "run", "--python", worker, ...args, "--", "true"], { env: s.env, cwd: jobDir });
      expect(r.code).toBe(2);
      expect(r.stderr.trim()).toBe(line);
    }
    // A job file's project that cannot be one is refused before a job is recorded, named by the file.
    const jobs = async () => (JSON.parse((await cli(["job", "list", "--json"], { env: s.env, cwd: jobDir })).stdout) as unknown[]).length;
    const before = await jobs();
    writeFileSync(join(jobDir, "nothere.yaml"), ["command: python -c pass", "environment:", "  project: nothere", ""].join("\n"));
    writeFileSync(join(jobDir, "both.yaml"), ["command: python -c pass", "environment:", "  project: app", "  requirements: [b]", ""].join("\n"));
    for (const [file, line] of [
      ["nothere.yaml", "error: nothere.yaml: environment.project: no such folder: nothere"],
      ["both.yaml", "error: both.yaml: environment: project and requirements both say what to install; the lock is the whole environment: give one"],
    ] as const) {
      const r = await cli(["job", "run", "--python", worker, "-f", file], { env: s.env, cwd: jobDir });
      expect(r.code).toBe(2);
      expect(r.stderr.trim()).toBe(line);
    }
    // So is --project's, as env prepare refuses it.
    mkdirSync(join(jobDir, "unlocked"));
    writeFileSync(join(jobDir, "unlocked", "pyproject.toml"), '[project]\nname = "unlocked"\nversion = "0.1"\n');
    const unlocked = await cli(["job", "run", "--python", worker, "--project", "unlocked", "--", "true"], { env: s.env, cwd: jobDir });
    expect([unlocked.code, unlocked.stderr.trim()]).toEqual([2, `error: --project ${join(jobDir, "unlocked")}: no uv.lock in it (run uv lock)`]);
    expect(await jobs()).toBe(before);
  });

  test("a group or extra the project does not define is refused in uv's words, before anything is built, and by --dry-run", async () => {
    const keys = readyKeys(s.home).length;
    for (const [flag, line] of [
      ["--group", "Group `nope` is not defined in the project's `dependency-groups` table"],
      ["--extra", "Extra `nope` is not defined in the `optional-dependencies` table for `app`"],
    ] as const) {
      for (const dry of [[], ["--dry-run"]]) {
        const r = await cli(["env", "prepare", "--python", worker, "--project", project, flag, "nope", ...dry], { env: s.env, cwd: world });
        expect(r.code).toBe(2);
        expect(r.stderr.trim().split("\n").at(-1)).toBe(`error: ${project}: ${line}`);
        expect(r.stderr).not.toContain("creating");
      }
    }
    expect(readyKeys(s.home)).toHaveLength(keys);
  });

  test("a stale lock is refused in one line, before anything is built", async () => {
    const py = join(project, "pyproject.toml");
    const before = readFileSync(py, "utf8");
    const keys = readyKeys(s.home).length;
    try {
      writeFileSync(py, before.replace('"a==1.0"', '"a==1.0", "c"'));
      const r = await cli(["env", "prepare", "--python", worker, "--project", project], { env: s.env, cwd: world });
      expect(r.code).not.toBe(0);
      expect(r.stderr).toContain("uv.lock: the lockfile needs to be updated: run uv lock");
      expect(r.stderr.trim().split("\n").filter((l) => /error/i.test(l))).toHaveLength(1);
      expect(r.stderr).not.toContain("creating");
      expect(readyKeys(s.home)).toHaveLength(keys);
      // --dry-run says so too, rather than "would build" what the build then refuses.
      const dry = await cli(["env", "prepare", "--python", worker, "--project", project, "--dry-run"], { env: s.env, cwd: world });
      expect([dry.code, dry.stderr.trim()]).toEqual([2, `error: ${project}/uv.lock: the lockfile needs to be updated: run uv lock`]);
    } finally {
      writeFileSync(py, before);
    }
  });

  test("a project whose own build fails is refused with its backend's error, not uv's hint after it", async () => {
    const dir = join(world, "broken");
    mkdirSync(dir);
    writeFileSync(join(dir, "pyproject.toml"), '[build-system]\nrequires = []\nbuild-backend = "backend"\nbackend-path = ["."]\n\n[project]\nname = "broken"\nversion = "0.1"\nrequires-python = ">=3.8"\ndependencies = []\n');
    writeFileSync(join(dir, "backend.py"), 'def _fail(*args, **kwargs):\n    raise RuntimeError("description must be specified")\nbuild_wheel = build_sdist = build_editable = _fail\ndef get_requires_for_build_wheel(config_settings=None):\n    return []\nget_requires_for_build_editable = get_requires_for_build_sdist = get_requires_for_build_wheel\n');
    await lock(dir);
    const r = await cli(["env", "prepare", "--python", worker, "--project", dir, "--json"], { env: s.env, cwd: world });
    expect(r.code).not.toBe(0);
    expect(JSON.parse(r.stdout).error.message).toBe("installing the locked project with uv sync failed: RuntimeError: description must be specified");
  });
});

// Skipped only without uv: a uv project and a pylock.toml are built by uv alone. CI installs uv (.ci/run), so there it runs.
describe.skipIf(!HAS_UV)("a pylock.toml as the environment", () => {
  let lockFile: string;
  beforeAll(async () => {
    lockFile = join(project, "pylock.toml");
    const r = await uv(["export", "--format", "pylock.toml", "--frozen", "--group", "tools", "--extra", "fancy", "-o", lockFile], project);
    if (r.code !== 0) throw new Error(r.stderr);
  });

  test("env prepare pylock.toml installs exactly the file's packages, the worker's reused only at the locked version", async () => {
    const r = await cli(["env", "prepare", "pylock.toml", "--python", worker, "--json"], { env: s.env, cwd: project });
    if (r.code !== 0) throw new Error(`env prepare exited ${r.code}: ${r.stderr}`);
    const got = JSON.parse(r.stdout) as { key: string; path: string; status: string; summary: string; shadowed?: unknown };
    expect(got.status).toBe("built");
    expect(seenByJob(got.path)).toEqual(await freshSync(["--group", "tools", "--extra", "fancy"]));
    expect(got.shadowed).toEqual([
      { name: "d", worker: "2.0", locked: "1.0" },
      { name: "torchy", worker: "2.1.0+cu1", locked: "2.1.0" },
    ]);
    const again = await cli(["env", "prepare", "pylock.toml", "--python", worker, "--json"], { env: s.env, cwd: project });
    expect(JSON.parse(again.stdout)).toMatchObject({ key: got.key, status: "reused" });
    // A lock under another name, or the project's pyproject.toml given as its folder: one line saying what to give.
    writeFileSync(join(project, "lock.toml"), readFileSync(lockFile));
    const misnamed = await cli(["env", "prepare", "lock.toml", "--python", worker], { env: s.env, cwd: project });
    expect(misnamed.code).toBe(2);
    expect(misnamed.stderr.trim()).toBe(`error: ${join(project, "lock.toml")}: a TOML file is read as a lock only when named pylock.toml or pylock.NAME.toml (PEP 751); for a uv project, give --project with its folder`);
    const file = await cli(["env", "prepare", "--project", join(project, "pyproject.toml"), "--python", worker], { env: s.env, cwd: project });
    expect(file.code).toBe(2);
    expect(file.stderr.trim()).toBe(`error: --project ${join(project, "pyproject.toml")}: a file; give the project's folder (${project})`);
    rmSync(join(project, "lock.toml")); // the project's files are its key: leave them as the other cases found them
  });

  test("a job file's environment.requirements: pylock.toml runs the job in that env; another content is another key", async () => {
    writeFileSync(join(project, "job.yaml"), ["name: pylocked", "command: python -c 'import app, b, c, d; print(d.__file__)'", "environment:", "  requirements: pylock.toml", ""].join("\n"));
    const r = await cli(["job", "run", "--python", worker, "-f", "job.yaml"], { env: s.env, cwd: project });
    expect(r.code).toBe(0);
    const first = JSON.parse((await cli(["env", "prepare", "pylock.toml", "--python", worker, "--json"], { env: s.env, cwd: project })).stdout);
    expect(r.stdout.trim()).toStartWith(first.path);
    const before = readFileSync(lockFile, "utf8");
    try {
      writeFileSync(lockFile, `${before}\n# another content\n`);
      const other = JSON.parse((await cli(["env", "prepare", "pylock.toml", "--python", worker, "--json"], { env: s.env, cwd: project })).stdout);
      expect(other.key).not.toBe(first.key);
    } finally {
      writeFileSync(lockFile, before);
    }
  });
});

// Skipped only without uv: a uv project and a pylock.toml are built by uv alone. CI installs uv (.ci/run), so there it runs.
describe.skipIf(!HAS_UV)("--dry-run of a lock", () => {
  test("says the lock is the input: the project's uv.lock with its selection, its local projects", async () => {
    const r = await cli(["env", "prepare", "--python", worker, "--project", project, "--group", "tools", "--dry-run", "--json"], { env: s.env, cwd: world });
    expect(r.code, r.stderr).toBe(0);
    const got = JSON.parse(r.stdout) as { inputs: { lock?: { kind: string; path: string; groups: string[] }; locals: { path: string }[] } };
    expect(got.inputs.lock).toMatchObject({ kind: "uv.lock", path: join(project, "uv.lock"), groups: ["tools"] });
    expect(got.inputs.locals.map((l) => l.path.split("/").pop()).sort()).toEqual(["app", "libproj"]);
    // Without --json: the lock on a line of its own, and the index it installs from is the lock's, not pip's.
    const human = await cli(["env", "prepare", "--python", worker, "--project", project, "--group", "tools", "--dry-run"], { env: s.env, cwd: world });
    expect(human.code, human.stderr).toBe(0);
    expect(human.stdout).toMatch(new RegExp(`^lock +${join(project, "uv.lock").replace(/[.]/g, "\\.")} sha256:[0-9a-f]{12}, pyproject\\.toml sha256:[0-9a-f]{12} \\(--group tools\\)$`, "m"));
    expect(human.stdout).toMatch(/^index +the lock's own \(each package's source in it\)$/m);
  });
});
