import { describe, expect, test } from "bun:test";
import { contentHash } from "../src/core/hashing.ts";
import { hideCredentials, hideCredentialsIn, redactDeep, redactUrl } from "../src/env/request/url-credentials.ts";

/**
 * Credentials in URLs are found in time linear in the text: the server
 * redacts every string a request stores, and a regex that retries a scheme
 * from every letter made 1 MB of letters cost 39 s. The scanner answers what
 * the regexes it replaced answered, on random and realistic text alike.
 */

const OLD = {
  redactUrl: (text: string) => text.replace(/([a-z][a-z0-9+.-]*:\/\/)[^/?#\s]*@/gi, "$1***@"),
  hideCredentials: (url: string) => url.replace(/^([a-z][a-z0-9+.-]*:\/\/)([^/?#\s]*)@/i, (_m, scheme: string, creds: string) => `${scheme}cred-${contentHash(creds).slice(0, 12)}@`),
  hideCredentialsIn: (text: string) => text.replace(/[a-z][a-z0-9+.-]*:\/\/[^\s'"]+/gi, (url) => OLD.hideCredentials(url)),
};

/** A small deterministic generator (the failures reproduce). */
function random(seed: number): () => number {
  let s = seed >>> 0;
  return () => {
    s = (s * 1664525 + 1013904223) >>> 0;
    return s / 2 ** 32;
  };
}

const ALPHABET = ["a", "Z", "h", "t", "p", "s", "1", "+", ".", "-", ":", "/", "//", "://", "@", "?", "#", " ", "\t", "\n", "\u00a0", "'", '"', "é", "ſ", "K", "_", "%40"];
const REALISTIC = [
  "https://user:pa@ss@pypi.example.com/simple",
  "git+https://tok:x-oauth@github.com/o/r.git@v1#egg=r",
  "pip install --index-url http://u:p@host:8080/ -r req.txt",
  "see http://host/path?q=a@b and ftp://a@b",
  "s3://key:secret@bucket/obj 'https://x:y@z' \"svn+ssh://me@h\"",
  "1a://x@y 9://q@r A+B-C.d://u@v ://nope@x a:/b@c",
];

function cases(n: number, seed: number): string[] {
  const next = random(seed);
  const out = [...REALISTIC];
  for (let i = 0; i < n; i++) {
    const len = Math.floor(next() * 24);
    let s = "";
    for (let j = 0; j < len; j++) s += next() < 0.1 ? REALISTIC[Math.floor(next() * REALISTIC.length)] : ALPHABET[Math.floor(next() * ALPHABET.length)];
    out.push(s);
  }
  return out;
}

describe("URL credentials", () => {
  test("redactUrl, hideCredentials and hideCredentialsIn answer as the regexes did, on 20,000 random and realistic strings", () => {
    for (const text of cases(20_000, 37)) {
      expect([text, redactUrl(text)]).toEqual([text, OLD.redactUrl(text)]);
      expect([text, hideCredentials(text)]).toEqual([text, OLD.hideCredentials(text)]);
      expect([text, hideCredentialsIn(text)]).toEqual([text, OLD.hideCredentialsIn(text)]);
    }
  });

  test("every UTF-16 code unit ends a URL's authority, or not, as the regexes' \\s did", () => {
    for (let c = 0; c < 0x10000; c++) {
      const text = `a://x${String.fromCharCode(c)}y@z'q`;
      if (redactUrl(text) !== OLD.redactUrl(text) || hideCredentialsIn(text) !== OLD.hideCredentialsIn(text)) throw new Error(`differs at U+${c.toString(16)}`);
    }
  });

  test("credentials are hidden where they were", () => {
    expect(redactUrl("from https://alice:s3cr@t@pypi.example.com/simple and http://bob@h/x")).toBe("from https://***@pypi.example.com/simple and http://***@h/x");
    expect(redactDeep({ a: ["http://u:p@h/"], b: 1 })).toEqual({ a: ["http://***@h/"], b: 1 });
    expect(hideCredentialsIn("-i https://u:p@h/simple")).toMatch(/^-i https:\/\/cred-[0-9a-f]{12}@h\/simple$/);
  });

  test("6 MB of letters (before, after and in a URL) are redacted well under a second each", () => {
    const letters = "abcdefghijklmnopqrstuvwxyz".repeat(242_000);
    for (const text of [letters, `${letters}://x`, `http://${letters}`, "a:".repeat(3_000_000)]) {
      const start = performance.now();
      redactUrl(text);
      hideCredentialsIn(text);
      hideCredentials(text);
      expect(performance.now() - start).toBeLessThan(1000);
    }
  });
});
