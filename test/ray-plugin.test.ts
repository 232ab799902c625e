/**
 * The Ray runtime_env plugin (integrations/ray) with a real Ray: a head (`ray start --head`, dashboard on, for
 * `ray job submit`) and a second node on the same machine (its own GPULAYER_HOME, told apart by a custom
 * resource), both on 127.0.0.1 with the plugin registered (RAY_RUNTIME_ENV_PLUGINS); drivers whose tasks and
 * actors ask for `runtime_env={"gpulayer": {...}}` from the test's own index.
 *
 * Ray comes from a venv .ci/run makes once and caches (GPULAYER_TEST_RAY_PYTHON); the nodes run a Python of the
 * test's own over it (fixtures/ray-cluster.ts) that also holds a torch stand-in. A machine without the venv skips
 * this file, CI requires it (GPULAYER_TEST_REQUIRE_RAY=1). One Ray cluster for the whole file, one CPU a node: Ray is heavy.
 */
import { afterAll, beforeAll, describe, expect, test } from "bun:test";
import { existsSync, readFileSync, writeFileSync } from "node:fs";
import { homedir } from "node:os";
import { join } from "node:path";
import { makeDist, PackageIndex } from "./fixtures/index.ts";
import { freePort, makeNodePython, type RayNode, startRayNode, stopRayNode } from "./fixtures/ray-cluster.ts";
import { CLI_ARGV, cli, readyKeys, ROOT, run, sandbox, tempDir } from "./helpers.ts";

const RAY_PYTHON = process.env.GPULAYER_TEST_RAY_PYTHON ?? join(process.env.XDG_CACHE_HOME ?? join(homedir(), ".cache"), "gpulayer-ci", "ray-default-venv", "bin", "python");
const HAS_RAY = existsSync(RAY_PYTHON);
const REQUIRED = process.env.GPULAYER_TEST_REQUIRE_RAY === "1";
const DRIVER = join(ROOT, "test", "fixtures", "ray_driver.py");

if (!HAS_RAY && REQUIRED) {
  test("Ray is required (GPULAYER_TEST_REQUIRE_RAY) and installed", () => {
    throw new Error(`no Ray venv at ${RAY_PYTHON}: .ci/run makes it (GPULAYER_TEST_RAY_PYTHON)`);
  });
}

