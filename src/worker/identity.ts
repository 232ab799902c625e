import { chmodSync, existsSync, mkdirSync, readFileSync, renameSync, statSync, writeFileSync } from "node:fs";
import { join } from "node:path";
import * as v from "valibot";
import { serverUrls } from "../config/kinds.ts";
import type { HomeLayout } from "../config/paths.ts";

/**
 * Who this worker is to a server: the id and credential it was given when it
 * registered, kept in its home (one file per server and name, mode 0600, in a
 * 0700 folder; the replicas of one server are one server) so that `gpulayer
 * join` started again comes back as the same worker instead of a second one. The credential is a secret: it is never
 * logged, and only ever sent to the server that issued it.
 */

export interface WorkerIdentity {
  server: string;
  name: string;
  id: string;
  credential: string;
}

const IdentitySchema = v.strictObject({ server: v.string(), name: v.string(), id: v.string(), credential: v.string() });

function identityDir(layout: HomeLayout): string {
  return layout.identity;
}

/** A server as an identity knows it: its URLs, sorted (their order says which replica is asked first, not which server it is). */
export function identityServer(server: string): string {
  return [...new Set(serverUrls(server))].sort().join(",");
}

export function identityFile(layout: HomeLayout, server: string, name: string): string {
  const key = new Bun.CryptoHasher("sha256").update(`${identityServer(server)}\n${name}`).digest("hex").slice(0, 24);
  return join(identityDir(layout), `${key}.json`);
}

function readIdentity(layout: HomeLayout, server: string, name: string): { identity: WorkerIdentity; at: number } | null {
  const file = identityFile(layout, server, name);
  let data: unknown;
  let at: number;
  try {
    data = JSON.parse(readFileSync(file, "utf8"));
    at = statSync(file).mtimeMs;
  } catch {
    return null;
  }
  const parsed = v.safeParse(IdentitySchema, data);
  if (!parsed.success || parsed.output.server !== identityServer(server) || parsed.output.name !== name) return null;
  return { identity: parsed.output, at };
}

/**
 * The saved identity for this server and name; null when there is none or it
 * cannot be read (a new one is made then). A server of several replicas also
 * takes one saved under any single URL of them (a worker first joined with
 * one URL, restarted with the list, stays the same worker): the most recently
 * saved wins, so a worker that took this one over is seen.
 */
export function loadIdentity(layout: HomeLayout, server: string, name: string): WorkerIdentity | null {
  const urls = serverUrls(server);
  const found = [server, ...(urls.length > 1 ? urls : [])].map((s) => readIdentity(layout, s, name)).filter((f) => f !== null);
  return found.reduce<(typeof found)[number] | null>((best, f) => (best && best.at >= f.at ? best : f), null)?.identity ?? null;
}

function writeIdentity(layout: HomeLayout, identity: WorkerIdentity): string {
  const file = identityFile(layout, identity.server, identity.name);
  const tmp = `${file}.${process.pid}.tmp`;
  writeFileSync(tmp, `${JSON.stringify(identity, null, 2)}\n`, { mode: 0o600 });
  chmodSync(tmp, 0o600);
  renameSync(tmp, file);
  return file;
}

/**
 * Written to a private temp file, then renamed over the old one: never half a
 * file, never readable by others. Saved under a list of replicas, the files
 * of its single URLs that exist are brought up to date too: a `join` with one
 * of them alone finds the credential that works, not a replaced one.
 */
export function saveIdentity(layout: HomeLayout, identity: WorkerIdentity): string {
  const dir = identityDir(layout);
  mkdirSync(dir, { recursive: true, mode: 0o700 });
  chmodSync(dir, 0o700);
  const urls = serverUrls(identity.server);
  if (urls.length > 1) for (const url of urls) if (existsSync(identityFile(layout, url, identity.name))) writeIdentity(layout, { ...identity, server: url });
  return writeIdentity(layout, { ...identity, server: identityServer(identity.server) });
}
