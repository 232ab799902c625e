import { contentHash } from "../../core/hashing.ts";

/**
 * URLs in text, found in time linear in its length: each `://` is found with
 * indexOf, its scheme walked back over by hand and its authority read by one
 * anchored match. (A regex that starts a scheme anywhere, like
 * /[a-z][a-z0-9+.-]*:\/\//gi, retries from every letter of a long run of
 * letters: quadratic, and a 1 MB request once stalled the server 39 s.)
 * Scheme, authority and userinfo are as RFC 3986 has them; the results are
 * those of the regexes in the comments, match for match.
 */

const isLetter = (c: number) => (c >= 97 && c <= 122) || (c >= 65 && c <= 90);
const isSchemeChar = (c: number) => isLetter(c) || (c >= 48 && c <= 57) || c === 43 || c === 45 || c === 46;

/** Where the scheme that ends at `sep` (a `://`) starts, no earlier than `floor`: the first letter of the run of scheme characters before it; -1 when there is none. */
function schemeStart(text: string, sep: number, floor: number): number {
  let start = sep;
  while (start > floor && isSchemeChar(text.charCodeAt(start - 1))) start--;
  while (start < sep && !isLetter(text.charCodeAt(start))) start++;
  return start < sep ? start : -1;
}

/** JavaScript's \s: whitespace and line terminators. */
function isSpace(c: number): boolean {
  if (c <= 0x20) return c === 0x20 || (c >= 0x09 && c <= 0x0d);
  if (c < 0xa0) return false;
  return c === 0xa0 || c === 0x1680 || (c >= 0x2000 && c <= 0x200a) || c === 0x2028 || c === 0x2029 || c === 0x202f || c === 0x205f || c === 0x3000 || c === 0xfeff;
}

/** The index of the `@` that ends the userinfo of the authority after `sep` (which runs up to the path, query, fragment or a space), or -1; a password may hold `@` and `:`, so the last one counts. */
function userinfoEnd(text: string, sep: number): number {
  let at = -1;
  for (let i = sep + 3; i < text.length; i++) {
    const c = text.charCodeAt(i);
    if (c === 0x2f || c === 0x3f || c === 0x23 || isSpace(c)) break;
    if (c === 0x40) at = i;
  }
  return at;
}

/** Where a URL that starts at `from` ends, as far as a line of requirements goes: at a space or a quote. */
function urlEnd(text: string, from: number): number {
  let i = from;
  for (; i < text.length; i++) {
    const c = text.charCodeAt(i);
    if (c === 0x22 || c === 0x27 || isSpace(c)) break;
  }
  return i;
}

/** Every `scheme://userinfo@` in the text, left to right, none overlapping (as /([a-z][a-z0-9+.-]*:\/\/)[^/?#\s]*@/gi finds them). */
function replaceUserinfo(text: string, replace: (scheme: string, userinfo: string) => string): string {
  let out = "";
  let done = 0;
  for (let sep = text.indexOf("://"); sep !== -1; sep = text.indexOf("://", sep + 1)) {
    const start = schemeStart(text, sep, done);
    if (start < 0) continue;
    const at = userinfoEnd(text, sep);
    if (at < 0) continue;
    out += text.slice(done, start) + replace(text.slice(start, sep + 3), text.slice(sep + 3, at)) + "@";
    done = at + 1;
    sep = at;
  }
  return done ? out + text.slice(done) : text;
}

/** Replace the credentials in a URL by a short hash of them: stable for the key, useless to a reader. */
export function hideCredentials(url: string): string {
  // Only a URL at the very start (as /^([a-z][a-z0-9+.-]*:\/\/)([^/?#\s]*)@/i).
  const sep = url.indexOf("://");
  if (sep < 0 || schemeStart(url, sep, 0) !== 0) return url;
  const at = userinfoEnd(url, sep);
  if (at < 0) return url;
  return `${url.slice(0, sep + 3)}cred-${contentHash(url.slice(sep + 3, at)).slice(0, 12)}${url.slice(at)}`;
}

/** URLs in a line with their credentials replaced by a digest of them (user and password both); each URL runs to a space or a quote (as /[a-z][a-z0-9+.-]*:\/\/[^\s'"]+/gi). */
export function hideCredentialsIn(text: string): string {
  let out = "";
  let done = 0;
  for (let sep = text.indexOf("://"); sep !== -1; sep = text.indexOf("://", sep + 1)) {
    const start = schemeStart(text, sep, done);
    if (start < 0) continue;
    const end = urlEnd(text, sep + 3);
    if (end === sep + 3) continue;
    out += text.slice(done, start) + hideCredentials(text.slice(start, end));
    done = end;
    sep = end - 1;
  }
  return done ? out + text.slice(done) : text;
}

/** For messages: the credentials of every URL in the text shown as *** (pip shows the user name; we do not). */
export function redactUrl(text: string): string {
  return replaceUserinfo(text, (scheme) => `${scheme}***`);
}

/** A JSON-like value with every string's URL credentials shown as ***: what a record may keep. */
export function redactDeep<T>(value: T): T {
  if (typeof value === "string") return redactUrl(value) as T;
  if (Array.isArray(value)) return value.map(redactDeep) as T;
  if (value && typeof value === "object" && !(value instanceof Uint8Array)) return Object.fromEntries(Object.entries(value).map(([k, v]) => [k, redactDeep(v)])) as T;
  return value;
}

/** Whether redactDeep would change anything in the value: a walk that copies nothing (a 1 MB request costs its scan, not two serialisations). */
export function holdsCredentials(value: unknown): boolean {
  if (typeof value === "string") return redactUrl(value) !== value;
  if (Array.isArray(value)) return value.some(holdsCredentials);
  if (value && typeof value === "object" && !(value instanceof Uint8Array)) return Object.values(value).some(holdsCredentials);
  return false;
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
