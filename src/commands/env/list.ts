import { existsSync } from "node:fs";
import { defineCommand } from "citty";
import { placeContext } from "../_place.ts";
import { listEnvs } from "../../env/index-light.ts";
import { formatBytes, formatAgo, shortKey, table } from "../../ui/output.ts";
import { outputArgs, placeArgs } from "../_args.ts";
import type { EnvEntry } from "../../env/index-light.ts";
import type { ImageEntry } from "../../docker/inventory.ts";
import type { EnvListEnvDoc, EnvListImageDoc } from "../_json.ts";
import { pythonLabel, requestLabels } from "../../ui/env-labels.ts";

const ago = (iso: string | null | undefined) => (iso ? formatAgo(Date.parse(iso)) : "-");

/** `env list --json`: an environment. */
function envJson(e: EnvEntry): EnvListEnvDoc {
  return { kind: "env", key: e.key, path: e.path, state: e.state, size_bytes: e.sizeBytes, created: e.created, last_used: e.lastUsed, summary: e.summary, python: e.python, requirements_file: e.requirementsFile?.path ?? null };
}

/** `env list --json`: an image gpulayer recorded. */
function imageJson(i: ImageEntry): EnvListImageDoc {
  return {
    kind: "image",
    id: i.id,
    dir: i.dir,
    engine: i.engine,
    ref: i.ref,
    digest: i.digest,
    image_id: i.imageId,
    repo_digests: i.repoDigests,
    size_bytes: i.sizeBytes,
    first_seen: i.firstSeen,
    last_pulled: i.lastPulled ?? null,
    last_used: i.lastUsed,
    pulled_by_gpulayer: i.pulledByGpulayer,
  };
}

const args = { ...placeArgs, ...outputArgs } as const;

export default defineCommand({
  meta: { name: "list", description: "List cached environments and the images gpulayer recorded, most recently used first; with a server configured, each worker's envs and the server's artifacts (--local: this machine's)" },
  args,
  async run({ args: a, rawArgs }) {
    const { out, ctx, remote } = await placeContext(a, rawArgs, args);
    if (remote) return (await import("../_remote/fleet-envs.ts")).fleetEnvList(remote, out);
    const { layout } = ctx;
    const envs = await listEnvs(layout);
    // The container code loads only when there is an image inventory to read.
    const images = existsSync(layout.images) ? (await import("../../docker/inventory.ts")).listImageRecords(layout) : [];
    out.result(
      [...envs.map(envJson), ...images.map(imageJson)],
      () => {
        if (!envs.length && !images.length) return "no environments yet (gpulayer env prepare REQ_FILE builds one)";
        const lines: string[] = [];
        if (envs.length) {
          const rows = [["KEY", "STATE", "SIZE", "CREATED", "LAST USED", "PYTHON", "REQUEST"]];
          const requests = requestLabels(envs);
          envs.forEach((e, i) => rows.push([shortKey(e.key), e.state, formatBytes(e.sizeBytes), ago(e.created), ago(e.lastUsed), pythonLabel(e.python), requests[i]!]));
          lines.push(...table(rows));
        }
        if (images.length) {
          if (lines.length) lines.push("");
          const rows = [["IMAGE", "ENGINE", "SIZE", "FIRST SEEN", "LAST USED", "ID"]];
          for (const i of images) rows.push([i.ref, i.engine, formatBytes(i.sizeBytes), ago(i.firstSeen), ago(i.lastUsed), `${i.imageId.replace(/^sha256:/, "").slice(0, 12)}${i.pulledByGpulayer ? "" : " (not pulled by gpulayer)"}`]);
          lines.push(...table(rows));
        }
        return lines;
      },
    );
  },
});
