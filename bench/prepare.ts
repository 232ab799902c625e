/**
 * `gpulayer env prepare`, as whole processes of the built binary, side by side:
 *   warm: a prepare that finds its env  vs  `python -c pass` (and Bun's own floor)
 *   cold: a build into a fresh GPULAYER_HOME  vs  `python -m venv --without-pip` + `pip install`
 * of the same small request (3 tiny wheels, a chain of dependencies) from the same
 * PEP 503 index on 127.0.0.1. Writes the tables to docs/bench-prepare.md.
 *
 * Run: bun run bench/prepare.ts   (BENCH_RUNS=30 warm runs, BENCH_FLOOR_RUNS=100, BENCH_COLD_RUNS=5, BENCH_REBUILD=1)
 */
import { copyFileSync, existsSync, mkdirSync, mkdtempSync, readdirSync, rmSync, statSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join, relative } from "node:path";
import { makeDist, PackageIndex } from "../test/fixtures/index.ts";
import { makeWorkerVenv } from "../test/helpers.ts";
import { ensureBinary, ROOT, stats, writeReport } from "./_lib.ts";

type Stats = ReturnType<typeof stats>;



/** One whole process (async: the index server in this process must keep answering). */
async function run(argv: string[], opts: { env?: Record<string, string>; cwd?: string } = {}) {
  const p = Bun.spawn(argv, { env: opts.env, cwd: opts.cwd, stdout: "pipe", stderr: "pipe", stdin: "ignore" });
  const [out, err, code] = await Promise.all([new Response(p.stdout).text(), new Response(p.stderr).text(), p.exited]);
  return { out, err, code };
}

async function timed(argv: string[], opts: { env?: Record<string, string>; cwd?: string } = {}): Promise<number> {
  const t = performance.now();
  const p = Bun.spawn(argv, { env: opts.env, cwd: opts.cwd, stdout: "ignore", stderr: "ignore", stdin: "ignore" });
  const code = await p.exited;
  const ms = performance.now() - t;
  if (code !== 0) throw new Error(`${argv.join(" ")} exited ${code}`);
  return ms;
}

/** Alternate the contenders run by run, so the machine's drift hits all alike. */
async function sideBySide(contenders: [string, () => Promise<number>][], runs: number, warmup: number): Promise<[string, Stats][]> {
  const samples = contenders.map(() => [] as number[]);
  for (let i = 0; i < warmup + runs; i++) {
    for (const [j, [, fn]] of contenders.entries()) {
      const ms = await fn();
      if (i >= warmup) samples[j]!.push(ms);
    }
  }
  return contenders.map(([name], j) => [name, stats(samples[j]!)]);
}

function table(rows: [string, Stats][], baseline: string, unit: "ms" | "s"): string[] {
  const base = rows.find(([n]) => n === baseline)![1].median;
  const f = (ms: number) => (unit === "s" ? `${(ms / 1000).toFixed(2)} s` : `${ms.toFixed(1)} ms`);
  return ["| | median | p90 | min | ratio |", "|---|---:|---:|---:|---:|", ...rows.map(([n, s]) => `| ${n} | ${f(s.median)} | ${f(s.p90)} | ${f(s.min)} | ${(s.median / base).toFixed(2)}x |`)];
}

const sh = (cmd: string) => Bun.spawnSync(["sh", "-c", cmd]).stdout.toString().trim();

