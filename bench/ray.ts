/**
 * gpulayer against Ray's runtime_env `pip` (the anchor in DESIGN.md, "Anchors and what they lack"), side by side in
 * one run, on the same requests from the same local index ($BENCH_INDEX, e.g. a local PEP 503 mirror).
 *
 * Ray: a venv with ray (+ virtualenv, which Ray's pip plugin imports) made once and kept at
 * $TMPDIR/gpulayer-bench-ray/ray-venv; bench/ray_job.py starts a local Ray (ray.init(num_cpus=1,
 * include_dashboard=False)) with PIP_INDEX_URL/PIP_CONFIG_FILE=/dev/null in its environment (Ray's pip plugin runs pip
 * with the agent's os.environ) and times, inside the driver, ray.get of: a task without runtime_env (a worker that is
 * there, and a new worker process each call), the first task with runtime_env={"pip": ["tqdm"]} (Ray creates the env),
 * the same again (Ray's warm case: the idle worker is reused) and the same with max_calls=1 (the env is there, a new
 * worker process each call). Every run of ray_job.py is a new Ray session, so its first call shows whether Ray reuses
 * the env an earlier session built (it is still on disk under <temp>/session_<id>/runtime_resources/pip/<sha1>).
 *
 * gpulayer: dist/gpulayer on the same worker interpreter (the ray venv's python): `env prepare` cold (fresh
 * GPULAYER_HOME, fresh pip and uv caches) by the uv fast path and by the pip path (GPULAYER_INSTALLER=pip, the ADR's
 * build), `job run -- python -c "import tqdm"` cold and warm, `env prepare` warm. Whole processes.
 *
 * Second request: torchmetrics on a worker venv that has torch 2.13.0 (+ ray), kept at
 * $TMPDIR/gpulayer-bench-ray/ray-torch-venv: what Ray's env holds (it clones the whole venv) against gpulayer's.
 *
 * Last, bench/ray-plugin.ts: gpulayer's Ray plugin against Ray's `pip` and `uv` and no runtime_env, on one cluster.
 *
 * Run: bun run bench/ray.ts   (BENCH_RAY_RUNS=3, BENCH_RAY_TORCH_RUNS=2, BENCH_COLD_RUNS=5, BENCH_WARM_RUNS=10, BENCH_REBUILD=1)
 */
