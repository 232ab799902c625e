import { afterAll, beforeAll, describe, expect, setDefaultTimeout, test } from "bun:test";
import { mkdirSync, writeFileSync } from "node:fs";
import { join } from "node:path";
import { PackageIndex } from "./fixtures/index.ts";
import { addCondaRecord, makeCondaRoot, pyenvPython } from "./fixtures/conda.ts";
import { cli, HAS_UV, run, sandbox, tempDir } from "./helpers.ts";
import { homeLayout } from "../src/config/paths.ts";
import { probeMachine } from "../src/worker/probe.ts";
import { jobNeeds, neverReason } from "../src/server/match.ts";
import type { WorkerRow } from "../src/server/store.ts";

/**
 * A conda environment as the base of an env, on real builds: conda itself
 * cannot be installed here (its channels are out of reach), so the
 * environment is laid out as conda leaves it (test/fixtures/conda.ts: a real
 * Python copied in, conda-meta records, activate.d scripts). Requirements
 * layer on top of what conda put there; the key follows conda-meta; a job
 * runs with the environment's activation.
 */

setDefaultTimeout(120_000);

// Skipped only without a pyenv Python 3.8+ to copy into the fixture prefix; this machine and CI have pyenv's.
const python = pyenvPython();
const world = tempDir("gpl-conda-env-");
const index = new PackageIndex(join(world, "index"));
const roots = { root: "", envs: {} as Record<string, string> };

beforeAll(() => {
  if (!python) return;
  index.start();
  index.wheel({ name: "gl-top", version: "1.0", requires: ["condapkg>=1"] });
  // What a lock resolves condapkg to (the version conda has): the env keeps conda's own.
  index.wheel({ name: "condapkg", version: "1.5" });
  Object.assign(
    roots,
    makeCondaRoot(join(world, "miniconda3"), {
      envs: {
        ml: {
          packages: [{ name: "condapkg", version: "1.5", build: "py_0" }],
          activate: { "ml-vars.sh": "export ML_HOME=\"$CONDA_PREFIX/share/ml\"\nexport FROM_ACTIVATE=yes\n" },
          envVars: { ML_MODE: "conda-var" },
        },
      },
    }),
  );
  // What conda's package would have put in site-packages: a module and its dist-info, which pip sees as installed.
  const site = join(roots.envs.ml!, "lib", `python${python.version}`, "site-packages");
  mkdirSync(join(site, "condapkg"), { recursive: true });
  writeFileSync(join(site, "condapkg", "__init__.py"), "WHERE = 'conda'\n");
  mkdirSync(join(site, "condapkg-1.5.dist-info"));
  writeFileSync(join(site, "condapkg-1.5.dist-info", "METADATA"), "Metadata-Version: 2.1\nName: condapkg\nVersion: 1.5\n");
  writeFileSync(join(site, "condapkg-1.5.dist-info", "INSTALLER"), "conda\n");
});
afterAll(() => index.stop());

