import { defineCommand } from "citty";
import { hostname } from "node:os";
import { normalizeServerUrl } from "../cluster/client.ts";
import { formatLabels, type MachineProbe, parseLabels } from "../cluster/protocol.ts";
import { bundleLimits } from "../cluster/bundle.ts";
import { commandContext, runAsChecks, runnerSettings } from "./_context.ts";
import { UsageError } from "../errors.ts";
import { forbidDumps } from "../core/no-dump.ts";
import { refuseUnrunnablePython, resolveRunAs } from "../jobs/run-as.ts";
import { Agent } from "../worker/agent.ts";
import { serveWorkerMetrics } from "../worker/metrics.ts";
import { parseListen } from "../cluster/listen.ts";
import { probeMachine } from "../worker/probe.ts";
import { loadWorkerSettings, mergeWorkerSettings, saveWorkerSettings } from "../worker/settings.ts";
import { formatBytes, Output } from "../ui/output.ts";
import { outputArgs, refuseTokenOnCommandLine, rejectUnknownFlags, repeated } from "./_args.ts";
import type { JoinDoc, JoinLeftDoc } from "./_json.ts";
import { probeJson } from "./_probe-json.ts";
import { useNormalJitPolicy } from "../core/jit-policy.ts";

const args = {
  server: { type: "positional", required: false, valueHint: "SERVER_URL", description: "The coordinator to work for; several replicas of it may be given, comma-separated (http://a:7070,http://b:7070): the worker moves to the next when one stops answering. Without it, save this machine's worker settings and show its probe" },
  "token-file": { type: "string", valueHint: "FILE", description: "Read the join token from FILE (- : standard input; else GPULAYER_TOKEN_FILE, else GPULAYER_TOKEN). Never on the command line: every process here could read it" },
  token: { type: "string", valueHint: "TOKEN", description: "Refused: a token on the command line is readable by every process on the machine; use --token-file" },
  "run-as": { type: "string", valueHint: "USER", description: "Run jobs as this OS user (the worker runs as root; else GPULAYER_WORKER_RUN_AS)" },
  offline: { type: "boolean", description: "This worker has no package index: it fetches the envs other workers built, and builds only an env that needs compiled wheels, from theirs (else GPULAYER_OFFLINE)" },
  "prefetch-envs": { type: "string", valueHint: "N", description: "On joining, fetch the fleet's N most used envs this worker can use, in the background, before a job needs them (else GPULAYER_PREFETCH_ENVS; default 0)" },
  python: { type: "string", valueHint: "PATH", description: "The worker's default Python (its torch/CUDA); jobs' envs link to it" },
  name: { type: "string", description: "This worker's name (default: the host name)" },
  label: { type: "string", valueHint: "K=V", description: "A label jobs can ask for with --label (repeatable)" },
  "metrics-listen": { type: "string", valueHint: "HOST:PORT", description: "Serve this worker's Prometheus metrics at http://HOST:PORT/metrics, without a token (bind it to 127.0.0.1 or a private interface; else GPULAYER_WORKER_METRICS_LISTEN)" },
  ...outputArgs,
} as const;

function probeLines(p: MachineProbe, labels: Record<string, string>, name: string): string[] {
  const gpus = p.gpus.length
    ? p.gpus.map((g) => `${g.index}: ${g.name ?? "unknown GPU"}${g.memoryMiB !== null ? ` (${g.memoryMiB} MiB` : " ("}${g.driver ? `, driver ${g.driver})` : ")"}`)
    : ["none (no nvidia-smi, or it sees no GPU)"];
  const torch = p.frameworks.torch ? `${p.frameworks.torch}${p.cuda ? ` (CUDA ${p.cuda})` : " (no CUDA)"}` : "not installed";
  return [
    `name      ${name}`,
    `host      ${p.hostname} (${p.os}, ${p.arch}, ${p.cpus} CPUs, ${formatBytes(p.memoryBytes)})`,
    `gpus      ${gpus[0]}`,
    ...gpus.slice(1).map((g) => `          ${g}`),
    `python    ${p.python ? `${p.python.path} (${p.python.version})` : `not usable: ${p.pythonError}`}`,
    `torch     ${torch}`,
    `packages  ${Object.keys(p.frameworks).length} in the worker's site-packages`,
    `engine    ${p.engine ?? "none (no working docker or podman)"}`,
    ...(p.conda?.length ? [`conda     ${p.conda.map((c) => c.name ?? c.prefix).join(", ")}`] : []),
    `labels    ${formatLabels(labels)}`,
    `probe     ${p.probeMs} ms`,
  ];
}

