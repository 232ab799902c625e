import { createReadStream, readFileSync } from "node:fs";
import { join, posix } from "node:path";
import * as tar from "tar";
import { parseTarFrames } from "./frames.ts";

/**
 * An env as an artifact another worker can unpack: a tar of the env folder
 * (entries sorted, no owners, times kept so the bytecode stays valid), zstd
 * compressed (pack.ts), named by its sha256. Envs hold their own absolute path (scripts'
 * shebangs, pip's RECORD, editable .pth lines), so an artifact is unpacked
 * only at the same path: the path is one of its conditions (shipping.ts), with
 * the worker's interpreter, platform and installed base (which the key covers too).
 * Loaded only to pack or unpack: tar and zstd cost the warm path nothing.
 */

/** The sha256 of a file, streaming. */
export async function fileSha256(file: string): Promise<string> {
  const hasher = new Bun.CryptoHasher("sha256");
  for await (const chunk of createReadStream(file)) hasher.update(chunk as Buffer);
  return hasher.digest("hex");
}

/** Entry types an env holds: files, folders, symbolic links. Never a hard link (a second name of a file that may be outside), a device or a fifo. */
const KINDS = new Set(["File", "OldFile", "ContiguousFile", "Directory", "SymbolicLink"]);
/** What the worker itself writes into a fetched env afterwards (store.ts markReady, the lock): never through a link. */
const WRITTEN_AFTER = new Set([".gpulayer", ".gpulayer/meta.json", ".gpulayer/ready", ".gpulayer/last-used", ".lock"]);
export const META_ENTRY = ".gpulayer/meta.json";

/** An entry's path as the unpacker resolves it (`a/./b/` is `a/b`), or null when it is not strictly inside the env. */
export function entryPath(raw: string): string | null {
  if (!raw || raw.includes("\0") || raw.startsWith("/") || raw.split("/").includes("..")) return null;
  const p = posix.normalize(raw).replace(/\/+$/, "");
  return p === "." || p === "" || p === ".." || p.startsWith("../") ? null : p;
}

/**
 * Checks an artifact's entries in the order they come, so that none resolves
 * outside the env whatever the order: each path appears once, as a tree whose
 * symbolic links are leaves (nothing is written under a link, and a link never
 * replaces a folder or file already written or implied by a path under it),
 * and no hard link. A link may point anywhere (bin/python is the worker's
 * interpreter): nothing of the artifact is written through it.
 */
export class EntryGuard {
  private readonly dirs = new Set<string>();
  private readonly leaves = new Map<string, string>();

  /** Why this entry may not be unpacked, or null. */
  refusal(raw: string, type: string): string | null {
    const p = entryPath(raw);
    if (p === null) return `${JSON.stringify(raw)} is outside the env`;
    if (!KINDS.has(type)) return `${JSON.stringify(raw)} is ${type === "Link" ? "a hard link" : `a ${type} entry`}`;
    const parts = p.split("/");
    for (let i = 1; i < parts.length; i++) {
      const up = parts.slice(0, i).join("/");
      const leaf = this.leaves.get(up);
      if (leaf) return `${JSON.stringify(raw)} is under ${leaf === "SymbolicLink" ? "the symbolic link" : "the file"} ${up}`;
      this.dirs.add(up);
    }
    if (type === "Directory") {
      if (this.leaves.has(p)) return `${JSON.stringify(raw)} replaces ${p}`;
      this.dirs.add(p);
      return null;
    }
    if (this.dirs.has(p) || this.leaves.has(p)) return `${JSON.stringify(raw)} replaces ${p}`;
    if (WRITTEN_AFTER.has(p) && type === "SymbolicLink") return `${JSON.stringify(raw)} is a symbolic link where the worker writes`;
    if (p === ".gpulayer") return `${JSON.stringify(raw)} is not a folder`;
    this.leaves.set(p, type);
    return null;
  }
}

/** The env metadata an unpacked artifact holds, or why it is not that of `key` at `envPath`. */
export function unpackedMetaMismatch(into: string, key: string, envPath: string): string | null {
  let meta: { key?: unknown; path?: unknown };
  try {
    meta = JSON.parse(readFileSync(join(into, META_ENTRY), "utf8")) as typeof meta;
  } catch (error) {
    return `it holds no readable ${META_ENTRY} (${(error as Error).message.split("\n")[0]})`;
  }
  return metaMismatch(meta, key, envPath);
}

function metaMismatch(meta: { key?: unknown; path?: unknown } | null, key: string, envPath: string): string | null {
  if (!meta || typeof meta !== "object") return `its ${META_ENTRY} is not an env's metadata`;
  if (meta.key !== key || meta.path !== envPath) return `it holds env ${String(meta.key).slice(0, 12)} at ${String(meta.path)}, not ${key.slice(0, 12)} at ${envPath}`;
  return null;
}

const META_MAX = 1024 ** 2;

/**
 * Why an artifact file is not a sound artifact of `key` at `envPath` (its
 * sha256, its tar, each entry as the unpacker checks it, its metadata), or
 * null: what the server checks at an upload and when a worker says it refused
 * one, without unpacking anything. Streaming: an artifact never sits in memory.
 */
export async function artifactFault(file: string, sha: string, key: string, envPath: string): Promise<string | null> {
  const got = await fileSha256(file).catch((error: Error) => `unreadable: ${error.message}`);
  if (got !== sha) return got.startsWith("unreadable") ? `it is ${got}` : "its content does not match its sha256";
  const guard = new EntryGuard();
  let refused: string | null = null;
  let meta: string | null = null;
  const parser = new tar.Parser({
    strict: true,
    onReadEntry: (entry) => {
      refused ??= guard.refusal(entry.path, entry.type);
      if (!refused && entryPath(entry.path) === META_ENTRY) {
        let text = "";
        entry.on("data", (chunk: Buffer) => {
          if (text.length < META_MAX) text += chunk.toString("utf8");
        });
        entry.on("end", () => (meta = text));
      } else entry.resume();
    },
  });
  try {
    await parseTarFrames(createReadStream(file), parser);
  } catch (error) {
    return `it is not a readable artifact (${(error as Error).message.split("\n")[0]})`;
  }
  if (refused) return `it holds an entry that may not be unpacked: ${refused}`;
  if (meta === null) return `it holds no ${META_ENTRY}`;
  try {
    return metaMismatch(JSON.parse(meta) as { key?: unknown; path?: unknown }, key, envPath);
  } catch {
    return `its ${META_ENTRY} is not JSON`;
  }
}
