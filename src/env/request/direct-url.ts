import { createHash } from "node:crypto";
import { closeSync, constants, ftruncateSync, openSync, readdirSync, readFileSync, writeSync } from "node:fs";
import { join } from "node:path";
import type { Requirement } from "./requirements.ts";
import { unexpandVariables } from "./url-credentials.ts";

/**
 * pip records where a distribution came from in its dist-info's
 * direct_url.json (PEP 610), with the URL as it fetched it: a `${VAR}` of the
 * requirement's line expanded (pip strips expanded credentials from the
 * authority itself, not a value in the path or the query). The env would
 * keep the value in a file any reader of the env (and an artifact shipped to
 * other workers) holds. After the install, each such value is put back as
 * `${NAME}`, as the line was written: `pip freeze` then prints the line as
 * the user wrote it, and RECORD is updated with the file's new hash and size
 * so the installed set stays consistent (uninstall reads RECORD's paths).
 */
export function unexpandDirectUrls(site: string, requirements: Requirement[]): number {
  const variables = requirements.flatMap((r) => r.variables ?? []).filter(([, value]) => value);
  if (!variables.length) return 0;
  let names: string[];
  try {
    names = readdirSync(site).filter((n) => n.endsWith(".dist-info"));
  } catch {
    return 0;
  }
  let rewritten = 0;
  for (const distInfo of names) {
    const file = join(site, distInfo, "direct_url.json");
    const text = readPlain(file);
    if (text === null) continue;
    let parsed: unknown;
    try {
      parsed = JSON.parse(text);
    } catch {
      continue; // not pip's: nothing of ours to put back
    }
    const fixed = JSON.stringify(unexpandDeep(parsed, variables));
    if (fixed === JSON.stringify(parsed)) continue;
    rewritePlain(file, fixed);
    updateRecord(join(site, distInfo, "RECORD"), `${distInfo}/direct_url.json`, Buffer.from(fixed));
    rewritten++;
  }
  return rewritten;
}

function unexpandDeep(value: unknown, variables: [string, string | undefined][]): unknown {
  if (typeof value === "string") return unexpandVariables(value, variables);
  if (Array.isArray(value)) return value.map((v) => unexpandDeep(v, variables));
  if (value && typeof value === "object") return Object.fromEntries(Object.entries(value).map(([k, v]) => [k, unexpandDeep(v, variables)]));
  return value;
}

/** RECORD's line for `path`, with the hash and size of its new content (the wheel spec's urlsafe base64, unpadded). */
function updateRecord(record: string, path: string, content: Buffer): void {
  const text = readPlain(record);
  if (text === null) return;
  const digest = createHash("sha256").update(content).digest("base64url");
  const lines = text.split("\n").map((line) => (line.split(",")[0] === path ? `${path},sha256=${digest},${content.length}` : line));
  rewritePlain(record, lines.join("\n"));
}

/*
 * Read and rewritten in place, never through a link: a --run-as build's user
 * made these files (build-user.ts), and the env is taken back (owner, group,
 * modes) before this runs, so a rewrite keeps what the take-back set and a
 * link the build left leads nowhere. The env is not ready yet: a crash here
 * leaves no marker, and the next request builds again.
 */
function readPlain(file: string): string | null {
  let fd: number;
  try {
    fd = openSync(file, constants.O_RDONLY | constants.O_NOFOLLOW);
  } catch {
    return null;
  }
  try {
    return readFileSync(fd, "utf8");
  } finally {
    closeSync(fd);
  }
}

function rewritePlain(file: string, text: string): void {
  const fd = openSync(file, constants.O_WRONLY | constants.O_NOFOLLOW);
  try {
    ftruncateSync(fd, 0);
    writeSync(fd, text, 0);
  } finally {
    closeSync(fd);
  }
}
