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
      expect(unknown.stderr).toContain("pyhton: unknown key");
    } finally {
      box.cleanup();
    }
  });
});
