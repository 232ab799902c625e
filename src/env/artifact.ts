import { createReadStream, createWriteStream, lstatSync, readdirSync } from "node:fs";
import { join } from "node:path";
import { Readable, Transform } from "node:stream";
import { pipeline } from "node:stream/promises";
import zlib from "node:zlib";
import * as tar from "tar";

/**
 * An env as an artifact another worker can unpack: a tar of the env folder
 * (entries sorted, no owners, times kept so the bytecode stays valid), zstd
 * compressed, named by its sha256. Envs hold their own absolute path (scripts'
 * shebangs, pip's RECORD, editable .pth lines), so an artifact is unpacked
 * only at the same path: the path is one of its conditions (shipping.ts), with
 * the worker's interpreter, platform and installed base (which the key covers too).
 * Loaded only to pack or unpack: tar and zstd cost the warm path nothing.
 */

/** What is never shipped: the entry's own state of use on the worker that built it. */
const LOCAL_ONLY = new Set([".gpulayer/ready", ".gpulayer/last-used", ".lock"]);

function entries(root: string): string[] {
  const out: string[] = [];
  const walk = (rel: string) => {
    const names = readdirSync(rel ? join(root, rel) : root).sort();
    for (const n of names) {
      const r = rel ? `${rel}/${n}` : n;
      if (LOCAL_ONLY.has(r)) continue;
      out.push(r);
      if (lstatSync(join(root, r)).isDirectory()) walk(r);
    }
  };
  walk("");
  return out;
}

export interface PackedArtifact {
  sha256: string;
  bytes: number;
}

/** Counts and hashes what passes. */
function hashing(hasher: Bun.CryptoHasher, count: { bytes: number }): Transform {
  return new Transform({
    transform(chunk: Buffer, _enc, cb) {
      hasher.update(chunk);
      count.bytes += chunk.length;
      cb(null, chunk);
    },
  });
}

/** Pack `envDir` into `file` (tar, zstd), streaming: an env of gigabytes never sits in memory. */
export async function packEnv(envDir: string, file: string): Promise<PackedArtifact> {
  const list = entries(envDir);
  const hasher = new Bun.CryptoHasher("sha256");
  const count = { bytes: 0 };
  const stream = tar.create({ cwd: envDir, portable: true, noDirRecurse: true, follow: false }, list) as unknown as NodeJS.ReadableStream;
  await pipeline(Readable.from(stream as AsyncIterable<Buffer>), zlib.createZstdCompress({ params: { [zlib.constants.ZSTD_c_compressionLevel]: 3 } }), hashing(hasher, count), createWriteStream(file, { mode: 0o600 }));
  return { sha256: hasher.digest("hex"), bytes: count.bytes };
}

/** The sha256 of a file, streaming. */
export async function fileSha256(file: string): Promise<string> {
  const hasher = new Bun.CryptoHasher("sha256");
  for await (const chunk of createReadStream(file)) hasher.update(chunk as Buffer);
  return hasher.digest("hex");
}

/**
 * Unpack an artifact (already checked against its sha256) into `into`, a
 * fresh folder. Symbolic links keep their absolute targets (an env's
 * bin/python points at the worker's interpreter), so tar's own stripping is
 * off and every entry is checked here instead: a relative path without `..`,
 * never under a link the artifact made.
 */
export async function unpackEnv(file: string, into: string): Promise<void> {
  const links: string[] = [];
  let refused: string | null = null;
  const filter = (path: string, entry: tar.ReadEntry | import("node:fs").Stats) => {
    const p = path.replace(/\/+$/, "");
    const bad = p.startsWith("/") || p.split("/").includes("..") || links.some((l) => p.startsWith(`${l}/`));
    if (bad) refused ??= path;
    if (!bad && "type" in entry && entry.type === "SymbolicLink") links.push(p);
    return !bad;
  };
  await pipeline(createReadStream(file), zlib.createZstdDecompress(), tar.extract({ cwd: into, strict: true, preserveOwner: false, preservePaths: true, filter }));
  if (refused) throw new Error(`the artifact holds an entry outside the env: ${refused}`);
}
