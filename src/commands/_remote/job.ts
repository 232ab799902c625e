import { ExitError, UserError } from "../../errors.ts";
import { sleep } from "../../core/sleep.ts";
import type { JobSpec } from "../../jobs/spec.ts";
import { formatBytes, formatSeconds, type Output, shortKey } from "../../ui/output.ts";
import { ClusterClient, HttpError, type RemoteTarget } from "../../cluster/client.ts";
import { formatLabels, labelsFromArgs, type RemoteJobStatus, type RemoteSpec, type SubmitResponse, type WatchResponse } from "../../cluster/protocol.ts";
import { inBundle, packTemp, postWithBundle } from "../../cluster/upload.ts";
import { isUrl } from "../../env/request.ts";

/**
 * `job run` against a server: the command layer of the remote branch (it
 * prints, through Output, like the local one). Pack the workdir, submit
 * (uploading the bundle only when the server lacks it), then stream the
 * job's output and events until it ends, and exit with its exit code.
 */

export function remoteSpec(spec: JobSpec, pack: Parameters<typeof inBundle>[3]): RemoteSpec {
  const e = spec.environment;
  return {
    name: spec.name,
    argv: spec.argv,
    commandText: spec.commandText,
    env: spec.env,
    environment: {
      ...(e.requirementsFile ? { requirementsFile: inBundle(spec.workdir, e.requirementsFile, "the requirements file", pack) } : {}),
      specs: e.specs,
      ...(e.python ? { python: e.python } : {}),
      ...(e.indexUrl ? { indexUrl: e.indexUrl } : {}),
      extraIndexUrls: e.extraIndexUrls,
      findLinks: e.findLinks.map((f) => (isUrl(f) ? f : inBundle(spec.workdir, f, "--find-links", pack))),
      ...(e.image ? { image: e.image } : {}),
    },
    resources: spec.resources,
  };
}

export interface FollowHooks {
  onOutput?(chunk: Uint8Array, stream: "stdout" | "stderr"): void;
  onEvent?(type: string, data: Record<string, unknown>, w: WatchResponse): void;
}

/** Watch a job (long polls) until it has ended and its output is all here; rides out a minute of network trouble. */
export async function followJob(client: ClusterClient, id: string, hooks: FollowHooks, opts: { fromLog?: number } = {}): Promise<WatchResponse> {
  let log = opts.fromLog ?? 0;
  let after = 0;
  let troubleSince = 0;
  for (;;) {
    let w: WatchResponse;
    try {
      w = await client.json<WatchResponse>("GET", `/v1/jobs/${id}/watch?log=${log}&after=${after}&wait=20`);
      troubleSince = 0;
    } catch (error) {
      if (error instanceof HttpError) throw error;
      troubleSince ||= Date.now();
      if (Date.now() - troubleSince > 60_000) throw error;
      await sleep(1000);
      continue;
    }
    for (const c of w.output) hooks.onOutput?.(Buffer.from(c.data, "base64"), c.stream);
    log = w.log_offset;
    for (const e of w.events) {
      after = e.seq;
      hooks.onEvent?.(e.type, e.data, w);
    }
    if (w.done) return w;
  }
}

/** A line on stderr for each event worth a line; errors as errors. */
export function progressOf(out: Output): NonNullable<FollowHooks["onEvent"]> {
  return (type, d, w) => {
    if (type === "job.waiting") out.progress(`waiting for ${d.for}`);
    if (type === "job.assigned") out.progress(`assigned to worker ${d.worker} (attempt ${d.attempt}${Array.isArray(d.gpus) && d.gpus.length ? `, GPUs ${d.gpus.join(",")}` : ""})`);
    if (type === "task.prepare.finished") out.progress(`task.prepare ${d.status} env ${shortKey(String(d.env_key ?? ""))} in ${formatSeconds(Number(d.seconds))} on ${w.worker}`);
    if (type === "task.prepare.failed") out.log.error(`task.prepare failed on ${w.worker}: ${d.message}`);
    if (type === "task.bundle.failed") out.log.error(`the job could not start on ${w.worker}: ${d.message}`);
    if (type === "job.requeued") out.log.warn(`re-queued: ${d.reason}`);
    if (type === "job.lost") out.log.error(String(d.message));
    if (type === "job.cancel.requested") out.progress(`cancelling on ${d.worker}`);
  };
}

