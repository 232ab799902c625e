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
