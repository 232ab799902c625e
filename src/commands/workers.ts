import { defineCommand } from "citty";
import { remoteTarget } from "../cluster/client.ts";
import { listArtifacts, listWorkers, waitForWorkers } from "../cluster/workers-client.ts";
import { formatLabels, type WorkerPrefetch } from "../cluster/protocol.ts";
import { printable } from "../ui/escape.ts";
import { UsageError } from "../errors.ts";
import { formatAgo, formatBytes, Output, table } from "../ui/output.ts";
import { count, outputArgs, rejectUnknownFlags, serverArgs } from "./_args.ts";
import { commandContext } from "./_context.ts";
import { workersJson } from "./_probe-json.ts";

const args = {
  all: { type: "boolean", alias: "a", description: "Also workers that left or were lost" },
  wait: { type: "string", valueHint: "COUNT", description: "First wait until at least COUNT workers are connected (a server still starting is waited for too), then list them" },
  timeout: { type: "string", valueHint: "SECONDS", description: "With --wait: give up after SECONDS (default 120), exit 1" },
  ...serverArgs,
  ...outputArgs,
} as const;

function prefetchLine(p: WorkerPrefetch): string {
  const got = `${p.fetched} fetched (${formatBytes(p.bytes)})${p.present ? `, ${p.present} here already` : ""}`;
  if (p.state === "prefetching") return `prefetching ${p.fetched + p.present}/${p.planned || p.wanted}`;
  if (p.state === "done") return `${got} of ${p.wanted} wanted${p.planned < p.wanted ? ` (the fleet has ${p.planned} that fit)` : ""}`;
  return `${p.state}${p.reason ? `: ${printable(p.reason)}` : ""}${p.fetched ? `; ${got}` : ""}`;
}

export default defineCommand({
  meta: { name: "workers", description: "List the server's workers: GPUs, torch/CUDA, state, last seen, labels" },
  args,
  async run({ args: a, rawArgs }) {
    rejectUnknownFlags(rawArgs, args);
    const out = new Output(a);
    const remote = remoteTarget((await commandContext({ server: a.server, token: a.token, token_file: a["token-file"] })).settings);
    if (!remote) throw new UsageError("gpulayer workers asks a server: --server URL or GPULAYER_SERVER (and --token or GPULAYER_TOKEN)");
    const wait = a.wait === undefined ? null : count("--wait", a.wait);
    if (a.timeout !== undefined && wait === null) throw new UsageError("--timeout goes with --wait COUNT");
    if (wait !== null) await waitForWorkers(remote, wait, (a.timeout === undefined ? 120 : count("--timeout", a.timeout)) * 1000);
    const [workers, artifacts] = await Promise.all([listWorkers(remote, { all: Boolean(a.all) }), out.json ? null : listArtifacts(remote)]);
    out.result(workersJson(workers), () => {
      if (!workers.length) return `no workers${a.all ? "" : " connected"} (on a GPU box: gpulayer join ${remote.url} --token-file FILE)`;
      const rows = [["NAME", "GPUS", "TORCH/CUDA", "PYTHON", "STATE", "LAST SEEN", "LABELS"]];
      for (const w of workers) {
        const p = w.probe;
        const gpus = p.gpus.length ? `${w.free_gpus.length}/${p.gpus.length} free${p.gpus[0]?.name ? ` ${p.gpus[0].name}` : ""}` : "0";
        const torch = p.frameworks.torch ? `${p.frameworks.torch}/${p.cuda ?? "cpu"}` : "-";
        const state = `${w.running ? `${w.state} (${w.running}/${w.slots})` : w.state}${p.offline ? " offline" : ""}`;
        // Labels and GPU names come from the worker (a join token's holder): shown with control characters escaped.
        rows.push([w.name, printable(gpus), printable(torch), printable(p.python?.version ?? "-"), state, formatAgo(Date.parse(w.last_seen)), printable(formatLabels(w.labels))]);
      }
      const built = new Map<string, number>();
      for (const x of artifacts?.artifacts ?? []) built.set(x.built_by, (built.get(x.built_by) ?? 0) + 1);
      const shared = artifacts
        ? [`artifacts  ${artifacts.count} (${formatBytes(artifacts.bytes)} of ${formatBytes(artifacts.max_bytes)}${artifacts.share ? "" : "; sharing is off"})${built.size ? `, built by ${[...built].map(([n, c]) => `${n} (${c})`).join(", ")}` : ""}`, ...(artifacts.wheels ? [`wheels     ${artifacts.wheels.count} (${formatBytes(artifacts.wheels.bytes)}), compiled without build isolation`] : [])]
        : [];
      // What each worker fetched on joining (worker.prefetch_envs), where it prefetches at all.
      const prefetched = workers.flatMap((w) => (w.cache?.prefetch ? [`prefetch   ${w.name}: ${prefetchLine(w.cache.prefetch)}`] : []));
      return [...table(rows), ...shared, ...prefetched];
    });
  },
});