export async function runRemoteJob(target: RemoteTarget, spec: JobSpec, opts: { rawArgs: string[]; detach: boolean; out: Output }): Promise<void> {
  const { out } = opts;
  const labels = labelsFromArgs(opts.rawArgs);
  const client = new ClusterClient(target.url, target.token);
  const pack = packTemp(spec.workdir, target.bundleLimits);
  let submitted: SubmitResponse;
  try {
    for (const s of pack.skipped) out.log.warn(`not sent: ${s.path}: ${s.reason}`);
    const body = { spec: remoteSpec(spec, pack), bundle: pack.hash, labels, workdir: spec.workdir };
    submitted = await postWithBundle<SubmitResponse>(client, "/v1/jobs", body, pack, {
      onUpload: (p) => out.progress(`uploading ${spec.workdir} (${p.files} entries, ${formatBytes(p.bytes)} packed, bundle ${shortKey(p.hash)})`),
      onAlreadyThere: (p) => out.log.debug(`bundle ${shortKey(p.hash)} of ${spec.workdir} is already on the server; not sent again`),
    });
  } finally {
    pack.dispose();
  }
  const id = submitted.id;
  if (opts.detach) {
    out.result({ id, state: submitted.state, server: target.url }, () => id, true);
    return;
  }
  out.progress(`job ${id} (${spec.name}) on ${target.url}${Object.keys(labels).length ? ` [${formatLabels(labels)}]` : ""}`);
  let cancelling = false;
  const onSignal = (signal: string) => {
    if (cancelling) return;
    cancelling = true;
    out.progress(`\n${signal}: cancelling job ${id}`);
    void client.request("POST", `/v1/jobs/${id}/cancel`).catch((e) => out.log.warn(`cancel: ${(e as Error).message}`));
  };
  process.on("SIGINT", onSignal);
  process.on("SIGTERM", onSignal);
  // With --json, stdout carries only the final document: the job's output goes to stderr.
  const write = (c: Uint8Array, stream: "stdout" | "stderr") => (out.json || stream === "stderr" ? process.stderr.write(c) : process.stdout.write(c));
  try {
    await followJob(client, id, { onOutput: write, onEvent: progressOf(out) });
  } finally {
    process.off("SIGINT", onSignal);
    process.off("SIGTERM", onSignal);
  }
  const status = await client.json<RemoteJobStatus>("GET", `/v1/jobs/${id}`);
  const run = status.phases.find((p) => p.name === "task.run");
  if (run?.seconds != null) out.progress(`task.run exit ${status.exit_code} in ${formatSeconds(run.seconds)} (job ${id} ${status.state} on ${status.worker})`);
  else if (status.error) out.log.error(`job ${id} ${status.state}: ${status.error}`);
  if (out.json) out.result(status, () => "");
  const code = status.exit_code ?? (status.state === "succeeded" ? 0 : 1);
  if (code !== 0) throw new ExitError(code);
}

/** Wait for a cancelled job to end (its worker stops it and reports back). */
export async function cancelRemoteJob(target: RemoteTarget, id: string, graceMs: number): Promise<{ id: string; state: string }> {
  const client = new ClusterClient(target.url, target.token);
  const first = await client.json<{ id: string; state: string }>("POST", `/v1/jobs/${id}/cancel`);
  const deadline = Date.now() + graceMs + 15_000;
  for (;;) {
    const s = await client.json<RemoteJobStatus>("GET", `/v1/jobs/${first.id}`);
    if (["succeeded", "failed", "cancelled"].includes(s.state)) return { id: s.id, state: s.state };
    if (Date.now() > deadline) throw new UserError(`job ${s.id} did not stop in time on worker ${s.worker}`);
    await sleep(200);
  }
}