// Skipped only without a pyenv Python 3.8+ to copy into the conda fixture's prefix; this machine and CI have pyenv's.
describe.skipIf(!python)("a conda environment as the base interpreter", () => {
  const env = (s: ReturnType<typeof sandbox>) => ({ ...s.env, CONDA_ROOT: roots.root });

  test("env prepare --conda NAME: requirements layer on top of conda's packages; the key follows conda-meta", async () => {
    const s = sandbox();
    try {
      const args = ["env", "prepare", "--conda", "ml", "-p", "gl-top", "--index-url", index.url];
      const dry = await cli([...args, "--dry-run", "--json"], { env: env(s), cwd: s.root });
      expect(dry.code).toBe(0);
      const plan = JSON.parse(dry.stdout) as { key: string; would: string; inputs: { conda: { prefix: string; name: string; packages: number }; interpreter: { path: string } } };
      expect(plan.inputs.conda).toMatchObject({ prefix: roots.envs.ml, name: "ml", packages: 2 });
      expect(plan.inputs.interpreter.path).toStartWith(join(roots.envs.ml!, "bin"));

      const built = await cli([...args, "--json"], { env: env(s), cwd: s.root });
      expect(built.code).toBe(0);
      const doc = JSON.parse(built.stdout) as { key: string; path: string; python: string; status: string };
      expect(doc).toMatchObject({ key: plan.key, status: "built" });
      // gl-top from the index, condapkg (its requirement) from conda's own site-packages: not installed again.
      const seen = Bun.spawnSync([doc.python, "-c", "import gl_top, condapkg, sys; print(condapkg.WHERE, sys.base_prefix == sys.prefix)"], { stdout: "pipe", stderr: "pipe" });
      expect(seen.stdout.toString().trim()).toBe("conda False");
      expect(Bun.spawnSync(["ls", join(doc.path, "lib", `python${python!.version}`, "site-packages")]).stdout.toString()).not.toContain("condapkg");

      const again = JSON.parse((await cli([...args, "--json"], { env: env(s), cwd: s.root })).stdout) as { key: string; status: string };
      expect(again).toMatchObject({ key: doc.key, status: "reused" });
      // conda installs something: another base, another key.
      addCondaRecord(roots.envs.ml!, { name: "libfoo", version: "2.0", build: "h0" });
      const after = JSON.parse((await cli([...args, "--dry-run", "--json"], { env: env(s), cwd: s.root })).stdout) as { key: string; would: string };
      expect(after.key).not.toBe(doc.key);
      expect(after.would).toBe("build");
    } finally {
      s.cleanup();
    }
  });

  test("a job with environment.conda runs with the environment's activation, the env's bin first on PATH", async () => {
    const s = sandbox();
    try {
      writeFileSync(
        join(s.root, "job.yaml"),
        [
          "command: python -c \"import os, sys, condapkg; print(os.environ['CONDA_PREFIX'], os.environ['CONDA_DEFAULT_ENV'], os.environ['FROM_ACTIVATE'], os.environ['ML_HOME'], os.environ['ML_MODE'], condapkg.WHERE); print(os.environ['PATH'].split(':')[:2]); print(sys.prefix)\"",
          "environment:",
          "  conda: ml",
          "  requirements: [gl-top]",
          `  index_url: ${index.url}`,
          "",
        ].join("\n"),
      );
      const r = await cli(["job", "run", "-f", "job.yaml"], { env: env(s), cwd: s.root });
      expect(r.code).toBe(0);
      const [vars, path, prefix] = r.stdout.trim().split("\n");
      const ml = roots.envs.ml!;
      expect(vars).toBe(`${ml} ml yes ${ml}/share/ml conda-var conda`);
      expect(path).toBe(`['${prefix}/bin', '${ml}/bin']`);
      expect(prefix).toStartWith(join(s.home, "envs-v1"));
    } finally {
      s.cleanup();
    }
  });

  test("a worker reports its conda environments in its probe, and a job naming one (with frameworks inside it) goes only where it is", async () => {
    const s = sandbox();
    try {
      const probe = await probeMachine(homeLayout(s.home), undefined, { env: env(s), engine: null }, s.root);
      const ml = probe.conda?.find((c) => c.name === "ml");
      expect(ml).toMatchObject({ prefix: roots.envs.ml, frameworks: { condapkg: "1.5" } });
      expect(probe.conda?.find((c) => c.name === "base")?.prefix).toBe(roots.root);
      const worker = { name: "w", labels: {}, probe } as unknown as WorkerRow;
      const spec = (conda: string, frameworks: Record<string, string>) => ({ name: "j", argv: ["true"], commandText: "true", env: {}, environment: { specs: [], extraIndexUrls: [], findLinks: [], conda }, resources: { gpus: 0, frameworks } });
      expect(neverReason(jobNeeds(spec("ml", { condapkg: ">=1" }), {}), worker)).toBeNull();
      expect(neverReason(jobNeeds(spec("ml", { condapkg: ">=2" }), {}), worker)).toBe("condapkg 1.5 does not satisfy >=2");
      expect(neverReason(jobNeeds(spec("other", {}), {}), worker)).toBe("no conda environment other");
      expect(neverReason(jobNeeds(spec(roots.envs.ml!, {}), {}), worker)).toBeNull();
    } finally {
      s.cleanup();
    }
  });

  // A uv project is uv's to install: skipped only without uv (CI installs it).
  test.skipIf(!HAS_UV)("env prepare --conda NAME --project DIR: the lock's packages on top of conda's, conda's own kept at the locked version", async () => {
    const s = sandbox();
    try {
      const project = join(s.root, "app");
      mkdirSync(project);
      writeFileSync(join(project, "pyproject.toml"), `[project]\nname = "app"\nversion = "0.1"\nrequires-python = ">=3.8"\ndependencies = ["gl-top"]\n\n[tool.uv]\npackage = false\n\n[[tool.uv.index]]\nurl = "${index.url}"\ndefault = true\n`);
      const locked = await run(["uv", "lock", "--project", project], { env: s.env, cwd: s.root });
      expect(locked.code, locked.stderr).toBe(0);
      const args = ["env", "prepare", "--conda", "ml", "--project", project, "--json"];
      const built = await cli(args, { env: env(s), cwd: s.root });
      expect(built.code, built.stderr).toBe(0);
      const doc = JSON.parse(built.stdout) as { key: string; path: string; python: string; status: string; shadowed?: unknown[] };
      expect(doc.status).toBe("built");
      expect(doc.shadowed ?? []).toEqual([]);
      // gl-top from the lock; condapkg 1.5, as locked, from conda's site-packages: not installed again.
      const seen = Bun.spawnSync([doc.python, "-c", "import gl_top, condapkg, sys; print(condapkg.WHERE, sys.base_prefix == sys.prefix)"], { stdout: "pipe", stderr: "pipe" });
      expect(seen.stdout.toString().trim()).toBe("conda False");
      const own = Bun.spawnSync(["ls", join(doc.path, "lib", `python${python!.version}`, "site-packages")]).stdout.toString();
      expect(own).toContain("gl_top");
      expect(own).not.toContain("condapkg");
      const again = JSON.parse((await cli(args, { env: env(s), cwd: s.root })).stdout) as { key: string; status: string };
      expect(again).toMatchObject({ key: doc.key, status: "reused" });
    } finally {
      s.cleanup();
    }
  });

  test("a conda environment that is not there is one line naming where it was looked for; --python with --conda is refused", async () => {
    const s = sandbox();
    try {
      const r = await cli(["env", "prepare", "--conda", "nope", "-p", "gl-top", "--index-url", index.url], { env: env(s), cwd: s.root });
      expect(r.code).toBe(2);
      const lines = r.stderr.trimEnd().split("\n");
      expect(lines).toHaveLength(1);
      expect(lines[0]).toMatch(new RegExp(`^error: conda environment nope not found; looked in: conda not on PATH, .*${roots.root.replaceAll("/", "\\/")}.*~/\\.conda/environments\\.txt$`));
      const both = await cli(["env", "prepare", "--conda", "ml", "--python", "python3", "-p", "gl-top"], { env: env(s), cwd: s.root });
      expect(both).toMatchObject({ code: 2, stderr: "error: --python python3 and --conda ml both name the base interpreter: give one\n" });
    } finally {
      s.cleanup();
    }
  });
});
