/**
 * Cold builds, side by side in one run: `gpulayer env prepare` by the uv fast
 * path (auto) and by the pip path (GPULAYER_INSTALLER=pip, the ADR's build),
 * against raw `uv venv` + `uv pip install` and raw `python -m venv
 * --without-pip` + `pip install` of the same request from the same local index
 * ($BENCH_INDEX, e.g. a local PEP 503 mirror). Every run has a
 * fresh GPULAYER_HOME and fresh pip and uv caches. Then the warm reuse.
 *
 * Cases: `tqdm` (the ADR's own) and `requests` on a small worker venv with pip;
 * `torchmetrics` (needs torch>=2) on a worker venv with torch 2.13.0 installed.
 * The torch worker is made once with the machine's own pip config (which
 * serves torch from a local file) and kept at $TMPDIR/gpulayer-bench-cold.
 *
 * Run: bun run bench/cold.ts   (BENCH_COLD_RUNS=5, BENCH_TORCH_RUNS=3, BENCH_WARM_RUNS=30, BENCH_REBUILD=1;
 * BENCH_ONLY=locked runs the locked project alone, BENCH_ONLY=changed its changed lock alone (with BENCH_BEFORE=PATH,
 * another gpulayer build beside it, on a home it seeded itself), BENCH_ONLY=big the 300-distribution worker alone,
 * BENCH_LOCKED_DEPS=requests,tqdm another lock than transformers)
 */
