import { afterEach, describe, expect, setDefaultTimeout, test } from "bun:test";
import { existsSync, mkdirSync, readdirSync, readFileSync, realpathSync, rmSync, writeFileSync } from "node:fs";
import { join } from "node:path";
import { CONDA_DEFAULT_ROOTS, type CondaLookupContext, condaActivation, findCondaEnv, listCondaEnvs } from "../src/env/request/conda.ts";
import { UsageError } from "../src/errors.ts";
import { addCondaRecord, fakeConda, makeCondaEnv, makeCondaRoot, pyenvPython, writeEnvironmentsTxt } from "./fixtures/conda.ts";
import { run, tempDir } from "./helpers.ts";

// Real processes and real builds take seconds; a file that sets none gets 5 s, whatever another file set.
setDefaultTimeout(120_000);

// Every prefix holds a real Python copied from a pyenv one; without pyenv there is nothing real to copy.
const PY = pyenvPython();

let roots: string[] = [];
afterEach(() => {
  for (const r of roots) rmSync(r, { recursive: true, force: true });
  roots = [];
});

/** A temp world: a home, an empty bin (conda not on PATH), and ctx with only the variables a test names. */
function world() {
  const root = realpathSync(tempDir("gpl-conda-"));
  roots.push(root);
  const home = join(root, "home");
  const bin = join(root, "bin");
  mkdirSync(home);
  mkdirSync(bin);
  const ctx = (env: Record<string, string> = {}, cwd = root): CondaLookupContext => ({ env: { PATH: bin, ...env }, home, cwd });
  return { root, home, bin, ctx };
}

/** The one-line UsageError a call fails with. */
function oneLine(error: unknown): string {
  expect(error).toBeInstanceOf(UsageError);
  expect((error as Error).message.split("\n")).toHaveLength(1);
  return (error as Error).message;
}
function failure(fn: () => unknown): string {
  try {
    fn();
  } catch (error) {
    return oneLine(error);
  }
  throw new Error("expected a UsageError");
}
const failureOf = async (p: Promise<unknown>) => oneLine(await p.then(() => null, (e: unknown) => e));

/** Processes whose command line holds `text`. */
function running(text: string): string[] {
  return readdirSync("/proc").filter((pid) => {
    try {
      return /^\d+$/.test(pid) && readFileSync(`/proc/${pid}/cmdline`, "latin1").includes(text);
    } catch {
      return false; // ended meanwhile
    }
  });
}

/** Machine-wide roots (/opt/conda …) that exist here: a not-found message names their envs/ too. */
const machineEnvsDirs = CONDA_DEFAULT_ROOTS.filter((r) => r.startsWith("/") && existsSync(join(r, "envs"))).map((r) => realpathSync(join(r, "envs")));

// Skipped only without a pyenv Python 3.8+ to copy into the prefixes; this machine and CI have pyenv's.
describe.skipIf(!PY)("conda fixture", () => {
  test("a made prefix's python is a base interpreter of its own: sys.prefix and site-packages are the prefix's", async () => {
    const { root } = world();
    const prefix = makeCondaEnv(join(root, "env"));
    const r = await run([join(prefix, "bin", "python"), "-c", "import sys, site; print(sys.prefix); print(site.getsitepackages())"], { env: { PATH: "/usr/bin:/bin" } });
    expect(r.stderr).toBe("");
    expect(r.stdout).toBe(`${prefix}\n['${prefix}/lib/python${PY!.version}/site-packages']\n`);
    expect(readdirSync(join(prefix, "lib", `python${PY!.version}`, "site-packages"))).toEqual([]);
    expect(readFileSync(join(prefix, "conda-meta", "history"), "utf8")).toContain(`::python-${PY!.full}-`);
  });
});

