import { defineCommand } from "citty";
import { UsageError } from "../../errors.ts";
import { dryRunPrepare, prepareEnv } from "../../env/prepare.ts";
import { inputsLines } from "../../env/inputs-report.ts";
import { nearestLines } from "../../env/nearest.ts";
import { formatSeconds, Output, shortKey } from "../../ui/output.ts";
import { remoteTarget } from "../../cluster/client.ts";
import { commandContext, engineHost, stopOnSignals } from "../_context.ts";
import { defaultPython } from "../../config/python.ts";
import { rejectUnknownFlags, repeated } from "../_args.ts";
import { FROM_JOB_RUN, prepareArgs } from "./_prepare-args.ts";
import { localPrepareRequest, reportPrepared } from "./_prepare-local.ts";
import { prepareHooks, prepareFailure } from "../_prepare-ui.ts";
import type { EnvDryRunDoc } from "../_json.ts";

export default defineCommand({
  meta: {
    name: "prepare",
    description: "Build the environment for a request, or find it already built. Prints its path (last line on stdout).",
  },
  args: prepareArgs,
  async run({ args: a, rawArgs }) {
    rejectUnknownFlags(rawArgs, prepareArgs, FROM_JOB_RUN);
    const out = new Output(a);
    const specs = repeated(rawArgs, ["-p", "--package"]);
    const ctx = await commandContext({ python: a.python, server: a.server, token: a.token, token_file: a["token-file"], prepare_timeout: a["prepare-timeout"] });
    const { layout, values } = ctx;
    const remote = remoteTarget(ctx.settings, rawArgs, { local: a.local });
    if (a["dry-run"] && (remote || a.image !== undefined)) throw new UsageError("--dry-run shows a local request's key; it does not go with --server or --image");
    if (remote) {
      const request = { requirementsFile: a.requirements, specs, python: a.python, conda: a.conda, indexUrl: a["index-url"], extraIndexUrls: repeated(rawArgs, ["--extra-index-url"]), findLinks: repeated(rawArgs, ["--find-links"]), image: a.image, pull: a.pull };
      return (await import("../_remote/prepare.ts")).prepareRemote(remote, request, rawArgs, out, ctx.cwd);
    }
    if (a.image !== undefined || a.pull !== undefined) {
      // Loaded only for images: the container code (and the YAML parser it brings) costs a warm prepare ~2 ms.
      const [{ ensureImage, parsePullPolicy }, { ensureImageEnv }, { imageHooks, imageJson, imageSummary }] = await Promise.all([import("../../docker/index.ts"), import("../../docker/image-env.ts"), import("../_image-ui.ts")]);
      if (a.image === undefined) throw new UsageError("--pull goes with --image");
      const withRequirements = Boolean(a.requirements || specs.length);
      if (a.python !== undefined) throw new UsageError("--python does not go with --image: the env is built for the image's own Python");
      const other = (["index-url", "extra-index-url", "find-links"] as const).find((f) => a[f] !== undefined);
      if (other && !withRequirements) throw new UsageError(`--${other} applies to requirements, not to --image alone`);
      const host = engineHost(ctx);
      const result = await ensureImage(layout, a.image, { pull: parsePullPolicy(a.pull), host, ...imageHooks(out) });
      out.progress(imageSummary(result));
      if (!withRequirements) return out.result(imageJson(result), () => result.digest, true);
      const env = await ensureImageEnv(
        layout,
        { ref: result.image, imageId: result.imageId, engine: result.engine },
        { requirementsFile: a.requirements, specs, indexUrl: a["index-url"], extraIndexUrls: repeated(rawArgs, ["--extra-index-url"]), findLinks: repeated(rawArgs, ["--find-links"]), cwd: ctx.cwd, env: ctx.childEnv, network: values["container.network"], uv: values.uv, python: defaultPython(layout, ctx.settings).python },
        { engineEnv: host.env, hooks: { onStep: (step, detail) => out.phase(`${step} ${detail}`) }, signal: stopOnSignals() },
      );
      out.progress(`env ${shortKey(env.key)} ${env.status} (${formatSeconds(env.seconds)}) on ${result.image}`);
      out.result({ ...imageJson(result), env: { key: env.key, path: env.path, status: env.status, seconds: Number(env.seconds.toFixed(4)) } }, () => env.path, true);
      return;
    }
    const request = { ...localPrepareRequest(a, rawArgs, ctx), signal: stopOnSignals() };
    if (a["dry-run"]) {
      const plan = dryRunPrepare(layout, request, { onHashing: prepareHooks(out).onHashing });
      const doc: EnvDryRunDoc = { key: plan.key, would: plan.would, path: plan.path, summary: plan.summary, inputs: plan.inputs, nearest: plan.nearest };
      out.result(doc, () => [`key          ${plan.key}`, `would        ${plan.would} (${plan.path})`, ...inputsLines(plan.inputs), ...nearestLines(plan.nearest, plan.would)]);
      return;
    }
    try {
      reportPrepared(out, await prepareEnv(layout, request, { hooks: prepareHooks(out) }));
    } catch (error) {
      throw prepareFailure(error);
    }
  },
});
