import { defineCommand } from "citty";
import { versionInfo } from "../version.ts";
import { Output } from "../ui/output.ts";
import { outputArgs, rejectUnknownFlags } from "./_args.ts";
import type { VersionDoc } from "./_json.ts";

export default defineCommand({
  meta: { name: "version", description: "Print gpulayer's version, commit and target" },
  args: { ...outputArgs },
  run({ args, rawArgs }) {
    rejectUnknownFlags(rawArgs, outputArgs);
    const out = new Output(args);
    const doc: VersionDoc = { version: versionInfo.version, commit: versionInfo.commit, target: versionInfo.target };
    out.result(doc, () => `gpulayer ${versionInfo.version} (${versionInfo.commit}, ${versionInfo.target})`, true);
  },
});
