import { defineCommand } from "citty";
import { versionInfo } from "../version.ts";
import { Output } from "../ui/output.ts";
import { outputArgs, rejectUnknownFlags } from "./_args.ts";

export default defineCommand({
  meta: { name: "version", description: "Print gpulayer's version, commit and target" },
  args: { ...outputArgs },
  run({ args, rawArgs }) {
    rejectUnknownFlags(rawArgs, outputArgs);
    const out = new Output(args);
    out.result(versionInfo, () => `gpulayer ${versionInfo.version} (${versionInfo.commit}, ${versionInfo.target})`, true);
  },
});
