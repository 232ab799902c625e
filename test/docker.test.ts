import { afterAll, beforeAll, describe, expect, setDefaultTimeout, test } from "bun:test";
import { existsSync, mkdirSync, readdirSync, readFileSync, writeFileSync } from "node:fs";
import { join } from "node:path";
import { homeLayout } from "../src/config/paths.ts";
import { type Engine, ensureImage, gpuArgs, listImageRecords, runContainer } from "../src/docker/index.ts";
import { containerExists } from "../src/docker/run.ts";
import { PullParser } from "../src/docker/pull.ts";
import { shellSplit } from "../src/docker/shellwords.ts";
import { type EngineName, plainHttpRegistry, pushBusybox, engineMatrix, engineTest, useRegistry, ENGINES } from "./fixtures/registry.ts";
import { cli, sandbox, tempDir } from "./helpers.ts";

// Real processes and real builds take seconds; a file that sets none gets 5 s, whatever another file set.
setDefaultTimeout(120_000);

/**
 * Images with real engines and a real registry on 127.0.0.1. Every case runs
 * against Docker and against Podman; an engine that does not answer is
 * skipped with its reason, or fails when GPULAYER_TEST_REQUIRE_ENGINES names it.
 */
const matrix = await engineMatrix("docker.test");
const { status, working } = matrix;

const registryOf = useRegistry(working);

/** Push with whichever engine works (docker first); the image is then absent from the engine under test. */
const push = (repo: string, engine: EngineName, tag = "1") => pushBusybox(registryOf(), repo, tag, working[0]!, [...new Set([working[0]!, engine])]);

function sandboxFor(engine: EngineName) {
  const box = sandbox();
  box.env.GPULAYER_CONTAINER_ENGINE = engine;
  return box;
}

const prepare = async (env: Record<string, string>, ...args: string[]) => {
  const r = await cli(["env", "prepare", "--json", ...args], { env });
  return { ...r, json: r.code === 0 ? (JSON.parse(r.stdout) as Record<string, unknown>) : null };
};

const T = 60_000;

