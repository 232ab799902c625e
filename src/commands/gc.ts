import { defineCommand } from "citty";
import { commandContext, originText } from "./_context.ts";
import { ExitCode, ExitError, UsageError, UserError } from "../errors.ts";
import { printable } from "../ui/escape.ts";
import { resolveGcLimits } from "../gc/limits.ts";
import { type GcItem, type GcReport, runGc } from "../gc/run.ts";
import { formatBytes, formatAgo, formatSeconds, Output, shortKey, table } from "../ui/output.ts";
import { outputArgs, rejectUnknownFlags, repeated, serverArgs } from "./_args.ts";
import type { GcDoc, GcServerDoc } from "./_json.ts";
import { remoteTarget } from "../cluster/client.ts";
import { trimArtifacts } from "../cluster/workers-client.ts";
import { writeErr } from "../ui/terminal.ts";

const args = {
  "max-size": { type: "string", valueHint: "SIZE", description: `Trim the cache to this size, least recently used first (50G, 500MiB; powers of 1024). Else GPULAYER_CACHE_MAX_SIZE, else cache.max_size in config.yaml` },
  "dry-run": { type: "boolean", description: "Say what would be removed; remove nothing" },
  "min-age": { type: "string", valueHint: "AGE", description: "Never remove entries younger than this (default 10m; 30s, 2h, 1d, 0)" },
  keep: { type: "string", valueHint: "KEY", description: "Never remove entries whose key, image id or image reference starts with this (repeatable)" },
  "high-watermark": { type: "string", valueHint: "PCT", description: "When the cache's filesystem is more than PCT% full, remove until --low-watermark" },
  "low-watermark": { type: "string", valueHint: "PCT", description: "Filesystem use to get down to once above --high-watermark (default high - 5)" },
  "refresh-sizes": { type: "boolean", description: "Measure every entry's size again instead of trusting recorded sizes" },
  strict: { type: "boolean", description: "Exit 1 when the limit cannot be reached (entries in use, kept, or too new)" },
  server: { type: "string", valueHint: "URL", description: "Trim a gpulayer server's env artifacts instead of this machine's cache (--max-size, else its coordinator.artifacts_max_size) and show each worker's cache; several replicas may be given, comma-separated" },
  local: { type: "boolean", description: "This machine's cache, even with a server configured (GPULAYER_SERVER or the config file: then gc needs --local, --server URL or --dry-run)" },
  token: serverArgs.token,
  "token-file": serverArgs["token-file"],
  ...outputArgs,
} as const;

const size = (n: number) => formatBytes(n);

/** An env by its key, an image by its references. */
const label = (e: GcItem) => (e.image ? `  image ${e.image.refs.join(", ")}` : `  ${e.kind} ${shortKey(e.id)}`);
/** What a removed entry was: an env's request, an image's engine and id. */
const what = (e: GcItem) => (e.image ? `${e.image.engine} ${shortKey(e.id.replace(/^sha256:/, ""))}` : e.summary);
/** Not gc's to remove, and not counted: images gpulayer did not pull. */
const notCounted = (e: { reasons: { code: string }[] }) => e.reasons.some((r) => r.code === "not-pulled");

function rows(items: (GcItem & { note: string })[]): string[] {
  return table(items.map((e) => [label(e), size(e.sizeBytes), e.state === "incomplete" ? "failed build remains" : e.lastUsed ? `last used ${formatAgo(Date.parse(e.lastUsed))}` : "never used", e.note]));
}

/** `gc --json`: the report with snake_case keys. */
function gcJson(r: GcReport): GcDoc {
  const item = (e: GcItem) => ({ kind: e.kind, id: e.id, state: e.state, size_bytes: e.sizeBytes, last_used: e.lastUsed, created: e.created, summary: e.summary, ...(e.image ? { image: { engine: e.image.engine, refs: e.image.refs, digest: e.image.digest } } : {}) });
  const w = r.limit.watermark;
  return {
    ran: r.ran,
    dry_run: r.dryRun,
    limit: {
      max_size_bytes: r.limit.maxSizeBytes,
      origin: r.limit.origin,
      watermark: w ? { high: w.high, low: w.low, path: w.path, used_percent: w.usedPercent, excess_bytes: w.excessBytes } : null,
      min_age_seconds: r.limit.minAgeSeconds,
      keep: r.limit.keep,
    },
    target_bytes: r.targetBytes,
    entries: r.entries,
    total_before_bytes: r.totalBeforeBytes,
    total_after_bytes: r.totalAfterBytes,
    freed_bytes: r.freedBytes,
    removed: r.removed.map((e) => ({ ...item(e), reason: e.reason })),
    skipped: r.skipped.map((e) => ({ ...item(e), reasons: e.reasons.map((x) => ({ code: x.code, message: x.message })) })),
    trash: { finished: r.trash.finished, freed_bytes: r.trash.freedBytes },
    limit_reached: r.limitReached,
    sizes_refreshed: r.sizesRefreshed,
    seconds: r.seconds,
  };
}

