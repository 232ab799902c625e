import { defineCommand } from "citty";
import { commandContext } from "../_context.ts";
import { findEnv, removeEnv } from "../../env/inventory.ts";
import { Output, shortKey } from "../../ui/output.ts";
import { outputArgs, rejectUnknownFlags } from "../_args.ts";
import type { EnvRmDoc } from "../_json.ts";

const args = {
  key: { type: "positional", required: true, valueHint: "KEY", description: "Environment key or a unique prefix of it" },
  force: { type: "boolean", description: "Remove it even while a running job uses it" },
  ...outputArgs,
} as const;

export default defineCommand({
  meta: { name: "rm", description: "Remove one cached environment" },
  args,
  async run({ args: a, rawArgs }) {
    rejectUnknownFlags(rawArgs, args);
    const out = new Output(a);
    const { layout } = await commandContext();
    const key = findEnv(layout, a.key);
    await removeEnv(layout, key, { force: a.force });
    const doc: EnvRmDoc = { key, removed: true };
    out.result(doc, () => `removed ${shortKey(key)}`);
  },
});