// Skipped only without a pyenv Python 3.8+ to copy into the prefixes; this machine and CI have pyenv's.
describe.skipIf(!PY)("findCondaEnv by name", () => {
  test("under a root's envs/ (CONDA_ROOT), and the root itself as base", () => {
    const w = world();
    const { root, envs } = makeCondaRoot(join(w.root, "conda"), { envs: { torch: {}, jax: {} } });
    const found = findCondaEnv("torch", w.ctx({ CONDA_ROOT: root }));
    expect(found.prefix).toBe(envs.torch!);
    expect(found.name).toBe("torch");
    expect(found.python).toBe(join(envs.torch!, "bin", "python"));
    const base = findCondaEnv("base", w.ctx({ CONDA_ROOT: root }));
    expect(base.prefix).toBe(root);
    expect(base.name).toBe("base");
  });

  test("in an installer's default root under the home (~/miniforge3), no variable set", () => {
    const w = world();
    const { envs } = makeCondaRoot(join(w.home, "miniforge3"), { envs: { torch: {} } });
    expect(findCondaEnv("torch", w.ctx()).prefix).toBe(envs.torch!);
    expect(findCondaEnv("base", w.ctx()).prefix).toBe(join(w.home, "miniforge3"));
  });

  test("from the roots CONDA_EXE, CONDA_PREFIX and MAMBA_ROOT_PREFIX point at", () => {
    const w = world();
    const a = makeCondaRoot(join(w.root, "a"), { envs: { one: {}, two: {} } });
    const b = makeCondaRoot(join(w.root, "b"), { envs: { three: {} } });
    expect(findCondaEnv("two", w.ctx({ CONDA_EXE: join(a.root, "bin", "conda") })).prefix).toBe(a.envs.two!);
    expect(findCondaEnv("two", w.ctx({ CONDA_PREFIX: a.envs.one! })).prefix).toBe(a.envs.two!);
    expect(findCondaEnv("three", w.ctx({ MAMBA_ROOT_PREFIX: b.root })).prefix).toBe(b.envs.three!);
    expect(() => findCondaEnv("three", w.ctx({ CONDA_EXE: join(a.root, "bin", "conda") }))).toThrow("conda environment three not found");
  });

  test("in ~/.conda/envs, and through ~/.conda/environments.txt (a missing line skipped)", () => {
    const w = world();
    const user = makeCondaEnv(join(w.home, ".conda", "envs", "mine"));
    const project = makeCondaEnv(join(w.root, "projects", "vision", "venv-conda"));
    writeEnvironmentsTxt(w.home, [join(w.root, "gone", "venv-conda"), project]);
    expect(findCondaEnv("mine", w.ctx()).prefix).toBe(user);
    const registered = findCondaEnv("venv-conda", w.ctx());
    expect(registered.prefix).toBe(project);
    expect(registered.name).toBeNull(); // not in an envs/ folder: conda shows it by its path
  });

  test("CONDA_ENVS_PATH's folders come first, in their order, before a root's envs/", () => {
    const w = world();
    const { root } = makeCondaRoot(join(w.root, "conda"), { envs: { shared: {} } });
    const first = makeCondaEnv(join(w.root, "team", "envs", "shared"));
    const second = makeCondaEnv(join(w.root, "more", "envs", "other"));
    const ctx = w.ctx({ CONDA_ROOT: root, CONDA_ENVS_PATH: `${join(w.root, "team", "envs")}:${join(w.root, "more", "envs")}` });
    expect(findCondaEnv("shared", ctx).prefix).toBe(first);
    expect(findCondaEnv("other", ctx).prefix).toBe(second);
    expect(findCondaEnv("other", w.ctx({ CONDA_ENVS_DIRS: join(w.root, "more", "envs") })).prefix).toBe(second);
  });

  test("not found: one line naming conda's absence and every folder looked in (the roots, for base), the home as ~", () => {
    const w = world();
    const { root } = makeCondaRoot(join(w.root, "conda"), { envs: { torch: {} } });
    mkdirSync(join(w.home, ".conda", "envs"), { recursive: true });
    mkdirSync(join(w.home, "team-envs"));
    const message = failure(() => findCondaEnv("nope", w.ctx({ CONDA_ROOT: root, CONDA_ENVS_PATH: join(w.home, "team-envs") })));
    const looked = ["conda not on PATH", "~/team-envs", join(root, "envs"), ...machineEnvsDirs, "~/.conda/envs", "~/.conda/environments.txt"];
    expect(message).toBe(`conda environment nope not found; looked in: ${looked.join(", ")}`);
    mkdirSync(join(w.home, "micromamba")); // a root without conda-meta: no base there
    expect(failure(() => findCondaEnv("base", w.ctx()))).toStartWith("conda environment base not found; looked in: conda not on PATH, ~/micromamba, ");
  });

  test("an environment without Python: one line naming its bin/python", () => {
    const w = world();
    const { root } = makeCondaRoot(join(w.root, "conda"), { envs: { r: { python: false } } });
    expect(failure(() => findCondaEnv("r", w.ctx({ CONDA_ROOT: root })))).toBe(`conda environment r has no Python (${join(root, "envs", "r", "bin", "python")})`);
  });
});

