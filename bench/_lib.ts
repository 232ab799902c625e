import { existsSync, mkdirSync, readdirSync, readFileSync, statSync, writeFileSync } from "node:fs";
import { join, resolve } from "node:path";

export const ROOT = resolve(import.meta.dir, "..");

function newestSource(dir: string): number {
  let newest = 0;
  for (const e of readdirSync(dir, { withFileTypes: true })) {
    const p = join(dir, e.name);
    newest = Math.max(newest, e.isDirectory() ? newestSource(p) : statSync(p).mtimeMs);
  }
  return newest;
}

/**
 * The built binary (benchmarks measure what users run): dist/gpulayer, built
 * with `bun run build` when missing, older than src/, or BENCH_REBUILD is set;
 * `how` says which, for the reports.
 */
export function ensureBinary(): { bin: string; how: string } {
  const bin = join(ROOT, "dist", "gpulayer");
  if (existsSync(bin) && !process.env.BENCH_REBUILD && statSync(bin).mtimeMs >= newestSource(join(ROOT, "src"))) return { bin, how: "dist/gpulayer as found" };
  const build = Bun.spawnSync(["bun", "run", "build"], { cwd: ROOT, stdout: "inherit", stderr: "inherit" });
  if (build.exitCode === 0 && existsSync(bin)) return { bin, how: "bun run build" };
  mkdirSync(join(ROOT, "dist"), { recursive: true });
  const plain = ["bun", "build", "--compile", "--minify", "--no-compile-autoload-dotenv", "--no-compile-autoload-bunfig", "src/cli.ts", "--outfile", bin];
  if (Bun.spawnSync(plain, { cwd: ROOT, stdout: "inherit", stderr: "inherit" }).exitCode !== 0) throw new Error("cannot build dist/gpulayer");
  return { bin, how: plain.join(" ") };
}

export function binary(): string {
  return ensureBinary().bin;
}

/** uv itself, not a pyenv shim (a bash script that costs ~0.1 s a call): every contender gets the same binary. */
export { realUv } from "../test/helpers.ts";

/** Wall time of one whole process, in ms. */
export function timeProcess(argv: string[], opts: { env?: Record<string, string>; cwd?: string } = {}): number {
  const t = performance.now();
  const r = Bun.spawnSync(argv, { env: opts.env, cwd: opts.cwd, stdout: "ignore", stderr: "ignore" });
  const ms = performance.now() - t;
  if (r.exitCode !== 0) throw new Error(`${argv.join(" ")} exited ${r.exitCode}`);
  return ms;
}

export function stats(samples: number[]) {
  const s = [...samples].sort((a, b) => a - b);
  const at = (q: number) => s[Math.min(s.length - 1, Math.floor(q * s.length))]!;
  return { median: at(0.5), p90: at(0.9), min: s[0]!, n: s.length };
}

/** Alternate the contenders run by run, so drift in the machine hits both alike. */
export function sideBySide(contenders: Record<string, () => number>, runs: number, warmup = 3): Record<string, ReturnType<typeof stats>> {
  const samples: Record<string, number[]> = {};
  for (const name of Object.keys(contenders)) samples[name] = [];
  for (let i = 0; i < warmup + runs; i++) {
    for (const [name, fn] of Object.entries(contenders)) {
      const ms = fn();
      if (i >= warmup) samples[name]!.push(ms);
    }
  }
  return Object.fromEntries(Object.entries(samples).map(([k, v]) => [k, stats(v)]));
}

export function printTable(title: string, rows: [string, ReturnType<typeof stats>][], baseline: string): void {
  const base = rows.find(([n]) => n === baseline)![1].median;
  console.log(`\n${title}`);
  console.log(`${"".padEnd(44)} ${"median".padStart(10)} ${"p90".padStart(10)} ${"ratio".padStart(8)}`);
  for (const [name, s] of rows) console.log(`${name.padEnd(44)} ${s.median.toFixed(1).padStart(8)}ms ${s.p90.toFixed(1).padStart(8)}ms ${(s.median / base).toFixed(2).padStart(7)}x`);
}

export function machine(): string {
  const cpu = Bun.spawnSync(["sh", "-c", "grep -m1 'model name' /proc/cpuinfo | cut -d: -f2"]).stdout.toString().trim();
  return `${navigator.hardwareConcurrency} cores, ${cpu || process.arch}`;
}

/**
 * The package index the benchmarks install from, and a folder of wheels (torch)
 * offered beside it: BENCH_INDEX and BENCH_FIND_LINKS, so no machine's paths
 * are written into the code. Every contender gets the same ones.
 */
export function benchIndex(): { index: string; findLinks: string | null } {
  const index = process.env.BENCH_INDEX;
  if (!index) {
    console.error("set BENCH_INDEX to a PEP 503 index every contender installs from (a local mirror, file:///…/simple, or https://pypi.org/simple), and BENCH_FIND_LINKS to a folder holding the torch wheel for the torch rows");
    process.exit(2);
  }
  return { index, findLinks: process.env.BENCH_FIND_LINKS || null };
}

/** For reports: the index and wheel folder by their variable names, not this machine's paths. */
export function redactBenchPaths(text: string): string {
  const { BENCH_INDEX: index, BENCH_FIND_LINKS: links } = process.env;
  let out = text;
  if (index) out = out.split(index).join("$BENCH_INDEX");
  if (links) out = out.split(links).join("$BENCH_FIND_LINKS");
  return out.replace(/\/tmp\/gpl-bench-[A-Za-z0-9-]+/g, "<tmp>").replace(/\/root\/\.pyenv\/versions\/[^/\s]+/g, "<pyenv>");
}

/** Rewrite only the part of a report between its markers (`part`: one report may hold several): notes kept around them survive a new run. */
export function writeReport(name: string, doc: string, part = "bench"): void {
  const file = join(ROOT, "docs", name);
  const [begin, end] = [`<!-- ${part}:begin -->`, `<!-- ${part}:end -->`];
  const old = existsSync(file) ? readFileSync(file, "utf8") : "";
  const kept = old.includes(begin) && old.includes(end) ? [old.slice(0, old.indexOf(begin)), old.slice(old.indexOf(end) + end.length)] : ["", "\n"];
  mkdirSync(join(ROOT, "docs"), { recursive: true });
  writeFileSync(file, `${kept[0]}${begin}\n${redactBenchPaths(doc)}\n${end}${kept[1]}`);
}
