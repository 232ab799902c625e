import { chmodSync, mkdirSync, readFileSync, renameSync, writeFileSync } from "node:fs";
import { join } from "node:path";
import * as v from "valibot";
import type { HomeLayout } from "../config/paths.ts";

/**
 * Who this worker is to a server: the id and credential it was given when it
 * registered, kept in its home (one file per server and name, mode 0600, in a
 * 0700 folder) so that `gpulayer join` started again comes back as the same
 * worker instead of a second one. The credential is a secret: it is never
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
  return join(layout.root, "cluster", "identity");
}

export function identityFile(layout: HomeLayout, server: string, name: string): string {
  const key = new Bun.CryptoHasher("sha256").update(`${server}\n${name}`).digest("hex").slice(0, 24);
  return join(identityDir(layout), `${key}.json`);
}

/** The saved identity for this server and name; null when there is none or it cannot be read (a new one is made then). */
export function loadIdentity(layout: HomeLayout, server: string, name: string): WorkerIdentity | null {
  let data: unknown;
  try {
    data = JSON.parse(readFileSync(identityFile(layout, server, name), "utf8"));
  } catch {
    return null;
  }
  const parsed = v.safeParse(IdentitySchema, data);
  if (!parsed.success || parsed.output.server !== server || parsed.output.name !== name) return null;
  return parsed.output;
}

/** Written to a private temp file, then renamed over the old one: never half a file, never readable by others. */
export function saveIdentity(layout: HomeLayout, identity: WorkerIdentity): string {
  const dir = identityDir(layout);
  mkdirSync(dir, { recursive: true, mode: 0o700 });
  chmodSync(dir, 0o700);
  const file = identityFile(layout, identity.server, identity.name);
  const tmp = `${file}.${process.pid}.tmp`;
  writeFileSync(tmp, `${JSON.stringify(identity, null, 2)}\n`, { mode: 0o600 });
  chmodSync(tmp, 0o600);
  renameSync(tmp, file);
  return file;
}