describe.each(ENGINES)("%s", (name) => {
  const it = engineTest(matrix, name);
  if (!it) return;
  let manifestsPerPull = 0;

  it("the first prepare pulls (the registry sees it), the second reuses without asking the registry", async () => {
    const ref = await push(`first-${name}`, name);
    const box = sandboxFor(name);
    try {
      // Without --json: progress on stderr, the digest on stdout.
      const human = await cli(["env", "prepare", "--image", ref], { env: box.env });
      expect(human.code, human.stderr).toBe(0);
      expect(human.stderr).toContain(`pulling ${ref} with ${name}`);
      expect(human.stderr).toMatch(/1\/1 layers/);
      expect(human.stderr).toMatch(new RegExp(`image ${ref.replace(/[.:/]/g, "\\$&")} \\(${name}, .*\\) pulled in`));
      const digest = human.stdout.trim();
      expect(digest).toMatch(/^sha256:[0-9a-f]{64}$/);
      manifestsPerPull = registryOf().manifestRequests(`first-${name}`, "1");
      expect(manifestsPerPull).toBeGreaterThan(0);
      const records = listImageRecords(homeLayout(box.home));
      expect(records).toHaveLength(1);
      expect(records[0]).toMatchObject({ engine: name, ref, digest, pulledByGpulayer: true });
      expect(records[0]!.sizeBytes).toBeGreaterThan(100_000);

      const second = await prepare(box.env, "--image", ref);
      expect(second.code, second.stderr).toBe(0);
      expect(second.json).toMatchObject({ image: ref, status: "reused", digest, engine: name });
      expect(second.json!.seconds).toBeLessThan(5);
      expect(second.stderr).not.toContain("pulling");
      expect(registryOf().manifestRequests(`first-${name}`, "1")).toBe(manifestsPerPull);

      // --pull always goes to the registry again.
      const again = await prepare(box.env, "--image", ref, "--pull", "always");
      expect(again.code, again.stderr).toBe(0);
      expect(again.json).toMatchObject({ status: "pulled", digest, pulled_by_gpulayer: true });
      expect(registryOf().manifestRequests(`first-${name}`, "1")).toBeGreaterThan(manifestsPerPull);
    } finally {
      box.cleanup();
    }
  }, T);

  it("an image the registry does not have, or a registry that does not answer: one line with the engine's message, nothing recorded", async () => {
    const box = sandboxFor(name);
    try {
      const missing = await prepare(box.env, "--image", `${registryOf().host}/no-such-image:1`);
      expect(missing.code).toBe(1);
      // --json: the failure is the error document on stdout, its message the line on stderr.
      const failure = JSON.parse(missing.stdout);
      expect(failure.error.exit_code).toBe(1);
      const line = missing.stderr.trim().split("\n").at(-1)!;
      expect(line).toStartWith(`error: cannot pull ${registryOf().host}/no-such-image:1 with ${name}: `);
      expect(line).toMatch(/manifest unknown|not found/);
      expect(line).toBe(`error: ${failure.error.message}`);

      plainHttpRegistry("127.0.0.1:1");
      const dead = await prepare(box.env, "--image", "127.0.0.1:1/nothing:1");
      expect(dead.code).toBe(1);
      expect(dead.stderr.trim().split("\n").at(-1)).toMatch(/^error: cannot pull 127\.0\.0\.1:1\/nothing:1 with \w+: .*(connection refused|connect)/);
      expect(listImageRecords(homeLayout(box.home))).toEqual([]);
    } finally {
      box.cleanup();
    }
  }, T);

  it("two prepares of a new image at once pull it once", async () => {
    const ref = await push(`twice-${name}`, name);
    const box = sandboxFor(name);
    try {
      const both = await Promise.all([prepare(box.env, "--image", ref), prepare(box.env, "--image", ref)]);
      for (const r of both) expect(r.code, r.stderr).toBe(0);
      expect(both.map((r) => r.json!.status).sort()).toEqual(["pulled", "reused"]);
      expect(both[0]!.json!.digest).toBe(both[1]!.json!.digest!);
      // As many manifest requests as one pull makes (measured by the first case).
      expect(manifestsPerPull).toBeGreaterThan(0);
      expect(registryOf().manifestRequests(`twice-${name}`, "1")).toBe(manifestsPerPull);
      expect(listImageRecords(homeLayout(box.home))).toHaveLength(1);
    } finally {
      box.cleanup();
    }
  }, T);

  describe("containers", () => {
    let engine: Engine;
    let imageId: string;
    const box = sandboxFor(name);
    beforeAll(async () => {
      if (!status[name].ok) return;
      const ref = await push(`run-${name}`, name);
      const r = await ensureImage(homeLayout(box.home), ref, { host: { env: box.env, forced: name, forcedBy: "the test" } });
      engine = r.engine;
      imageId = r.imageId;
      expect(engine.name).toBe(name);
    }, T);
    afterAll(() => box.cleanup());

    it("sees its workdir and env, passes the exit code through, and is removed afterwards", async () => {
      const workdir = tempDir("gpl-work-");
      writeFileSync(join(workdir, "hello.txt"), "hello from the host\n");
      const containerName = `gpl-test-${name}-${process.pid}-1`;
      let stdout = "";
      let stderr = "";
      const c = await runContainer({
        engine,
        image: imageId,
        workdir,
        env: { FOO: "bar baz", MULTI: "line1\nline2", EMPTY: "" },
        command: 'pwd; cat hello.txt; echo "foo=$FOO"; echo "multi=[$MULTI]"; echo "empty=[${EMPTY-unset}]"; echo out > made.txt; echo oops >&2; exit 7',
        name: containerName,
        network: "none",
        extraOptions: [],
        engineEnv: box.env,
        onStdout: (b) => (stdout += new TextDecoder().decode(b)),
        onStderr: (b) => (stderr += new TextDecoder().decode(b)),
      });
      expect(await c.exited).toBe(7);
      expect(stdout).toContain(`${workdir}\n`);
      expect(stdout).toContain("hello from the host");
      expect(stdout).toContain("foo=bar baz");
      expect(stdout).toContain("multi=[line1\nline2]");
      expect(stdout).toContain("empty=[]");
      expect(stderr).toContain("oops");
      expect(readFileSync(join(workdir, "made.txt"), "utf8")).toBe("out\n");
      expect(await containerExists(engine, containerName, box.env)).toBe(false);

      // A list command runs as is; the exit code comes through again.
      const list = await runContainer({ engine, image: imageId, workdir, env: {}, command: ["sh", "-c", "exit 3"], name: `${containerName}b`, engineEnv: box.env, network: "host", extraOptions: [] });
      expect(await list.exited).toBe(3);
    }, T);

    it("cancel stops it and removes it", async () => {
      const workdir = tempDir("gpl-work-");
      const containerName = `gpl-test-${name}-${process.pid}-2`;
      let stdout = "";
      let started!: () => void;
      const running = new Promise<void>((r) => (started = r));
      const c = await runContainer({
        engine,
        image: imageId,
        workdir,
        env: {},
        command: ["sh", "-c", "echo started; sleep 60"],
        name: containerName,
        engineEnv: box.env, network: "host", extraOptions: [],
        onStdout: (b) => {
          stdout += new TextDecoder().decode(b);
          if (stdout.includes("started")) started();
        },
      });
      await running;
      const t0 = performance.now();
      await c.stop(1);
      const code = await c.exited;
      expect(code).not.toBe(0);
      expect(performance.now() - t0).toBeLessThan(20_000);
      expect(await containerExists(engine, containerName, box.env)).toBe(false);
    }, T);

    it("GPUs: the engine's own way, or a clear error when the machine has no NVIDIA runtime / CDI spec", async () => {
      try {
        const args = await gpuArgs(engine, 1, box.env);
        expect(args.join(" ")).toMatch(name === "docker" ? /^--gpus 1$/ : /nvidia\.com\/gpu=/);
      } catch (error) {
        expect((error as Error).message).toMatch(name === "docker" ? /docker has no NVIDIA runtime.*nvidia-ctk runtime configure/ : /no CDI spec for nvidia\.com\/gpu.*nvidia-ctk cdi generate/);
      }
      if (name === "podman") {
        const cdi = tempDir("gpl-cdi-");
        writeFileSync(join(cdi, "nvidia.yaml"), 'cdiVersion: "0.5.0"\nkind: nvidia.com/gpu\ndevices:\n  - name: "0"\n  - name: "1"\n  - name: all\n');
        expect(await gpuArgs(engine, 2, box.env, [cdi])).toEqual(["--device", "nvidia.com/gpu=0", "--device", "nvidia.com/gpu=1"]);
        expect(await gpuArgs(engine, 4, box.env, [cdi])).toEqual(["--device", "nvidia.com/gpu=all"]);
      }
    }, T);
  });
});