const { bin: built, how } = ensureBinary();
const work = mkdtempSync(join(tmpdir(), "gpl-bench-prepare-"));
// Both binaries as fresh files, as Bun's floor below is: on this machine a 100 MB binary that has sat a while
// starts about 1 ms slower (its page cache state), which would tilt the comparison either way.
const bin = join(work, "gpulayer");
copyFileSync(built, bin);
const index = new PackageIndex(join(work, "index")).start();
try {
  index.wheel({ name: "bench-top", version: "1.0", requires: ["bench-mid>=1"] });
  index.wheel({ name: "bench-mid", version: "1.0", requires: ["bench-leaf"] });
  index.wheel({ name: "bench-leaf", version: "1.0" });
  const base: Record<string, string> = {};
  for (const [k, v] of Object.entries(process.env)) if (v !== undefined && !/^(PIP_|UV_|GPULAYER_)/.test(k)) base[k] = v;
  Object.assign(base, { PIP_CONFIG_FILE: "/dev/null", PIP_DISABLE_PIP_VERSION_CHECK: "1", NO_COLOR: "1" });
  // A worker venv with pip (gpulayer's usual case: the worker's pip through the .pth).
  const worker = await makeWorkerVenv(join(work, "worker"), { withPip: true, env: { ...base, UV_CACHE_DIR: join(work, "uv-cache") } });
  const request = ["-p", "bench-top", "--index-url", index.url, "--python", worker];

  // An empty program compiled the same way: Bun's own floor for a compiled binary.
  writeFileSync(join(work, "empty.ts"), "");
  const floor = join(work, "empty");
  await run(["bun", "build", "--compile", "--minify", join(work, "empty.ts"), "--outfile", floor]);

  // Warm: one build, then the prepare that finds it.
  const warmEnv = { ...base, GPULAYER_HOME: join(work, "home-warm"), PIP_CACHE_DIR: join(work, "pip-cache-warm"), UV_CACHE_DIR: join(work, "uv-cache") };
  const first = await run([bin, "env", "prepare", ...request, "--json"], { env: warmEnv });
  if (first.code !== 0) throw new Error(`first prepare failed: ${first.err}`);
  const runs = Number(process.env.BENCH_RUNS ?? 30);
  // The floor pair is cheap and its two medians differ by milliseconds: more runs, so one slow spell weighs less.
  const floorRuns = Number(process.env.BENCH_FLOOR_RUNS ?? 100);
  const warm = await sideBySide(
    [
      ["`python -c pass` (the worker's python)", () => timed([worker, "-c", "pass"], { env: warmEnv })],
      ["`gpulayer env prepare` (warm: reused)", () => timed([bin, "env", "prepare", ...request, "--quiet"], { env: warmEnv })],
      ["`gpulayer --version` (the binary's startup)", () => timed([bin, "--version"], { env: warmEnv })],
      ["empty program, `bun build --compile` (Bun's floor)", () => timed([floor], { env: warmEnv })],
    ],
    runs,
    3,
  );

  // The figure: the warm prepare against the compiled empty program, the two alone, alternated. With a
  // Python run between them (the table above), the 100 MB binary's pages and caches are colder for both, and
  // gpulayer, which touches more of them, pays more of it: both tables are shown.
  const floorPair = await sideBySide(
    [
      ["`gpulayer env prepare` (warm: reused)", () => timed([bin, "env", "prepare", ...request, "--quiet"], { env: warmEnv })],
      ["empty program, `bun build --compile` (Bun's floor)", () => timed([floor], { env: warmEnv })],
    ],
    floorRuns,
    3,
  );

  // Warm, with the inputs that cost the key work: a local project of 2,000 files (every one stat'ed,
  // digests from the stat cache) and an interpreter named through a pyenv shim (resolved before keying).
  const proj = makeDist("project", join(work, "proj2k"), { name: "bench-proj", version: "1.0" });
  mkdirSync(join(proj, "data"), { recursive: true });
  for (let i = 0; i < 1_997; i++) writeFileSync(join(proj, "data", `f${i}.txt`), `file ${i}\n`);
  const projRequest = ["-p", "bench-top", "-p", `./${relative(work, proj)}`, "--index-url", index.url, "--python", worker];
  // The `pip install -e .` of a repository: 2,000 modules in its package, served by the live link (their names count).
  const editable = makeDist("project", join(work, "edit2k"), { name: "bench-edit", version: "1.0" });
  for (let i = 0; i < 1_999; i++) writeFileSync(join(editable, "bench_edit", `m${i}.py`), `X = ${i}\n`);
  writeFileSync(join(work, "req-editable.txt"), `-e ./${relative(work, editable)}\nbench-top\n`);
  const editRequest = [join(work, "req-editable.txt"), "--index-url", index.url, "--python", worker];
  // Files changed in the last 2 s are digested every time (their stat cannot be trusted yet: "racily clean", as in git);
  // a user's project is not rewritten before every prepare: wait until these have settled.
  await Bun.sleep(2_100);
  const projFirst = await run([bin, "env", "prepare", ...projRequest, "--json"], { env: warmEnv, cwd: work });
  if (projFirst.code !== 0) throw new Error(`project prepare failed: ${projFirst.err}`);
  const editFirst = await run([bin, "env", "prepare", ...editRequest, "--json"], { env: warmEnv, cwd: work });
  if (editFirst.code !== 0) throw new Error(`editable project prepare failed: ${editFirst.err}`);
  const pyenvRoot = process.env.PYENV_ROOT ?? join(process.env.HOME ?? "", ".pyenv");
  const shim = join(pyenvRoot, "shims", "python3");
  const shimRequest = ["-p", "bench-top", "--index-url", index.url, "--python", shim];
  const hasShim = existsSync(shim) && (await run([bin, "env", "prepare", ...shimRequest, "--json"], { env: { ...warmEnv, PYENV_ROOT: pyenvRoot } })).code === 0;
  const inputs = await sideBySide(
    [
      ["`gpulayer env prepare` (warm, plain request)", () => timed([bin, "env", "prepare", ...request, "--quiet"], { env: warmEnv })],
      ["warm, with a local project of 2,000 files", () => timed([bin, "env", "prepare", ...projRequest, "--quiet"], { env: warmEnv, cwd: work })],
      ["warm, with an editable project of 2,000 modules (`-e ./proj`)", () => timed([bin, "env", "prepare", ...editRequest, "--quiet"], { env: warmEnv, cwd: work })],
      ...(hasShim ? ([["warm, `--python` a pyenv shim", () => timed([bin, "env", "prepare", ...shimRequest, "--quiet"], { env: { ...warmEnv, PYENV_ROOT: pyenvRoot } })]] as [string, () => Promise<number>][]) : []),
    ],
    runs,
    3,
  );

  // Bytecode: a heavy pure-Python package from BENCH_INDEX, each first import in an env of its own, against
  // the second (the first would compile and write into the shared env if the build had not compiled it).
  const heavy = process.env.BENCH_HEAVY ?? "sympy";
  let imports: [string, Stats][] = [];
  if (process.env.BENCH_INDEX) {
    // A first import happens once per env: each sample is its own fresh env (its own home; the uv cache shared).
    const firsts: number[] = [];
    let py = "";
    for (let i = 0; i < Number(process.env.BENCH_HEAVY_RUNS ?? 3); i++) {
      const heavyEnv = { ...warmEnv, GPULAYER_HOME: join(work, `home-heavy-${i}`) };
      const built = await run([bin, "env", "prepare", "-p", heavy, "--index-url", process.env.BENCH_INDEX, "--python", worker], { env: heavyEnv });
      if (built.code !== 0) throw new Error(`building ${heavy} failed: ${built.err}`);
      py = join(built.out.trim().split("\n").at(-1)!, "bin", "python");
      firsts.push(await timed([py, "-c", `import ${heavy}`], { env: base }));
    }
    const again = await sideBySide([["second and later imports", () => timed([py, "-c", `import ${heavy}`], { env: base })]], 5, 0);
    imports = [[`first import in a fresh env (${firsts.length} envs)`, stats(firsts)], ...again];
  }

  // Cold: a fresh home and fresh pip/uv caches each run, for both.
  let n = 0;
  const fresh = () => {
    const dir = join(work, `cold-${n++}`);
    mkdirSync(dir);
    return { dir, env: { ...base, GPULAYER_HOME: join(dir, "home"), PIP_CACHE_DIR: join(dir, "pip-cache"), UV_CACHE_DIR: join(dir, "uv-cache") } };
  };
  const coldRuns = Number(process.env.BENCH_COLD_RUNS ?? 5);
  let steps = "";
  const cold = await sideBySide(
    [
      ["`gpulayer env prepare` (cold: venv, link, pip install, pip check)", async () => {
        const { env } = fresh();
        const t = performance.now();
        const r = await run([bin, "env", "prepare", ...request], { env });
        if (r.code !== 0) throw new Error(r.err);
        steps = r.err.trim();
        return performance.now() - t;
      }],
      ["`python -m venv --without-pip` + `pip --python … install`", async () => {
        const { dir, env } = fresh();
        const t = performance.now();
        await timed([worker, "-m", "venv", "--without-pip", join(dir, "venv")], { env });
        await timed([worker, "-m", "pip", "--python", join(dir, "venv", "bin", "python"), "install", "--index-url", index.url, "bench-top"], { env });
        return performance.now() - t;
      }],
      ...(Bun.which("uv")
        ? ([["`uv venv` + `uv pip install` (reference)", async () => {
            const { dir, env } = fresh();
            const t = performance.now();
            await timed(["uv", "venv", "--no-config", "--quiet", "--python", worker, join(dir, "venv")], { env });
            await timed(["uv", "pip", "install", "--no-config", "--quiet", "--python", join(dir, "venv", "bin", "python"), "--index-url", index.url, "bench-top"], { env });
            return performance.now() - t;
          }]] as [string, () => Promise<number>][])
        : []),
    ],
    coldRuns,
    1,
  );

  const versions = [
    `gpulayer ${(await run([bin, "--version"])).out.trim()} (${how})`,
    `bun ${Bun.version}`,
    (await run([worker, "--version"])).out.trim(),
    (await run([worker, "-m", "pip", "--version"])).out.trim().split(" from ")[0]!,
    Bun.which("uv") ? (await run(["uv", "--version"])).out.trim() : "uv: not on PATH",
  ];
  const lines = [
    "# Benchmark: `gpulayer env prepare`",
    "",
    "Made by `bun run bench/prepare.ts` (it rewrites this part; the notes below stay). Whole processes, alternated run by run;",
    "the request is 3 tiny wheels in a dependency chain (`bench-top` → `bench-mid` → `bench-leaf`) from a PEP 503",
    "index on 127.0.0.1; the worker is a venv with pip, made with uv.",
    "",
    `- machine: ${sh("nproc")} CPUs (nproc), ${sh("grep -m1 'model name' /proc/cpuinfo | cut -d: -f2") || process.arch}, load average at start ${sh("cut -d' ' -f1-3 /proc/loadavg")}`,
    `- ${versions.join("; ")}`,
    `- date: ${new Date().toISOString()}`,
    "",
    `## Warm: the env is there (${runs} runs each, after 3 warm-up runs)`,
    "",
    ...table(warm, "`python -c pass` (the worker's python)", "ms"),
    "",
    `## Warm against Bun's floor, the two alone, alternated (${floorRuns} runs each, after 3 warm-up runs; aim: within 2x)`,
    "",
    ...table(floorPair, "empty program, `bun build --compile` (Bun's floor)", "ms"),
    "",
    `## Warm, with inputs that cost the key work (${runs} runs each; aim: within 1.5x of the plain request)`,
    "",
    ...table(inputs, "`gpulayer env prepare` (warm, plain request)", "ms"),
    "",
    ...(imports.length ? [`## \`import ${heavy}\` in an env gpulayer built (bytecode compiled at build; aim: the first within 10% of the second)`, "", ...table(imports, "second and later imports", "ms"), ""] : []),
    `## Cold: a build from nothing (${coldRuns} runs each, after 1 warm-up; fresh GPULAYER_HOME, pip and uv caches every run)`,
    "",
    ...table(cold, "`python -m venv --without-pip` + `pip --python … install`", "s"),
    "",
    "Steps of the last cold gpulayer run (its progress on stderr):",
    "",
    "```",
    steps,
    "```",
  ];
  const doc = lines.join("\n");
  console.log(doc);
  writeReport("bench-prepare.md", doc);
} finally {
  index.stop();
  rmSync(work, { recursive: true, force: true });
}
