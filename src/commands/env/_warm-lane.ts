import type { ParsedArgs } from "citty";
import { findPrepared, type PrepareResult } from "../../env/index-warm.ts";
import { Output } from "../../ui/output.ts";
import { plainArgs } from "../_plain-args.ts";
import { commandContext } from "../_context.ts";
import { prepareHooks } from "../_prepare-ui.ts";
import { prepareArgs } from "./_prepare-args.ts";
import { localPrepareRequest, reportPrepared } from "./_prepare-local.ts";

/**
 * `env prepare` for an env that is ready: the same flags read as citty reads them (plainArgs: the plain forms only),
 * the same settings, request, look and report as the command's, without loading the command tree (the warm path's
 * start-up is most of its time). It answers only a local request whose env is ready; anything else (a server, an
 * image, a token file, --conda, --dry-run, a build, an error to report) returns false and the command runs as
 * usual, from the start.
 * Stepping aside costs the command nothing and shows nothing: the look writes only what the command's own look would
 * (the digest cache), prints nothing until it answers (a big file to hash is left to the command), and a failure is
 * left for the command to report.
 */
export async function warmPrepare(rawArgs: string[]): Promise<boolean> {
  let answer: { out: Output; result: PrepareResult } | null;
  try {
    answer = await lookUp(rawArgs);
  } catch {
    return false;
  }
  if (!answer) return false;
  // Said with --verbose: which path answered (and a test's proof that the lane still answers at all).
  answer.out.debug(() => "answered by env prepare's warm lane (the command tree not loaded)");
  reportPrepared(answer.out, answer.result);
  return true;
}

/** Thrown to leave a request to the command; caught, as every failure of the look is, by warmPrepare. */
class SteppedAside extends Error {}

async function lookUp(rawArgs: string[]): Promise<{ out: Output; result: PrepareResult } | null> {
  const a = plainArgs(rawArgs, prepareArgs) as ParsedArgs<typeof prepareArgs> | null;
  if (!a) return null;
  const remoteOrImage = [a.server, a.token, a["token-file"], a.label, a.image, a.pull].some((v) => v !== undefined);
  if (remoteOrImage || a["dry-run"] || a.conda !== undefined) return null;
  const ctx = await commandContext({ python: a.python, prepare_timeout: a["prepare-timeout"] }, { tokenFileUnread: true });
  if ((ctx.values.server !== undefined && !a.local) || ctx.values.token_file !== undefined) return null;
  const out = new Output(a);
  // A big file to hash for the key is new or changed: its env is likely not built, and the command would hash it
  // again. Stepping aside before the hashing leaves it (and its line) to the command, once.
  const hooks = {
    ...prepareHooks(out),
    onHashing: () => {
      throw new SteppedAside();
    },
  };
  const result = findPrepared(ctx.layout, localPrepareRequest(a, rawArgs, ctx), hooks);
  return result && { out, result };
}