import { cpSync, existsSync, mkdirSync, mkdtempSync, readdirSync, readFileSync, rmSync, statSync, symlinkSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { basename, join } from "node:path";
import { makeDist } from "../test/fixtures/index.ts";
import { makeWorkerVenv } from "../test/helpers.ts";
import { benchIndex, ensureBinary, realUv, ROOT, stats, writeReport } from "./_lib.ts";

type Stats = ReturnType<typeof stats>;
type Env = Record<string, string>;

async function run(argv: string[], env?: Env) {
  const p = Bun.spawn(argv, { env, stdout: "pipe", stderr: "pipe", stdin: "ignore" });
  const [out, err, code] = await Promise.all([new Response(p.stdout).text(), new Response(p.stderr).text(), p.exited]);
  return { out, err, code };
}

async function must(argv: string[], env?: Env) {
  const r = await run(argv, env);
  if (r.code !== 0) throw new Error(`${argv.join(" ")} exited ${r.code}: ${r.err.slice(-2000)}`);
  return r;
}




/** Alternate the contenders run by run, so the machine's drift hits all alike. */
async function sideBySide(contenders: [string, () => Promise<number>][], runs: number): Promise<[string, Stats][]> {
  const samples = contenders.map(() => [] as number[]);
  for (let i = 0; i < runs; i++) for (const [j, [, fn]] of contenders.entries()) samples[j]!.push(await fn());
  return contenders.map(([name], j) => [name, stats(samples[j]!)]);
}

function table(rows: [string, Stats][], baseline: string, unit: "ms" | "s"): string[] {
  const base = rows.find(([n]) => n === baseline)![1].median;
  const f = (ms: number) => (unit === "s" ? `${(ms / 1000).toFixed(2)} s` : `${ms.toFixed(1)} ms`);
  return ["| | median | min | p90 | vs raw uv |", "|---|---:|---:|---:|---:|", ...rows.map(([n, s]) => `| ${n} | ${f(s.median)} | ${f(s.min)} | ${f(s.p90)} | ${(s.median / base).toFixed(2)}x |`)];
}

const sh = (cmd: string) => Bun.spawnSync(["sh", "-c", cmd]).stdout.toString().trim();
const { index: INDEX, findLinks: BENCH_WHEELS } = benchIndex();
const RAW_UV = "`uv venv` + `uv pip install` (raw)";

const { bin } = ensureBinary();
const uv = realUv() ?? (() => {
  throw new Error("uv is not on PATH (the cold benchmark compares against it)");
})();
const keep = join(tmpdir(), "gpulayer-bench-cold");
const work = mkdtempSync(join(tmpdir(), "gpl-bench-cold-"));
mkdirSync(join(work, "bin"));
symlinkSync(uv, join(work, "bin", "uv"));
const base: Env = {};
for (const [k, v] of Object.entries(process.env)) if (v !== undefined && !/^(PIP_|UV_|GPULAYER_)/.test(k)) base[k] = v;
Object.assign(base, { PATH: `${join(work, "bin")}:${process.env.PATH}`, PIP_DISABLE_PIP_VERSION_CHECK: "1", NO_COLOR: "1" });

// The torch worker: made once with the machine's own pip config (not isolated: it serves torch 2.13.0 from a local file).
const torchWorker = join(keep, "worker-torch");
const torchPy = join(torchWorker, "bin", "python");
let torchSetup = "kept from an earlier run";
if (!existsSync(join(torchWorker, ".ready"))) {
  rmSync(torchWorker, { recursive: true, force: true });
  mkdirSync(keep, { recursive: true });
  const t = performance.now();
  await must(["python3", "-m", "venv", torchWorker]);
  await must([join(torchWorker, "bin", "pip"), "install", "-q", "torch==2.13.0"], process.env as Env);
  torchSetup = `made in ${((performance.now() - t) / 1000).toFixed(0)} s (python3 -m venv; pip install torch==2.13.0)`;
  writeFileSync(join(torchWorker, ".ready"), "");
}
const smallPy = await makeWorkerVenv(join(work, "worker-small"), { withPip: true, env: { ...base, UV_CACHE_DIR: join(work, "uv-setup") } });

let n = 0;
const fresh = () => {
  const dir = join(work, `cold-${n++}`);
  mkdirSync(dir);
  return { dir, env: { ...base, GPULAYER_HOME: join(dir, "home"), PIP_CACHE_DIR: join(dir, "pip-cache"), UV_CACHE_DIR: join(dir, "uv-cache") } };
};
const sitePackages = (venv: string) => join(venv, "lib", "python3.11", "site-packages");
const hasTorch = (venv: string) => existsSync(join(sitePackages(venv), "torch"));
const du = (dir: string) => sh(`du -sh ${dir} | cut -f1`);

interface Notes {
  steps: Record<string, string>;
  torch: Record<string, string>;
}

/** A home that has built before: its interpreter probe, tools (stand-ins, a bare venv, pip's reading of its configuration) and stat cache of local files are kept; envs and pip/uv caches are fresh every run. */

/** `machine`: the case's machine pip configuration (PIP_CONFIG_FILE...), given to gpulayer and raw pip; raw uv gets `rawUvArgs` instead. */
/** `warmed`: the home a joining worker's warm-up left (warmedHome), in place of one that built this request before. */
async function coldCase(worker: string, spec: string, indexArgs: string[], runs: number, notes: Notes, machine: { env: Env; rawUvArgs: string[] } | null = null, before?: string, warmed?: string): Promise<[string, Stats][]> {
  const extra = machine?.env ?? {};
  const seedHome = warmed ?? join(work, "seed-home");
  if (!warmed) await must([bin, "env", "prepare", "-p", spec, ...indexArgs, "--python", worker, "--quiet"], { ...base, ...extra, GPULAYER_HOME: seedHome, UV_CACHE_DIR: join(work, "uv-seed"), PIP_CACHE_DIR: join(work, "pip-seed") });
  const gpulayer = (installer: "auto" | "pip", seeded = false, binary = bin) => async () => {
    const { env: freshEnv } = fresh();
    const env = { ...freshEnv, ...extra };
    if (seeded) for (const kept of ["interpreters-v1", "tools", "digests-v2"]) if (existsSync(join(seedHome, kept))) cpSync(join(seedHome, kept), join(env.GPULAYER_HOME, kept), { recursive: true });
    const t = performance.now();
    const r = await run([binary, "env", "prepare", "-p", spec, ...indexArgs, "--python", worker], { ...env, GPULAYER_INSTALLER: installer });
    const ms = performance.now() - t;
    if (r.code !== 0) throw new Error(r.err);
    const path = r.out.trim().split("\n").pop()!;
    const meta = JSON.parse(readFileSync(join(path, ".gpulayer", "meta.json"), "utf8"));
    if (installer === "auto" && meta.installerPath !== "uv (fast path)") throw new Error(`auto did not take the fast path: ${meta.installerFallback}`);
    notes.steps[installer] = r.err.trim();
    notes.torch[installer === "auto" ? "gpulayer, fast path" : "gpulayer, pip path"] = `${hasTorch(path) ? "torch INSTALLED again" : "no torch"} in the env's own site-packages; installed: ${meta.installed.join(", ")}; ${du(path)}`;
    return ms;
  };
  const rawUv = async () => {
    const { dir, env } = fresh();
    const venv = join(dir, "venv");
    const t = performance.now();
    await must(["uv", "venv", "--no-config", "--quiet", "--python", worker, venv], env);
    await must(["uv", "pip", "install", "--no-config", "--quiet", "--python", join(venv, "bin", "python"), ...(machine?.rawUvArgs ?? indexArgs), spec], env);
    const ms = performance.now() - t;
    notes.torch["raw uv"] = `${hasTorch(venv) ? "torch installed again" : "no torch"}; ${du(venv)}`;
    return ms;
  };
  const rawUvCompiled = async () => {
    const { dir, env } = fresh();
    const venv = join(dir, "venv");
    const t = performance.now();
    await must(["uv", "venv", "--no-config", "--quiet", "--python", worker, venv], env);
    await must(["uv", "pip", "install", "--no-config", "--quiet", "--compile-bytecode", "--python", join(venv, "bin", "python"), ...(machine?.rawUvArgs ?? indexArgs), spec], env);
    return performance.now() - t;
  };
  const rawPip = async () => {
    const { dir, env } = fresh();
    const venv = join(dir, "venv");
    const t = performance.now();
    await must([worker, "-m", "venv", "--without-pip", venv], env);
    await must([worker, "-m", "pip", "--python", join(venv, "bin", "python"), "install", "-q", ...indexArgs, spec], { ...env, PIP_CONFIG_FILE: "/dev/null", ...extra });
    const ms = performance.now() - t;
    notes.torch["raw pip"] = `${hasTorch(venv) ? "torch installed again" : "no torch"}; ${du(venv)}`;
    return ms;
  };
  const rows = await sideBySide(
    [
      ["`gpulayer env prepare`, uv fast path (auto)", gpulayer("auto")],
      [warmed ? "`gpulayer env prepare`, uv fast path, on a home a joining worker warmed (`gpulayer join`'s warm-up: probe and tools kept)" : "`gpulayer env prepare`, uv fast path, on a home that has built before (interpreter probe, tools and stat cache kept)", gpulayer("auto", true)],
      ...(before ? [[`the binary before (${before}), uv fast path (auto)`, gpulayer("auto", false, before)] as [string, () => Promise<number>]] : []),
      ["`gpulayer env prepare`, pip path (GPULAYER_INSTALLER=pip, the ADR's build)", gpulayer("pip")],
      [RAW_UV, rawUv],
      ["`uv venv` + `uv pip install --compile-bytecode` (raw, compiled as gpulayer's envs are)", rawUvCompiled],
      ["`python -m venv --without-pip` + `pip install` (raw)", rawPip],
    ],
    runs,
  );
  for (const d of readdirSync(work)) if (d.startsWith("cold-")) rmSync(join(work, d), { recursive: true, force: true });
  return rows;
}

/**
 * A uv project locked against the bench's index (`uv lock`, its [[tool.uv.index]] the index): `gpulayer env prepare
 * --project` (a fresh home, and a home that has built on this worker before) against raw `uv venv` + `uv sync
 * --frozen`, without and with `--compile-bytecode` (gpulayer compiles at build), fresh uv caches, alternated. Then
 * warm: the locked env found again, alternated with the plain warm prepare (`-p tqdm`, built on the same worker).
 */
/** A uv project (package = false) on `deps`, locked by `uv lock` against the bench's index. */
async function lockedProject(name: string, deps: string[]): Promise<string> {
  const proj = join(work, name);
  mkdirSync(proj, { recursive: true });
  writeFileSync(join(proj, "pyproject.toml"), `[project]\nname = "bench-locked"\nversion = "0.1"\nrequires-python = ">=3.11"\ndependencies = [${deps.map((d) => JSON.stringify(d)).join(", ")}]\n\n[tool.uv]\npackage = false\n\n[[tool.uv.index]]\nurl = "${INDEX}"\ndefault = true\n`);
  await must(["uv", "lock", "--project", proj, "--quiet"], { ...base, UV_CACHE_DIR: join(work, "uv-lock") });
  return proj;
}

async function lockedCase(worker: string, deps: string[], runs: number, warmRuns: number): Promise<{ cold: [string, Stats][]; changed: [string, Stats][]; warm: [string, Stats][]; packages: number }> {
  const proj = await lockedProject("locked-project", deps);
  // The project itself is a package of the lock too.
  const packages = (readFileSync(join(proj, "uv.lock"), "utf8").match(/^\[\[package\]\]$/gm)?.length ?? 1) - 1;
  const prepare = ["env", "prepare", "--project", proj, "--python", worker];
  // A home that has built on this worker (another env): its interpreter probe, tools (stand-ins, their check, uv's venv) and stat cache kept.
  const seed = join(work, "seed-locked");
  await must([bin, "env", "prepare", "-p", "tqdm", "--index-url", INDEX, "--python", worker, "--quiet"], { ...base, GPULAYER_HOME: seed, UV_CACHE_DIR: join(work, "uv-seed-locked") });
  const gpulayer = (seeded: boolean) => async () => {
    const { env } = fresh();
    if (seeded) for (const kept of ["interpreters-v1", "tools", "digests-v2"]) if (existsSync(join(seed, kept))) cpSync(join(seed, kept), join(env.GPULAYER_HOME, kept), { recursive: true });
    const t = performance.now();
    await must([bin, ...prepare, "--quiet"], env);
    return performance.now() - t;
  };
  const rawSync = (compile: boolean) => async () => {
    const { dir, env } = fresh();
    const venv = join(dir, "venv");
    const t = performance.now();
    await must(["uv", "venv", "--no-config", "--quiet", "--python", worker, venv], env);
    await must(["uv", "sync", "--frozen", "--quiet", ...(compile ? ["--compile-bytecode"] : []), "--project", proj], { ...env, UV_PROJECT_ENVIRONMENT: venv });
    return performance.now() - t;
  };
  const cold = await sideBySide(
    [
      [COLD_LOCKED, gpulayer(false)],
      ["`gpulayer env prepare --project`, on a home that has built on this worker before", gpulayer(true)],
      [RAW_SYNC, rawSync(false)],
      ["`uv venv` + `uv sync --frozen --compile-bytecode` (raw, compiled as gpulayer's envs are)", rawSync(true)],
    ],
    runs,
  );
  for (const d of readdirSync(work)) if (d.startsWith("cold-")) rmSync(join(work, d), { recursive: true, force: true });
  const changed = await changedLockCase(worker, proj, deps, runs);
  const warmEnv = { ...base, GPULAYER_HOME: join(work, "home-locked"), UV_CACHE_DIR: join(work, "uv-locked") };
  const plain = ["env", "prepare", "-p", "tqdm", "--index-url", INDEX, "--python", worker];
  await must([bin, ...prepare], warmEnv);
  await must([bin, ...plain], warmEnv);
  const timed = (argv: string[]) => async () => {
    const t = performance.now();
    await must([bin, ...argv, "--quiet"], warmEnv);
    return performance.now() - t;
  };
  for (let i = 0; i < 3; i++) for (const argv of [prepare, plain]) await timed(argv)();
  const warm = await sideBySide([[WARM_LOCKED, timed(prepare)], [WARM_PLAIN, timed(plain)]], warmRuns);
  return { cold, changed, warm, packages };
}

/**
 * The lock changed (a dependency added: a new key, a new env), on a worker that built the lock before: gpulayer's
 * home and uv cache, and raw uv's uv cache, each as the earlier lock's build left them (copied afresh for every run,
 * files linked), so each side reuses what its own earlier build kept: uv its cache, gpulayer that and its bytecode.
 */
async function changedLockCase(worker: string, earlier: string, deps: string[], runs: number, before?: string): Promise<[string, Stats][]> {
  const after = await lockedProject("locked-project-changed", [...deps, "attrs"]);
  const seedRawUv = join(work, "changed-seed-raw-uv");
  const seedVenv = join(work, "changed-seed-venv");
  // Made anew on each call (the case runs once to warm up first).
  for (const d of [seedRawUv, seedVenv]) rmSync(d, { recursive: true, force: true });
  await must(["uv", "venv", "--no-config", "--quiet", "--python", worker, seedVenv], { ...base, UV_CACHE_DIR: seedRawUv });
  await must(["uv", "sync", "--frozen", "--quiet", "--project", earlier], { ...base, UV_CACHE_DIR: seedRawUv, UV_PROJECT_ENVIRONMENT: seedVenv });
  const linkedCopy = (from: string, to: string) => must(["cp", "-al", from, to]);
  // Each binary's own earlier build (its home's bytecode store is its own to read).
  const gpulayer = async (binary: string) => {
    const seedHome = join(work, `changed-seed-home-${basename(binary)}`);
    const seedUv = join(work, `changed-seed-uv-${basename(binary)}`);
    if (!existsSync(seedHome)) await must([binary, "env", "prepare", "--project", earlier, "--python", worker, "--quiet"], { ...base, GPULAYER_HOME: seedHome, UV_CACHE_DIR: seedUv });
    return async () => {
      const { dir, env } = fresh();
      mkdirSync(env.GPULAYER_HOME);
      for (const kept of ["interpreters-v1", "tools", "digests-v2", "bytecode-v1"]) if (existsSync(join(seedHome, kept))) await linkedCopy(join(seedHome, kept), join(env.GPULAYER_HOME, kept));
      await linkedCopy(seedUv, env.UV_CACHE_DIR);
      settle();
      const t = performance.now();
      const r = await must([binary, "env", "prepare", "--project", after, "--python", worker, "--verbose"], env);
      const ms = performance.now() - t;
      if (binary === bin) changedSteps = r.err.split("\n").filter((l) => /^\[|took|bytecode:|built in/.test(l));
      rmSync(dir, { recursive: true, force: true });
      return ms;
    };
  };
  for (const d of readdirSync(work)) if (d.startsWith("changed-seed-home-") || d.startsWith("changed-seed-uv-")) rmSync(join(work, d), { recursive: true, force: true });
  const rawSync = (compile: boolean) => async () => {
    const { dir, env } = fresh();
    await linkedCopy(seedRawUv, env.UV_CACHE_DIR);
    const venv = join(dir, "venv");
    settle();
    const t = performance.now();
    await must(["uv", "venv", "--no-config", "--quiet", "--python", worker, venv], env);
    await must(["uv", "sync", "--frozen", "--quiet", ...(compile ? ["--compile-bytecode"] : []), "--project", after], { ...env, UV_PROJECT_ENVIRONMENT: venv });
    const ms = performance.now() - t;
    rmSync(dir, { recursive: true, force: true });
    return ms;
  };
  return sideBySide(
    [
      [CHANGED_LOCKED, await gpulayer(bin)],
      [CHANGED_RAW, rawSync(false)],
      ["`uv venv` + `uv sync --frozen --compile-bytecode` of the changed lock (raw, the same uv cache)", rawSync(true)],
      ...(before ? [[`the binary before (${before}), the same`, await gpulayer(before)] as [string, () => Promise<number>]] : []),
    ],
    runs,
  );
}
/** The last run's deleted trees and copies written out before the next is timed: each starts on a quiet disk. */
const settle = () => Bun.spawnSync(["sync"]);
/** Where the last changed-lock build went (--verbose), for the report. */
let changedSteps: string[] = [];
const CHANGED_LOCKED = "`gpulayer env prepare --project`, the lock changed (`attrs` added), on a home that built it before";
const CHANGED_RAW = "`uv venv` + `uv sync --frozen` of the changed lock (raw, a uv cache that synced it before)";
const COLD_LOCKED = "`gpulayer env prepare --project` (uv.lock)";
const RAW_SYNC = "`uv venv` + `uv sync --frozen` (raw)";
const WARM_LOCKED = "`gpulayer env prepare --project` (warm: reused)";
const WARM_PLAIN = "`gpulayer env prepare -p tqdm` (warm: reused; the plain warm prepare)";
// The transformers stack's lock by default (the issue's case): transformers and what it needs, from the bench's index.
const LOCKED_DEPS = (process.env.BENCH_LOCKED_DEPS ?? "transformers").split(",");

/** The locked case's part of the report: its tables and its ratios against the aims. */
function lockedReport(locked: Awaited<ReturnType<typeof lockedCase>>, runs: number, warmRuns: number): string[] {
  const median = (rows: [string, Stats][], name: string) => rows.find(([n]) => n === name)![1].median;
  const [fresh, seeded, raw, rawCompiled] = locked.cold.map(([, s]) => s.median);
  const [changed, changedRaw, changedRawCompiled] = locked.changed.map(([, s]) => s.median);
  const warmRatio = median(locked.warm, WARM_LOCKED) / median(locked.warm, WARM_PLAIN);
  return [
    `## A uv project locked on ${LOCKED_DEPS.join(", ")} (${locked.packages} packages; ${runs} runs each; aim: within 1.15x of raw \`uv sync --frozen\`, warm within 1.2x of the plain warm prepare)`,
    "",
    ...table(locked.cold, RAW_SYNC, "s"),
    "",
    `- cold: ${(fresh! / raw!).toFixed(2)}x raw \`uv sync --frozen\` (${(seeded! / raw!).toFixed(2)}x on a home that has built before); ${(fresh! / rawCompiled!).toFixed(2)}x (${(seeded! / rawCompiled!).toFixed(2)}x) raw uv compiling bytecode as gpulayer does`,
    "",
    ...table(locked.changed, CHANGED_RAW, "s"),
    "",
    `- the lock changed: ${(changed! / changedRaw!).toFixed(2)}x raw \`uv sync --frozen\`; ${(changed! / changedRawCompiled!).toFixed(2)}x raw uv compiling bytecode as gpulayer does; where its last run went (\`--verbose\`):`,
    "",
    "```",
    ...changedSteps,
    "```",
    `- warm: ${warmRatio.toFixed(2)}x the plain warm prepare (${warmRuns} runs each, alternated, after 3 warm-up runs of each)`,
    "",
    "| | median | min | p90 |",
    "|---|---:|---:|---:|",
    ...locked.warm.map(([name, s]) => `| ${name} | ${s.median.toFixed(1)} ms | ${s.min.toFixed(1)} ms | ${s.p90.toFixed(1)} ms |`),
  ];
}

/** A big worker: 300 distributions (small fixture wheels, plus torch when BENCH_FIND_LINKS has it), as a real GPU venv holds; kept between runs. */
async function bigWorker(): Promise<string> {
  const dir = join(keep, "worker-300");
  if (!existsSync(join(dir, ".ready"))) {
    rmSync(dir, { recursive: true, force: true });
    const wheels = join(keep, "wheels-300");
    mkdirSync(wheels, { recursive: true });
    const names = Array.from({ length: 299 }, (_, i) => `bench-dist-${i}`);
    for (const name of names) makeDist("wheel", wheels, { name, version: "1.0" });
    await must(["python3", "-m", "venv", dir]);
    await must([join(dir, "bin", "pip"), "install", "-q", "--no-index", "--find-links", wheels, ...names], base);
    if (BENCH_WHEELS) await must([join(dir, "bin", "pip"), "install", "-q", "--no-deps", "--no-index", "--find-links", BENCH_WHEELS, "torch"], base).catch(() => undefined);
    writeFileSync(join(dir, ".ready"), "");
  }
  return join(dir, "bin", "python");
}

/** A fresh home as `gpulayer join` leaves it once warmed up (worker/warm.ts): a real server and worker on 127.0.0.1, stopped after the warm-up's line. */
async function warmedHome(python: string): Promise<string> {
  const home = join(work, "warmed-home");
  const env = { ...base, GPULAYER_TOKEN: "bench-warm-token-0123456789", GPULAYER_WORKER_ENGINE: "none" };
  const procs: Bun.Subprocess<"ignore", "pipe", "pipe">[] = [];
  /** Both streams of a process, as one text that grows (gpulayer logs on stderr, --json documents on stdout). */
  const said = (argv: string[], home: string) => {
    const proc = Bun.spawn(argv, { env: { ...env, GPULAYER_HOME: home }, stdin: "ignore", stdout: "pipe", stderr: "pipe" });
    procs.push(proc);
    const text = { all: "" };
    for (const stream of [proc.stdout, proc.stderr]) void (async () => { for await (const c of stream) text.all += new TextDecoder().decode(c); })();
    return text;
  };
  const until = async (what: string, text: { all: string }, done: RegExp) => {
    for (const deadline = Date.now() + 60_000; !done.test(text.all); await Bun.sleep(50)) if (Date.now() > deadline) throw new Error(`no ${what} within 60 s: ${text.all.slice(-2000)}`);
  };
  try {
    const server = said([bin, "server", "--listen", "127.0.0.1:0", "--json"], join(work, "warm-server"));
    await until("server URL", server, /"url": "[^"]+"/);
    const worker = said([bin, "join", /"url": "([^"]+)"/.exec(server.all)![1]!, "--name", "bench", "--python", python], home);
    await until("warm-up", worker, /warmed up for a first build|warm-up (failed|skipped)/);
    if (!worker.all.includes("warmed up")) throw new Error(`the worker did not warm up: ${worker.all.slice(-2000)}`);
    return home;
  } finally {
    for (const p of procs) p.kill("SIGKILL");
    await Promise.all(procs.map((p) => p.exited));
  }
}

if (process.env.BENCH_ONLY === "big") {
  // The 300-distribution worker alone, printed, the report untouched: BENCH_ONLY=big bun run bench/cold.ts
  try {
    const runs = Number(process.env.BENCH_COLD_RUNS ?? 5);
    const idx = ["--index-url", INDEX];
    const py = await bigWorker();
    await coldCase(py, "tqdm", idx, 1, { steps: {}, torch: {} });
    const notes: Notes = { steps: {}, torch: {} };
    // BENCH_BEFORE=PATH: another gpulayer build's fresh-home build, in the same alternation.
    console.log(table(await coldCase(py, "tqdm", idx, runs, notes, null, process.env.BENCH_BEFORE, await warmedHome(py)), RAW_UV, "s").join("\n"));
    console.log(`\nsteps of the last fresh-home build:\n${notes.steps.auto}`);
  } finally {
    rmSync(work, { recursive: true, force: true });
  }
  process.exit(0);
}

if (process.env.BENCH_ONLY === "changed") {
  // The changed lock alone, printed: BENCH_ONLY=changed [BENCH_BEFORE=PATH] bun run bench/cold.ts
  try {
    const runs = Number(process.env.BENCH_COLD_RUNS ?? 9);
    const earlier = await lockedProject("locked-project", LOCKED_DEPS);
    await changedLockCase(smallPy, earlier, LOCKED_DEPS, 1, process.env.BENCH_BEFORE);
    console.log(table(await changedLockCase(smallPy, earlier, LOCKED_DEPS, runs, process.env.BENCH_BEFORE), CHANGED_RAW, "s").join("\n"));
    console.log(["", "last run (--verbose):", ...changedSteps].join("\n"));
  } finally {
    rmSync(work, { recursive: true, force: true });
  }
  process.exit(0);
}

if (process.env.BENCH_ONLY === "locked") {
  // This case alone, printed, the report untouched: BENCH_ONLY=locked bun run bench/cold.ts
  try {
    const runs = Number(process.env.BENCH_COLD_RUNS ?? 5);
    const warmRuns = Number(process.env.BENCH_WARM_RUNS ?? 30);
    await lockedCase(smallPy, LOCKED_DEPS, 1, 1);
    console.log(lockedReport(await lockedCase(smallPy, LOCKED_DEPS, runs, warmRuns), runs, warmRuns).join("\n"));
  } finally {
    rmSync(work, { recursive: true, force: true });
  }
  process.exit(0);
}

try {
  const runs = Number(process.env.BENCH_COLD_RUNS ?? 5);
  const torchRuns = Number(process.env.BENCH_TORCH_RUNS ?? 3);
  const warmRuns = Number(process.env.BENCH_WARM_RUNS ?? 30);
  const idx = ["--index-url", INDEX];
  // One warm-up of each, not counted: the page cache holds the index and the interpreters after it.
  await coldCase(smallPy, "tqdm", idx, 1, { steps: {}, torch: {} });
  const tqdmNotes: Notes = { steps: {}, torch: {} };
  const tqdm = await coldCase(smallPy, "tqdm", idx, runs, tqdmNotes);
  const requests = await coldCase(smallPy, "requests", idx, runs, { steps: {}, torch: {} });
  // torch comes from the machine's wheel folder for whoever installs it; gpulayer gets the same options.
  const torchNotes: Notes = { steps: {}, torch: {} };
  const torchIdx = [...idx, ...(BENCH_WHEELS ? ["--find-links", BENCH_WHEELS] : [])];
  const torch = await coldCase(torchPy, "torchmetrics", torchIdx, torchRuns, torchNotes);

  const bigPy = await bigWorker();
  const bigCount = readdirSync(sitePackages(join(keep, "worker-300"))).filter((d) => d.endsWith(".dist-info")).length;
  const bigNotes: Notes = { steps: {}, torch: {} };
  const big = await coldCase(bigPy, "tqdm", idx, runs, bigNotes);

  // The machine's pip configuration, as GPU boxes behind a mirror have it: a pip.conf with the index, a find-links
  // folder and a constraint file, no --index-url given. gpulayer gives uv what pip reads there; raw uv gets the same as flags.
  const conf = join(work, "machine");
  mkdirSync(join(conf, "links"), { recursive: true });
  makeDist("wheel", join(conf, "links"), { name: "bench-local-extra", version: "1.0" });
  writeFileSync(join(conf, "constraints.txt"), "tqdm<5\n");
  writeFileSync(join(conf, "pip.conf"), `[global]\nindex-url = ${INDEX}\nfind-links = ${join(conf, "links")}\nconstraint = ${join(conf, "constraints.txt")}\ntimeout = 60\n`);
  // Only that file: the bench machine's own user and site pip files (a home and XDG_CONFIG_DIRS of their own) would add options raw uv is not given.
  mkdirSync(join(conf, "home"), { recursive: true });
  const machineNotes: Notes = { steps: {}, torch: {} };
  const machineRows = await coldCase(smallPy, "tqdm", [], runs, machineNotes, {
    env: { PIP_CONFIG_FILE: join(conf, "pip.conf"), HOME: join(conf, "home"), XDG_CONFIG_DIRS: join(conf, "home") },
    rawUvArgs: ["--index-url", INDEX, "--find-links", join(conf, "links"), "-c", join(conf, "constraints.txt")],
  });

  const locked = await lockedCase(smallPy, LOCKED_DEPS, runs, warmRuns);

  // Warm: the tqdm env built once (fast path), then whole processes that find it.
  const warmEnv = { ...base, GPULAYER_HOME: join(work, "home-warm"), PIP_CACHE_DIR: join(work, "pip-warm"), UV_CACHE_DIR: join(work, "uv-warm") };
  const request = ["env", "prepare", "-p", "tqdm", ...idx, "--python", smallPy];
  await must([bin, ...request], warmEnv);
  const warmSamples = { reuse: [] as number[], python: [] as number[] };
  for (let i = 0; i < warmRuns + 3; i++) {
    let t = performance.now();
    await must([bin, ...request, "--quiet"], warmEnv);
    if (i >= 3) warmSamples.reuse.push(performance.now() - t);
    t = performance.now();
    await must([smallPy, "-c", "pass"], warmEnv);
    if (i >= 3) warmSamples.python.push(performance.now() - t);
  }
  const warm: [string, Stats][] = [
    ["`python -c pass` (the worker's python)", stats(warmSamples.python)],
    ["`gpulayer env prepare -p tqdm` (warm: reused)", stats(warmSamples.reuse)],
  ];

  const versions = [`bun ${Bun.version}`, (await run([smallPy, "--version"])).out.trim(), (await run([smallPy, "-m", "pip", "--version"])).out.trim().split(" from ")[0]!, (await run([uv, "--version"])).out.trim()];
  const ratio = (rows: [string, Stats][], a: string, b: string) => rows.find(([x]) => x.startsWith(a))![1].median / rows.find(([x]) => x.startsWith(b))![1].median;
  const summary = (name: string, rows: [string, Stats][]) =>
    `- ${name}: fast path ${ratio(rows, "`gpulayer env prepare`, uv fast path (auto)", RAW_UV).toFixed(2)}x raw uv (${ratio(rows, "`gpulayer env prepare`, uv fast path, on", RAW_UV).toFixed(2)}x on a home that has built before; ${ratio(rows, "`gpulayer env prepare`, uv fast path, on", "`uv venv` + `uv pip install --compile-bytecode`").toFixed(2)}x raw uv compiling bytecode as gpulayer does); pip path ${ratio(rows, "`gpulayer env prepare`, pip", "`gpulayer env prepare`, uv fast path (auto)").toFixed(1)}x the fast path`;
  const doc = [
    "# Benchmark: cold builds, the uv fast path against the pip path (the ADR), raw uv and raw pip",
    "",
    "Made by `bun run bench/cold.ts` (it rewrites this part; the notes below stay). Whole processes, alternated run by",
    "run, each with a fresh GPULAYER_HOME (one row keeps what an earlier build left besides its env: the interpreter probe, tools and the stat cache) and fresh pip and",
    "uv caches; every contender gets the same request from the same",
    `local index (\`${INDEX}\`, a PEP 503 folder on this machine) and the same uv binary (${uv}, not a pyenv shim).`,
    "",
    `- machine: ${sh("nproc")} CPUs (nproc), ${sh("grep -m1 'model name' /proc/cpuinfo | cut -d: -f2") || process.arch}, ${sh("free -g | awk '/Mem:/{print $2}'")} GiB, load average at start ${sh("cut -d' ' -f1-3 /proc/loadavg")}`,
    `- gpulayer ${(await run([bin, "--version"])).out.trim()} (dist/gpulayer); ${versions.join("; ")}`,
    `- date: ${new Date().toISOString()}`,
    `- torch worker: ${torchWorker} (${torchSetup}); small worker: a venv with pip, made with uv`,
    "",
    summary("tqdm", tqdm),
    summary("requests", requests),
    summary("torchmetrics on the torch worker", torch),
    summary(`tqdm on a worker with ${bigCount} distributions`, big),
    summary("tqdm under the machine's pip configuration (pip.conf: index, find-links, constraint)", machineRows),
    `- warm reuse: median ${stats(warmSamples.reuse).median.toFixed(1)} ms whole-process`,
    "",
    `## \`tqdm\` (the ADR's case; ${runs} runs each, after one warm-up)`,
    "",
    ...table(tqdm, RAW_UV, "s"),
    "",
    `## \`requests\` (5 packages; ${runs} runs each)`,
    "",
    ...table(requests, RAW_UV, "s"),
    "",
    `## \`torchmetrics\` on a worker with torch 2.13.0 (${torchRuns} runs each; \`--find-links $BENCH_FIND_LINKS\` offers torch to all)`,
    "",
    ...table(torch, RAW_UV, "s"),
    "",
    "What each left (last run):",
    "",
    ...Object.entries(torchNotes.torch).map(([k, v]) => `- ${k}: ${v}`),
    "",
    `## \`tqdm\` on a worker with ${bigCount} distributions (${runs} runs each; aim: within 1.15x of raw uv)`,
    "",
    ...table(big, RAW_UV, "s"),
    "",
    `## \`tqdm\` under the machine's pip configuration (${runs} runs each; aim: within 1.3x of raw uv given the same options as flags)`,
    "",
    ...table(machineRows, RAW_UV, "s"),
    "",
    ...lockedReport(locked, runs, warmRuns),
    "",
    `## Warm: the \`tqdm\` env is there (${warmRuns} runs each, after 3 warm-up runs)`,
    "",
    "| | median | min | p90 |",
    "|---|---:|---:|---:|",
    ...warm.map(([name, s]) => `| ${name} | ${s.median.toFixed(1)} ms | ${s.min.toFixed(1)} ms | ${s.p90.toFixed(1)} ms |`),
    "",
    "Steps of the last cold `tqdm` builds (gpulayer's progress on stderr):",
    "",
    "```",
    tqdmNotes.steps.auto ?? "",
    "",
    tqdmNotes.steps.pip ?? "",
    "```",
    "",
    "Steps of the last cold `torchmetrics` builds:",
    "",
    "```",
    torchNotes.steps.auto ?? "",
    "",
    torchNotes.steps.pip ?? "",
    "```",,
    "",
    `Steps of the last cold fast-path builds on the ${bigCount}-distribution worker and under the machine's pip configuration:`,
    "",
    "```",
    (bigNotes.steps.auto ?? "").split("\n").filter((l) => !l.startsWith("warning: pip check")).join("\n"),
    "",
    machineNotes.steps.auto ?? "",
    "```",
  ].join("\n");
  console.log(doc);
  writeReport("bench-cold.md", doc);
} finally {
  rmSync(work, { recursive: true, force: true });
}
