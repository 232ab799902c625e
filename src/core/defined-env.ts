/** An environment without its unset entries (process.env's type allows them): what Bun.spawn and its kin take. */
export function definedOnly(env: Record<string, string | undefined>): Record<string, string> {
  const out: Record<string, string> = {};
  for (const [k, v] of Object.entries(env)) if (v !== undefined) out[k] = v;
  return out;
}
