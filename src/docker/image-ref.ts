import { UsageError } from "../errors.ts";

/** An image reference as the engines take it: [registry/]path[:tag][@digest]. */
const REF = /^[a-z0-9][a-z0-9._\-/:@]*$/i;

/** The reference, trimmed; a malformed one refused in one line (before a job is recorded, and again where an engine is asked). */
export function validateRef(ref: string): string {
  const r = ref.trim();
  if (!r || !REF.test(r) || r.includes("//") || r.length > 512) throw new UsageError(`not an image reference: ${JSON.stringify(ref)} (expected [registry/]name[:tag][@sha256:digest])`);
  return r;
}
