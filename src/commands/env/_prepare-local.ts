import type { ParsedArgs } from "citty";
import { type EnvironmentRequest, hostRequest, type PrepareRequest, type PrepareResult, wheelDocs, wheelLines } from "../../env/index-warm.ts";
import { formatBytes, formatSeconds, type Output, shortKey } from "../../ui/output.ts";
import { projectFlags, repeated } from "../_args.ts";
import { type CommandContext, envSettings } from "../_context.ts";
import type { EnvPrepareDoc } from "../_json.ts";
import type { prepareArgs } from "./_prepare-args.ts";
import { shadowsText } from "../_prepare-ui.ts";

/** What `env prepare`'s flags ask of the environment (the image aside). */
export function askedByFlags(a: ParsedArgs<typeof prepareArgs>, rawArgs: string[]): EnvironmentRequest {
  // --python without --conda is the default Python (the settings' python, named by the flag): not the request's own.
  return { requirementsFile: a.requirements, specs: repeated(rawArgs, ["-p", "--package"]), conda: a.conda, python: a.conda === undefined ? undefined : a.python, indexUrl: a["index-url"], extraIndexUrls: repeated(rawArgs, ["--extra-index-url"]), findLinks: repeated(rawArgs, ["--find-links"]), noBuildIsolation: repeated(rawArgs, ["--no-build-isolation-package"]), ...projectFlags(a.project, rawArgs) };
}


/** A local `env prepare`'s host request, by the one assembly every prepare makes (hostRequest): its warm lane's look and --dry-run's. */
export function localPrepareRequest(a: ParsedArgs<typeof prepareArgs>, rawArgs: string[], ctx: CommandContext): PrepareRequest {
  return hostRequest(envSettings(ctx), { request: askedByFlags(a, rawArgs), workdir: ctx.cwd });
}

/** A prepared env as `env prepare` shows it: pip check's findings, a line on stderr, the path (or the document) on stdout. */
export function reportPrepared(out: Output, result: PrepareResult): void {
  for (const finding of result.check) out.log.warn(`pip check: ${finding}`);
  const detail = result.build ? `built in ${formatSeconds(result.seconds)}, ${formatBytes(result.build.sizeBytes)}` : `reused (${formatSeconds(result.seconds)})`;
  for (const line of wheelLines(result.wheels)) out.progress(`wheel ${line}`);
  out.progress(`env ${shortKey(result.key)} ${detail}: ${result.summary}`);
  if (result.shadowed?.length) out.progress(`shadows ${shadowsText(result.shadowed)}`);
  const doc: EnvPrepareDoc = { key: result.key, path: result.path, python: result.python, status: result.status, seconds: Number(result.seconds.toFixed(4)), check: result.check, installer_path: result.installerPath, ...(result.shadowed ? { shadowed: result.shadowed } : {}), ...wheelDocs(result.wheels) };
  out.result(doc, () => result.path, true);
}
