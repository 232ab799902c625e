import { defineCommand } from "citty";
import { commandContext, originText } from "../_context.ts";
import { UsageError } from "../../errors.ts";
import { findEnv, removeEnv } from "../../env/index-light.ts";
import { Output, shortKey } from "../../ui/output.ts";
import { outputArgs, rejectUnknownFlags } from "../_args.ts";
import type { EnvRmDoc } from "../_json.ts";

const args = {
  key: { type: "positional", required: true, valueHint: "KEY", description: "Environment key or a unique prefix of it" },
  force: { type: "boolean", description: "Remove it even while a running job uses it" },
  local: { type: "boolean", description: "This machine's cache (needed with a server configured: a fleet's workers each remove their own)" },
  ...outputArgs,
} as const;

export default defineCommand({
  meta: { name: "rm", description: "Remove one cached environment of this machine (with a server configured, say so with --local)" },
  args,
  async run({ args: a, rawArgs }) {
    rejectUnknownFlags(rawArgs, args);
    const out = new Output(a);
    const ctx = await commandContext();
    // No remote removal exists: with a server configured the place is said, never assumed.
    if (!a.local && ctx.values.server) throw new UsageError(`a server is configured (${originText(ctx, "server")}): env rm --local removes ${a.key} from this machine's cache; a worker's envs are removed on it`);
    const { layout } = ctx;
    const key = findEnv(layout, a.key);
    await removeEnv(layout, key, { force: a.force });
    const doc: EnvRmDoc = { key, removed: true };
    out.result(doc, () => `removed ${shortKey(key)}`);
  },
});
