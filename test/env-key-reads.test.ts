import { afterAll, beforeAll, describe, expect, setDefaultTimeout, test } from "bun:test";
import { copyFileSync, existsSync, mkdirSync, rmSync, writeFileSync } from "node:fs";
import { basename, join } from "node:path";
import { PackageIndex } from "./fixtures/index.ts";
import { cli, makeWorkerVenv, run, sandbox, tempDir } from "./helpers.ts";

/**
 * Every file a fresh install reads is in the key: real setuptools builds of
 * projects whose package data, prebuilt library or version a .gitignore or a
 * setup.py hides from a reading by names. Build, change that one file,
 * prepare again: a new env, holding the new file, never the old env.
 */

setDefaultTimeout(240_000);

// setuptools from PyPI, as the build backend (no index is reached: it is served from the test's own). CI (.ci/run)
// downloads it first and sets GPULAYER_TEST_SETUPTOOLS_WHEEL, so there these always run.
const SETUPTOOLS = process.env.GPULAYER_TEST_SETUPTOOLS_WHEEL && existsSync(process.env.GPULAYER_TEST_SETUPTOOLS_WHEEL) ? process.env.GPULAYER_TEST_SETUPTOOLS_WHEEL : null;
const skipped = SETUPTOOLS ? "" : ' (skipped: set GPULAYER_TEST_SETUPTOOLS_WHEEL to a setuptools>=70.1 wheel, e.g. from `pip download "setuptools>=70.1" --no-deps`)';

const world = tempDir("gpl-reads-");
const index = new PackageIndex(join(world, "index"));
let py: string;

beforeAll(async () => {
  if (!SETUPTOOLS) return;
  copyFileSync(SETUPTOOLS, join(index.dir, basename(SETUPTOOLS)));
  index.start();
  const s = sandbox();
  py = await makeWorkerVenv(join(world, "worker"), { env: s.env });
  s.cleanup();
}, 120_000);

afterAll(() => {
  if (SETUPTOOLS) index.stop();
  rmSync(world, { recursive: true, force: true });
});

const PYPROJECT = (packageData: string) =>
  `[build-system]\nrequires = ["setuptools>=70.1"]\nbuild-backend = "setuptools.build_meta"\n\n[project]\nname = "localpkg"\nversion = "0.1"\n\n[tool.setuptools]\npackages = ["localpkg"]\n\n[tool.setuptools.package-data]\nlocalpkg = [${packageData}]\n`;

/** A project folder `dir` of `files` (path → text). */
function writeProject(dir: string, files: Record<string, string>): string {
  for (const [path, text] of Object.entries(files)) {
    mkdirSync(join(dir, path, ".."), { recursive: true });
    writeFileSync(join(dir, path), text);
  }
  return dir;
}

/** Python of the env, run from outside any project folder (so only the env's own files serve imports). */
async function inEnv(envPath: string, code: string): Promise<string> {
  const r = await run([join(envPath, "bin", "python"), "-c", code], { cwd: "/" });
  if (r.code !== 0) throw new Error(r.stderr);
  return r.stdout.trim();
}

/** The installed package's file, read from the env. */
const installed = (file: string) => `import importlib.resources as r; print(r.files("localpkg").joinpath(${JSON.stringify(file)}).read_text().strip())`;

