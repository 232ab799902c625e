import { afterAll, beforeAll, describe, expect, setDefaultTimeout, test } from "bun:test";
import { copyFileSync, existsSync, mkdirSync, readdirSync, readFileSync, rmSync, statSync, symlinkSync, writeFileSync } from "node:fs";
import { basename, join } from "node:path";
import type { InterpreterInfo } from "../src/env/request/interpreter.ts";
import type { RequestInputs } from "../src/env/request/requirements.ts";
import { resolveInterpreter } from "../src/env/request/shims.ts";
import { findUv, pinnedUvPath, pinnedWheelFor, UV_VERSION, UV_WHEEL_SHA256 } from "../src/env/build/uv-tool.ts";
import { makeDist, PackageIndex } from "./fixtures/index.ts";
import { makeUvWheel } from "./fixtures/uv-wheel.ts";
import { cli, makeWorkerVenv, realUv, run, sandbox, tempDir } from "./helpers.ts";

/**
 * The `uv` setting (GPULAYER_UV): a uv of one's own, off, and auto on a box
 * with no uv on PATH, where gpulayer installs the pinned uv from the package
 * index (a local one here: tests never reach PyPI) after checking its hash.
 */

setDefaultTimeout(120_000);

const UV = realUv();
/** The test process's PATH without any folder that holds a uv. */
const NO_UV_PATH = (process.env.PATH ?? "").split(":").filter((d) => d && !existsSync(join(d, "uv"))).join(":");
/** A copy of the official wheel for this platform (no network in tests): the success path runs only with it. */
const OFFICIAL = process.env.GPULAYER_TEST_UV_WHEEL && existsSync(process.env.GPULAYER_TEST_UV_WHEEL) ? process.env.GPULAYER_TEST_UV_WHEEL : null;

function platformTag(): string {
  const arch = process.arch === "arm64" ? "aarch64" : "x86_64";
  if (process.platform === "darwin") return process.arch === "arm64" ? "macosx_11_0_arm64" : "macosx_10_12_x86_64";
  return `manylinux_2_17_${arch}`;
}

const world = tempDir("gpl-uvtool-");
let wPip: string; // worker with pip
let wPlain: string; // worker without pip (the bundled pip downloads)

beforeAll(async () => {
  const s = sandbox();
  [wPip, wPlain] = await Promise.all([makeWorkerVenv(join(world, "w-pip"), { env: s.env, withPip: true }), makeWorkerVenv(join(world, "w-plain"), { env: s.env })]);
  s.cleanup();
}, 180_000);

afterAll(() => rmSync(world, { recursive: true, force: true }));

/** An index of its own for a test: `tiny` and `other`, and the given uv wheel if any. */
function indexWith(name: string, uvWheel?: (dir: string) => string): { index: PackageIndex; wheel: string | null } {
  const index = new PackageIndex(join(world, name));
  makeDist("wheel", index.dir, { name: "tiny", version: "1.0" });
  makeDist("wheel", index.dir, { name: "other", version: "1.0" });
  const wheel = uvWheel ? uvWheel(index.dir) : null;
  return { index: index.start(), wheel };
}

interface Built {
  code: number;
  stderr: string;
  meta: Record<string, any>;
}

async function prepare(s: ReturnType<typeof sandbox>, args: string[], env: Record<string, string>): Promise<Built> {
  const r = await cli(["env", "prepare", ...args, "--json"], { env: { ...s.env, PATH: NO_UV_PATH, ...env }, cwd: s.root });
  if (r.code !== 0) return { code: r.code, stderr: r.stderr, meta: {} };
  const { path } = JSON.parse(r.stdout);
  return { code: 0, stderr: r.stderr, meta: JSON.parse(readFileSync(join(path, ".gpulayer", "meta.json"), "utf8")) };
}