// Skipped only without a pyenv Python 3.8+ to copy into the prefixes; this machine and CI have pyenv's.
describe.skipIf(!PY)("findCondaEnv by path", () => {
  test("relative to cwd, from ~, and absolute; a link resolved to the real prefix", () => {
    const w = world();
    const prefix = makeCondaEnv(join(w.home, "work", "envs", "exp"));
    expect(findCondaEnv("./envs/exp", w.ctx({}, join(w.home, "work"))).prefix).toBe(prefix);
    expect(findCondaEnv("../work/envs/exp/", w.ctx({}, join(w.home, "work"))).prefix).toBe(prefix);
    const byHome = findCondaEnv("~/work/envs/exp", w.ctx());
    expect(byHome.prefix).toBe(prefix);
    expect(byHome.name).toBe("exp");
    Bun.spawnSync(["ln", "-s", prefix, join(w.root, "link")]);
    expect(findCondaEnv(join(w.root, "link"), w.ctx()).prefix).toBe(prefix);
    makeCondaRoot(join(w.home, "miniconda3"));
    expect(findCondaEnv("~/miniconda3", w.ctx()).name).toBe("base");
  });

  test("a folder without conda-meta, or none at all: one line", () => {
    const w = world();
    mkdirSync(join(w.home, "plain", "bin"), { recursive: true });
    expect(failure(() => findCondaEnv("~/plain", w.ctx()))).toBe("~/plain is not a conda environment: no conda-meta in ~/plain");
    expect(failure(() => findCondaEnv("./nowhere", w.ctx({}, w.home)))).toBe("./nowhere is not a conda environment: no such folder ~/nowhere");
  });
});

// Skipped only without a pyenv Python 3.8+ to copy into the prefixes; this machine and CI have pyenv's.
describe.skipIf(!PY)("conda on PATH", () => {
  test("conda env list is asked, with the caller's environment; its root is base, others go by folder name", () => {
    const w = world();
    const { root, envs } = makeCondaRoot(join(w.root, "install"), { envs: { alpha: {} } });
    const special = makeCondaEnv(join(w.root, "elsewhere", "special")); // only conda knows of it
    fakeConda(join(root, "condabin", "conda"), { envs: [root, envs.alpha!, special, join(w.root, "ghost")] });
    const log = join(w.root, "conda.log");
    const ctx = w.ctx({ PATH: join(root, "condabin"), FAKE_CONDA_LOG: log });
    expect(findCondaEnv("special", ctx)).toMatchObject({ prefix: special, name: null });
    expect(findCondaEnv("base", ctx)).toMatchObject({ prefix: root, name: "base" });
    expect(findCondaEnv("alpha", ctx)).toMatchObject({ prefix: envs.alpha!, name: "alpha" });
    expect(readFileSync(log, "utf8")).toBe("env list --json\n".repeat(3));
    expect(failure(() => findCondaEnv("ghost", ctx))).toStartWith("conda environment ghost not found; looked in: conda env list, ");
  });

  test("a conda that fails: the folders are looked in, and the message says how conda failed", () => {
    const w = world();
    const { root, envs } = makeCondaRoot(join(w.root, "conda"), { envs: { torch: {} } });
    fakeConda(join(w.bin, "conda"), { envs: [], exitCode: 1 });
    const ctx = w.ctx({ CONDA_ROOT: root });
    expect(findCondaEnv("torch", ctx).prefix).toBe(envs.torch!);
    expect(failure(() => findCondaEnv("jax", ctx))).toStartWith(`conda environment jax not found; looked in: conda env list (CondaError: something broke), ${join(root, "envs")}, `);
  });

  test("listCondaEnvs: conda's answer, then the folders', each prefix once, a Python-less env with python null", () => {
    const w = world();
    const { root, envs } = makeCondaRoot(join(w.root, "install"), { envs: { alpha: {}, r: { python: false } } });
    const special = makeCondaEnv(join(w.root, "elsewhere", "special"));
    const registered = makeCondaEnv(join(w.root, "proj", "env"));
    writeEnvironmentsTxt(w.home, [registered]);
    fakeConda(join(root, "condabin", "conda"), { envs: [special, root] });
    const listed = listCondaEnvs(w.ctx({ PATH: join(root, "condabin"), CONDA_ROOT: root }));
    expect(listed).toEqual([
      { name: null, prefix: special, python: join(special, "bin", "python") },
      { name: "base", prefix: root, python: join(root, "bin", "python") },
      { name: "alpha", prefix: envs.alpha!, python: join(envs.alpha!, "bin", "python") },
      { name: "r", prefix: envs.r!, python: null },
      { name: null, prefix: registered, python: join(registered, "bin", "python") },
    ]);
  });
});

