import { defineCommand } from "citty";
import { placeContext } from "../_place.ts";
import { UserError } from "../../errors.ts";
import { findEnv } from "../../env/index-light.ts";
import { entryPaths, isReady, lastUsedMs, readMeta, wheelDocs, wheelLines } from "../../env/index-light.ts";
import { formatBytes, formatSeconds } from "../../ui/output.ts";
import { inputsLines } from "../../env/index-light.ts";
import { outputArgs, placeArgs } from "../_args.ts";
import type { EnvShowDoc } from "../_json.ts";
import { shadowsText } from "../_prepare-ui.ts";

const args = { key: { type: "positional", required: true, valueHint: "KEY", description: "Environment key or a unique prefix of it" }, ...placeArgs, ...outputArgs } as const;

export default defineCommand({
  meta: { name: "show", description: "Show one environment: its request, interpreter, installed packages, size, last use; with a server configured, which workers hold it and its artifact (--local: this machine's)" },
  args,
  async run({ args: a, rawArgs }) {
    const { out, ctx, remote } = await placeContext(a, rawArgs, args);
    if (remote) return (await import("../_remote/fleet-envs.ts")).fleetEnvShow(remote, a.key, out);
    const { layout } = ctx;
    const key = findEnv(layout, a.key);
    const paths = entryPaths(layout, key);
    const meta = readMeta(paths);
    if (!meta || !isReady(paths)) throw new UserError(`environment ${key.slice(0, 12)} is not ready (being built, or a failed build not yet cleared)`);
    const lastUsed = new Date(lastUsedMs(paths)).toISOString();
    const doc: EnvShowDoc = {
      key: meta.key,
      path: meta.path,
      python: meta.python,
      created: meta.created,
      build_seconds: meta.buildSeconds,
      size_bytes: meta.sizeBytes,
      venv_creator: meta.venvCreator,
      installer: meta.installer,
      installer_path: meta.installerPath ?? null,
      installer_fallback: meta.installerFallback ?? null,
      summary: meta.summary,
      request: meta.request,
      inputs: meta.inputs ?? null,
      installed: meta.installed,
      check: meta.check,
      ...(meta.shadowed ? { shadowed: meta.shadowed } : {}),
      ...wheelDocs(meta.wheels),
      last_used: lastUsed,
    };
    out.result(doc, () => [
      `key          ${meta.key}`,
      `path         ${meta.path}`,
      ...(meta.inputs ? inputsLines(meta.inputs) : [`request      ${meta.summary}`]),
      `built        ${meta.created} in ${formatSeconds(meta.buildSeconds)} (venv by ${meta.venvCreator}, installed by ${meta.installer})${meta.installerFallback ? ` (not uv: ${meta.installerFallback})` : ""}`,
      `last used    ${lastUsed}`,
      `size         ${formatBytes(meta.sizeBytes)}`,
      `installed    ${meta.installed.join(", ") || "(nothing: the worker's packages satisfy it)"}`,
      ...(meta.shadowed?.length ? [`shadows      ${shadowsText(meta.shadowed)}`] : []),
      ...wheelLines(meta.wheels).map((l) => `wheel        ${l}`),
      ...(meta.check.length ? [`pip check    ${meta.check.join("; ")}`] : []),
    ]);
  },
});