function human(r: GcReport, entriesWord = (n: number) => `${n} ${n === 1 ? "entry" : "entries"}`): string[] {
  const lines: string[] = [];
  const verb = r.dryRun ? "would remove" : "removed";
  const change = `${size(r.totalBeforeBytes)} -> ${size(r.totalAfterBytes)}`;
  if (r.removed.length) lines.push(`${verb} ${r.removed.length} of ${entriesWord(r.entries)}, ${change}`);
  else lines.push(`nothing to remove: ${entriesWord(r.entries)}, ${size(r.totalBeforeBytes)}${r.limitReached && r.limit.maxSizeBytes !== null ? ` (limit ${size(r.limit.maxSizeBytes)})` : ""}`);
  lines.push(...rows(r.removed.map((e) => ({ ...e, note: what(e) }))));
  const skipped = r.skipped.filter((e) => !notCounted(e));
  const ignored = r.skipped.filter(notCounted);
  if (skipped.length) {
    lines.push(`${r.dryRun ? "would skip" : "skipped"} ${skipped.length} (in use or protected):`);
    lines.push(...rows(skipped.map((e) => ({ ...e, note: e.reasons.map((x) => x.message).join("; ") }))));
  }
  if (ignored.length) {
    lines.push(`not counted, never removed: ${ignored.length} image${ignored.length === 1 ? "" : "s"} gpulayer did not pull:`);
    lines.push(...rows(ignored.map((e) => ({ ...e, note: e.reasons.map((x) => x.message).join("; ") }))));
  }
  if (r.trash.finished) lines.push(`${r.dryRun ? "would finish" : "finished"} ${r.trash.finished} interrupted deletion${r.trash.finished === 1 ? "" : "s"} (${size(r.trash.freedBytes)})`);
  return lines;
}

async function gcServer(out: Output, a: { server?: string; token?: string; "token-file"?: string; "max-size"?: string; "dry-run"?: boolean }): Promise<void> {
  const ctx = await commandContext({ server: a.server, token: a.token, token_file: a["token-file"], "cache.max_size": a["max-size"] });
  const remote = remoteTarget(ctx.settings)!;
  const maxBytes = a["max-size"] === undefined ? undefined : ctx.values["cache.max_size"];
  const [r, workers] = await Promise.all([trimArtifacts(remote, { maxBytes, dryRun: Boolean(a["dry-run"]) }), import("./_remote/fleet-envs.ts").then((m) => m.fleetCaches(remote))]);
  const doc: GcServerDoc = { server: remote.url, dry_run: Boolean(a["dry-run"]), max_bytes: r.max_bytes, removed: r.removed.map((x) => ({ sha256: x.sha, key: x.key, bytes: x.bytes, built_by: x.built_by })), skipped: r.skipped.map((x) => ({ sha256: x.sha, reason: x.reason })), kept: r.kept, kept_bytes: r.kept_bytes, workers };
  out.result(doc, () => [
    `${a["dry-run"] ? "would remove" : "removed"} ${r.removed.length} env artifact(s) of ${remote.url}, ${size(r.removed.reduce((n, x) => n + x.bytes, 0))}; ${r.kept} kept, ${size(r.kept_bytes)} (limit ${size(r.max_bytes)})`,
    ...table(r.removed.map((x) => [`  artifact ${shortKey(x.sha)}`, size(x.bytes), `env ${shortKey(x.key)}`, `built by ${x.built_by}`])),
    ...r.skipped.map((x) => `  skipped ${shortKey(x.sha)}: ${x.reason}`),
    // No remote gc of a worker's cache: shown only, each worker trims its own (gc --local there, or its cache.max_size).
    ...(workers.length ? [`workers' caches, not trimmed from here (each runs its own: gpulayer gc --local on it):`] : []),
    ...workers.map((w) => `  ${printable(w.worker)}: ${w.entries === null ? "no report yet" : `${w.entries} env(s), ${size(w.bytes ?? 0)}`}`),
  ]);
}

