/**
 * A request nothing satisfies (`tiny==9`, the index has 1.0), side by side in
 * one run: `gpulayer env prepare` (auto: the uv fast path) against raw
 * `uv venv` + `uv pip install` of the same request from the same index (a
 * local PEP 503 index on 127.0.0.1, served by the test fixture). Every run has
 * a fresh GPULAYER_HOME, venv and a uv cache for each contender, then again with
 * the home and raw uv's cache kept across runs (a worker that has built before); the order alternates. Both must fail; gpulayer's failure
 * must be one line with uv's explanation, and pip must not run a second
 * resolution. Goal (issue 39): within 1.5x of raw uv's own failure.
 *
 * Run: bun run bench/failure.ts   (BENCH_FAILURE_RUNS=10)
 */
import { mkdtempSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { PackageIndex } from "../test/fixtures/index.ts";
import { makeWorkerVenv } from "../test/helpers.ts";
import { ensureBinary, machine, realUv, stats, writeReport } from "./_lib.ts";

const RUNS = Number(process.env.BENCH_FAILURE_RUNS ?? 10);
const { bin, how } = ensureBinary();
const uv = realUv() ?? (() => {
  throw new Error("uv is not on PATH (the benchmark compares against it)");
})();
const work = mkdtempSync(join(tmpdir(), "gpl-bench-failure-"));
const index = new PackageIndex(join(work, "index"));
index.start();
index.wheel({ name: "tiny", version: "1.0" });

const base: Record<string, string> = {};
for (const [k, v] of Object.entries(process.env)) if (v !== undefined && !/^(PIP_|UV_|GPULAYER_)/.test(k)) base[k] = v;
Object.assign(base, { PIP_DISABLE_PIP_VERSION_CHECK: "1", NO_COLOR: "1" });
const python = await makeWorkerVenv(join(work, "worker"), { env: base });

let n = 0;
/** One failing run: its wall time and what it said; a success is a broken benchmark. */
// Spawned, not spawnSync: the index answers from this same process.
async function failing(argv: string[], env: Record<string, string>): Promise<{ ms: number; said: string }> {
  const t = performance.now();
  const p = Bun.spawn(argv, { env, cwd: work, stdout: "ignore", stderr: "pipe", stdin: "ignore" });
  const [said, code] = await Promise.all([new Response(p.stderr).text(), p.exited]);
  const ms = performance.now() - t;
  if (code === 0) throw new Error(`${argv.join(" ")} succeeded on a request nothing satisfies`);
  return { ms, said };
}

const RAW = "`uv venv` + `uv pip install` (raw)";
const GPL = "gpulayer env prepare (auto)";
const RAW_USED = "`uv venv` + `uv pip install` (raw), its cache used before";
const GPL_USED = "gpulayer env prepare (auto), on a home used before";
const samples: Record<string, number[]> = { [RAW]: [], [GPL]: [], [RAW_USED]: [], [GPL_USED]: [] };
let gplSaid = "";
/** Raw uv's failure: a venv, then the install that fails; its own fresh uv cache (or `cacheDir`, kept across runs). */
async function rawRun(dir: string, cacheDir = join(dir, "uv-cache-raw")): Promise<number> {
  const cache = { UV_CACHE_DIR: cacheDir };
  const venv = join(dir, "venv");
  const t = performance.now();
  const made = Bun.spawn([uv, "venv", "--quiet", "--python", python, venv], { env: { ...base, ...cache }, stdout: "ignore", stderr: "ignore" });
  if ((await made.exited) !== 0) throw new Error("uv venv failed");
  const raw = await failing([uv, "pip", "install", "--python", join(venv, "bin", "python"), "--index-url", index.url, "tiny==9"], { ...base, ...cache });
  if (!/No solution found/.test(raw.said)) throw new Error(`raw uv failed otherwise: ${raw.said}`);
  return performance.now() - t;
}

/** gpulayer's failure: a fresh home and a uv cache of its own (never the one raw uv just filled), or `home` kept across runs. */
async function gplRun(dir: string, home?: string): Promise<number> {
  const where: Record<string, string> = home ? { GPULAYER_HOME: home } : { UV_CACHE_DIR: join(dir, "uv-cache-gpl"), GPULAYER_HOME: join(dir, "home") };
  const gpl = await failing([bin, "env", "prepare", "-p", "tiny==9", "--index-url", index.url, "--python", python], { ...base, ...where });
  gplSaid = gpl.said;
  return gpl.ms;
}

for (let i = 0; i < RUNS + 1; i++) {
  const dir = join(work, `run-${n++}`);
  // Alternated: which goes first changes each run, so neither always finds the machine warmed by the other.
  const order = i % 2 ? ([[GPL, gplRun], [RAW, rawRun]] as const) : ([[RAW, rawRun], [GPL, gplRun]] as const);
  for (const [name, run] of order) {
    const ms = await run(dir);
    if (i > 0) samples[name]!.push(ms); // the first round warms the page cache and the binary
  }
  // As a failure meets a worker that has built before: gpulayer's home (its uv cache inside) and raw uv's cache
  // kept across runs, each filled by the first round; a new venv each time on both sides.
  const used = i % 2 ? ([[GPL_USED, () => gplRun(dir, join(work, "used-home"))], [RAW_USED, () => rawRun(join(dir, "used"), join(work, "used-uv-cache"))]] as const) : ([[RAW_USED, () => rawRun(join(dir, "used"), join(work, "used-uv-cache"))], [GPL_USED, () => gplRun(dir, join(work, "used-home"))]] as const);
  for (const [name, run] of used) {
    const ms = await run();
    if (i > 0) samples[name]!.push(ms);
  }
}
index.stop();
rmSync(work, { recursive: true, force: true });

const errors = gplSaid.split("\n").filter((l) => l.startsWith("error:"));
const pipRan = /with pip/.test(gplSaid);
const table = (names: string[]) => {
  const rows = names.map((name) => [name, stats(samples[name]!)] as const);
  const rawMedian = rows[0]![1].median;
  return rows.map(([name, s]) => `| ${name} | ${s.median.toFixed(0)} ms | ${s.min.toFixed(0)} ms | ${s.p90.toFixed(0)} ms | ${(s.median / rawMedian).toFixed(2)}x |`);
};
const lines = [
  `## A request nothing satisfies (\`tiny==9\`), ${RUNS} runs each, alternated`,
  "",
  `${machine()}; ${how}.`,
  "",
  "| | median | min | p90 | vs raw uv |",
  "|---|---:|---:|---:|---:|",
  ...table([RAW, GPL]),
  "",
  "| on a worker that has built before | median | min | p90 | vs raw uv |",
  "|---|---:|---:|---:|---:|",
  ...table([RAW_USED, GPL_USED]),
  "",
  `gpulayer's error: ${errors.length} line(s), \`${errors[0] ?? "(none)"}\`; pip ran a second resolution: ${pipRan ? "yes" : "no"}.`,
];
const doc = lines.join("\n");
console.log(doc);
writeReport("bench-failure.md", doc);
if (errors.length !== 1 || pipRan) process.exit(1);
