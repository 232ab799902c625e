/**
 * Overhead of `gpulayer job run` on a warm environment against running the
 * same `python -c pass` directly, as whole processes, side by side.
 * Run: bun run bench/job.ts
 * BENCH_BEFORE=PATH times another gpulayer build (the binary before a change) in the same alternation, on the same env.
 */
import { mkdtempSync, rmSync, writeFileSync } from "node:fs";
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
const before = process.env.BENCH_BEFORE;
const DIRECT = "python -c pass (the env's python, direct)";
const OURS = "gpulayer job run -- python -c pass (warm)";
const BEFORE = `the binary before (${before}), the same`;
const jobRun = (b: string) => () => timeProcess([b, "job", "run", "--quiet", "--python", python, "--", "python", "-c", "pass"], { env });
if (before) jobRun(before)();
const results = sideBySide(
  {
    [DIRECT]: () => timeProcess([envPython, "-c", "pass"], { env }),
    [OURS]: jobRun(bin),
    ...(before ? { [BEFORE]: jobRun(before) } : {}),
  },
  runs,
);
console.log(`machine: ${machine()}; ${runs} runs each, alternating`);
printTable("job run overhead", Object.entries(results), DIRECT);
const added = results[OURS]!.median - results[DIRECT]!.median;
console.log(`\nadded by gpulayer: ${added.toFixed(1)} ms (aim: under 15 ms)`);
if (before) console.log(`added by the binary before: ${(results[BEFORE]!.median - results[DIRECT]!.median).toFixed(1)} ms`);

// Tasks: a job of two tasks (the second needs the first; both envs warm) against the same two commands as two
// single-task jobs run one after the other: what the task orchestration adds (its own record per task, the scheduler).
const work = mkdtempSync(join(tmpdir(), "gpl-bench-tasks-"));
const jobFile = join(work, "two.yaml");
writeFileSync(jobFile, `environment: {python: ${python}}\ntasks:\n  first: {command: [python, -c, pass]}\n  second: {command: [python, -c, pass], needs: [first]}\n`);
const single = [bin, "job", "run", "--quiet", "--python", python, "--", "python", "-c", "pass"];
timeProcess([bin, "job", "run", "--quiet", "-f", jobFile], { env, cwd: work });
const tasks = sideBySide(
  {
    "two single-task jobs, one after the other": () => timeProcess(single, { env }) + timeProcess(single, { env }),
    "one job of two tasks (second needs first)": () => timeProcess([bin, "job", "run", "--quiet", "-f", jobFile], { env, cwd: work }),
  },
  runs,
);
printTable("job of tasks against separate jobs", Object.entries(tasks), "two single-task jobs, one after the other");
const orchestration = tasks["one job of two tasks (second needs first)"]!.median - tasks["two single-task jobs, one after the other"]!.median;
console.log(`\nadded by the task orchestration: ${orchestration.toFixed(1)} ms (aim: under 30 ms; negative: one process instead of two)`);
rmSync(work, { recursive: true, force: true });
rmSync(home, { recursive: true, force: true });
