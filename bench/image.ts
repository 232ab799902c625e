/**
 * Overhead of a warm `gpulayer job run --image REF -- true` (the image is
 * already here) against the plain `<engine> run --rm --network host REF true`,
 * for each engine that answers, as whole processes, side by side.
 *
 * Run: bun run bench/image.ts [--image REF] [--engine docker|podman]...
 *   BENCH_RUNS=N (default 10) runs each, alternating, after 2 warm-ups.
 *   BENCH_BEFORE=PATH times another gpulayer build (the binary before a change) in the same alternation.
 *   BENCH_ONLY=warm stops after the image-only jobs.
 * Without --image: a busybox image imported into each engine (no registry).
 *
 * Then requirements on top of an image (an image made from Debian's python3,
 * test/fixtures/python-image.ts; a wheel index on 127.0.0.1): a warm job with
 * requirements against the same job without them and plain `<engine> run`,
 * and a cold build of the env against `pip install` in a plain container of
 * the same image (a fresh home each time; BENCH_UV names a uv binary to
 * mount in, else the image's pip builds).
 */
import { mkdtempSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { parseArgs } from "node:util";
import { busyboxTar } from "../test/fixtures/registry.ts";
import { binary, machine, printTable, sideBySide, timeProcess } from "./_lib.ts";

type EngineName = "docker" | "podman";
const { values } = parseArgs({ options: { image: { type: "string" }, engine: { type: "string", multiple: true }, exec: { type: "string" } }, strict: true });

// `--exec REF`: what the job runner will do for an image, without the job store: ensureImage, then runContainer.
if (values.exec) {
  const { homeLayout } = await import("../src/config/paths.ts");
  const { ensureImage, runContainer } = await import("../src/docker/index.ts");
  const { commandContext, engineHost } = await import("../src/commands/_context.ts");
  const ctx = await commandContext();
  const image = await ensureImage(ctx.layout, values.exec, { host: engineHost(ctx) });
  const c = await runContainer({ engine: image.engine, image: image.imageId, workdir: process.cwd(), env: {}, command: ["true"], name: `gpl-bench-${process.pid}`, network: "host", extraOptions: [], engineEnv: ctx.childEnv });
  process.exit(await c.exited);
}
const runs = Number(process.env.BENCH_RUNS ?? 10);
const wanted = (values.engine ?? ["docker", "podman"]) as EngineName[];

function works(engine: EngineName): string | null {
  if (!Bun.which(engine)) return "not installed";
  const r = Bun.spawnSync([engine, "info", "--format", engine === "docker" ? "{{.ServerVersion}}" : "{{.Host.OCIRuntime.Name}}"], { stdout: "ignore", stderr: "pipe" });
  return r.exitCode === 0 ? null : `${engine} info failed: ${r.stderr.toString().trim().split("\n").at(-1)}`;
}

function must(argv: string[], env?: Record<string, string>): string {
  const r = Bun.spawnSync(argv, { env, stdout: "pipe", stderr: "pipe" });
  if (r.exitCode !== 0) throw new Error(`${argv.join(" ")} exited ${r.exitCode}: ${r.stderr.toString().trim().split("\n").at(-1)}`);
  return r.stdout.toString();
}

const bin = binary();
const home = mkdtempSync(join(tmpdir(), "gpl-bench-image-"));
const workdir = mkdtempSync(join(tmpdir(), "gpl-bench-work-"));
const tar = values.image ? null : await busyboxTar();
const BENCH_REF = "localhost/gpulayer-bench/busybox:1";
let failures = 0;
console.log(`machine: ${machine()}; ${runs} runs each, alternating`);

for (const engine of wanted) {
  const problem = works(engine);
  if (problem) {
    console.log(`\n${engine}: skipped (${problem})`);
    continue;
  }
  const ref = values.image ?? BENCH_REF;
  if (tar) must([engine, "import", tar, BENCH_REF]);
  const env = { ...process.env, GPULAYER_HOME: home, GPULAYER_CONTAINER_ENGINE: engine } as Record<string, string>;
  // Warm: the image pulled (or found) and recorded, the engine remembered.
  must([bin, "env", "prepare", "--quiet", "--image", ref], env);
  const job = [bin, "job", "run", "--quiet", "--workdir", workdir, "--image", ref, "--", "true"];
  // src/docker alone (bun + ensureImage + runContainer), for comparison and for before job run has --image.
  const direct = [process.execPath, import.meta.path, "--exec", ref];
  const modules = "src/docker only: ensureImage+runContainer";
  const probe = Bun.spawnSync(job, { env, cwd: workdir, stdout: "pipe", stderr: "pipe" });
  if (probe.exitCode !== 0) {
    console.log(`\n${engine}: \`gpulayer job run --image\` failed (exit ${probe.exitCode}): ${probe.stderr.toString().trim().split("\n").at(-1)}`);
    console.log("  (does job run support --image yet?) comparing the plain engine with src/docker alone:");
    const plain = `${engine} run --rm --network host REF true`;
    const partial = sideBySide(
      {
        [plain]: () => timeProcess([engine, "run", "--rm", "--network", "host", ref, "true"], { env, cwd: workdir }),
        [modules]: () => timeProcess(direct, { env, cwd: workdir }),
      },
      runs,
      2,
    );
    printTable(`${engine}: ${ref}`, Object.entries(partial), plain);
    failures++;
    continue;
  }
  const plain = `${engine} run --rm --network host REF true`;
  const ours = `gpulayer job run --image REF -- true (warm)`;
  const before = process.env.BENCH_BEFORE;
  const BEFORE = `the binary before (${before}), the same`;
  const results = sideBySide(
    {
      [plain]: () => timeProcess([engine, "run", "--rm", "--network", "host", ref, "true"], { env, cwd: workdir }),
      [ours]: () => timeProcess(job, { env, cwd: workdir }),
      ...(before ? { [BEFORE]: () => timeProcess([before, ...job.slice(1)], { env, cwd: workdir }) } : { [modules]: () => timeProcess(direct, { env, cwd: workdir }) }),
    },
    runs,
    2,
  );
  printTable(`${engine}: ${ref}`, Object.entries(results), plain);
  console.log(`added by gpulayer: ${(results[ours]!.median - results[plain]!.median).toFixed(1)} ms per job`);
  if (before) console.log(`added by the binary before: ${(results[BEFORE]!.median - results[plain]!.median).toFixed(1)} ms per job`);
  if (tar) Bun.spawnSync([engine, "rmi", "-f", BENCH_REF], { stdout: "ignore", stderr: "ignore" });
}
if (process.env.BENCH_ONLY === "warm") {
  rmSync(home, { recursive: true, force: true });
  rmSync(workdir, { recursive: true, force: true });
  process.exit(failures ? 1 : 0);
}
// Requirements on top of an image.
const { pythonRootfs } = await import("../test/fixtures/python-image.ts");
const rootfs = await pythonRootfs();
if ("reason" in rootfs) console.log(`\nimage + requirements: skipped (${rootfs.reason})`);
else {
  // The index in a process of its own: the timed runs below wait synchronously, and an index in this one could not answer them.
  const indexProc = Bun.spawn([process.execPath, "-e", `const { PackageIndex } = await import(${JSON.stringify(join(import.meta.dir, "..", "test", "fixtures", "index.ts"))}); const i = new PackageIndex(${JSON.stringify(join(home, "index"))}).start(); i.wheel({ name: "benchdep", version: "1.0" }); console.log(i.url); await new Promise(() => {});`], { stdout: "pipe", stderr: "inherit" });
  const reader = (indexProc.stdout as ReadableStream<Uint8Array>).getReader();
  const index = { url: new TextDecoder().decode((await reader.read()).value).trim(), stop: () => indexProc.kill() };
  const PY_REF = "localhost/gpulayer-bench/python:bookworm";
  const uvEnv = process.env.BENCH_UV ? { GPULAYER_UV: process.env.BENCH_UV } : { GPULAYER_UV: "off" };
  for (const engine of wanted) {
    if (works(engine)) continue;
    must([engine, "import", rootfs.tar, PY_REF]);
    const env = { ...process.env, ...uvEnv, GPULAYER_HOME: join(home, `py-${engine}`), GPULAYER_CONTAINER_ENGINE: engine, PIP_CONFIG_FILE: "/dev/null" } as Record<string, string>;
    const req = ["-p", "benchdep", "--index-url", index.url];
    must([bin, "env", "prepare", "--quiet", "--image", PY_REF, ...req], env);
    const plain = `${engine} run --rm REF python3 -c pass`;
    const imageOnly = "job run --image REF -- python3 -c pass";
    const withReq = "job run --image REF -p benchdep -- python3 -c pass";
    const warm = sideBySide(
      {
        [plain]: () => timeProcess([engine, "run", "--rm", "--network", "host", PY_REF, "python3", "-c", "pass"], { env, cwd: workdir }),
        [imageOnly]: () => timeProcess([bin, "job", "run", "--quiet", "--workdir", workdir, "--image", PY_REF, "--", "python3", "-c", "pass"], { env, cwd: workdir }),
        [withReq]: () => timeProcess([bin, "job", "run", "--quiet", "--workdir", workdir, "--image", PY_REF, ...req, "--", "python3", "-c", "pass"], { env, cwd: workdir }),
      },
      runs,
      2,
    );
    printTable(`${engine}: warm, image + requirements (${process.env.BENCH_UV ? "uv" : "pip"} built the env)`, Object.entries(warm), imageOnly);
    let fresh = 0;
    const pipPlain = `pip install in a plain ${engine} container`;
    const ours = "gpulayer env prepare --image REF -p benchdep (cold)";
    const cold = sideBySide(
      {
        [pipPlain]: () => timeProcess([engine, "run", "--rm", "--network", "host", PY_REF, "sh", "-c", `python3 -m venv --system-site-packages /tmp/v && /tmp/v/bin/python -m pip install -q --disable-pip-version-check --index-url ${index.url} benchdep`], { env, cwd: workdir }),
        // A fresh home each run: nothing reused, the image's Python probed again too.
        [ours]: () => timeProcess([bin, "env", "prepare", "--quiet", "--image", PY_REF, ...req], { env: { ...env, GPULAYER_HOME: join(home, `cold-${engine}-${fresh++}`) }, cwd: workdir }),
      },
      Math.max(3, Math.floor(runs / 2)),
      1,
    );
    printTable(`${engine}: cold env on the image`, Object.entries(cold), pipPlain);
    Bun.spawnSync([engine, "rmi", "-f", PY_REF], { stdout: "ignore", stderr: "ignore" });
  }
  index.stop();
}

rmSync(home, { recursive: true, force: true });
rmSync(workdir, { recursive: true, force: true });
if (failures) {
  console.error(`\n${failures} engine(s) could not be compared: gpulayer job run --image failed (see above)`);
  process.exitCode = 1;
}
