import { afterAll, beforeAll, describe, expect, setDefaultTimeout, test } from "bun:test";
import { copyFileSync, existsSync, mkdirSync, writeFileSync } from "node:fs";
import { basename, join } from "node:path";
import { PackageIndex } from "./fixtures/index.ts";
import { cli, makeWorkerVenv, sandbox, startCli } from "./helpers.ts";
import { keepOutput, stopAll, waitFor } from "./fixtures/processes.ts";

/**
 * One job, the same here and on a fleet: a job whose requirements name a
 * local setuptools project with package data in a folder its .gitignore
 * leaves out (and a prebuilt library `*.so` ignores) reads that data through
 * importlib.resources. Run here, and through a real server and worker (the
 * job's folder travels as a bundle): the same output, as the bundle carries
 * what a fresh install of the project reads.
 */

setDefaultTimeout(240_000);

// setuptools from PyPI, as the build backend, served from the test's own index. CI (.ci/run) sets the variable.
const SETUPTOOLS = process.env.GPULAYER_TEST_SETUPTOOLS_WHEEL && existsSync(process.env.GPULAYER_TEST_SETUPTOOLS_WHEEL) ? process.env.GPULAYER_TEST_SETUPTOOLS_WHEEL : null;
const skipped = SETUPTOOLS ? "" : ' (skipped: set GPULAYER_TEST_SETUPTOOLS_WHEEL to a setuptools>=70.1 wheel, e.g. from `pip download "setuptools>=70.1" --no-deps`)';

const TOKEN = "bundle-package-data-token-0123456789";
const FAST = { GPULAYER_HEARTBEAT_SECONDS: "0.5", GPULAYER_WORKER_LOST_SECONDS: "5", GPULAYER_WORKER_ENGINE: "none", GPULAYER_CANCEL_GRACE: "1", GPULAYER_WORKER_DRAIN_SECONDS: "1", GPULAYER_WORKER_SLOTS: "1" };
const boxes = { local: sandbox(), server: sandbox(), w1: sandbox(), client: sandbox() };
const index = new PackageIndex(join(boxes.client.root, "index"));
const procs: { proc: ReturnType<typeof startCli>; out: () => string }[] = [];
let url = "";
let localPython = "";

beforeAll(async () => {
  if (!SETUPTOOLS) return;
  copyFileSync(SETUPTOOLS, join(index.dir, basename(SETUPTOOLS)));
  index.start();
  localPython = await makeWorkerVenv(join(boxes.local.root, "venv"), { env: boxes.local.env });
  const server = keepOutput(startCli(["server", "--listen", "127.0.0.1:0", "--json"], { env: { GPULAYER_TOKEN: TOKEN, ...boxes.server.env, ...FAST } }), procs);
  url = (await waitFor("the server", async () => /"url": "([^"]+)"/.exec(server.out())?.[1])) as string;
  const venv = await makeWorkerVenv(join(boxes.w1.root, "venv"), { env: boxes.w1.env });
  keepOutput(startCli(["join", url, "--name", "w1", "--python", venv], { env: { ...boxes.w1.env, ...FAST, GPULAYER_TOKEN: TOKEN } }), procs);
  await waitFor("the worker", async () => (JSON.parse((await cli(["workers", "--json"], { env: { ...boxes.client.env, GPULAYER_SERVER: url, GPULAYER_TOKEN: TOKEN } })).stdout) as unknown[]).length === 1);
}, 240_000);

afterAll(async () => {
  await stopAll(procs);
  if (SETUPTOOLS) index.stop();
  for (const b of Object.values(boxes)) b.cleanup();
}, 30_000);

function writeTree(dir: string, files: Record<string, string>): string {
  for (const [path, text] of Object.entries(files)) {
    mkdirSync(join(dir, path, ".."), { recursive: true });
    writeFileSync(join(dir, path), text);
  }
  return dir;
}

const PYPROJECT = `[build-system]\nrequires = ["setuptools>=70.1"]\nbuild-backend = "setuptools.build_meta"\n\n[project]\nname = "localpkg"\nversion = "0.1"\n\n[tool.setuptools]\npackages = ["localpkg"]\n\n[tool.setuptools.package-data]\nlocalpkg = ["data/*.json", "*.so"]\n`;

const SHOW = `import importlib.resources as r\nfiles = r.files("localpkg")\nprint(files.joinpath("data/table.json").read_text().strip(), files.joinpath("_kernels.so").read_text().strip())\n`;

describe("a local project's package data, ignored by .gitignore", () => {
  // Skipped only without GPULAYER_TEST_SETUPTOOLS_WHEEL (a real setuptools builds the project, offline); CI downloads it (.ci/run).
  test.skipIf(!SETUPTOOLS)(`reaches the job the same way here and through a server and worker${skipped}`, async () => {
    const dir = writeTree(join(boxes.client.root, "job"), {
      "requirements.txt": "./localpkg\n",
      "show.py": SHOW,
      ".gitignore": "*.so\n",
      "localpkg/pyproject.toml": PYPROJECT,
      "localpkg/.gitignore": "data/\n",
      "localpkg/localpkg/__init__.py": "",
      "localpkg/localpkg/data/table.json": '{"rows": 3}\n',
      "localpkg/localpkg/_kernels.so": "kernels built on Monday\n",
    });
    const args = ["job", "run", "-r", "requirements.txt", "--workdir", ".", "--index-url", index.url, "--", "python", "show.py"];
    const local = await cli(args, { env: { ...boxes.local.env, GPULAYER_PYTHON: localPython }, cwd: dir });
    expect({ code: local.code, stdout: local.stdout, stderr: local.code ? local.stderr : "" }).toEqual({ code: 0, stdout: '{"rows": 3} kernels built on Monday\n', stderr: "" });
    const fleet = await cli(args, { env: { ...boxes.client.env, GPULAYER_SERVER: url, GPULAYER_TOKEN: TOKEN }, cwd: dir });
    expect({ code: fleet.code, stdout: fleet.stdout, stderr: fleet.code ? fleet.stderr : "" }).toEqual({ code: 0, stdout: local.stdout, stderr: "" });
  });
});
