import { defineCommand } from "citty";
import { UsageError } from "../../errors.ts";
import { dryRunPrepare, prepareEnv } from "../../env/prepare.ts";
import { defaultPython } from "../../config/python.ts";
import { environmentRequest } from "../../env/request.ts";
import { inputsLines } from "../../env/inputs-report.ts";
import { formatBytes, formatSeconds, Output, shortKey } from "../../ui/output.ts";
import { remoteTarget } from "../../cluster/client.ts";

import { commandContext, engineHost, stopOnSignals } from "../_context.ts";
import { buildOutputArgs, installerArgs, labelArgs, rejectUnknownFlags, repeated, serverArgs } from "../_args.ts";
import { prepareHooks, prepareFailure } from "../_prepare-ui.ts";
import type { EnvDryRunDoc, EnvPrepareDoc } from "../_json.ts";

const args = {
  requirements: { type: "positional", required: false, valueHint: "REQ_FILE", description: "A requirements file (pip's format: -r/-c includes, options, markers)" },
  package: { type: "string", alias: "p", valueHint: "SPEC", description: "A requirement such as 'numpy<3' (repeatable)" },
  image: { type: "string", valueHint: "REF", description: "Pull a container image ahead of jobs (Docker or Podman), or find it already here" },
  pull: { type: "string", valueHint: "missing|always|never", description: "With --image: pull only when missing (default), always, or never" },
  "dry-run": { type: "boolean", description: "Show the key, whether it would reuse or build, and every input the key covers; build nothing" },
  ...installerArgs,
  ...serverArgs,
  ...labelArgs,
  ...buildOutputArgs,
} as const;

/** `job run` names its file with -r; here it is the argument. */
const FROM_JOB_RUN = Object.fromEntries(["-r", "--requirement"].map((f) => [f, "the requirements file is the argument here (gpulayer env prepare requirements.txt)"]));

export default defineCommand({
  meta: {
    name: "prepare",
    description: "Build the environment for a request, or find it already built. Prints its path (last line on stdout).",
  },
  args,
  async run({ args: a, rawArgs }) {
    rejectUnknownFlags(rawArgs, args, FROM_JOB_RUN);
    const out = new Output(a);
    const specs = repeated(rawArgs, ["-p", "--package"]);
    const ctx = await commandContext({ python: a.python, server: a.server, token: a.token, token_file: a["token-file"], prepare_timeout: a["prepare-timeout"] });
    const { layout, values } = ctx;
    const remote = remoteTarget(ctx.settings, rawArgs);
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
        { requirementsFile: a.requirements, specs, indexUrl: a["index-url"], extraIndexUrls: repeated(rawArgs, ["--extra-index-url"]), findLinks: repeated(rawArgs, ["--find-links"]), cwd: ctx.cwd, env: ctx.childEnv, network: values["container.network"], uv: values.uv },
        { engineEnv: host.env, hooks: { onStep: (step, detail) => out.phase(`${step} ${detail}`) }, signal: stopOnSignals() },
      );
      out.progress(`env ${shortKey(env.key)} ${env.status} (${formatSeconds(env.seconds)}) on ${result.image}`);
      out.result({ ...imageJson(result), env: { key: env.key, path: env.path, status: env.status, seconds: Number(env.seconds.toFixed(4)) } }, () => env.path, true);
      return;
    }
    const fallback = defaultPython(layout, ctx.settings);
    const asked = { requirementsFile: a.requirements, specs, conda: a.conda, python: a.conda === undefined ? undefined : a.python, indexUrl: a["index-url"], extraIndexUrls: repeated(rawArgs, ["--extra-index-url"]), findLinks: repeated(rawArgs, ["--find-links"]) };
    const request = {
      ...environmentRequest(asked, ctx.cwd, fallback.python, fallback.origin),
      cwd: ctx.cwd,
      env: ctx.childEnv,
      installer: values.installer,
      venvCreator: values.venv_creator,
      uv: values.uv,
      timeoutMs: values.prepare_timeout,
      signal: stopOnSignals(),
    };
    if (a["dry-run"]) {
      const plan = dryRunPrepare(layout, request, { onHashing: prepareHooks(out).onHashing });
      const doc: EnvDryRunDoc = { key: plan.key, would: plan.would, path: plan.path, summary: plan.summary, inputs: plan.inputs };
      out.result(doc, () => [`key          ${plan.key}`, `would        ${plan.would} (${plan.path})`, ...inputsLines(plan.inputs)]);
      return;
    }
    try {
      const result = await prepareEnv(layout, request, { hooks: prepareHooks(out) });
      for (const finding of result.check) out.log.warn(`pip check: ${finding}`);
      const detail = result.build ? `built in ${formatSeconds(result.seconds)}, ${formatBytes(result.build.sizeBytes)}` : `reused (${formatSeconds(result.seconds)})`;
      out.progress(`env ${shortKey(result.key)} ${detail}: ${result.summary}`);
      const doc: EnvPrepareDoc = { key: result.key, path: result.path, python: result.python, status: result.status, seconds: Number(result.seconds.toFixed(4)), check: result.check, installer_path: result.installerPath };
      out.result(
        doc,
        () => result.path,
        true,
      );
    } catch (error) {
      throw prepareFailure(error);
    }
  },
});