/** What of the pinned uv is in a home's tools folder, temp folders included. */
/** What an install left in tools/: a uv, or a half-made folder (the record of a failure aside). */
const pinnedLeft = (home: string) => (existsSync(join(home, "tools")) ? readdirSync(join(home, "tools")).filter((f) => f.startsWith(`uv-${UV_VERSION}`) && !f.endsWith(".failed.json")) : []);

const sha256 = (file: string) => new Bun.CryptoHasher("sha256").update(readFileSync(file)).digest("hex");

test("the pinned version is the one this machine's uv reports, and the table is for Linux and macOS", async () => {
  if (UV) expect((await run([UV, "--version"])).stdout).toStartWith(`uv ${UV_VERSION} `);
  expect(Object.keys(UV_WHEEL_SHA256).every((f) => f.startsWith(`uv-${UV_VERSION}-py3-none-`))).toBe(true);
  expect(Object.values(UV_WHEEL_SHA256).every((h) => /^[0-9a-f]{64}$/.test(h))).toBe(true);
  // A wheel of another name is held to the entry it shares a platform tag with.
  expect(pinnedWheelFor(`uv-${UV_VERSION}-py3-none-manylinux_2_17_x86_64.whl`)?.name).toBe(`uv-${UV_VERSION}-py3-none-manylinux_2_17_x86_64.manylinux2014_x86_64.whl`);
  expect(pinnedWheelFor(`uv-${UV_VERSION}-py3-none-musllinux_1_1_aarch64.whl`)?.name).toBe(`uv-${UV_VERSION}-py3-none-manylinux_2_17_aarch64.manylinux2014_aarch64.musllinux_1_1_aarch64.whl`);
  expect(pinnedWheelFor(`uv-${UV_VERSION}-py3-none-win_amd64.whl`)).toBeNull();
});

test("findUv: off and a path that is no uv say why, and nothing is installed", async () => {
  const toolsDir = join(world, "tools-unit");
  const plan = (uv: string) => ({ uv, env: { PATH: NO_UV_PATH }, toolsDir, cwd: world, interpreter: {} as InterpreterInfo, inputs: {} as RequestInputs, isolated: false });
  expect(await findUv(plan("off"))).toEqual({ path: null, reason: "the uv setting is off (GPULAYER_UV=off)" });
  expect(await findUv(plan(join(world, "no-such-uv")))).toEqual({ path: null, reason: `the uv setting names ${join(world, "no-such-uv")}, which is not an executable file` });
  // auto with neither installer nor venv creator wanting uv: no download.
  expect(await findUv({ ...plan("auto"), installer: "pip", venvCreator: "venv" })).toEqual({ path: null, reason: "uv is not on PATH" });
  expect(existsSync(toolsDir)).toBe(false);
});

test("findUv: a pyenv shim for uv that the Python version pyenv picks lacks is no uv at all, not one that fails", async () => {
  // A pyenv root of its own: 3.12.0 has a uv, 3.11.0 has none; the shim is pyenv's own text.
  const root = join(world, "pyenv-root");
  for (const v of ["3.11.0", "3.12.0"]) mkdirSync(join(root, "versions", v, "bin"), { recursive: true });
  writeFileSync(join(root, "versions", "3.12.0", "bin", "uv"), "#!/bin/sh\n", { mode: 0o755 });
  mkdirSync(join(root, "shims"), { recursive: true });
  const shim = join(root, "shims", "uv");
  writeFileSync(shim, `#!/usr/bin/env bash\nset -e\nprogram="\${0##*/}"\nexport PYENV_ROOT="${root}"\nexec "${root}/libexec/pyenv" exec "$program" "$@"\n`, { mode: 0o755 });
  const toolsDir = join(world, "tools-shim");
  const plan = (PYENV_VERSION: string, uv = "auto") => ({ uv, env: { PATH: `${join(root, "shims")}:${NO_UV_PATH}`, PYENV_VERSION }, toolsDir, cwd: world, interpreter: {} as InterpreterInfo, inputs: {} as RequestInputs, isolated: false, installer: "pip" as const, venvCreator: "venv" as const });
  expect(await findUv(plan("3.12.0"))).toEqual({ path: join(root, "versions", "3.12.0", "bin", "uv"), reason: null });
  // As with none on PATH (this build would not download one).
  expect(await findUv(plan("3.11.0"))).toEqual({ path: null, reason: "uv is not on PATH" });
  expect(await findUv(plan("3.11.0", shim))).toEqual({ path: null, reason: `the uv setting names ${shim}, a pyenv shim, and the Python version pyenv picks here (PYENV_VERSION=3.11.0) has no uv` });
  // The same for --python: one line saying so, not the shim's own "command not found".
  const py = join(root, "shims", "python3.12");
  copyFileSync(shim, py);
  expect(() => resolveInterpreter(py, { PYENV_VERSION: "3.11.0" }, world)).toThrow(`--python: ${py} is a pyenv shim, and the Python version pyenv picks here (PYENV_VERSION=3.11.0) has no python3.12`);
});

