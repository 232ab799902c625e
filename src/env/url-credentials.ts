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