export default defineCommand({
  meta: { name: "join", description: "Make this machine a worker: with a server URL, register and run its jobs until stopped; without, save the worker settings and show the probe" },
  args,
  async run({ args: a, rawArgs }) {
    rejectUnknownFlags(rawArgs, args);
    const out = new Output(a);
    refuseTokenOnCommandLine("join", a.token);
    // Before anything else: a job of the same user may not read this process's environment or memory.
    forbidDumps();
    useNormalJitPolicy();
    const ctx = await commandContext({ python: a.python, token_file: a["token-file"], "worker.run_as": a["run-as"], "worker.metrics_listen": a["metrics-listen"], "worker.prefetch_envs": a["prefetch-envs"], ...(a.offline ? { "worker.offline": "true" } : {}) });
    const { layout, values } = ctx;
    const saved = loadWorkerSettings(layout);
    const settings = mergeWorkerSettings(saved, { python: values.python, name: a.name, labels: parseLabels(repeated(rawArgs, ["--label"])) });
    const name = settings.name ?? hostname().split(".")[0]!;
    const labels = settings.labels ?? {};
    const runAs = values["worker.run_as"] === undefined ? undefined : resolveRunAs(values["worker.run_as"], process.getuid?.() === 0, runAsChecks(ctx));
    const runner = { ...runnerSettings(ctx), defaultPython: settings.python, runAs };
    const probed = await probeMachine(layout, settings.python, { env: ctx.childEnv, engine: values["worker.engine"] === "none" ? null : runner.engine }, ctx.cwd);
    const probe = { ...probed, offline: values["worker.offline"], shareEnvs: values["worker.share_envs"] };
    // A Python named now must work now: a bad path is never saved.
    if (a.python !== undefined && !probe.python) throw new UsageError(probe.pythonError ?? `--python: ${a.python} is not a working Python 3`);
    // The jobs' user must run it too, or a job's `python` fails (or is another one on PATH).
    if (runAs && probe.python) refuseUnrunnablePython(runAs, probe.python.path, ctx.childEnv);

    if (!a.server) {
      const file = saveWorkerSettings(layout, settings);
      out.progress(`saved worker settings to ${file}`);
      const doc: JoinDoc = { settings_file: file, name, python: settings.python ?? null, labels, probe: probeJson(probe) };
      out.result(doc, () => probeLines(probe, labels, name), true);
      return;
    }

    const url = normalizeServerUrl(a.server, "SERVER_URL");
    const token = values.token;
    if (!token) throw new UsageError("joining needs a join token: --token-file FILE, --token-file - (standard input) or GPULAYER_TOKEN (make one on the server: gpulayer server token create --role join --name NAME)");
    // A job of the worker's own user reads what that user reads: a token file is out of its reach only with --run-as.
    const tokenFile = values.token_file;
    if (!runAs && tokenFile !== undefined && tokenFile !== "-" && ctx.settings.origins.token === ctx.settings.origins.token_file) out.log.warn(`jobs run as this worker's own user, who can read ${tokenFile}: any job can read the join token there; give it on standard input (--token-file - < FILE) or in GPULAYER_TOKEN, or run jobs as another user (--run-as USER)`);
    if (!probe.python) out.log.warn(`the worker's Python is not usable (${probe.pythonError}); jobs that name no Python of their own will not be sent here`);
    for (const line of probeLines(probe, labels, name)) out.progress(line);
    const agent = new Agent({
      url,
      token,
      name,
      labels,
      slots: values["worker.slots"] ?? Math.max(1, probe.gpus.length),
      probe,
      layout,
      // Jobs inherit ctx.childEnv: the server's token is not theirs to see.
      runner,
      bundleLimits: bundleLimits(values),
      keepWorkdirs: values["worker.keep_workdirs"],
      shareEnvs: values["worker.share_envs"],
      offline: values["worker.offline"],
      prefetch: { count: values["worker.prefetch_envs"], python: probe.python?.path ?? null, env: ctx.childEnv, cwd: ctx.cwd },
      heartbeatMs: ctx.settings.origins["coordinator.heartbeat"].source === "default" ? undefined : values["coordinator.heartbeat"],
      drainSeconds: values["worker.drain"] / 1000,
      onLog: (m) => out.log.info(m),
    });
    const metricsAt = values["worker.metrics_listen"] === undefined ? null : parseListen(values["worker.metrics_listen"], "--metrics-listen");
    const metrics = metricsAt ? serveWorkerMetrics(metricsAt, () => agent.metricsSource()) : null;
    if (metrics) out.progress(`metrics at ${metrics.url}`);
    process.on("SIGINT", () => agent.stop("SIGINT"));
    process.on("SIGTERM", () => agent.stop("SIGTERM"));
    await agent.run().finally(() => metrics?.stop());
    const left: JoinLeftDoc = { name, url, left: true };
    if (a.json) out.result(left, () => "");
  },
});
