import { defineCommand } from "citty";
import prettyBytes from "pretty-bytes";
import { homeLayout } from "../../config/paths.ts";
import { listEnvs } from "../../env/inventory.ts";
import { formatAgo, Output, shortKey, table } from "../../ui/output.ts";
import { outputArgs, rejectUnknownFlags } from "../_args.ts";

export default defineCommand({
  meta: { name: "list", description: "List cached environments, most recently used first" },
  args: { ...outputArgs },
  async run({ args, rawArgs }) {
    rejectUnknownFlags(rawArgs, outputArgs);
    const out = new Output(args);
    const entries = await listEnvs(homeLayout());
    out.result(
      entries.map(({ meta: _meta, ...e }) => e),
      () => {
        if (!entries.length) return "no environments yet (gpulayer env prepare REQ_FILE builds one)";
        const rows = [["KEY", "STATE", "SIZE", "CREATED", "LAST USED", "REQUEST"]];
        for (const e of entries) {
          rows.push([shortKey(e.key), e.state, prettyBytes(e.sizeBytes), e.created ? formatAgo(Date.parse(e.created)) : "-", e.lastUsed ? formatAgo(Date.parse(e.lastUsed)) : "-", e.summary]);
        }
        return table(rows);
      },
    );
  },
});
