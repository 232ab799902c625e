import { dirname, resolve } from "node:path";
import { ExitError } from "../../errors.ts";
import { packLines } from "./pack-lines.ts";
import { formatBytes, formatSeconds, type Output, shortKey } from "../../ui/output.ts";
import type { RemoteTarget } from "../../cluster/client.ts";
import { followPrepare, startPrepare, type StartPrepareOptions, type WorkerPrepareResult } from "../../cluster/prepare-client.ts";
import { formatLabels, labelsFromArgs, type PrepareRequestPayload, type PrepareTaskResult } from "../../cluster/protocol.ts";
import { writeOut } from "../../ui/terminal.ts";
import { shadowsText } from "../_prepare-ui.ts";

/**
 * `env prepare` against a server, printed: the library (src/cluster/prepare-client.ts)
 * starts a prepare task on every matching worker and yields each one as it
 * ends; this prints a line per worker: built / reused / failed (with the
 * installer's message), and seconds.
 */

function line(worker: string, r: PrepareTaskResult | null): string {
  if (!r) return `${worker}  failed  -  no result`;
  const what = r.status === "failed" ? r.message?.split("\n").join("\n    ") : r.image ? `${r.image} ${r.digest ?? ""}`.trim() : `env ${shortKey(r.key ?? "")} ${r.path ?? ""}${r.fetched ? ` (from ${r.fetched.built_by}, ${formatBytes(r.fetched.bytes)})` : ""}`.trim();
  return `${worker}  ${r.status}  ${formatSeconds(r.seconds)}  ${what}`;
}

export async function prepareRemote(target: RemoteTarget, req: PrepareRequestPayload, rawArgs: string[], out: Output, cwd: string, reading: StartPrepareOptions["reading"]): Promise<void> {
  const labels = labelsFromArgs(rawArgs);
  const folder = req.requirementsFile ? dirname(resolve(cwd, req.requirementsFile)) : cwd;
  const group = await startPrepare(target, req, { labels, cwd, reading, ...packLines(out, folder), onUpload: (p, root) => out.progress(`uploading ${root} (${p.files} entries) for the workers`) });
  out.progress(`preparing on ${group.workers.length} worker(s) of ${target.url}${Object.keys(labels).length ? ` [${formatLabels(labels)}]` : ""}: ${group.workers.join(", ")}`);
  let workers: WorkerPrepareResult[] = [];
  for await (const u of followPrepare(target, group.id)) {
    if (u.kind === "done") workers = u.workers;
    else if (u.kind === "step") {
      // Each worker's build as it goes, on stderr (with --json too), as a remote job shows it.
      const d = u.data as { step?: string; detail?: string; tool?: string; seconds?: number };
      if (u.type === "task.prepare.step") out.phase(`[${u.worker}] ${d.step} ${d.detail}`);
      else if (u.type === "task.prepare.quiet") out.phase(`[${u.worker}] still preparing; ${d.tool} has said nothing for ${formatSeconds(Number(d.seconds))}`);
    } else {
      // What a local prepare says of its env, said of each worker's: pip check's findings (on stderr, --json or not), the worker packages a lock shadows.
      for (const finding of u.result?.check ?? []) out.log.warn(`[${u.worker}] pip check: ${finding}`);
      if (out.json) continue;
      writeOut(`${line(u.worker, u.result)}\n`);
      if (u.result?.shadowed?.length) writeOut(`    shadows ${shadowsText(u.result.shadowed)}\n`);
    }
  }
  if (out.json) out.result({ server: target.url, workers }, () => "");
  const failed = workers.filter((w) => w.status === "failed");
  if (failed.length) {
    out.log.error(`failed on ${failed.length} of ${workers.length} worker(s): ${failed.map((w) => w.worker).join(", ")}`);
    throw new ExitError(1);
  }
}
