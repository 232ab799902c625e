import type { RemoteTarget } from "../../cluster/client.ts";
import type { WorkerView } from "../../cluster/protocol.ts";
import { type ArtifactsView, listArtifacts, listWorkers } from "../../cluster/workers-client.ts";
import { keyByPrefix } from "../../env/index-light.ts";
import { UserError } from "../../errors.ts";
import { printable } from "../../ui/escape.ts";
import { formatAgo, formatBytes, type Output, shortKey, table } from "../../ui/output.ts";
import type { EnvListFleetDoc, EnvShowFleetDoc } from "../_json.ts";
import { pythonLabel, requestLabels } from "../../ui/env-labels.ts";

/**
 * `env list` and `env show` of the fleet (a server configured, no --local):
 * each present worker's envs as its heartbeats last reported them (at most
 * every few seconds, when they changed), and the env artifacts the server
 * keeps. Read-only: nothing on a worker is asked or touched.
 */

const ago = (iso: string | null | undefined) => (iso ? formatAgo(Date.parse(iso)) : "-");
const artifactJson = (a: ArtifactsView["artifacts"][number]) => ({ sha256: a.sha256, key: a.key, bytes: a.bytes, built_by: a.built_by, created: a.created, last_used: a.last_used });

async function fleet(target: RemoteTarget): Promise<{ workers: WorkerView[]; artifacts: ArtifactsView }> {
  const [workers, artifacts] = await Promise.all([listWorkers(target), listArtifacts(target)]);
  return { workers, artifacts };
}

export async function fleetEnvList(target: RemoteTarget, out: Output): Promise<void> {
  const { workers, artifacts } = await fleet(target);
  const doc: EnvListFleetDoc = {
    server: target.url,
    workers: workers.map((w) => ({ worker: w.name, state: w.state, reported: w.cache !== null, envs: (w.cache?.envs ?? []).map((e) => ({ key: e.key, state: e.state, size_bytes: e.bytes, last_used: e.last_used, summary: e.summary, python: e.python ?? null, requirements_file: e.requirements_file?.path ?? null })) })),
    artifacts: artifacts.artifacts.map(artifactJson),
  };
  out.result(doc, () => {
    const lines = [`the fleet of ${target.url} (this machine's envs: gpulayer env list --local)`];
    if (!workers.length) lines.push("no workers connected");
    for (const w of workers) {
      // Names and requests come from the worker (a join token's holder): shown with control characters escaped.
      const head = `${printable(w.name)} (${w.state})`;
      if (!w.cache) {
        lines.push(`${head}: no env report yet`);
        continue;
      }
      lines.push(`${head}: ${w.cache.entries} env(s), ${formatBytes(w.cache.bytes)}`);
      if (!w.cache.envs.length) continue;
      const rows = [["  KEY", "STATE", "SIZE", "LAST USED", "PYTHON", "REQUEST"]];
      const requests = requestLabels(w.cache.envs.map((e) => ({ summary: e.summary, requirementsFile: e.requirements_file })));
      w.cache.envs.forEach((e, i) => rows.push([`  ${shortKey(e.key)}`, printable(e.state), formatBytes(e.bytes), ago(e.last_used), printable(pythonLabel(e.python)), printable(requests[i]!)]));
      lines.push(...table(rows));
    }
    lines.push(`server artifacts: ${artifacts.count} (${formatBytes(artifacts.bytes)} of ${formatBytes(artifacts.max_bytes)}${artifacts.share ? "" : "; sharing is off"})`);
    if (artifacts.artifacts.length) {
      const rows = [["  ARTIFACT", "ENV", "SIZE", "BUILT BY", "LAST USED"]];
      for (const a of artifacts.artifacts) rows.push([`  ${shortKey(a.sha256)}`, shortKey(a.key), formatBytes(a.bytes), printable(a.built_by), ago(a.last_used)]);
      lines.push(...table(rows));
    }
    return lines;
  });
}

export async function fleetEnvShow(target: RemoteTarget, prefix: string, out: Output): Promise<void> {
  const { workers, artifacts } = await fleet(target);
  // The prefix checked as this machine's `env show` checks it (env/store/inventory.ts).
  const key = keyByPrefix(prefix, [...workers.flatMap((w) => (w.cache?.envs ?? []).map((e) => e.key)), ...artifacts.artifacts.map((a) => a.key)]);
  if (!key) throw new UserError(`no environment ${prefix} on the fleet of ${target.url} (gpulayer env list shows it; this machine's: gpulayer env show ${prefix} --local)`);
  const held = workers.flatMap((w) => (w.cache?.envs ?? []).filter((e) => e.key === key).map((e) => ({ w, e })));
  const kept = artifacts.artifacts.filter((a) => a.key === key);
  const doc: EnvShowFleetDoc = {
    server: target.url,
    key,
    summary: held[0]?.e.summary ?? "",
    workers: held.map(({ w, e }) => ({ worker: w.name, state: e.state, size_bytes: e.bytes, last_used: e.last_used })),
    artifacts: kept.map(artifactJson),
  };
  out.result(doc, () => [
    `key          ${key}`,
    ...(doc.summary ? [`request      ${printable(doc.summary)}`] : []),
    ...held.map(({ w, e }) => `on worker    ${printable(w.name)}: ${printable(e.state)}, ${formatBytes(e.bytes)}, last used ${ago(e.last_used)}`),
    ...kept.map((a) => `artifact     ${shortKey(a.sha256)} on the server, ${formatBytes(a.bytes)}, built by ${printable(a.built_by)}`),
    `details      gpulayer env show ${shortKey(key)} --local, on ${held.length ? printable(held[0]!.w.name) : "a worker that has it"}`,
  ]);
}

/** Each present worker's cache in a line: `gc` of the fleet shows them, each worker trims its own. */
export async function fleetCaches(target: RemoteTarget): Promise<{ worker: string; entries: number | null; bytes: number | null }[]> {
  return (await listWorkers(target)).map((w) => ({ worker: w.name, entries: w.cache?.entries ?? null, bytes: w.cache?.bytes ?? null }));
}