const sh = (s: string) => `'${s.replace(/'/g, `'\\''`)}'`;

// Skipped only without a Ray venv (GPULAYER_TEST_RAY_PYTHON); CI makes one and sets GPULAYER_TEST_REQUIRE_RAY, under which a missing Ray fails instead.
(HAS_RAY ? describe : describe.skip)("Ray runtime_env plugin", () => {
  let box: ReturnType<typeof sandbox>;
  let index: PackageIndex;
  let env: Record<string, string>;
  let node: Awaited<ReturnType<typeof makeNodePython>>;
  const nodes: RayNode[] = [];
  let address = "";
  let dashboard = "";
  let secondHome = "";
  let first: {
    task: [string, string];
    actor: [string, string];
    six: [string, string][];
    bad: string | null;
    second: [string, string];
    second_node: string[];
    torch: [string, string, string];
  };

  const driver = async (mode: "first" | "again" | "held") => {
    const r = await run([node.python, DRIVER, address, mode, index.url], { env });
    if (r.code !== 0) throw new Error(`driver ${mode} exited ${r.code}: ${r.stderr.slice(-3000)}`);
    return JSON.parse(r.stdout.trim().split("\n").at(-1)!);
  };
  /** What `gpulayer env prepare --json` says for a request on the head's Python. */
  const prepare = async (specs: string[]) => {
    const r = await cli(["env", "prepare", "--json", "--local", ...specs.flatMap((s) => ["-p", s]), "--index-url", index.url, "--python", node.python], { env });
    return { code: r.code, report: JSON.parse(r.stdout) };
  };

  beforeAll(async () => {
    box = sandbox();
    index = new PackageIndex(join(box.root, "index")).start();
    index.wheel({ name: "raytest-one", version: "1.0" });
    index.wheel({ name: "raytest-six", version: "6.0" });
    index.wheel({ name: "raytest-held", version: "3.0" });
    index.wheel({ name: "torch", version: "9.0" }); // newer than the node's: installed only if the node's were not used
    index.sdist({ name: "raytest-extra", version: "1.0", counter: join(box.root, "extra-builds"), sleep: 1 }); // each build of it counts itself
    node = await makeNodePython(join(box.root, "node-python"), RAY_PYTHON, [makeDist("wheel", tempDir("gpl-ray-torch-"), { name: "torch", version: "2.4.0" })], box.env);
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
    dashboard = `http://127.0.0.1:${freePort()}`;
    const common = ["--node-ip-address=127.0.0.1", "--num-cpus=1", "--num-gpus=0", `--temp-dir=${join(box.root, "ray")}`];
    nodes.push(
      await startRayNode(node.ray, ["--head", `--port=${gcs}`, ...common, `--resources=${JSON.stringify({ head: 100 })}`, "--include-dashboard=true", "--dashboard-host=127.0.0.1", `--dashboard-port=${dashboard.split(":").at(-1)}`, `--dashboard-agent-listen-port=${freePort()}`], env),
    );
    // The second node, as another machine would be: its own gpulayer home.
    secondHome = join(box.root, "second-home");
    nodes.push(await startRayNode(node.ray, [`--address=${address}`, ...common, `--resources=${JSON.stringify({ second: 1 })}`, `--dashboard-agent-listen-port=${freePort()}`], { ...env, GPULAYER_HOME: secondHome }));
    first = await driver("first");
  }, 300_000);

  afterAll(async () => {
    for (const n of nodes.reverse()) await stopRayNode(n);
    index?.stop();
  }, 60_000);

  test("a task runs in the env `gpulayer env prepare` reports for the same request, with the node's Python linked", async () => {
    const { code, report } = await prepare(["raytest-one"]);
    expect(code).toBe(0);
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

  test("a bad requirement fails the task with gpulayer's own line, as Ray's runtime_env setup error", async () => {
    const { code, report } = await prepare(["raytest-missing==1"]);
    expect(code).not.toBe(0);
    expect(report.error.message).toContain("raytest-missing");
    expect(first.bad).toContain("RuntimeEnvSetupError");
    expect(first.bad).toContain(`gpulayer: ${report.error.message}`);
  });

  test("a task pinned to a second node runs in the env that node's gpulayer prepared", () => {
    const [prefix, nodeId] = first.second;
    expect(first.second_node).toEqual([nodeId]);
    expect(readyKeys(secondHome).map((k) => join(secondHome, "envs-v1", k))).toContain(prefix);
    expect(prefix).not.toBe(first.task[0]);
  });

  test("`ray job submit` with the gpulayer runtime_env: the entrypoint's python is the env's", async () => {
    const runtimeEnv = JSON.stringify({ gpulayer: { pip: ["raytest-one"], index_url: index.url } });
    const submitted = await run(
      [node.ray, "job", "submit", `--address=${dashboard}`, `--runtime-env-json=${runtimeEnv}`, "--", "python", "-c", "import sys, raytest_one; print('PREFIX=' + sys.prefix)"],
      { env },
    );
    expect(submitted.code).toBe(0);
    const { report } = await prepare(["raytest-one"]);
    expect(`${submitted.stdout}${submitted.stderr}`).toContain(`PREFIX=${report.path}\n`);
  }, 120_000);

  test("torch asked for is the node's: imported from the node's site-packages, not installed into the env", () => {
    const [prefix, torchFile, version] = first.torch;
    expect(version).toBe("2.4.0");
    expect(torchFile.startsWith(`${node.sitePackages}/`)).toBe(true);
    expect(readyKeys(box.home).map((k) => join(box.home, "envs-v1", k))).toContain(prefix);
    expect(existsSync(join(prefix, "lib", node.sitePackages.split("/").at(-2)!, "site-packages", "torch"))).toBe(false);
  });

  test("a second Ray job reuses the env: nothing fetched or built again", async () => {
    const envs = readyKeys(box.home).length;
    const fetched = index.requests.length;
    const again = await driver("again");
    expect(again.task).toEqual(first.task);
    expect(readyKeys(box.home).length).toBe(envs);
    expect(index.requests.length).toBe(fetched);
  }, 120_000);

  // Last: its gc empties the head's cache of everything no worker uses.
  test("gc keeps an env while a Ray worker runs in it (the worker's lease), and removes it once the worker has ended", async () => {
    const held = await driver("held");
    expect(held.there).toBe(true);
    expect(held.use).toBe("3.0");
    const key = held.prefix.split("/").at(-1);
    const skipped = held.during.skipped.find((s: { id?: string }) => s.id === key);
    expect(JSON.stringify(skipped?.reasons)).toContain("ray worker");
    expect(held.during.removed.some((r: { id?: string }) => r.id === key)).toBe(false);
    expect(held.gone).toBe(true);
    expect(held.after.removed.some((r: { id?: string }) => r.id === key)).toBe(true);
  }, 180_000);
});