import { existsSync, mkdirSync, mkdtempSync, readdirSync, readFileSync, rmSync, statSync, symlinkSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { basename, dirname, join } from "node:path";
import { benchIndex, ensureBinary, realUv, ROOT, stats, writeReport } from "./_lib.ts";
import { rayPluginBench } from "./ray-plugin.ts";

type Stats = ReturnType<typeof stats>;
type Env = Record<string, string>;
type Row = [string, Stats | null, string?];

async function run(argv: string[], env?: Env, timeoutMs = 600_000) {
  const p = Bun.spawn(argv, { env, stdout: "pipe", stderr: "pipe", stdin: "ignore" });
  const timer = setTimeout(() => p.kill("SIGTERM"), timeoutMs);
  const [out, err, code] = await Promise.all([new Response(p.stdout).text(), new Response(p.stderr).text(), p.exited]);
  clearTimeout(timer);
  return { out, err, code };
}

async function must(argv: string[], env?: Env, timeoutMs?: number) {
  const r = await run(argv, env, timeoutMs);
  if (r.code !== 0) throw new Error(`${argv.join(" ")} exited ${r.code}: ${(r.err || r.out).slice(-3000)}`);
  return r;
}




const sh = (cmd: string) => Bun.spawnSync(["sh", "-c", cmd]).stdout.toString().trim();
const du = (p: string) => sh(`du -sh '${p}' | cut -f1`);
const sitePackages = (venv: string) => join(venv, "lib", "python3.11", "site-packages");
const median = (xs: number[]) => stats(xs).median;
const fmt = (ms: number) => (ms >= 1000 ? `${(ms / 1000).toFixed(2)} s` : `${ms.toFixed(1)} ms`);

const { index: INDEX, findLinks: BENCH_WHEELS } = benchIndex();
// torch's wheel folder, offered to Ray and gpulayer alike.
const WHEELS = BENCH_WHEELS ?? (() => {
  throw new Error("set BENCH_FIND_LINKS to a folder with the torch wheel");
})();
const keep = join(tmpdir(), "gpulayer-bench-ray");
const rayTemp = join(keep, "rt"); // Ray's _temp_dir: sessions (and their runtime_resources) land here
const work = mkdtempSync(join(tmpdir(), "gpl-bench-ray-"));
const { bin } = ensureBinary();
const uv = realUv();

// One environment for every contender: none of the machine's PIP_*/UV_*/GPULAYER_* settings, pip's config files shut out.
const base: Env = {};
for (const [k, v] of Object.entries(process.env)) if (v !== undefined && !/^(PIP_|UV_|GPULAYER_)/.test(k)) base[k] = v;
if (uv) {
  mkdirSync(join(work, "bin"));
  symlinkSync(uv, join(work, "bin", "uv"));
  base.PATH = `${join(work, "bin")}:${process.env.PATH}`;
}
Object.assign(base, { PIP_CONFIG_FILE: "/dev/null", PIP_DISABLE_PIP_VERSION_CHECK: "1", NO_COLOR: "1" });

/** A venv with ray, made once with `python3 -m venv` + pip from the local index; kept across runs. */
async function rayVenv(name: string, packages: string[], findLinks: boolean): Promise<{ venv: string; py: string; setup: string }> {
  const venv = join(keep, name);
  const ready = join(venv, ".ready");
  if (existsSync(ready)) return { venv, py: join(venv, "bin", "python"), setup: `kept from an earlier run (${readFileSync(ready, "utf8").trim()})` };
  rmSync(venv, { recursive: true, force: true });
  mkdirSync(keep, { recursive: true });
  const t = performance.now();
  await must(["python3", "-m", "venv", venv], base);
  const links = findLinks ? ["--find-links", WHEELS] : [];
  await must([join(venv, "bin", "python"), "-m", "pip", "install", "-q", "--index-url", INDEX, ...links, ...packages], { ...base, PIP_CACHE_DIR: join(work, "pip-setup") });
  const note = `made in ${((performance.now() - t) / 1000).toFixed(1)} s: python3 -m venv; pip install --index-url ${INDEX}${findLinks ? ` --find-links ${WHEELS}` : ""} ${packages.join(" ")}`;
  writeFileSync(ready, note + "\n");
  return { venv, py: join(venv, "bin", "python"), setup: note };
}

interface RayOut {
  ray: string;
  init_s: number;
  session_dir: string;
  baseline_first_s?: number;
  baseline_task_s?: number[];
  baseline_new_worker_s?: number[];
  baseline_new_worker_distinct_pids?: number;
  pip_dirs_before: string[];
  cold_s: number;
  env_python: string;
  module_version: string | null;
  module_file: string | null;
  warm_same_worker_s: number[];
  warm_new_worker_s: number[];
  warm_new_worker_distinct_pids: number;
  pip_dirs_after: string[];
  shutdown_s: number;
  setup_log: string[];
}

interface Session extends RayOut {
  hash: string;
  envDir: string;
  earlierOnDisk: string[]; // the same sha1 under earlier sessions' dirs, still there when this session began
  rebuilt: boolean; // this session's agent cloned/created a virtualenv and ran pip install
  wallS: number;
}

/** One new Ray session (one process of bench/ray_job.py). */
async function raySession(py: string, pip: string[], module: string, repeat: number, baseline: boolean, findLinks: boolean): Promise<Session> {
  const before = existsSync(rayTemp) ? readdirSync(rayTemp).filter((d) => d.startsWith("session_2")) : [];
  const env: Env = { ...base, PIP_INDEX_URL: INDEX, ...(findLinks ? { PIP_FIND_LINKS: WHEELS } : {}) };
  const cfg = JSON.stringify({ temp_dir: rayTemp, pip, module, repeat, baseline });
  const t = performance.now();
  const r = await must([py, join(ROOT, "bench", "ray_job.py"), cfg], env, 420_000);
  const wallS = (performance.now() - t) / 1000;
  const out = JSON.parse(r.out.trim().split("\n").pop()!) as RayOut;
  const envDir = out.pip_dirs_after[0];
  if (!envDir) throw new Error(`Ray made no pip env: ${r.err.slice(-2000)}`);
  const hash = basename(envDir);
  const earlierOnDisk = before.map((s) => join(rayTemp, s, "runtime_resources", "pip", hash)).filter((p) => existsSync(join(p, "virtualenv", "bin", "python")));
  const rebuilt = out.setup_log.some((l) => /Cloning virtualenv|Creating virtualenv/.test(l)) && out.setup_log.some((l) => l.includes("Installing python requirements"));
  return { ...out, hash, envDir, earlierOnDisk, rebuilt, wallS };
}

/** Fresh GPULAYER_HOME and fresh pip and uv caches. */
let n = 0;
function freshEnv(): Env {
  const dir = join(work, `cold-${n++}`);
  mkdirSync(dir);
  return { ...base, GPULAYER_HOME: join(dir, "home"), PIP_CACHE_DIR: join(dir, "pip-cache"), UV_CACHE_DIR: join(dir, "uv-cache") };
}

async function timed(argv: string[], env: Env): Promise<[number, string]> {
  const t = performance.now();
  const r = await must(argv, env);
  return [performance.now() - t, r.out];
}

interface EnvNote {
  path: string;
  installerPath: string;
  installed: string[];
  torchInOwnSitePackages: boolean;
  size: string;
}

function envNote(json: string): EnvNote {
  const j = JSON.parse(json);
  const meta = JSON.parse(readFileSync(join(j.path, ".gpulayer", "meta.json"), "utf8"));
  return { path: j.path, installerPath: j.installer_path ?? meta.installerPath, installed: meta.installed, torchInOwnSitePackages: existsSync(join(sitePackages(j.path), "torch")), size: du(j.path) };
}

/** gpulayer's side of one request: cold (fast path, pip path, job run) then warm. */
async function gpulayerCase(worker: string, spec: string, module: string, idx: string[], coldRuns: number, pipRuns: number, warmRuns: number) {
  const prepare = ["env", "prepare", "-p", spec, ...idx, "--python", worker];
  const job = ["job", "run", "-p", spec, ...idx, "--python", worker, "--quiet", "--", "python", "-c", `import ${module}`];
  const s = { fast: [] as number[], pip: [] as number[], jobCold: [] as number[], warm: [] as number[], jobWarm: [] as number[], floor: [] as number[] };
  let fastNote: EnvNote | null = null;
  let pipNote: EnvNote | null = null;
  for (let i = 0; i < Math.max(coldRuns, pipRuns); i++) {
    if (i < coldRuns) {
      const [ms, out] = await timed([bin, ...prepare, "--json"], freshEnv());
      s.fast.push(ms);
      fastNote = envNote(out);
      if (fastNote.installerPath !== "uv (fast path)") throw new Error(`gpulayer did not take the fast path: ${fastNote.installerPath}`);
      s.jobCold.push((await timed([bin, ...job], freshEnv()))[0]);
    }
    if (i < pipRuns) {
      const [ms, out] = await timed([bin, ...prepare, "--json"], { ...freshEnv(), GPULAYER_INSTALLER: "pip" });
      s.pip.push(ms);
      pipNote = envNote(out);
    }
  }
  const warmEnv = freshEnv();
  const built = envNote((await must([bin, ...prepare, "--json"], warmEnv)).out);
  await must([bin, ...job], warmEnv);
  for (let i = 0; i < warmRuns; i++) {
    s.warm.push((await timed([bin, ...prepare, "--json"], warmEnv))[0]);
    s.jobWarm.push((await timed([bin, ...job], warmEnv))[0]);
    s.floor.push((await timed([join(built.path, "bin", "python"), "-c", `import ${module}`], warmEnv))[0]);
  }
  for (const d of readdirSync(work)) if (d.startsWith("cold-")) rmSync(join(work, d), { recursive: true, force: true });
  return { s, fastNote: fastNote!, pipNote: pipNote! };
}

/** Ray's setup steps of one session, times relative to the first, paths shortened. */
function raySteps(sess: Session): string[] {
  const t0 = sess.setup_log.map((l) => l.match(/^(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d),(\d{3})/)).find(Boolean);
  const at = (l: string) => {
    const m = l.match(/^(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d),(\d{3})/);
    if (!m || !t0) return "        ";
    const ms = Date.parse(m[1]!.replace(" ", "T")) + Number(m[2]) - (Date.parse(t0[1]!.replace(" ", "T")) + Number(t0[2]));
    return `[${(ms / 1000).toFixed(2)} s]`.padEnd(9);
  };
  return sess.setup_log.map((l) => {
    const msg = l
      .replace(/^\S+ \S+\s+INFO\s+/, "")
      .replaceAll(sess.envDir, "<env>")
      .replaceAll(dirname(dirname(sess.envDir)), "<session>/runtime_resources")
      .replace(/\S*\/site-packages\/ray\/_private\/runtime_env\//g, "…/ray/_private/runtime_env/")
      .replace(/(Output of cmd\[\d+\]: )/, "")
      .replace(/'-c', '\\nimport ray.*$/, "'-c', 'import ray; … ray.__version__ …']  (Ray's check that the env's ray is the driver's)");
    return `${at(l)} ${msg}`.slice(0, 300);
  });
}

/** Whether the env's torch is a copy of the worker's (its own inode) or a link. */
function torchCopy(envSite: string, workerSite: string): string {
  const lib = ["torch/lib/libtorch_cpu.so", "torch/_C.cpython-311-x86_64-linux-gnu.so"].find((f) => existsSync(join(envSite, f)));
  if (!lib) return "torch not in the env's own site-packages";
  const a = statSync(join(envSite, lib));
  const b = existsSync(join(workerSite, lib)) ? statSync(join(workerSite, lib)) : null;
  return `torch IN the env's own site-packages (${du(join(envSite, "torch"))}; ${lib} ${b && a.ino === b.ino ? "is a hard link to the worker's" : "is a copy, its own inode"})`;
}

try {
  const rayRuns = Number(process.env.BENCH_RAY_RUNS ?? 3);
  const rayTorchRuns = Number(process.env.BENCH_RAY_TORCH_RUNS ?? 2);
  const coldRuns = Number(process.env.BENCH_COLD_RUNS ?? 5);
  const warmRuns = Number(process.env.BENCH_WARM_RUNS ?? 10);
  const repeat = 5;
  const started = performance.now();
  const load = sh("cut -d' ' -f1-3 /proc/loadavg");

  const small = await rayVenv("ray-venv", ["ray", "virtualenv"], false);
  const torchV = await rayVenv("ray-torch-venv", ["torch==2.13.0", "ray", "virtualenv"], true);
  rmSync(rayTemp, { recursive: true, force: true });
  console.error(`ray venv: ${small.setup}\nray+torch venv: ${torchV.setup}`);

  // ---- tqdm: one uncounted session first (it builds the env that later sessions could reuse, and warms the page cache).
  const idx = ["--index-url", INDEX];
  const warmup = await raySession(small.py, ["tqdm"], "tqdm", repeat, true, false);
  console.error(`ray warm-up session: cold ${warmup.cold_s.toFixed(2)} s, init ${warmup.init_s.toFixed(2)} s`);
  await gpulayerCase(small.py, "tqdm", "tqdm", idx, 1, 1, 1);
  const sessions: Session[] = [];
  const g = { fast: [] as number[], pip: [] as number[], jobCold: [] as number[] };
  let gNotes: { fastNote: EnvNote; pipNote: EnvNote } | null = null;
  // Alternate: a Ray session, then gpulayer's cold builds, so the machine's drift hits both alike.
  const perSession = Math.ceil(coldRuns / rayRuns);
  for (let i = 0; i < rayRuns; i++) {
    sessions.push(await raySession(small.py, ["tqdm"], "tqdm", repeat, true, false));
    const k = Math.min(perSession, coldRuns - g.fast.length);
    if (k > 0) {
      const r = await gpulayerCase(small.py, "tqdm", "tqdm", idx, k, k, 0);
      g.fast.push(...r.s.fast);
      g.pip.push(...r.s.pip);
      g.jobCold.push(...r.s.jobCold);
      gNotes = r;
    }
    console.error(`ray session ${i + 1}/${rayRuns}: cold ${sessions.at(-1)!.cold_s.toFixed(2)} s`);
  }
  const gWarm = await gpulayerCase(small.py, "tqdm", "tqdm", idx, 0, 0, warmRuns);
  const last = sessions.at(-1)!;
  const rayEnvSize = du(last.envDir);
  const rayTqdm = { size: rayEnvSize, torch: existsSync(join(sitePackages(join(last.envDir, "virtualenv")), "torch")) };
  const pool = (k: "baseline_task_s" | "baseline_new_worker_s" | "warm_same_worker_s" | "warm_new_worker_s") => sessions.flatMap((s) => (s[k] ?? []).map((x) => x * 1000));
  const rayCold = sessions.map((s) => s.cold_s * 1000);
  const baseNew = pool("baseline_new_worker_s");
  const rayInit = sessions.map((s) => s.init_s * 1000);

  const coldRows: Row[] = [
    ["gpulayer `job run -p tqdm … -- python -c 'import tqdm'`, cold (fresh home and caches; env built, python run)", stats(g.jobCold)],
    ["gpulayer `env prepare -p tqdm --json`, cold, uv fast path (auto)", stats(g.fast)],
    ["gpulayer `env prepare -p tqdm --json`, cold, pip path (GPULAYER_INSTALLER=pip, the ADR's build)", stats(g.pip)],
    ["Ray: first task with runtime_env={'pip': ['tqdm']} in a new session (env created; inside the driver, ray.init not counted)", stats(rayCold)],
    ["Ray: the same less the median no-runtime_env new-worker task (≈ the env's creation alone)", stats(rayCold.map((x) => x - median(baseNew)))],
    ["Ray: ray.init (a new local session; paid before any of it)", stats(rayInit)],
  ];
  const warmRows: Row[] = [
    ["gpulayer `job run -p tqdm … -- python -c 'import tqdm'`, warm (env reused; a new python process)", stats(gWarm.s.jobWarm)],
    ["gpulayer `env prepare -p tqdm --json`, warm (reused)", stats(gWarm.s.warm)],
    ["`<env>/bin/python -c 'import tqdm'` (the floor of a new process)", stats(gWarm.s.floor)],
    ["Ray: task with the same runtime_env, same session, new worker process (max_calls=1)", stats(pool("warm_new_worker_s"))],
    ["Ray: task with the same runtime_env, same session, idle worker reused (Ray's warm case)", stats(pool("warm_same_worker_s"))],
    ["Ray: task without runtime_env, new worker process (max_calls=1)", stats(baseNew)],
    ["Ray: task without runtime_env, worker reused (task overhead)", stats(pool("baseline_task_s"))],
  ];

  // ---- torchmetrics on a worker venv with torch 2.13.0 (and ray).
  rmSync(rayTemp, { recursive: true, force: true });
  const tidx = [...idx, "--find-links", WHEELS];
  const tSessions: Session[] = [];
  const tg = { fast: [] as number[], pip: [] as number[], jobCold: [] as number[] };
  let tNotes: { fastNote: EnvNote; pipNote: EnvNote } | null = null;
  const tCold = Math.max(rayTorchRuns, 3);
  for (let i = 0; i < rayTorchRuns; i++) {
    tSessions.push(await raySession(torchV.py, ["torchmetrics"], "torchmetrics", 2, false, true));
    console.error(`ray torch session ${i + 1}/${rayTorchRuns}: cold ${tSessions.at(-1)!.cold_s.toFixed(2)} s`);
  }
  const tLast = tSessions.at(-1)!;
  const tRayEnv = join(tLast.envDir, "virtualenv");
  const tRayNote = { size: du(tLast.envDir), torch: torchCopy(sitePackages(tRayEnv), sitePackages(torchV.venv)) };
  for (let i = 0; i < tCold; i++) {
    const r = await gpulayerCase(torchV.py, "torchmetrics", "torchmetrics", tidx, 1, i < 2 ? 1 : 0, 0);
    tg.fast.push(...r.s.fast);
    tg.pip.push(...r.s.pip);
    tg.jobCold.push(...r.s.jobCold);
    if (r.pipNote) tNotes = { fastNote: r.fastNote, pipNote: r.pipNote };
  }
  const tWarm = await gpulayerCase(torchV.py, "torchmetrics", "torchmetrics", tidx, 0, 0, Math.min(warmRuns, 5));
  const tPool = (k: "warm_same_worker_s" | "warm_new_worker_s") => tSessions.flatMap((s) => s[k].map((x) => x * 1000));
  const torchRows: Row[] = [
    ["gpulayer `job run -p torchmetrics … -- python -c 'import torchmetrics'`, cold", stats(tg.jobCold)],
    ["gpulayer `env prepare -p torchmetrics --json`, cold, uv fast path (auto)", stats(tg.fast)],
    ["gpulayer `env prepare -p torchmetrics --json`, cold, pip path (the ADR's build)", stats(tg.pip)],
    ["Ray: first task with runtime_env={'pip': ['torchmetrics']} in a new session (env created)", stats(tSessions.map((s) => s.cold_s * 1000))],
    ["gpulayer `job run … -- python -c 'import torchmetrics'`, warm", stats(tWarm.s.jobWarm)],
    ["`<env>/bin/python -c 'import torchmetrics'` (the floor)", stats(tWarm.s.floor)],
    ["Ray: same runtime_env, same session, new worker process (max_calls=1)", stats(tPool("warm_new_worker_s"))],
    ["Ray: same runtime_env, same session, idle worker reused", stats(tPool("warm_same_worker_s"))],
  ];
  rmSync(rayTemp, { recursive: true, force: true });
  const totalS = (performance.now() - started) / 1000;

  // ---- the report
  const table = (rows: Row[], baseline: string, count: (s: Stats) => string) => {
    const b = rows.find(([name]) => name === baseline)![1]!.median;
    return ["| | median | min | p90 | n | vs gpulayer |", "|---|---:|---:|---:|---:|---:|", ...rows.map(([name, s]) => `| ${name} | ${fmt(s!.median)} | ${fmt(s!.min)} | ${fmt(s!.p90)} | ${count(s!)} | ${(s!.median / b).toFixed(2)}x |`)];
  };
  const num = (s: Stats) => String(s.n);
  const mem = sh("awk '/MemTotal/ {printf \"%.0f GiB\", $2/1048576}' /proc/meminfo");
  const cpu = sh("grep -m1 'model name' /proc/cpuinfo | cut -d: -f2");
  const version = async (argv: string[]) => (await run(argv, base)).out.trim().split("\n")[0]!;
  const versions = [
    `ray ${last.ray}`,
    await version([small.py, "--version"]),
    (await version([small.py, "-m", "pip", "--version"])).split(" from ")[0],
    `virtualenv ${(await version([small.py, "-c", "import virtualenv; print(virtualenv.__version__)"]))}`,
    uv ? await version([uv, "--version"]) : "uv: none on PATH",
    (await version([bin, "version"])).replace(/ \(.*/, ""),
    `bun ${Bun.version}`,
  ].join("; ");
  const reuse = sessions.map(
    (s, i) =>
      `- session ${i + 1}: first call ${s.cold_s.toFixed(2)} s; env ${s.hash.slice(0, 12)}… (same sha1 in every session); ${s.earlierOnDisk.length} earlier session(s) had built it and still had it on disk; this session ${s.rebuilt ? "cloned the venv and ran pip install again" : "did NOT rebuild"}; dirs under this session's runtime_resources/pip before the call: ${s.pip_dirs_before.length}`,
  );
  const cmp = (a: Stats, b: Stats) => (a.median / b.median).toFixed(1);
  const reuseT = tSessions.map(
    (s, i) => `- torch session ${i + 1}: first call ${s.cold_s.toFixed(2)} s; ${s.earlierOnDisk.length} earlier session(s) had built env ${s.hash.slice(0, 12)}… and still had it on disk; this session ${s.rebuilt ? "cloned the venv and ran pip install again" : "did NOT rebuild"}`,
  );
  const doc = [
    "# Benchmark: gpulayer against Ray's runtime_env `pip`",
    "",
    "Made by `bun run bench/ray.ts` (it rewrites this part; the notes below stay). Same requests, same local index",
    `(\`${INDEX}\`), same worker interpreter for both (the Ray venv's python); pip config shut out for all`,
    "(`PIP_CONFIG_FILE=/dev/null`, no `PIP_*`/`UV_*` of the machine). Ray gets the index through `PIP_INDEX_URL` in the",
    "environment of `ray.init` (its pip plugin runs pip with the agent's environment; the default `pip_install_options`,",
    "`--disable-pip-version-check --no-cache-dir`, stay). Ray's times are taken inside the driver around `ray.get`",
    "(bench/ray_job.py); gpulayer's are whole processes.",
    "",
    `- machine: ${sh("nproc")} CPUs (nproc),${cpu ? ` ${cpu},` : ""} ${mem} memory, load average at start ${load}; shared, not idle`,
    `- ${versions}`,
    `- date: ${new Date().toISOString()}; whole bench ${totalS.toFixed(0)} s`,
    `- Ray venv (${small.venv}): ${small.setup}; ${du(small.venv)}`,
    `- Ray + torch venv (${torchV.venv}): ${torchV.setup}; ${du(torchV.venv)}`,
    `- Ray: \`ray.init(num_cpus=1, include_dashboard=False, _temp_dir=${rayTemp})\`; ${rayRuns} counted sessions for tqdm after one uncounted, ${rayTorchRuns} for torchmetrics; ${repeat} warm calls of each kind per session`,
    "",
    "## `tqdm` (the ADR's request)",
    "",
    `### Cold: the env does not exist yet (gpulayer: ${coldRuns} runs each, fresh GPULAYER_HOME, pip and uv caches; Ray: one per new session)`,
    "",
    ...table(coldRows, coldRows[0]![0], num),
    "",
    `### Warm: the env exists (gpulayer: ${warmRuns} runs each; Ray: ${repeat} calls per session, all sessions pooled)`,
    "",
    ...table(warmRows, warmRows[0]![0], num),
    "",
    "### Does a new Ray session reuse the env an earlier session built?",
    "",
    `Uncounted first session: first call ${warmup.cold_s.toFixed(2)} s (env ${warmup.hash.slice(0, 12)}…, rebuilt: ${warmup.rebuilt}).`,
    "",
    ...reuse,
    "",
    `Ray's env for \`tqdm\`: ${rayTqdm.size} (${last.envDir.replace(rayTemp, "<temp>")}; the driver runs in a venv, so Ray`,
    `copies the whole venv, ray included, then pip-installs tqdm into the copy; torch in it: ${rayTqdm.torch}). gpulayer's:`,
    `${gNotes!.fastNote.size} by the fast path, ${gNotes!.pipNote.size} by the pip path (installed: ${gNotes!.fastNote.installed.join(", ")}; the worker's packages are seen through a \`.pth\`).`,
    "",
    "Ray's setup steps in the last session (runtime_env_setup log):",
    "",
    "```",
    ...raySteps(last),
    "```",
    "",
    `## \`torchmetrics\` on a worker venv with torch 2.13.0 (Ray: ${rayTorchRuns} session(s); gpulayer: ${tCold} runs, pip path 2)`,
    "",
    `\`--find-links ${WHEELS}\` / \`PIP_FIND_LINKS=${WHEELS}\` offers torch to both.`,
    "",
    ...table(torchRows, torchRows[0]![0], num),
    "",
    ...reuseT,
    "",
    "What each env holds (last run):",
    "",
    `- Ray: ${tRayNote.size} (${tLast.envDir.replace(rayTemp, "<temp>")}); ${tRayNote.torch}; pip said torch was "already satisfied": it came with the venv's copy`,
    `- gpulayer, fast path: ${tNotes!.fastNote.size}; ${tNotes!.fastNote.torchInOwnSitePackages ? "torch INSTALLED again" : "no torch"} in the env's own site-packages (the worker's is used through the \`.pth\`); installed: ${tNotes!.fastNote.installed.join(", ")}`,
    `- gpulayer, pip path: ${tNotes!.pipNote.size}; ${tNotes!.pipNote.torchInOwnSitePackages ? "torch INSTALLED again" : "no torch"} in the env's own site-packages; installed: ${tNotes!.pipNote.installed.join(", ")}`,
    "",
    "Ray's setup steps (last session):",
    "",
    "```",
    ...raySteps(tLast),
    "```",
    "",
    `Summary: cold, Ray's first call is ${cmp(stats(rayCold), stats(g.jobCold))}x gpulayer's cold \`job run\` and ${cmp(stats(rayCold), stats(g.pip))}x its pip path for tqdm,`,
    `${cmp(stats(tSessions.map((s) => s.cold_s * 1000)), stats(tg.jobCold))}x for torchmetrics on the torch worker; warm, a Ray task on a new worker with the env is`,
    `${cmp(stats(pool("warm_new_worker_s")), stats(gWarm.s.jobWarm))}x gpulayer's warm \`job run\` (a new process too); a Ray task on an idle worker it reuses takes ${fmt(stats(pool("warm_same_worker_s")).median)}, which gpulayer,`,
    "running every job as a new process, has no counterpart for.",
  ].join("\n");
  console.log(doc);
  writeReport("bench-ray.md", doc);
  // The plugin against Ray's pip and uv on one long-running cluster: its own part of the report.
  const plugin = await rayPluginBench();
  console.log(plugin);
  writeReport("bench-ray.md", plugin, "bench-plugin");
} finally {
  rmSync(work, { recursive: true, force: true });
}
