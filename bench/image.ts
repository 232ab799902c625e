/**
 * Overhead of a warm `gpulayer job run --image REF -- true` (the image is
 * already here) against the plain `<engine> run --rm --network host REF true`,
 * for each engine that answers, as whole processes, side by side.
 *
 * Run: bun run bench/image.ts [--image REF] [--engine docker|podman]...
 *   BENCH_RUNS=N (default 10) runs each, alternating, after 2 warm-ups.
 * Without --image: a busybox image imported into each engine (no registry).
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
  const ctx = commandContext();
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
  const results = sideBySide(
    {
      [plain]: () => timeProcess([engine, "run", "--rm", "--network", "host", ref, "true"], { env, cwd: workdir }),
      [ours]: () => timeProcess(job, { env, cwd: workdir }),
      [modules]: () => timeProcess(direct, { env, cwd: workdir }),
    },
    runs,
    2,
  );
  printTable(`${engine}: ${ref}`, Object.entries(results), plain);
  console.log(`added by gpulayer: ${(results[ours]!.median - results[plain]!.median).toFixed(1)} ms per job`);
  if (tar) Bun.spawnSync([engine, "rmi", "-f", BENCH_REF], { stdout: "ignore", stderr: "ignore" });
}
rmSync(home, { recursive: true, force: true });
rmSync(workdir, { recursive: true, force: true });
if (failures) {
  console.error(`\n${failures} engine(s) could not be compared: gpulayer job run --image failed (see above)`);
  process.exitCode = 1;
}