describe("every file a fresh install reads is in the key", () => {
  const s = sandbox();
  afterAll(() => s.cleanup());
  const prepare = async (args: string[]) => {
    const r = await cli(["env", "prepare", ...args, "--python", py, "--index-url", index.url, "--json"], { env: s.env, cwd: s.root });
    if (r.code !== 0) throw new Error(r.stderr);
    return JSON.parse(r.stdout) as { key: string; path: string; status: string };
  };

  /** Build `args`, check the env holds `before`, change `file` to `text`, and check the next prepare builds an env that holds `after`. */
  async function rebuiltOn(args: string[], check: string, before: string, change: () => void, after: string) {
    const first = await prepare(args);
    expect(first.status).toBe("built");
    expect(await inEnv(first.path, check)).toBe(before);
    expect((await prepare(args)).status).toBe("reused");
    change();
    const again = await prepare(args);
    expect({ status: again.status, holds: await inEnv(again.path, check) }).toEqual({ status: "built", holds: after });
  }

  // Skipped only without GPULAYER_TEST_SETUPTOOLS_WHEEL (a real setuptools builds these projects, offline); CI downloads it (.ci/run).
  test.skipIf(!SETUPTOOLS)(`package data in a folder .gitignore names (data/ ignored, package-data data/*.json)${skipped}`, async () => {
    const proj = writeProject(join(s.root, "data-ignored"), {
      "pyproject.toml": PYPROJECT('"data/*.json"'),
      ".gitignore": "data/\n",
      "localpkg/__init__.py": "",
      "localpkg/data/table.json": '{"v": 1}\n',
    });
    await rebuiltOn(["-p", `./${basename(proj)}`], installed("data/table.json"), '{"v": 1}', () => writeFileSync(join(proj, "localpkg", "data", "table.json"), '{"v": 2}\n'), '{"v": 2}');
  });

  // Skipped only without GPULAYER_TEST_SETUPTOOLS_WHEEL (a real setuptools builds these projects, offline); CI downloads it (.ci/run).
  test.skipIf(!SETUPTOOLS)(`a prebuilt library in a package (*.so ignored, listed as package data), rebuilt${skipped}`, async () => {
    const proj = writeProject(join(s.root, "kernels"), {
      "pyproject.toml": PYPROJECT('"_kernels.so"'),
      ".gitignore": "*.so\n",
      "localpkg/__init__.py": "",
      "localpkg/_kernels.so": "kernels built on Monday\n",
    });
    await rebuiltOn(["-p", `./${basename(proj)}`], installed("_kernels.so"), "kernels built on Monday", () => writeFileSync(join(proj, "localpkg", "_kernels.so"), "kernels built on Tuesday\n"), "kernels built on Tuesday");
  });

  // Skipped only without GPULAYER_TEST_SETUPTOOLS_WHEEL (a real setuptools builds these projects, offline); CI downloads it (.ci/run).
  test.skipIf(!SETUPTOOLS)(`package data in a folder named *.egg-info inside a package${skipped}`, async () => {
    const proj = writeProject(join(s.root, "egg-info-data"), {
      "pyproject.toml": PYPROJECT('"vendor.egg-info/*.txt"'),
      "localpkg/__init__.py": "",
      "localpkg/vendor.egg-info/notes.txt": "one\n",
    });
    await rebuiltOn(["-p", `./${basename(proj)}`], installed("vendor.egg-info/notes.txt"), "one", () => writeFileSync(join(proj, "localpkg", "vendor.egg-info", "notes.txt"), "two\n"), "two");
  });

  // Skipped only without GPULAYER_TEST_SETUPTOOLS_WHEEL (a real setuptools builds these projects, offline); CI downloads it (.ci/run).
  test.skipIf(!SETUPTOOLS)(`an editable project whose setup.py reads its version through os.path.join("localpkg", "meta.py"): 0.1 → 0.2${skipped}`, async () => {
    const proj = writeProject(join(s.root, "editable-meta"), {
      "pyproject.toml": '[build-system]\nrequires = ["setuptools>=70.1"]\nbuild-backend = "setuptools.build_meta"\n',
      "setup.py": [
        "import os",
        "from setuptools import setup",
        "",
        "def version():",
        "    ns = {}",
        '    with open(os.path.join("localpkg", "meta.py")) as f:',
        "        exec(f.read(), ns)",
        '    return ns["VERSION"]',
        "",
        'setup(name="localpkg", version=version(), packages=["localpkg"])',
        "",
      ].join("\n"),
      "localpkg/__init__.py": "",
      "localpkg/meta.py": 'VERSION = "0.1"\n',
    });
    writeFileSync(join(s.root, "req-editable.txt"), `-e ./${basename(proj)}\n`);
    const version = 'import importlib.metadata as m; print(m.version("localpkg"))';
    await rebuiltOn(["req-editable.txt"], version, "0.1", () => writeFileSync(join(proj, "localpkg", "meta.py"), 'VERSION = "0.2"\n'), "0.2");
  });
});