// Skipped only without a pyenv Python 3.8+ to copy into the prefixes; this machine and CI have pyenv's.
describe.skipIf(!PY)("packages and metaDigest", () => {
  const numpy = { name: "numpy", version: "1.26.4", build: "py311h64a7726_0" };
  const zlib = { name: "zlib", version: "1.2.13", build: "hd590333_5" };

  test("packages are the records' name==version, sorted; a malformed record is skipped but counted in the digest", () => {
    const w = world();
    const prefix = makeCondaEnv(join(w.root, "env"), { packages: [zlib, numpy, { name: "ca-certificates", version: "2024.2.2", build: "hbcca054_0" }] });
    const env = findCondaEnv(prefix, w.ctx());
    expect(env.packages).toEqual(["ca-certificates==2024.2.2", "numpy==1.26.4", `python==${PY!.full}`, "zlib==1.2.13"]);
    writeFileSync(join(prefix, "conda-meta", "half-written.json"), '{"name": "scipy", "vers');
    const after = findCondaEnv(prefix, w.ctx());
    expect(after.packages).toEqual(env.packages);
    expect(after.metaDigest).not.toBe(env.metaDigest);
  });

  test("metaDigest: the same while nothing changes; changes when conda adds a record or writes history", () => {
    const w = world();
    const prefix = makeCondaEnv(join(w.root, "env"), { packages: [zlib] });
    const first = findCondaEnv(prefix, w.ctx()).metaDigest;
    expect(first).toMatch(/^[0-9a-f]{64}$/);
    expect(findCondaEnv(prefix, w.ctx()).metaDigest).toBe(first);
    writeFileSync(join(prefix, "lib", "unrelated.txt"), "not conda's"); // outside conda-meta
    writeFileSync(join(prefix, "conda-meta", "pinned"), "numpy 1.26.*\n"); // neither a record nor the history
    expect(findCondaEnv(prefix, w.ctx()).metaDigest).toBe(first);
    addCondaRecord(prefix, numpy);
    const added = findCondaEnv(prefix, w.ctx());
    expect(added.metaDigest).not.toBe(first);
    expect(added.packages).toContain("numpy==1.26.4");
    writeFileSync(join(prefix, "conda-meta", "history"), `${readFileSync(join(prefix, "conda-meta", "history"), "utf8")}# cmd: conda update --all\n`);
    expect(findCondaEnv(prefix, w.ctx()).metaDigest).not.toBe(added.metaDigest);
  });
});

