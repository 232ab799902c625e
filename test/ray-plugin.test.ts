/**
 * The Ray runtime_env plugin (integrations/ray) with a real Ray: `ray start --head` on
 * 127.0.0.1 with the plugin registered (RAY_RUNTIME_ENV_PLUGINS), drivers whose tasks
 * and actors ask for `runtime_env={"gpulayer": {...}}` from the test's own index.
 *
 * Ray comes from a venv .ci/run makes once and caches (GPULAYER_TEST_RAY_PYTHON); a
 * machine without it skips this file, CI requires it (GPULAYER_TEST_REQUIRE_RAY=1).
 * One Ray cluster for the whole file, one CPU: Ray is heavy.
 */
import { afterAll, beforeAll, describe, expect, test } from "bun:test";
import { existsSync, readFileSync, writeFileSync } from "node:fs";
import { homedir } from "node:os";
import { join } from "node:path";
import { PackageIndex } from "./fixtures/index.ts";
import { CLI_ARGV, cli, readyKeys, ROOT, run, sandbox, tempDir } from "./helpers.ts";

const RAY_PYTHON = process.env.GPULAYER_TEST_RAY_PYTHON ?? join(process.env.XDG_CACHE_HOME ?? join(homedir(), ".cache"), "gpulayer-ci", "ray-venv", "bin", "python");
const HAS_RAY = existsSync(RAY_PYTHON);
const REQUIRED = process.env.GPULAYER_TEST_REQUIRE_RAY === "1";
const DRIVER = join(ROOT, "test", "fixtures", "ray_driver.py");

if (!HAS_RAY && REQUIRED) {
  test("Ray is required (GPULAYER_TEST_REQUIRE_RAY) and installed", () => {
    throw new Error(`no Ray venv at ${RAY_PYTHON}: .ci/run makes it (GPULAYER_TEST_RAY_PYTHON)`);
  });
}

function freePort(): number {
  const socket = Bun.listen({ hostname: "127.0.0.1", port: 0, socket: { data() {} } });
  const port = socket.port;
  socket.stop(true);
  return port;
}

