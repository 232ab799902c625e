import { defineCommand } from "citty";
import { UsageError } from "../../errors.ts";
import { dryRunPrepare } from "../../env/index-light.ts";
import { hasRequirements, prepare } from "../../jobs/prepare.ts";
import { inputsLines } from "../../env/index-light.ts";
import { nearestLines } from "../../env/index-light.ts";
import { formatSeconds, Output, shortKey } from "../../ui/output.ts";
import { remoteTarget } from "../../cluster/client.ts";
import { commandContext, originText, prepareSettings, stopOnSignals } from "../_context.ts";
import { rejectUnknownFlags } from "../_args.ts";
import { FROM_JOB_RUN, prepareArgs } from "./_prepare-args.ts";
import { askedByFlags, localPrepareRequest, reportPrepared } from "./_prepare-local.ts";
import { prepareHooks, prepareFailure, shadowsText } from "../_prepare-ui.ts";
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
    const ctx = await commandContext({ python: a.python, server: a.server, token: a.token, token_file: a["token-file"], prepare_timeout: a["prepare-timeout"] });
    const { layout } = ctx;
    const remote = remoteTarget(ctx.settings, rawArgs, { local: a.local });
    if (a["dry-run"] && remote) throw new UsageError(`--dry-run shows a local request's key; it does not go with a server (${originText(ctx, "server")} names one; --local prepares here)`);
    if (a["dry-run"] && a.image !== undefined) throw new UsageError("--dry-run shows a local request's key; it does not go with --image");
    if (remote) {
      // A worker's default Python is its own: --python goes as the request's.
      const request = { ...askedByFlags(a, rawArgs), python: a.python, image: a.image, pull: a.pull };
      return (await import("../_remote/prepare.ts")).prepareRemote(remote, request, rawArgs, out, ctx.cwd, { env: ctx.childEnv, digestCache: ctx.layout.digests });
    }
    const settings = prepareSettings(ctx);
    if (a.image !== undefined || a.pull !== undefined) {
      // Loaded only for images: the container code (and the YAML parser it brings) costs a warm prepare ~2 ms.
      const { imageHooks, imageJson, imageSummary } = await import("../_image-ui.ts");
      if (a.image === undefined) throw new UsageError("--pull goes with --image");
      // --python goes as the request's own, so prepare() refuses it with the image, in the words it refuses a job's.
      const request = { ...askedByFlags(a, rawArgs), python: a.python, image: a.image };
      const withRequirements = hasRequirements(request);
      const other = (["index-url", "extra-index-url", "find-links"] as const).find((f) => a[f] !== undefined);
      if (other && !withRequirements) throw new UsageError(`--${other} applies to requirements, not to --image alone`);
      // Ctrl-C stops the env's build; a pull stops as any command does (the handlers come once the image is here).
      const stop = new AbortController();
      const prepared = await prepare(layout, settings, {
        request,
        workdir: ctx.cwd,
        pull: a.pull,
        signal: stop.signal,
        hooks: {
          image: imageHooks(out),
          env: { onStep: (step, detail) => out.phase(`${step} ${detail}`) },
          onImage: (image, withEnv) => {
            out.progress(imageSummary(image));
            if (withEnv) stopOnSignals().addEventListener("abort", (e) => stop.abort((e.target as AbortSignal).reason));
          },
        },
      });
      if (prepared.kind !== "image") throw new Error("an image request prepared no image");
      const { image, env } = prepared;
      if (!env) return out.result(imageJson(image), () => image.digest, true);
      out.progress(`env ${shortKey(env.key)} ${env.status} (${formatSeconds(env.seconds)}) on ${image.image}`);
      if (env.shadowed?.length) out.progress(`shadows ${shadowsText(env.shadowed).replaceAll("the worker's", "the image's")}`);
      out.result({ ...imageJson(image), env: { key: env.key, path: env.path, status: env.status, seconds: Number(env.seconds.toFixed(4)), ...(env.shadowed ? { shadowed: env.shadowed } : {}) } }, () => env.path, true);
      return;
    }
    if (a["dry-run"]) {
      const plan = dryRunPrepare(layout, localPrepareRequest(a, rawArgs, ctx), { onHashing: prepareHooks(out).onHashing });
      const doc: EnvDryRunDoc = { key: plan.key, would: plan.would, path: plan.path, summary: plan.summary, inputs: plan.inputs, nearest: plan.nearest };
      out.result(doc, () => [`key          ${plan.key}`, `would        ${plan.would} (${plan.path})`, ...inputsLines(plan.inputs), ...nearestLines(plan.nearest, plan.would)]);
      return;
    }
    try {
      const prepared = await prepare(layout, settings, { request: askedByFlags(a, rawArgs), workdir: ctx.cwd, signal: stopOnSignals(), hooks: { env: prepareHooks(out) } });
      if (prepared.kind !== "host") throw new Error("a host request prepared an image");
      reportPrepared(out, prepared.env);
    } catch (error) {
      throw prepareFailure(error);
    }
  },
});
