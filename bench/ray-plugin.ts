/**
 * gpulayer's Ray plugin (integrations/ray) against Ray's own `pip` and `uv` runtime_env and against no runtime_env,
 * side by side in one run, on one long-running local cluster (`ray start --head`, 2 CPUs) with all three registered,
 * every install from the same index ($BENCH_INDEX, on 127.0.0.1: no network).
 *
 * Each sample is a new Ray job (a new driver, bench/ray_plugin_job.py) timing, inside the driver, its first task
 * (Ray starts workers per job, so a new worker process each time) or eight actors asked for at once:
 * - cold: the env does not exist yet. gpulayer: its home and the pip/uv caches emptied first. Ray: a request
 *   it has not seen (a comment line, `# sample N`, makes a new hash); its pip runs with --no-cache-dir and its uv
 *   with --no-cache (Ray's defaults), so no contender has a cache.
 * - cached: the same request as the cold sample just before, in a new job.
 * The baseline is a runtime_env with `env_vars` alone: Ray starts a worker process of its own for it too, with
 * nothing to install (a job without runtime_env may get a worker Ray started ahead, also shown).
 * Rounds alternate the contenders, so drift in the machine hits them alike.
 *
 * Ray: a venv of its own with ray, virtualenv (Ray's pip plugin imports it) and uv (Ray's uv plugin runs
 * `python -m uv` in the env, else pip-installs uv into it each time), from $BENCH_INDEX and the uv wheel
 * ($BENCH_UV_WHEEL, else $GPULAYER_TEST_UV_WHEEL as .ci/run fetches it), kept at $TMPDIR/gpulayer-bench-ray/ray-uv-venv.
 *
 * Run: bun run bench/ray-plugin.ts   (BENCH_RAY_PLUGIN_RUNS=5, BENCH_RAY_ACTOR_RUNS=3); bench/ray.ts runs it last.
 */
