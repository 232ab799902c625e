import type { ArgsDef } from "citty";
import { type RemoteTarget, remoteTarget } from "../cluster/client.ts";
import { Output, type OutputFlags } from "../ui/output.ts";
import { rejectUnknownFlags } from "./_args.ts";
import { type CommandContext, commandContext } from "./_context.ts";

/** The flags of a command that acts here or on the fleet (placeArgs, outputArgs). */
export interface PlaceFlags extends OutputFlags {
  server?: string;
  token?: string;
  "token-file"?: string;
  local?: boolean;
}

/**
 * The start of every command that has a meaning here and on a fleet: its
 * flags checked, its output, its settings, and where it acts (the server
 * configured, unless --local: then `remote` is null and it acts here).
 */
export async function placeContext(a: PlaceFlags, rawArgs: string[], args: ArgsDef): Promise<{ out: Output; ctx: CommandContext; remote: RemoteTarget | null }> {
  rejectUnknownFlags(rawArgs, args);
  const out = new Output(a);
  const ctx = await commandContext({ server: a.server, token: a.token, token_file: a["token-file"] });
  return { out, ctx, remote: remoteTarget(ctx.settings, [], { local: a.local }) };
}