describe("without an engine", () => {
  test("no engine on PATH: one line naming what was tried", async () => {
    const box = sandbox();
    try {
      const r = await cli(["env", "prepare", "--image", "busybox:1"], { env: { ...box.env, PATH: join(box.root, "empty") } });
      expect(r.code).toBe(1);
      expect(r.stderr.trim()).toBe("error: no working container engine; tried docker: not installed (not found on PATH); podman: not installed (not found on PATH) (GPULAYER_CONTAINER_ENGINE=docker|podman or container.engine in the config file picks one)");
      const forced = await cli(["env", "prepare", "--image", "busybox:1"], { env: { ...box.env, PATH: join(box.root, "empty"), GPULAYER_CONTAINER_ENGINE: "podman" } });
      expect(forced.stderr.trim()).toBe("error: GPULAYER_CONTAINER_ENGINE chose podman, but podman is not installed (not found on PATH)");
      expect(existsSync(join(box.home, "images-v1")) ? readdirSync(join(box.home, "images-v1")) : []).toEqual([]);
    } finally {
      box.cleanup();
    }
  });

  // Skipped only without a docker binary: what is tested is that binary failing to reach its daemon. CI installs docker.io.
  test.skipIf(!Bun.which("docker"))("a docker that does not answer: its own message", async () => {
    const box = sandbox();
    try {
      mkdirSync(join(box.root, "x"));
      const r = await cli(["env", "prepare", "--image", "busybox:1"], { env: { ...box.env, GPULAYER_CONTAINER_ENGINE: "docker", DOCKER_HOST: `unix://${join(box.root, "x", "none.sock")}` } });
      expect(r.code).toBe(1);
      expect(r.stderr.trim()).toMatch(/^error: container engine docker does not work: .*(Cannot connect|no such file).*\(GPULAYER_CONTAINER_ENGINE chose it\)$/);
    } finally {
      box.cleanup();
    }
  });

  test("bad image flags are refused before anything happens", async () => {
    const box = sandbox();
    try {
      // The env is built for the image's own Python: another one is a contradiction.
      const r = await cli(["env", "prepare", "--image", "busybox:1", "-p", "tqdm", "--python", "python3"], { env: box.env });
      expect(r.code).toBe(2);
      expect(r.stderr.trim()).toBe("error: --python python3 does not go with an image (busybox:1): the env is built for the image's own Python");
      const alone = await cli(["env", "prepare", "--image", "busybox:1", "--index-url", "http://127.0.0.1:9/simple"], { env: box.env });
      expect(alone.code).toBe(2);
      expect(alone.stderr).toContain("--index-url applies to requirements, not to --image alone");
      const bad = await cli(["env", "prepare", "--image", "busybox:1", "--pull", "sometimes"], { env: box.env });
      expect(bad.code).toBe(2);
      expect(bad.stderr.trim()).toBe('error: --pull must be one of missing, always, never, not "sometimes"');
    } finally {
      box.cleanup();
    }
  });

  test("GPULAYER_CONTAINER_OPTIONS splits like a shell", () => {
    expect(shellSplit(`--shm-size 8g -v "/a b:/c" --label 'x=y z' a\\ b`)).toEqual(["--shm-size", "8g", "-v", "/a b:/c", "--label", "x=y z", "a b"]);
    expect(() => shellSplit(`-v "unterminated`)).toThrow(/unterminated double quote/);
  });

  test("pull progress: layers and bytes from Docker's and Podman's terminal output", () => {
    const d = new PullParser();
    d.line("929044f23243: Pulling fs layer");
    d.line("aaaaaaaaaaaa: Pulling fs layer");
    d.line("929044f23243: Downloading [=>      ]  32.77kB/1.065MB");
    expect(d.snapshot()).toMatchObject({ layers: 2, layersDone: 0, bytesDone: 32770, bytesTotal: 1065000 });
    d.line("929044f23243: Pull complete");
    d.line("aaaaaaaaaaaa: Already exists");
    expect(d.snapshot()).toMatchObject({ layers: 2, layersDone: 2, bytesDone: 1065000 });
    const p = new PullParser();
    p.line("Copying blob 929044f23243 [=====>-----] 1.0MiB / 2.0MiB");
    expect(p.snapshot()).toMatchObject({ layers: 1, layersDone: 0, bytesDone: 1048576, bytesTotal: 2097152 });
    p.line("Copying blob 929044f23243 done  ");
    expect(p.snapshot()).toMatchObject({ layers: 1, layersDone: 1, bytesDone: 2097152 });
  });
});