import { existsSync, mkdirSync, mkdtempSync, readdirSync, readFileSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { freePort, type RayNode, startRayNode, stopRayNode } from "../test/fixtures/ray-cluster.ts";
import { benchIndex, ensureBinary, realUv, ROOT, stats, writeReport } from "./_lib.ts";

type Env = Record<string, string>;
type Stats = ReturnType<typeof stats>;

async function must(argv: string[], env: Env, timeoutMs = 600_000) {
  const p = Bun.spawn(argv, { env, stdout: "pipe", stderr: "pipe", stdin: "ignore" });
  const timer = setTimeout(() => p.kill("SIGTERM"), timeoutMs);
  const [out, err, code] = await Promise.all([new Response(p.stdout).text(), new Response(p.stderr).text(), p.exited]);
  clearTimeout(timer);
  if (code !== 0) throw new Error(`${argv.join(" ")} exited ${code}: ${(err || out).slice(-3000)}`);
  return out;
}

const sh = (cmd: string) => Bun.spawnSync(["sh", "-c", cmd]).stdout.toString().trim();
const fmt = (ms: number) => (ms >= 1000 ? `${(ms / 1000).toFixed(2)} s` : `${ms.toFixed(0)} ms`);

export async function rayPluginBench(): Promise<string> {
  const { index: INDEX } = benchIndex();
  const uvWheel = process.env.BENCH_UV_WHEEL || process.env.GPULAYER_TEST_UV_WHEEL;
  if (!uvWheel || !existsSync(uvWheel)) throw new Error("set BENCH_UV_WHEEL to uv's wheel (Ray's uv plugin runs `python -m uv`; .ci/run fetches one: GPULAYER_TEST_UV_WHEEL)");
  const runs = Number(process.env.BENCH_RAY_PLUGIN_RUNS ?? 5);
  const actorRuns = Number(process.env.BENCH_RAY_ACTOR_RUNS ?? 3);
  const started = performance.now();
  const load = sh("cut -d' ' -f1-3 /proc/loadavg");
  const work = mkdtempSync(join(tmpdir(), "gpl-bench-rayp-"));
  const { bin } = ensureBinary();

  const base: Env = {};
  for (const [k, v] of Object.entries(process.env)) if (v !== undefined && !/^(PIP_|UV_|GPULAYER_|RAY_)/.test(k)) base[k] = v;
  const uv = realUv();
  if (uv) {
    mkdirSync(join(work, "bin"));
    Bun.spawnSync(["ln", "-s", uv, join(work, "bin", "uv")]);
    base.PATH = `${join(work, "bin")}:${process.env.PATH}`;
  }
  Object.assign(base, { PIP_CONFIG_FILE: "/dev/null", PIP_DISABLE_PIP_VERSION_CHECK: "1", NO_COLOR: "1" });

  // The node's Python: a real venv (Ray's pip and uv plugins copy it), made once and kept.
  const keep = join(tmpdir(), "gpulayer-bench-ray");
  const venv = join(keep, "ray-uv-venv");
  if (!existsSync(join(venv, ".ready"))) {
    rmSync(venv, { recursive: true, force: true });
    mkdirSync(keep, { recursive: true });
    await must(["python3", "-m", "venv", venv], base);
    await must([join(venv, "bin", "python"), "-m", "pip", "install", "-q", "--index-url", INDEX, "ray", "virtualenv", uvWheel], { ...base, PIP_CACHE_DIR: join(work, "pip-setup") });
    writeFileSync(join(venv, ".ready"), "ray virtualenv uv\n");
  }
  const py = join(venv, "bin", "python");
  const plugin = join(work, "plugin");
  await must([py, "-m", "pip", "install", "-q", "--no-deps", "--no-index", "--target", plugin, join(ROOT, "integrations", "ray")], base);

  const home = join(work, "home");
  const caches = join(work, "caches");
  const rt = join(work, "rt");
  const env: Env = {
    ...base,
    PIP_INDEX_URL: INDEX,
    UV_INDEX_URL: INDEX,
    PIP_CACHE_DIR: join(caches, "pip"),
    UV_CACHE_DIR: join(caches, "uv"),
    GPULAYER_HOME: home,
    GPULAYER_BIN: bin,
    PYTHONPATH: plugin,
    RAY_RUNTIME_ENV_PLUGINS: JSON.stringify([{ class: "gpulayer_ray.GpulayerPlugin" }]),
    RAY_USAGE_STATS_ENABLED: "0",
  };
  const address = `127.0.0.1:${freePort()}`;
  let head: RayNode | undefined;
  try {
    head = await startRayNode(join(venv, "bin", "ray"), ["--head", `--port=${address.split(":")[1]}`, "--node-ip-address=127.0.0.1", "--num-cpus=2", "--num-gpus=0", "--include-dashboard=false", `--dashboard-agent-listen-port=${freePort()}`, `--temp-dir=${rt}`], env);
    // module: what the task imports (tqdm, where the runtime_env installs it).
    const job = async (runtimeEnv: object | null, actors = 0, module: string | null = "tqdm") => {
      const out = await must([py, join(ROOT, "bench", "ray_plugin_job.py"), JSON.stringify({ address, runtime_env: runtimeEnv, module, actors })], env, 600_000);
      const r = JSON.parse(out.trim().split("\n").at(-1)!) as { seconds: number; prefixes: string[] };
      return { ms: r.seconds * 1000, prefixes: r.prefixes };
    };
    const emptyCaches = () => {
      rmSync(home, { recursive: true, force: true });
      rmSync(caches, { recursive: true, force: true });
    };
    const gpl = { gpulayer: { pip: ["tqdm"], index_url: INDEX } };
    let nonce = 0;
    const fresh = () => `# sample ${nonce++}`;
    const rows = ["none", "newWorker", "gplCached", "gplCold", "pipCached", "pipCold", "uvCached", "uvCold"] as const;
    const s = Object.fromEntries(rows.map((r) => [r, [] as number[]])) as Record<(typeof rows)[number], number[]>;
    const where: Record<string, string> = {};
    await job(null, 0, null); // warm-up: the page cache, the first job of the cluster
    for (let i = 0; i < runs; i++) {
      s.none.push((await job(null, 0, null)).ms);
      // A runtime_env with env_vars alone: Ray starts a worker process of its own for it, with nothing to install.
      s.newWorker.push((await job({ env_vars: { BENCH_SAMPLE: fresh() } }, 0, null)).ms);
      emptyCaches();
      const cold = await job(gpl);
      s.gplCold.push(cold.ms);
      where.gpulayer = cold.prefixes[0]!;
      s.gplCached.push((await job(gpl)).ms);
      const pip = { pip: ["tqdm", fresh()] };
      const pipCold = await job(pip);
      s.pipCold.push(pipCold.ms);
      where.pip = pipCold.prefixes[0]!;
      s.pipCached.push((await job(pip)).ms);
      const uvEnv = { uv: ["tqdm", fresh()] };
      const uvCold = await job(uvEnv);
      s.uvCold.push(uvCold.ms);
      where.uv = uvCold.prefixes[0]!;
      s.uvCached.push((await job(uvEnv)).ms);
      console.error(`ray plugin round ${i + 1}/${runs}: new worker ${fmt(s.newWorker.at(-1)!)}, gpulayer cached ${fmt(s.gplCached.at(-1)!)}`);
    }
    // Eight actors at once, one new env for all of them.
    const eight = { gpl: [] as number[], uv: [] as number[], gplEnvs: [] as number[], uvEnvs: [] as number[] };
    // Installs run: gpulayer's envs in its (emptied) home; Ray's "Installing python requirements" lines in its logs.
    const rayInstalls = () => {
      const logs = join(rt, "session_latest", "logs");
      return readdirSync(logs).filter((f) => f.endsWith(".log")).reduce((n, f) => n + readFileSync(join(logs, f), "utf8").split("Installing python requirements").length - 1, 0);
    };
    const gplEnvs = () => (existsSync(join(home, "envs-v1")) ? readdirSync(join(home, "envs-v1")).filter((k) => existsSync(join(home, "envs-v1", k, ".gpulayer", "ready"))).length : 0);
    for (let i = 0; i < actorRuns; i++) {
      emptyCaches();
      const g = await job(gpl, 8);
      eight.gpl.push(g.ms);
      eight.gplEnvs.push(gplEnvs());
      const before = rayInstalls();
      const u = await job({ uv: ["tqdm", fresh()] }, 8);
      eight.uv.push(u.ms);
      eight.uvEnvs.push(rayInstalls() - before);
    }
    const base0 = stats(s.newWorker);
    const line = (name: string, st: Stats, vs: Stats) => `| ${name} | ${fmt(st.median)} | ${fmt(st.min)} | ${fmt(st.p90)} | ${st.n} | ${(st.median / vs.median).toFixed(2)}x |`;
    const head1 = ["| | median | min | p90 | n | vs a new worker, nothing to install |", "|---|---:|---:|---:|---:|---:|"];
    const ray = (await must([py, "-c", "import ray; print(ray.__version__)"], base)).trim();
    const uvVersion = (await must([py, "-m", "uv", "--version"], base)).trim();
    const g8 = stats(eight.gpl);
    const u8 = stats(eight.uv);
    const doc = [
      "## The Ray plugin against Ray's `pip` and `uv` runtime_env, on one long-running cluster",
      "",
      "Made by `bun run bench/ray-plugin.ts` (bench/ray.ts runs it last; it rewrites this part). One local cluster",
      "(`ray start --head --num-cpus=2`) with gpulayer's plugin registered; every sample is a new Ray job (a new driver)",
      "timing, inside the driver, its first task (a new worker process: Ray starts workers per job); request `tqdm`",
      "from `$BENCH_INDEX` for all. Cold: gpulayer's home and pip/uv caches emptied first; Ray gets a request it has",
      "not seen (a `# sample N` comment line: a new hash) and installs without a cache (its defaults). Cached: the same",
      "request again, in a new job.",
      "",
      `- machine: ${sh("nproc")} CPUs, load average at start ${load}; shared with other work, not idle`,
      `- ray ${ray}; ${uvVersion}; gpulayer: dist/gpulayer; ${runs} rounds, contenders alternating; whole part ${((performance.now() - started) / 1000).toFixed(0)} s`,
      `- where the tasks ran (last cold sample): gpulayer \`${where.gpulayer!.replace(work, "<tmp>")}\`, pip \`${where.pip!.replace(rt, "<rt>").replace(/session_[^/]+/, "<session>")}\`, uv \`${where.uv!.replace(rt, "<rt>").replace(/session_[^/]+/, "<session>")}\``,
      "",
      "### First task of a new Ray job",
      "",
      ...head1,
      line("no runtime_env (Ray may hand the job a worker it started ahead)", stats(s.none), base0),
      line("runtime_env with `env_vars` only: a new worker process, nothing to install", base0, base0),
      line("gpulayer plugin, env cached on the node", stats(s.gplCached), base0),
      line("gpulayer plugin, cold (env built)", stats(s.gplCold), base0),
      line("Ray `pip`, cached in this cluster", stats(s.pipCached), base0),
      line("Ray `pip`, cold", stats(s.pipCold), base0),
      line("Ray `uv`, cached in this cluster", stats(s.uvCached), base0),
      line("Ray `uv`, cold", stats(s.uvCold), base0),
      "",
      `### Eight actors asking at once for one new env (${actorRuns} rounds; until all eight answered)`,
      "",
      "| | median | min | p90 | n | installs run, per round |",
      "|---|---:|---:|---:|---:|---:|",
      `| gpulayer plugin | ${fmt(g8.median)} | ${fmt(g8.min)} | ${fmt(g8.p90)} | ${g8.n} | ${eight.gplEnvs.join(", ")} |`,
      `| Ray \`uv\` | ${fmt(u8.median)} | ${fmt(u8.min)} | ${fmt(u8.p90)} | ${u8.n} | ${eight.uvEnvs.join(", ")} |`,
      "",
      `Summary: a new job's first task with gpulayer's env cached takes ${(stats(s.gplCached).median / base0.median).toFixed(2)}x the same task on a new worker with nothing to`,
      `install (aim: within 1.3x; the worker's start is most of both); cold, gpulayer is ${(stats(s.pipCold).median / stats(s.gplCold).median).toFixed(1)}x faster than Ray's \`pip\` and ${(stats(s.uvCold).median / stats(s.gplCold).median).toFixed(1)}x than its \`uv\`;`,
      `eight actors on one new env: ${(u8.median / g8.median).toFixed(1)}x faster than Ray's \`uv\`.`,
    ].join("\n");
    return doc;
  } finally {
    if (head) await stopRayNode(head);
    rmSync(work, { recursive: true, force: true });
  }
}

if (import.meta.main) {
  const doc = await rayPluginBench();
  console.log(doc);
  writeReport("bench-ray.md", doc, "bench-plugin");
}
