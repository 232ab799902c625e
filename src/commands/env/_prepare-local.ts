import type { ParsedArgs } from "citty";
import { defaultPython } from "../../config/python.ts";
import type { PrepareRequest, PrepareResult } from "../../env/lookup.ts";
import { environmentRequest } from "../../env/request.ts";
import { formatBytes, formatSeconds, type Output, shortKey } from "../../ui/output.ts";
import { repeated } from "../_args.ts";
import type { CommandContext } from "../_context.ts";
import type { EnvPrepareDoc } from "../_json.ts";
import type { prepareArgs } from "./_prepare-args.ts";

/** A local `env prepare`'s request, from its flags and the settings: the command's and its warm lane's (which builds nothing, so stops nothing: the command adds the signal). */
export function localPrepareRequest(a: ParsedArgs<typeof prepareArgs>, rawArgs: string[], ctx: CommandContext): PrepareRequest {
  const { layout, values } = ctx;
  const fallback = defaultPython(layout, ctx.settings);
  const asked = { requirementsFile: a.requirements, specs: repeated(rawArgs, ["-p", "--package"]), conda: a.conda, python: a.conda === undefined ? undefined : a.python, indexUrl: a["index-url"], extraIndexUrls: repeated(rawArgs, ["--extra-index-url"]), findLinks: repeated(rawArgs, ["--find-links"]) };
  return {
    ...environmentRequest(asked, ctx.cwd, fallback.python, fallback.origin),
    cwd: ctx.cwd,
    env: ctx.childEnv,
    installer: values.installer,
    venvCreator: values.venv_creator,
    uv: values.uv,
    timeoutMs: values.prepare_timeout,
  };
}

/** A prepared env as `env prepare` shows it: pip check's findings, a line on stderr, the path (or the document) on stdout. */
export function reportPrepared(out: Output, result: PrepareResult): void {
  for (const finding of result.check) out.log.warn(`pip check: ${finding}`);
  const detail = result.build ? `built in ${formatSeconds(result.seconds)}, ${formatBytes(result.build.sizeBytes)}` : `reused (${formatSeconds(result.seconds)})`;
  out.progress(`env ${shortKey(result.key)} ${detail}: ${result.summary}`);
  const doc: EnvPrepareDoc = { key: result.key, path: result.path, python: result.python, status: result.status, seconds: Number(result.seconds.toFixed(4)), check: result.check, installer_path: result.installerPath };
  out.result(doc, () => result.path, true);
}
