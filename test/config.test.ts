import { afterAll, beforeAll, describe, expect, setDefaultTimeout, test } from "bun:test";
import { writeFileSync } from "node:fs";
import { join } from "node:path";
import { PackageIndex } from "./fixtures/index.ts";
import { cli, HAS_UV, sandbox } from "./helpers.ts";

setDefaultTimeout(120_000);

/** config.yaml: flag > GPULAYER_* variable > config file > default, validated with key paths. */
const world = sandbox();
const index = new PackageIndex(join(world.root, "index"));
beforeAll(() => {
  index.start();
  index.wheel({ name: "cfgpkg", version: "1.0" });
});
afterAll(() => {
  index.stop();
  world.cleanup();
});

describe("config.yaml", () => {
  test("a setting in the file applies; the variable wins over it", async () => {
    const box = sandbox();
    try {
      writeFileSync(join(box.home, "config.yaml"), "installer: pip\nvenv_creator: venv\n");
      const fromFile = await cli(["env", "prepare", "-p", "cfgpkg", "--index-url", index.url, "--json"], { env: box.env });
      expect(fromFile.code, fromFile.stderr).toBe(0);
      expect(JSON.parse(fromFile.stdout).installer_path).toBe("pip");
      if (HAS_UV) {
        const overridden = await cli(["env", "prepare", "-p", "cfgpkg", "-p", "pip", "--index-url", index.url, "--json"], { env: { ...box.env, GPULAYER_INSTALLER: "auto", GPULAYER_VENV_CREATOR: "uv" } });
        expect(overridden.code, overridden.stderr).toBe(0);
        expect(JSON.parse(overridden.stdout).installer_path).not.toBe("pip");
      }
    } finally {
      box.cleanup();
    }
  });

  test("an unknown key or a bad value is one line naming the key path, exit 2", async () => {
    const box = sandbox();
    try {
      writeFileSync(join(box.home, "config.yaml"), "container:\n  engine: lxc\n");
      const bad = await cli(["env", "list"], { env: box.env });
      expect(bad.code).toBe(2);
      expect(bad.stderr).toContain("container.engine");
      expect(bad.stderr.trim().split("\n")).toHaveLength(1);
      writeFileSync(join(box.home, "config.yaml"), "pyhton: /usr/bin/python3\n");
      const unknown = await cli(["env", "list"], { env: box.env });
      expect(unknown.code).toBe(2);
      expect(unknown.stderr).toContain("pyhton: unknown key (did you mean python?)");
      // A misspelt key is answered as a misspelt flag is: with the name it was probably meant to be.
      writeFileSync(join(box.home, "config.yaml"), "prepare_timout: 10m\n");
      const typo = await cli(["env", "list"], { env: box.env });
      expect([typo.code, typo.stderr]).toEqual([2, `error: ${join(box.home, "config.yaml")}: prepare_timout: unknown key (did you mean prepare_timeout?)\n`]);
      // Nothing near: no guess.
      writeFileSync(join(box.home, "config.yaml"), "colour_scheme: dark\n");
      expect((await cli(["env", "list"], { env: box.env })).stderr).toEndWith("colour_scheme: unknown key\n");
    } finally {
      box.cleanup();
    }
  });
});

describe("the Python, wherever it was named", () => {
  test("a Python that is not there is named by where it came from: the flag, the variable, the config file, join's save, a job file", async () => {
    const box = sandbox();
    try {
      const missing = join(box.root, "no-such-python");
      const prepare = ["env", "prepare", "-p", "cfgpkg", "--index-url", index.url, "--dry-run"];
      const last = (r: { stderr: string }) => r.stderr.trimEnd().split("\n").at(-1);
      expect(last(await cli([...prepare, "--python", missing], { env: box.env }))).toBe(`error: --python: not found: ${missing}`);
      expect(last(await cli(prepare, { env: { ...box.env, GPULAYER_PYTHON: missing } }))).toBe(`error: GPULAYER_PYTHON: not found: ${missing}`);
      writeFileSync(join(box.home, "config.yaml"), `python: ${missing}\n`);
      expect(last(await cli(prepare, { env: box.env }))).toBe(`error: python (in ${join(box.home, "config.yaml")}): not found: ${missing}`);
      writeFileSync(join(box.home, "config.yaml"), "");
      writeFileSync(join(box.home, "worker.json"), JSON.stringify({ python: missing }));
      const saved = `the Python \`join --python\` saved (in ${join(box.home, "worker.json")})`;
      expect(last(await cli(prepare, { env: box.env }))).toBe(`error: ${saved}: not found: ${missing}`);
      const job = await cli(["job", "run", "-p", "cfgpkg", "--index-url", index.url, "--", "true"], { env: box.env, cwd: box.root });
      expect(job.code).toBe(2);
      expect(last(job)).toBe(`error: task.prepare failed: ${saved}: not found: ${missing}`);
      writeFileSync(join(box.root, "job.yaml"), `command: "true"\nenvironment:\n  python: ${missing}\n`);
      expect(last(await cli(["job", "run", "--dry-run", "-f", "job.yaml"], { env: box.env, cwd: box.root }))).toBe(`error: job.yaml: environment.python: not found: ${missing}`);
    } finally {
      box.cleanup();
    }
  });

  test("gpulayer config shows the Python join --python saved as the effective one, unless a setting names another", async () => {
    const box = sandbox();
    try {
      writeFileSync(join(box.home, "worker.json"), JSON.stringify({ python: "/usr/bin/python3" }));
      const row = async (env: Record<string, string>) => (JSON.parse((await cli(["config", "--json"], { env })).stdout).settings as any[]).find((r) => r.name === "python");
      expect(await row(box.env)).toMatchObject({ value: "/usr/bin/python3", source: "worker", origin: join(box.home, "worker.json") });
      expect(await row({ ...box.env, GPULAYER_PYTHON: "python3.11" })).toMatchObject({ value: "python3.11", source: "env", origin: "GPULAYER_PYTHON" });
      expect((await cli(["config"], { env: box.env })).stdout).toMatch(/^python\s+\/usr\/bin\/python3\s+join --python \(worker\.json\)$/m);
    } finally {
      box.cleanup();
    }
  });
});