// Skipped only without a pyenv Python 3.8+ to copy into the prefixes; this machine and CI have pyenv's.
describe.skipIf(!PY)("condaActivation", () => {
  const base = { PATH: "/usr/bin:/bin", HOME: "/nonexistent", CHANGED: "start", DROP_ME: "1", REMOVE_ME: "1" };

  test("conda's variables and PATH, on a copy of base", async () => {
    const w = world();
    const { envs } = makeCondaRoot(join(w.root, "conda"), { envs: { torch: {} } });
    const env = findCondaEnv(envs.torch!, w.ctx());
    const given = { ...base };
    const vars = await condaActivation(env, given);
    expect(given).toEqual(base);
    expect(vars).toEqual({ ...base, CONDA_PREFIX: env.prefix, CONDA_DEFAULT_ENV: "torch", CONDA_PROMPT_MODIFIER: "(torch) ", CONDA_SHLVL: "1", PATH: `${env.prefix}/bin:/usr/bin:/bin` });
    expect(Bun.which("python", { PATH: vars.PATH! })).toBe(env.python);
    const pathEnv = makeCondaEnv(join(w.root, "loose"));
    const loose = await condaActivation({ prefix: pathEnv, name: null }, {});
    expect(loose).toMatchObject({ CONDA_DEFAULT_ENV: pathEnv, CONDA_PROMPT_MODIFIER: `(${pathEnv}) `, PATH: `${pathEnv}/bin` });
  });

  test("the env's config vars (conda-meta/state): set, and conda's unset marker removes", async () => {
    const w = world();
    const prefix = makeCondaEnv(join(w.root, "env"), { envVars: { MY_VAR: "a b=c", REMOVE_ME: "***unset***" } });
    const vars = await condaActivation({ prefix, name: null }, base);
    expect(vars.MY_VAR).toBe("a b=c");
    expect("REMOVE_ME" in vars).toBe(false);
  });

  test("activate.d scripts, in sorted order: what they export, change and unset; their stdout and cd change nothing else", async () => {
    const w = world();
    const prefix = makeCondaEnv(join(w.root, "env"), {
      envVars: { MY_VAR: "from-state" },
      activate: {
        "20-second.sh": 'export SECOND="$FIRST+two"\nexport MULTI="$(printf "line1\\nline2")"\n',
        "10-first.sh": 'echo "noise=on stdout"\nexport FIRST=one\nexport CHANGED="$CHANGED-more"\nunset DROP_ME\nexport SAW="$CONDA_PREFIX|$MY_VAR|$CONDA_SHLVL"\ncd /\n',
        "30-csh-only.csh": "setenv CSH_ONLY 1\n", // conda sources only *.sh in a POSIX shell
      },
    });
    const vars = await condaActivation({ prefix, name: "exp" }, base);
    const { DROP_ME: _dropped, ...kept } = base;
    expect(vars).toStrictEqual({
      ...kept,
      CONDA_PREFIX: prefix,
      CONDA_DEFAULT_ENV: "exp",
      CONDA_PROMPT_MODIFIER: "(exp) ",
      CONDA_SHLVL: "1",
      PATH: `${prefix}/bin:/usr/bin:/bin`,
      MY_VAR: "from-state",
      FIRST: "one",
      SECOND: "one+two",
      MULTI: "line1\nline2",
      CHANGED: "start-more",
      SAW: `${prefix}|from-state|1`,
    });
  });

  // Skipped only without bash (conda-forge's activate scripts need it); CI's Debian has bash.
  test.skipIf(!Bun.which("bash"))("scripts run in bash where there is one: conda-forge's scripts use [[ ]]", async () => {
    const w = world();
    const prefix = makeCondaEnv(join(w.root, "env"), { activate: { "gdal.sh": 'if [[ -n "${CONDA_PREFIX:-}" ]]; then export GDAL_DATA="$CONDA_PREFIX/share/gdal"; fi\n' } });
    expect((await condaActivation({ prefix, name: null }, base)).GDAL_DATA).toBe(`${prefix}/share/gdal`);
  });

  test("a failing script: one line naming it and its last stderr line; a script that exits the shell too", async () => {
    const w = world();
    const prefix = makeCondaEnv(join(w.root, "env"), {
      activate: { "10-ok.sh": "export OK=1\n", "20-cuda.sh": 'echo "first complaint" >&2\necho "nvcc: not found in $CONDA_PREFIX" >&2\nfalse\n', "30-later.sh": "export LATER=1\n" },
    });
    const script = join(prefix, "etc", "conda", "activate.d", "20-cuda.sh");
    expect(await failureOf(condaActivation({ prefix, name: "gpu" }, base))).toBe(`conda environment gpu: activate script ${script} failed (exit 1): nvcc: not found in ${prefix}`);
    writeFileSync(script, "exit 3\n");
    expect(await failureOf(condaActivation({ prefix, name: "gpu" }, base))).toBe(`conda environment gpu: activate script ${script} failed (exit 3)`);
    writeFileSync(script, "exit 0\n");
    expect(await failureOf(condaActivation({ prefix, name: "gpu" }, base))).toBe(`conda environment gpu: activate script ${script} ended the shell early`);
  });

  test("a script that hangs is killed at the time limit, with what it started (an orphan too: by its process group)", async () => {
    const w = world();
    const marker = `30.${process.pid}${Date.now() % 1000}`; // a sleep left behind by a failing run ends by itself
    const prefix = makeCondaEnv(join(w.root, "env"), { activate: { "hang.sh": `(sleep ${marker} &)\nsleep ${marker}\n` } });
    const started = performance.now();
    const message = await failureOf(condaActivation({ prefix, name: "slow" }, base, { timeoutMs: 300 }));
    expect(message).toBe(`conda environment slow: activate script ${join(prefix, "etc", "conda", "activate.d", "hang.sh")} did not finish within 0.3 s`);
    expect(performance.now() - started).toBeLessThan(5_000);
    await Bun.sleep(100);
    expect(running(marker)).toEqual([]);
  });
});
