import { afterAll, beforeAll, describe, expect, setDefaultTimeout, test } from "bun:test";
import { existsSync, mkdirSync, readdirSync, readFileSync, rmSync, writeFileSync } from "node:fs";
import { join } from "node:path";
import { makeDist, PackageIndex } from "./fixtures/index.ts";
import { cli, HAS_UV, makeWorkerVenv, readyKeys, run, sandbox, tempDir } from "./helpers.ts";
import { waitFor } from "./fixtures/processes.ts";

/**
 * `gpulayer env prepare` end to end: the CLI as a whole process, real pip and
 * uv, a PEP 503 index on 127.0.0.1 serving wheels built on the fly.
 */

setDefaultTimeout(60_000);

const world = tempDir("gpl-prep-");
const index = new PackageIndex(join(world, "index"));
let plainPy: string; // worker venv without pip: gpulayer uses the interpreter's bundled pip
let bPy: string; // worker venv with pip and b==1.0
let editablePy: string; // worker venv with pip and an editable project
let editableSrc: string;

beforeAll(async () => {
  index.start();
  index.wheel({ name: "tiny", version: "1.0" });
  index.wheel({ name: "top", version: "1.0", requires: ["mid>=1"] });
  index.wheel({ name: "mid", version: "1.0" });
  index.wheel({ name: "b", version: "1.0" });
  index.wheel({ name: "b", version: "2.0" });
  index.wheel({ name: "needs-b1", version: "1.0", requires: ["b>=1"] });
  index.wheel({ name: "needs-b2", version: "1.0", requires: ["b>=2"] });
  const s = sandbox();
  editableSrc = makeDist("project", join(world, "src"), { name: "edproj", version: "0.1" });
  [plainPy, bPy, editablePy] = await Promise.all([
    makeWorkerVenv(join(world, "plain"), { env: s.env }),
    makeWorkerVenv(join(world, "with-b"), { env: s.env, withPip: true, packages: ["b==1.0"], findLinks: index.dir }),
    makeWorkerVenv(join(world, "editable"), { env: s.env, withPip: true, editable: editableSrc }),
  ]);
  s.cleanup();
}, 120_000);

afterAll(() => {
  index.stop();
  rmSync(world, { recursive: true, force: true });
});

async function prepare(s: ReturnType<typeof sandbox>, args: string[], env: Record<string, string> = {}) {
  return cli(["env", "prepare", ...args], { env: { ...s.env, ...env }, cwd: s.root });
}

async function pyRun(python: string, code: string) {
  const r = await run([python, "-c", code]);
  expect(r.stderr).toBe("");
  return r.stdout.trim();
}

