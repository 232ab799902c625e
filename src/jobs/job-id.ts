import { UsageError } from "../errors.ts";

/**
 * A job id as typed (`job status ID`, `logs`, `cancel`, `outputs`): the whole id or a prefix of it, hex, checked
 * before anything is looked up, here or on a server, so either says the same. An empty one (a script's unset
 * `$ID`) is named as such.
 */
export function jobIdPrefix(typed: string | undefined): string {
  const text = typed ?? "";
  if (/^[0-9a-f]{1,16}$/i.test(text)) return text;
  throw new UsageError(text ? `not a job id: ${text} (hex, as gpulayer job list shows it; a unique prefix is enough)` : "no job id given: the id was empty (see gpulayer job list)");
}