export default defineCommand({
  meta: { name: "gc", description: "Keep the cache under a size limit: least recently used first, never what is in use; with a server configured, --dry-run shows the fleet's (the server's artifacts, each worker's cache) and trimming needs --local or --server URL" },
  args,
  async run({ args: a, rawArgs }) {
    rejectUnknownFlags(rawArgs, args);
    const out = new Output(a);
    if (a.local && a.server !== undefined) throw new UsageError("--local and --server name two places: give one");
    // Only a --server given here trims the server: a GPULAYER_SERVER in cron's environment must not turn a worker's gc into the server's.
    if (a.server !== undefined) return gcServer(out, a);
    const ctx = await commandContext({ "cache.max_size": a["max-size"] });
    if (!a.local && ctx.values.server) {
      // Nor silently this machine's: the fleet's view is shown (removing nothing), else the place must be said.
      if (a["dry-run"]) return gcServer(out, a);
      throw new UsageError(`a server is configured (${originText(ctx, "server")}): gc --local trims this machine's cache, gc --server URL the server's artifacts (each worker trims its own cache); gc --dry-run shows the fleet's`);
    }
    const { layout } = ctx;
    const maxSize = ctx.values["cache.max_size"];
    const limits = resolveGcLimits(
      { minAge: a["min-age"], keep: repeated(rawArgs, ["--keep"]), highWatermark: a["high-watermark"], lowWatermark: a["low-watermark"] },
      maxSize === undefined ? undefined : { bytes: maxSize, origin: originText(ctx, "cache.max_size") },
    );
    const report = await runGc(layout, { ...limits, dryRun: Boolean(a["dry-run"]), refreshSizes: Boolean(a["refresh-sizes"]), engineEnv: ctx.childEnv });
    if (!report.ran) {
      out.log.info("another gc is running on this cache; nothing done");
      out.result(gcJson(report), () => [], false);
      return;
    }
    if (!limits.maxSize && !limits.watermark) {
      out.log.info(`no size limit given (--max-size, GPULAYER_CACHE_MAX_SIZE or cache.max_size in config.yaml): only failed-build remains and interrupted deletions are cleaned`);
    } else if (report.limit.watermark) {
      const w = report.limit.watermark;
      out.log.debug(`filesystem ${w.path} ${w.usedPercent}% used (high ${w.high}%, low ${w.low}%)${w.excessBytes ? `: ${size(w.excessBytes)} to free` : ""}`);
    }
    if (report.sizesRefreshed) out.log.debug(`measured ${report.sizesRefreshed} sizes again`);
    out.log.debug(`gc took ${formatSeconds(report.seconds)}`);
    out.result(gcJson(report), () => human(report));
    if (!report.limitReached) {
      const w = report.limit.watermark;
      const held = report.skipped.filter((e) => !notCounted(e)).length;
      const why = `${held} ${held === 1 ? "entry" : "entries"} in use or protected${report.dryRun ? "" : `, ${size(report.freedBytes)} freed`}`;
      const message =
        report.limit.maxSizeBytes !== null && report.totalAfterBytes > report.limit.maxSizeBytes
          ? `could not get the cache down to ${size(report.limit.maxSizeBytes)}: ${size(report.totalAfterBytes)} left, ${why}`
          : `could not bring ${w?.path} under ${w?.low}% used: ${size(w?.excessBytes ?? 0)} to free, the cache ${report.dryRun ? "would go" : "went"} from ${size(report.totalBeforeBytes)} to ${size(report.totalAfterBytes)}, ${why}`;
      if (a.strict) {
        if (!out.json) throw new UserError(message, ExitCode.failed);
        // The report is the --json document: the failure is its line on stderr and the code, not a second document.
        writeErr(`error: ${message}\n`);
        throw new ExitError(ExitCode.failed);
      }
      out.log.warn(message);
    }
  },
});