// Skipped only without a real uv on this machine (it is named by path here, with none on PATH); .ci/run installs uv, so CI runs these.
describe.if(Boolean(UV))("the uv setting, with no uv on PATH", () => {
  test("GPULAYER_UV=/path/to/uv: the fast path with that uv, nothing downloaded", async () => {
    expect(Bun.which("uv", { PATH: NO_UV_PATH })).toBeNull();
    const { index } = indexWith("idx-own");
    const s = sandbox();
    try {
      const own = join(s.root, "bin", "my-uv");
      mkdirSync(join(s.root, "bin"));
      symlinkSync(UV!, own);
      const b = await prepare(s, ["-p", "tiny", "--index-url", index.url, "--python", wPip], { GPULAYER_UV: own });
      expect(b.stderr).not.toContain("error");
      expect(b.code).toBe(0);
      expect(b.meta.installerPath).toBe("uv (fast path)");
      expect(b.meta.installer).toBe(`uv ${UV_VERSION} (fast path)`);
      expect(b.meta.venvCreator).toBe("uv");
      expect(b.meta.installed).toEqual(["tiny==1.0"]);
      expect(index.asked("uv")).toBe(0);
      expect(pinnedLeft(s.home)).toEqual([]);
    } finally {
      index.stop();
      s.cleanup();
    }
  });

  test("GPULAYER_UV naming a uv that fails at everything: the venv is made by venv, the install by pip, and each line says why", async () => {
    const { index } = indexWith("idx-broken");
    const s = sandbox();
    try {
      const broken = join(s.root, "broken-uv");
      writeFileSync(broken, "#!/bin/sh\necho 'uv: cannot start' >&2\nexit 3\n", { mode: 0o755 });
      const b = await prepare(s, ["-p", "tiny", "--index-url", index.url, "--python", wPip], { GPULAYER_UV: broken });
      expect(b.code, b.stderr).toBe(0);
      expect(b.meta.venvCreator).toBe("venv");
      expect(b.meta.installerPath).toBe("pip");
      expect(b.meta.installed).toEqual(["tiny==1.0"]);
      expect(b.stderr).toContain(`creating virtual environment with venv (${broken} venv exited 3: uv: cannot start)`);
    } finally {
      index.stop();
      s.cleanup();
    }
  });

  test("GPULAYER_UV=off: the pip path, and the progress line says why", async () => {
    const { index } = indexWith("idx-off");
    const s = sandbox();
    try {
      const b = await prepare(s, ["-p", "tiny", "--index-url", index.url, "--python", wPip], { GPULAYER_UV: "off" });
      expect(b.code).toBe(0);
      expect(b.meta.installerPath).toBe("pip");
      expect(b.meta.venvCreator).toBe("venv");
      expect(b.meta.installerFallback).toBe("the uv setting is off (GPULAYER_UV=off)");
      expect(b.stderr).toContain("(not uv: the uv setting is off (GPULAYER_UV=off))");
      expect(index.asked("uv")).toBe(0);
    } finally {
      index.stop();
      s.cleanup();
    }
  });

  test("auto, the index serves a uv wheel that is not the official one: pip builds, the message names the mismatch, nothing is installed", async () => {
    const { index, wheel } = indexWith("idx-fake", (dir) => makeUvWheel(dir, { uvBinary: UV!, version: UV_VERSION, platformTag: platformTag() }));
    const got = sha256(wheel!);
    const official = pinnedWheelFor(basename(wheel!))!;
    expect(got).not.toBe(official.sha256);
    const s = sandbox();
    try {
      // The index as the machine's pip configuration names it (not --index-url): pip download reads it too. The bundled pip asks.
      const b = await prepare(s, ["-p", "tiny", "--python", wPlain], { PIP_INDEX_URL: index.url });
      expect(b.code).toBe(0);
      expect(index.asked("uv")).toBe(1);
      expect(b.meta.installerPath).toBe("pip");
      expect(b.meta.venvCreator).toBe("venv");
      expect(b.meta.installed).toEqual(["tiny==1.0"]);
      const reason: string = b.meta.installerFallback;
      expect(reason).toStartWith("uv is not on PATH and installing the pinned uv failed: hash mismatch: ");
      for (const part of [basename(wheel!), got, official.sha256, "GPULAYER_UV=/path/to/uv", "GPULAYER_UV=off"]) expect(reason).toContain(part);
      expect(b.stderr).toContain(`(not uv: ${reason})`);
      expect(pinnedLeft(s.home)).toEqual([]);
      expect(existsSync(pinnedUvPath(join(s.home, "tools")))).toBe(false);
      // The failure is remembered: the next cold build does not ask the index again for an hour.
      const again = await prepare(s, ["-p", "other", "--python", wPlain], { PIP_INDEX_URL: index.url });
      expect(again.code).toBe(0);
      expect(index.asked("uv")).toBe(1);
      expect(again.meta.installerFallback).toMatch(/hash mismatch: .* \(\d+ min ago; tried again an hour after, or remove .*uv-[\d.]+\.failed\.json\)$/);
    } finally {
      index.stop();
      s.cleanup();
    }
  });

  test("auto, neither the index the request's file names nor the machine's has uv: pip builds and says where pip looked", async () => {
    const { index } = indexWith("idx-none");
    const { index: machine } = indexWith("idx-none-machine");
    const s = sandbox();
    try {
      // The index as the request's own file names it: pip download asks it first, then the machine's pip configuration's.
      writeFileSync(join(s.root, "requirements.txt"), `--index-url ${index.url}\ntiny\n`);
      const b = await prepare(s, ["requirements.txt", "--python", wPip], { PIP_INDEX_URL: machine.url });
      expect(b.code).toBe(0);
      expect(b.meta.installerPath).toBe("pip");
      const reason: string = b.meta.installerFallback;
      expect(reason).toStartWith(`uv is not on PATH and installing the pinned uv failed: pip download uv==${UV_VERSION}: from the request's index: `);
      expect(reason).toContain("; from the machine's pip configuration: ");
      expect(reason).toContain(`uv==${UV_VERSION}`);
      expect(index.asked("uv")).toBeGreaterThanOrEqual(1);
      expect(machine.asked("uv")).toBeGreaterThanOrEqual(1);
      // The build itself kept to the request's index: the machine's was asked for uv alone.
      expect(machine.asked("tiny")).toBe(0);
      expect(pinnedLeft(s.home)).toEqual([]);
    } finally {
      index.stop();
      machine.stop();
      s.cleanup();
    }
  });

  // Skipped only without a copy of the official wheel (see the test below); CI always has one.
  test.skipIf(!OFFICIAL)("auto, a private --index-url without uv: the pinned uv comes from the machine's pip configuration, the build from the request's index", async () => {
    const { index } = indexWith("idx-private");
    const { index: machine } = indexWith("idx-machine-official", (dir) => {
      const to = join(dir, basename(OFFICIAL!));
      copyFileSync(OFFICIAL!, to);
      return to;
    });
    const s = sandbox();
    try {
      const b = await prepare(s, ["-p", "tiny", "--index-url", index.url, "--python", wPip], { PIP_INDEX_URL: machine.url });
      expect(b.code).toBe(0);
      expect(b.meta.installerPath).toBe("uv (fast path)");
      expect(b.meta.installer).toBe(`uv ${UV_VERSION} (fast path)`);
      expect(b.meta.installerFallback).toBeNull();
      expect(index.asked("uv")).toBeGreaterThanOrEqual(1);
      expect(machine.asked("uv")).toBeGreaterThanOrEqual(1);
      expect(machine.asked("tiny")).toBe(0);
      expect(index.asked("tiny")).toBeGreaterThanOrEqual(1);
      expect(pinnedLeft(s.home)).toEqual([`uv-${UV_VERSION}`]);
    } finally {
      index.stop();
      machine.stop();
      s.cleanup();
    }
  });

  // Skipped only without a copy of the official wheel: the tests never reach PyPI, and no wheel built here can carry
  // a pinned hash. CI (.ci/run) downloads it first and sets GPULAYER_TEST_UV_WHEEL, so there it always runs.
  test.skipIf(!OFFICIAL)(
    `auto installs the official uv wheel once, two builds at once, and later builds use it without asking pip${OFFICIAL ? "" : ` (skipped: set GPULAYER_TEST_UV_WHEEL to a copy of the official uv ${UV_VERSION} wheel for this platform, e.g. from \`pip download uv==${UV_VERSION} --only-binary :all: --no-deps\`)`}`,
    async () => {
      const { index, wheel } = indexWith("idx-official", (dir) => {
        const to = join(dir, basename(OFFICIAL!));
        copyFileSync(OFFICIAL!, to);
        return to;
      });
      expect(UV_WHEEL_SHA256[basename(wheel!)]).toBe(sha256(wheel!));
      const s = sandbox();
      try {
        const idx = ["--index-url", index.url];
        const [a, b] = await Promise.all([prepare(s, ["-p", "tiny", ...idx, "--python", wPip], {}), prepare(s, ["-p", "other", ...idx, "--python", wPlain], {})]);
        for (const x of [a, b]) {
          expect(x.code).toBe(0);
          expect(x.meta.installerPath).toBe("uv (fast path)");
          expect(x.meta.installer).toBe(`uv ${UV_VERSION} (fast path)`);
          expect(x.meta.venvCreator).toBe("uv");
          expect(x.meta.installerFallback).toBeNull();
        }
        const pinned = pinnedUvPath(join(s.home, "tools"));
        expect(pinnedLeft(s.home)).toEqual([`uv-${UV_VERSION}`]);
        expect(readdirSync(join(s.home, "tools", `uv-${UV_VERSION}`))).toEqual(["uv"]);
        expect(statSync(pinned).mode & 0o777).toBe(0o755);
        expect((await run([pinned, "--version"])).stdout).toStartWith(`uv ${UV_VERSION} `);
        const asked = index.asked("uv");
        expect(asked).toBeGreaterThanOrEqual(1);
        expect(asked).toBeLessThanOrEqual(2);
        // A later cold build: the pinned uv is there, pip is not asked for it again.
        const c = await prepare(s, ["-p", "tiny", "-p", "other", ...idx, "--python", wPip], {});
        expect(c.code).toBe(0);
        expect(c.meta.installerPath).toBe("uv (fast path)");
        expect(index.asked("uv")).toBe(asked);
      } finally {
        index.stop();
        s.cleanup();
      }
    },
  );
});
