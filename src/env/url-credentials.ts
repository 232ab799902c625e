import { contentHash } from "../core/hashing.ts";

/** A URL's user and password: everything before the last `@` of its authority (a password may hold `@` and `:`). */
const USERINFO = /^([a-z][a-z0-9+.-]*:\/\/)([^/?#\s]*)@/i;

/** Replace the credentials in a URL by a short hash of them: stable for the key, useless to a reader. */
export function hideCredentials(url: string): string {
  return url.replace(USERINFO, (_m, scheme: string, creds: string) => `${scheme}cred-${contentHash(creds).slice(0, 12)}@`);
}

/** For messages: the credentials of every URL in the text shown as *** (pip shows the user name; we do not). */
export function redactUrl(text: string): string {
  return text.replace(/([a-z][a-z0-9+.-]*:\/\/)[^/?#\s]*@/gi, "$1***@");
}

/** A JSON-like value with every string's URL credentials shown as ***: what a record may keep. */
export function redactDeep<T>(value: T): T {
  if (typeof value === "string") return redactUrl(value) as T;
  if (Array.isArray(value)) return value.map(redactDeep) as T;
  if (value && typeof value === "object" && !(value instanceof Uint8Array)) return Object.fromEntries(Object.entries(value).map(([k, v]) => [k, redactDeep(v)])) as T;
  return value;
}

/** Whether a stored (redacted) value once held credentials it no longer has. */
export const lostCredentials = (value: unknown): boolean => JSON.stringify(value ?? null).includes("://***@");

/**
 * Text a `${VAR}` was expanded into, with each set variable's value put back
 * as `${NAME}`, longest value first and in one pass (a value inside another's
 * `${NAME}` is not touched again): what gpulayer stores or shows of a URL
 * holds the variable's name, never its value (the key holds its digest).
 */
export function unexpandVariables(text: string, variables: Iterable<readonly [string, string | undefined]>): string {
  const byValue = new Map<string, string>();
  // As written into a URL, and as an installer may have quoted it there.
  for (const [name, value] of variables) if (value) for (const form of [value, encodeURI(value), encodeURIComponent(value)]) if (!byValue.has(form)) byValue.set(form, name);
  if (!byValue.size) return text;
  const values = [...byValue.keys()].sort((a, b) => b.length - a.length);
  const pattern = new RegExp(values.map((v) => v.replace(/[.*+?^${}()|[\]\\]/g, "\\$&")).join("|"), "g");
  return text.replace(pattern, (value) => `\${${byValue.get(value)}}`);
}