const sh = (s: string) => `'${s.replace(/'/g, `'\\''`)}'`;

// Skipped only without a Ray venv (GPULAYER_TEST_RAY_PYTHON); CI makes one and sets GPULAYER_TEST_REQUIRE_RAY, under which a missing Ray fails instead.
(HAS_RAY ? describe : describe.skip)("Ray runtime_env plugin", () => {
  let box: ReturnType<typeof sandbox>;
  let index: PackageIndex;
  let env: Record<string, string>;
  let head: { pid: number; exited: Promise<number> } | undefined;
  let address = "";
  let first: { task: [string, string]; actor: [string, string]; six: [string, string][]; bad: string | null };

  const driver = async (mode: "first" | "again") => {
    const r = await run([RAY_PYTHON, DRIVER, address, mode, index.url], { env });
    if (r.code !== 0) throw new Error(`driver ${mode} exited ${r.code}: ${r.stderr.slice(-3000)}`);
    return JSON.parse(r.stdout.trim().split("\n").at(-1)!);
  };

  beforeAll(async () => {
    box = sandbox();
    index = new PackageIndex(join(box.root, "index")).start();
    index.wheel({ name: "raytest-one", version: "1.0" });
    index.wheel({ name: "raytest-six", version: "6.0" });
    index.sdist({ name: "raytest-extra", version: "1.0", counter: join(box.root, "extra-builds"), sleep: 1 }); // each build of it counts itself
    // The plugin as pip installs it from its folder (offline: its own in-tree backend), on the node's PYTHONPATH.
    const plugin = tempDir("gpl-ray-plugin-");
    const pip = await run([RAY_PYTHON, "-m", "pip", "install", "-q", "--no-deps", "--no-index", "--disable-pip-version-check", "--target", plugin, join(ROOT, "integrations", "ray")], { env: box.env });
    if (pip.code !== 0) throw new Error(`pip install integrations/ray: ${pip.stderr}`);
    // The node's gpulayer: this checkout's CLI behind one executable path (GPULAYER_BIN).
    const bin = join(box.root, "gpulayer");
    writeFileSync(bin, `#!/bin/sh\nexec ${CLI_ARGV.map(sh).join(" ")} "$@"\n`, { mode: 0o755 });
    env = {
      ...box.env,
      PYTHONPATH: plugin,
      GPULAYER_BIN: bin,
      RAY_RUNTIME_ENV_PLUGINS: JSON.stringify([{ class: "gpulayer_ray.GpulayerPlugin" }]),
      RAY_USAGE_STATS_ENABLED: "0",
    };
    const gcs = freePort();
    address = `127.0.0.1:${gcs}`;
    // --block: the cluster lives as long as this process; its group is ended in afterAll.
    const proc = Bun.spawn(
      [join(RAY_PYTHON, "..", "ray"), "start", "--head", "--block", "--node-ip-address=127.0.0.1", `--port=${gcs}`, "--num-cpus=1", "--num-gpus=0", "--include-dashboard=false",
        `--dashboard-agent-listen-port=${freePort()}`, `--temp-dir=${join(box.root, "ray")}`, "--disable-usage-stats"],
      { env, stdout: "pipe", stderr: "pipe", detached: true },
    );
    head = proc;
    let said = "";
    const reader = proc.stdout.getReader();
    while (!said.includes("Ray runtime started")) {
      const { value, done } = await reader.read();
      if (done) throw new Error(`ray start --head ended: ${said}${await new Response(proc.stderr).text()}`);
      said += new TextDecoder().decode(value);
    }
    void (async () => {
      while (!(await reader.read()).done); // keep draining: a full pipe would stall Ray's head
    })();
    void new Response(proc.stderr).text();
    first = await driver("first");
  }, 240_000);

  afterAll(async () => {
    if (head) {
      // Ray's processes share the head's process group; SIGTERM lets them tidy up, then SIGKILL ends any that linger (gcs_server does).
      const group = (signal: NodeJS.Signals) => {
        try {
          process.kill(-head!.pid, signal);
        } catch {}
      };
      group("SIGTERM");
      await Promise.race([head.exited, Bun.sleep(5_000)]);
      group("SIGKILL");
    }
    index?.stop();
  }, 60_000);

  test("a task runs in the env `gpulayer env prepare` reports for the same request, with the node's Python linked", async () => {
    const prepared = await cli(["env", "prepare", "--json", "--local", "-p", "raytest-one", "--index-url", index.url, "--python", RAY_PYTHON], { env });
    expect(prepared.code).toBe(0);
    const report = JSON.parse(prepared.stdout);
    expect(report.status).toBe("reused");
    expect(first.task).toEqual([report.path, "1.0"]);
  });

  test("an actor with its own runtime_env runs in its own gpulayer env", () => {
    expect(first.actor[1]).toBe("6.0");
    expect(first.actor[0]).not.toBe(first.task[0]);
    expect(readyKeys(box.home).map((k) => join(box.home, "envs-v1", k))).toContain(first.actor[0]);
  });

  test("six actors asking at once for a new env make one build", () => {
    const prefixes = new Set(first.six.map(([p]) => p));
    expect(prefixes.size).toBe(1);
    expect(readFileSync(join(box.root, "extra-builds"), "utf8").trim().split("\n").length).toBe(1);
  });

  test("a bad requirement fails the task with gpulayer's line, as Ray's runtime_env setup error", () => {
    expect(first.bad).toContain("RuntimeEnvSetupError");
    expect(first.bad).toMatch(/gpulayer: .*raytest-missing/);
  });

  test("a second Ray job reuses the env: nothing fetched or built again", async () => {
    const envs = readyKeys(box.home).length;
    const fetched = index.requests.length;
    const again = await driver("again");
    expect(again.task).toEqual(first.task);
    expect(readyKeys(box.home).length).toBe(envs);
    expect(index.requests.length).toBe(fetched);
  }, 120_000);
});
