/**
 * Overhead of `gpulayer job run` on a warm environment against running the
 * same `python -c pass` directly, as whole processes, side by side.
 * Run: bun run bench/job.ts
 */
import { mkdtempSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { binary, machine, printTable, sideBySide, timeProcess } from "./_lib.ts";

const bin = binary();
const home = mkdtempSync(join(tmpdir(), "gpl-bench-job-"));
const env = { ...process.env, GPULAYER_HOME: home } as Record<string, string>;
const python = Bun.which("python3")!;

// Warm the env (no requirements: the worker's own packages) and the interpreter probe.
timeProcess([bin, "job", "run", "--python", python, "--", "python", "-c", "pass"], { env });
const envPython = JSON.parse(Bun.spawnSync([bin, "env", "prepare", "--python", python, "--json"], { env }).stdout.toString()).python as string;

const runs = Number(process.env.BENCH_RUNS ?? 30);
const results = sideBySide(
  {
    "python -c pass (the env's python, direct)": () => timeProcess([envPython, "-c", "pass"], { env }),
    "gpulayer job run -- python -c pass (warm)": () => timeProcess([bin, "job", "run", "--quiet", "--python", python, "--", "python", "-c", "pass"], { env }),
  },
  runs,
);
console.log(`machine: ${machine()}; ${runs} runs each, alternating`);
printTable("job run overhead", Object.entries(results), "python -c pass (the env's python, direct)");
const added = results["gpulayer job run -- python -c pass (warm)"]!.median - results["python -c pass (the env's python, direct)"]!.median;
console.log(`\nadded by gpulayer: ${added.toFixed(1)} ms (aim: under 30 ms)`);
rmSync(home, { recursive: true, force: true });