describe("env prepare", () => {
  test("builds, then reuses the same path; --json prints one document; human mode ends with the path", async () => {
    const s = sandbox();
    try {
      const first = await prepare(s, ["-p", "top", "--index-url", index.url, "--python", plainPy, "--json"]);
      expect(first.code).toBe(0);
      const doc = JSON.parse(first.stdout); // the whole of stdout is one JSON document
      expect(doc).toMatchObject({ status: "built", path: join(s.home, "envs-v1", doc.key) });
      expect(doc.key).toMatch(/^[0-9a-f]{64}$/);
      expect(typeof doc.seconds).toBe("number");
      expect(readyKeys(s.home)).toEqual([doc.key]);
      expect(await pyRun(join(doc.path, "bin", "python"), "import top, mid; print(top.__version__, mid.__version__)")).toBe("1.0 1.0");

      const again = await prepare(s, ["-p", "top", "--index-url", index.url, "--python", plainPy, "--json"]);
      expect(again.code).toBe(0);
      expect(JSON.parse(again.stdout)).toMatchObject({ key: doc.key, path: doc.path, status: "reused" });

      const human = await prepare(s, ["-p", "top", "--index-url", index.url, "--python", plainPy]);
      expect(human.code).toBe(0);
      expect(human.stdout.trimEnd().split("\n").pop()).toBe(doc.path);
      expect(human.stderr).toContain("reused");

      const quiet = await prepare(s, ["-p", "top", "--index-url", index.url, "--python", plainPy, "--quiet"]);
      expect(quiet.stdout).toBe(`${doc.path}\n`);
      expect(quiet.stderr).toBe("");
    } finally {
      s.cleanup();
    }
  });

  test("what the worker has and satisfies the request is not installed again; what it does not satisfy is", async () => {
    const s = sandbox();
    try {
      const ok = await prepare(s, ["-p", "needs-b1", "--index-url", index.url, "--python", bPy, "--json"], { GPULAYER_INSTALLER: "pip" });
      expect(ok.code).toBe(0);
      const env1 = JSON.parse(ok.stdout);
      const show = JSON.parse((await cli(["env", "show", env1.key, "--json"], { env: s.env })).stdout);
      expect(show.installed).toEqual(["needs-b1==1.0"]);
      expect(show.installer).toMatch(/^pip \d/); // the worker's own pip, through the .pth
      expect(show.installer).not.toContain("bundled");
      // In words: what made the venv and what installed into it, each named once.
      const human = (await cli(["env", "show", env1.key], { env: s.env })).stdout;
      expect(human).toMatch(new RegExp(`^built\\s+\\S+ in \\S+ (ms|s) \\(venv by (uv|venv), installed by ${show.installer.replace(/[.()+]/g, "\\$&")}\\)$`, "m"));
      expect(await pyRun(join(env1.path, "bin", "python"), "import b, needs_b1; print(b.__version__)")).toBe("1.0");

      const newer = await prepare(s, ["-p", "needs-b2", "--index-url", index.url, "--python", bPy, "--json"]);
      expect(newer.code).toBe(0);
      const env2 = JSON.parse(newer.stdout);
      expect(env2.key).not.toBe(env1.key);
      expect(await pyRun(join(env2.path, "bin", "python"), "import b; print(b.__version__)")).toBe("2.0");
      const show2 = JSON.parse((await cli(["env", "show", env2.key, "--json"], { env: s.env })).stdout);
      expect(show2.installed.sort()).toEqual(["b==2.0", "needs-b2==1.0"]);
      // The worker itself is untouched.
      expect(await pyRun(bPy, "import b; print(b.__version__)")).toBe("1.0");
    } finally {
      s.cleanup();
    }
  });

  test("the worker's editable installs are importable in the env", async () => {
    const s = sandbox();
    try {
      const r = await prepare(s, ["-p", "tiny", "--index-url", index.url, "--python", editablePy, "--json"]);
      expect(r.code).toBe(0);
      const { path } = JSON.parse(r.stdout);
      expect(await pyRun(join(path, "bin", "python"), "import edproj, tiny; print(edproj.SOURCE)")).toBe(join(editableSrc, "edproj", "__init__.py"));
    } finally {
      s.cleanup();
    }
  });

  test("a missing requirement fails once, in the installer's words, and leaves nothing ready; once published it builds", async () => {
    const s = sandbox();
    try {
      const args = ["-p", "late-pkg>=1", "-p", "tiny", "--index-url", index.url, "--python", plainPy];
      const r = await prepare(s, args);
      expect(r.code).toBe(1);
      expect(r.stdout).toBe("");
      const lines = r.stderr.trimEnd().split("\n");
      const first = lines.findIndex((l) => l.startsWith("error:"));
      // The fast path says uv's short explanation and pip does not run the same resolution again; without uv, pip's words.
      expect(lines[first]).toBe(
        HAS_UV
          ? "error: no solution found when resolving dependencies: Because late-pkg was not found in the package registry and you require late-pkg>=1, we can conclude that your requirements are unsatisfiable."
          : "error: installing the requirements failed: ERROR: No matching distribution found for late-pkg>=1",
      );
      expect(lines.slice(first + 1).every((l) => l.startsWith("  "))).toBe(true);
      expect(readyKeys(s.home)).toEqual([]);
      expect(readdirSync(join(s.home, "envs-v1"))).toEqual([]);
      expect(JSON.parse((await cli(["env", "list", "--json"], { env: s.env })).stdout)).toEqual([]);

      index.wheel({ name: "late-pkg", version: "1.0" });
      const ok = await prepare(s, [...args, "--json"]);
      expect(ok.code).toBe(0);
      expect(JSON.parse(ok.stdout).status).toBe("built");
    } finally {
      s.cleanup();
    }
  });

  test("bad input gives one clear line and a non-zero exit", async () => {
    const s = sandbox();
    try {
      const missing = await prepare(s, ["nope.txt", "--python", plainPy]);
      expect(missing.code).toBe(2);
      expect(missing.stderr).toBe("error: requirements file not found: nope.txt\n");

      writeFileSync(join(s.root, "req.txt"), "tiny\n# fine\nthis is not a requirement\n");
      // The installer reads the user's own file and names the line itself; nothing is left in the cache.
      const invalid = await prepare(s, ["req.txt", "--python", plainPy]);
      expect(invalid.code).toBe(1);
      expect(invalid.stderr).toMatch(
        HAS_UV
          ? /(^|\n)error: req\.txt:3: invalid requirement 'this is not a requirement': [^\n]+\n$/
          : /(^|\n)error: installing the requirements failed: ERROR: Invalid requirement: 'this is not a requirement' \(from line 3 of .*req\.txt\)\n/,
      );
      expect(readyKeys(s.home)).toEqual([]);

      const noPython = await prepare(s, ["-p", "tiny", "--python", "/nonexistent/bin/python"]);
      expect(noPython.code).toBe(2);
      expect(noPython.stderr).toBe("error: --python: not found: /nonexistent/bin/python\n");

      const notPython = await prepare(s, ["-p", "tiny", "--python", "/bin/false"]);
      expect(notPython.code).toBe(2);
      expect(notPython.stderr).toMatch(/^error: --python: \/bin\/false is not a working Python 3/);

      const badCreator = await prepare(s, ["-p", "tiny", "--python", plainPy, "--index-url", index.url], { GPULAYER_VENV_CREATOR: "conda" });
      expect(badCreator.code).toBe(2);
      expect(badCreator.stderr).toMatch(/GPULAYER_VENV_CREATOR/);

      const t = performance.now();
      const unreachable = await prepare(s, ["-p", "tiny", "--python", plainPy, "--index-url", "http://127.0.0.1:1/simple"]);
      expect(performance.now() - t).toBeLessThan(10_000);
      expect(unreachable.code).toBe(1);
      // The index is looked at while the build starts: its steps may show, then the one line, and none of uv's retries.
      const lines = unreachable.stderr.trimEnd().split("\n");
      expect(lines.at(-1)).toMatch(/^error: index unreachable: http:\/\/127\.0\.0\.1:1\/simple \(/);
      for (const line of lines.slice(0, -1)) expect(line).toMatch(/^\[\d+ ms\] (creating|linking|installing) /);
      expect(readyKeys(s.home)).toEqual([]);

      const unknown = await prepare(s, ["-p", "tiny", "--frobnicate"]);
      expect(unknown.code).toBe(2);
      expect(unknown.stderr).toBe("error: unknown option --frobnicate (see --help)\n");
    } finally {
      s.cleanup();
    }
  });

  test("credentials in the index URL never show", async () => {
    const s = sandbox();
    try {
      const url = index.url.replace("http://", "http://alice:s3cr3t-token@");
      const outputs: string[] = [];
      const ok = await prepare(s, ["-p", "tiny", "--index-url", url, "--python", plainPy, "--verbose"]);
      expect(ok.code).toBe(0);
      outputs.push(ok.stdout, ok.stderr);
      const json = await prepare(s, ["-p", "tiny", "--index-url", url, "--python", plainPy, "--json", "--verbose"]);
      outputs.push(json.stdout, json.stderr);
      const { key, path } = JSON.parse(json.stdout);
      outputs.push(readFileSync(join(path, ".gpulayer", "meta.json"), "utf8"));
      for (const args of [["list"], ["list", "--json"], ["show", key], ["show", key, "--json"]]) {
        const r = await cli(["env", ...args], { env: s.env });
        expect(r.code).toBe(0);
        outputs.push(r.stdout, r.stderr);
      }
      const failed = await prepare(s, ["-p", "no-such-thing", "--index-url", url, "--python", plainPy, "--verbose"]);
      expect(failed.code).toBe(1);
      outputs.push(failed.stdout, failed.stderr);
      const down = await prepare(s, ["-p", "tiny", "--index-url", "http://alice:s3cr3t-token@127.0.0.1:1/simple", "--python", plainPy]);
      expect(down.code).toBe(1);
      outputs.push(down.stdout, down.stderr);
      const bad = await prepare(s, ["-p", "tiny", "--index-url", "ftp://alice:s3cr3t-token@host/simple", "--python", plainPy]);
      expect(bad.code).toBe(2);
      outputs.push(bad.stdout, bad.stderr);
      for (const text of outputs) {
        expect(text).not.toContain("s3cr3t");
        expect(text).not.toContain("alice:");
      }
    } finally {
      s.cleanup();
    }
  });

  // Skipped only without uv on PATH (these compare against or run uv itself); .ci/run installs uv, so CI runs them.
  test.if(HAS_UV)("uv is the default venv creator; GPULAYER_VENV_CREATOR=venv forces python -m venv", async () => {
    const s = sandbox();
    try {
      const byUv = await prepare(s, ["-p", "tiny", "--index-url", index.url, "--python", bPy, "--json"]);
      expect(byUv.code).toBe(0);
      const uvKey = JSON.parse(byUv.stdout).key;
      expect(JSON.parse((await cli(["env", "show", uvKey, "--json"], { env: s.env })).stdout).venv_creator).toBe("uv");

      // Another request (another key), the same worker: built by the venv module, still installs and links.
      const byVenv = await prepare(s, ["-p", "top", "--index-url", index.url, "--python", bPy, "--json"], { GPULAYER_VENV_CREATOR: "venv" });
      expect(byVenv.code).toBe(0);
      const { key, path } = JSON.parse(byVenv.stdout);
      const meta = JSON.parse((await cli(["env", "show", key, "--json"], { env: s.env })).stdout);
      expect(meta.venv_creator).toBe("venv");
      expect(readFileSync(join(path, "pyvenv.cfg"), "utf8")).not.toContain("uv =");
      expect(await pyRun(join(path, "bin", "python"), "import top, b; print(top.__version__, b.__version__)")).toBe("1.0 1.0");
    } finally {
      s.cleanup();
    }
  });

  test("a worker without pip uses the interpreter's bundled pip", async () => {
    const s = sandbox();
    try {
      const r = await prepare(s, ["-p", "tiny", "--index-url", index.url, "--python", plainPy, "--json"], { GPULAYER_VENV_CREATOR: "venv", GPULAYER_INSTALLER: "pip" });
      expect(r.code).toBe(0);
      const { key, path } = JSON.parse(r.stdout);
      const meta = JSON.parse((await cli(["env", "show", key, "--json"], { env: s.env })).stdout);
      expect(meta.installer).toContain("bundled");
      expect(meta.venv_creator).toBe("venv");
      expect(existsSync(join(path, "bin", "pip"))).toBe(false);
      expect(await pyRun(join(path, "bin", "python"), "import tiny; print(tiny.__version__)")).toBe("1.0");
    } finally {
      s.cleanup();
    }
  });

  test("env list tells envs apart: the interpreter each was built for, and two projects' requirements.txt by folder, one file's versions by content", async () => {
    const s = sandbox();
    try {
      const file = (project: string, text: string) => {
        mkdirSync(join(s.root, project), { recursive: true });
        writeFileSync(join(s.root, project, "requirements.txt"), text);
        return join(project, "requirements.txt");
      };
      const built = async (args: string[]) => JSON.parse((await prepare(s, [...args, "--index-url", index.url, "--json"])).stdout) as { key: string; python: string };
      const a = await built([file("proj-a", "tiny\n"), "--python", plainPy]);
      const b = await built([file("proj-b", "tiny\n"), "--python", bPy]);
      const version = (await pyRun(plainPy, "import platform; print(platform.python_version())")).trim();
      const list = JSON.parse((await cli(["env", "list", "--json"], { env: s.env })).stdout) as { key: string; python: unknown; requirements_file: string; summary: string }[];
      const byKey = (key: string) => list.find((e) => e.key === key)!;
      expect(byKey(a.key)).toMatchObject({ summary: "requirements.txt", python: { version, path: plainPy }, requirements_file: join(s.root, "proj-a", "requirements.txt") });
      expect(byKey(b.key)).toMatchObject({ summary: "requirements.txt", python: { version, path: bPy }, requirements_file: join(s.root, "proj-b", "requirements.txt") });
      const row = (text: string, key: string) => text.split("\n").find((l) => l.startsWith(key.slice(0, 12)))!;
      const human = (await cli(["env", "list"], { env: s.env })).stdout;
      expect(human.split("\n")[0]).toMatch(/^KEY +STATE +SIZE +CREATED +LAST USED +PYTHON +REQUEST$/);
      // A long path keeps its last folders: the venv's name says which interpreter.
      expect(row(human, a.key)).toMatch(new RegExp(`${version.replaceAll(".", "\\.")} …/plain/bin/python +proj-a/requirements\\.txt$`));
      expect(row(human, b.key)).toMatch(new RegExp(`${version.replaceAll(".", "\\.")} …/with-b/bin/python +proj-b/requirements\\.txt$`));
      // proj-a's file changed: the same folder twice, told apart by content.
      const a2 = await built([file("proj-a", "tiny\nmid\n"), "--python", plainPy]);
      const again = (await cli(["env", "list"], { env: s.env })).stdout;
      expect(row(again, a.key)).toMatch(/proj-a\/requirements\.txt \(sha256:[0-9a-f]{8}\)$/);
      expect(row(again, a2.key)).toMatch(/proj-a\/requirements\.txt \(sha256:[0-9a-f]{8}\)$/);
      expect(row(again, a.key).slice(-18)).not.toBe(row(again, a2.key).slice(-18));
      expect(row(again, b.key)).toMatch(/ proj-b\/requirements\.txt$/);
    } finally {
      s.cleanup();
    }
  });

  test("env list, env show by prefix, env rm", async () => {
    const s = sandbox();
    try {
      const empty = await cli(["env", "list"], { env: s.env });
      expect(empty.stdout).toContain("no environments yet");
      const a = JSON.parse((await prepare(s, ["-p", "tiny", "--index-url", index.url, "--python", plainPy, "--json"])).stdout);
      const b = JSON.parse((await prepare(s, ["-p", "mid", "--index-url", index.url, "--python", plainPy, "--json"])).stdout);
      const list = JSON.parse((await cli(["env", "list", "--json"], { env: s.env })).stdout);
      expect(list.map((e: { key: string }) => e.key).sort()).toEqual([a.key, b.key].sort());
      for (const e of list) expect(e).toMatchObject({ state: "ready", path: join(s.home, "envs-v1", e.key) });
      expect(list.find((e: { key: string }) => e.key === a.key).summary).toBe("tiny");
      const human = await cli(["env", "list"], { env: s.env });
      expect(human.stdout).toContain(a.key.slice(0, 12));

      const show = await cli(["env", "show", a.key.slice(0, 10)], { env: s.env });
      expect(show.code).toBe(0);
      expect(show.stdout).toContain(`key          ${a.key}`);
      expect(show.stdout).toContain("installed    tiny==1.0");
      const showJson = JSON.parse((await cli(["env", "show", a.key.slice(0, 10), "--json"], { env: s.env })).stdout);
      expect(showJson).toMatchObject({ key: a.key, path: a.path, installed: ["tiny==1.0"] });

      expect((await cli(["env", "show", "zz"], { env: s.env })).code).toBe(2);
      const none = await cli(["env", "show", "0000000"], { env: s.env });
      if (!a.key.startsWith("0000000") && !b.key.startsWith("0000000")) expect(none.stderr).toMatch(/^error: no environment with key 0000000/);

      const rm = await cli(["env", "rm", a.key.slice(0, 10), "--json"], { env: s.env });
      expect(rm.code).toBe(0);
      expect(JSON.parse(rm.stdout)).toEqual({ key: a.key, removed: true });
      expect(existsSync(a.path)).toBe(false);
      expect(readyKeys(s.home)).toEqual([b.key]);
      expect((await cli(["env", "show", a.key], { env: s.env })).code).toBe(1);
      expect(JSON.parse((await prepare(s, ["-p", "mid", "--index-url", index.url, "--python", plainPy, "--json"])).stdout).status).toBe("reused");

      // An env a running job uses is not removed; the job is named once, whatever leases it holds.
      const id = (await cli(["job", "run", "-d", "-p", "mid", "--index-url", index.url, "--python", plainPy, "--", "sleep", "30"], { env: s.env, cwd: s.root })).stdout.trim();
      const running = await waitFor("the job to run", async () => {
        const st = JSON.parse((await cli(["job", "status", id, "--json"], { env: s.env })).stdout);
        return st.state === "running" && st;
      });
      const held = await cli(["env", "rm", running.env_key], { env: s.env });
      expect([held.code, held.stderr]).toEqual([1, `error: environment ${running.env_key.slice(0, 12)} is in use by job ${id}; use --force to remove it anyway\n`]);
      expect((await cli(["job", "cancel", id], { env: s.env })).code).toBe(0);
    } finally {
      s.cleanup();
    }
  });
});
