import { closeSync, constants, fstatSync, lstatSync, openSync, readdirSync, readlinkSync, readSync, type Stats, writeSync } from "node:fs";
import { join } from "node:path";
import * as tar from "tar";
import { FRAME, frameIndex } from "./frames.ts";

/**
 * Packing an env into an artifact (artifact.ts): a tar of the env folder
 * (entries sorted, no owners, times kept so the bytecode stays valid), cut
 * into frames of FRAME bytes that are zstd-compressed on Bun's thread pool,
 * FRAMES_IN_FLIGHT at once, and written in order, each after its lengths
 * (frames.ts): concatenated zstd frames are one zstd stream to every reader. tar's own packer is not used: under
 * Bun its asynchronous Pack spun at full CPU forever, or failed with "write
 * after end", on an env holding one file under several names (the bytecode
 * store links one compiled module into many packages), and took ~13 s for an
 * env of 13,000 files that this packs in ~4. tar still encodes every header.
 */

const FRAMES_IN_FLIGHT = 3;
const LEVEL = 3;

/** What is never shipped: the entry's own state of use on the worker that built it. */
const LOCAL_ONLY = new Set([".gpulayer/ready", ".gpulayer/last-used", ".lock"]);

export interface PackedArtifact {
  sha256: string;
  bytes: number;
}

/** Every entry under `root`, folders before what they hold, names sorted: the same env packs to the same bytes. */
function entries(root: string): { rel: string; stat: Stats }[] {
  const out: { rel: string; stat: Stats }[] = [];
  const walk = (rel: string) => {
    for (const name of readdirSync(rel ? join(root, rel) : root).sort()) {
      const r = rel ? `${rel}/${name}` : name;
      if (LOCAL_ONLY.has(r)) continue;
      const stat = lstatSync(join(root, r));
      out.push({ rel: r, stat });
      if (stat.isDirectory()) walk(r);
    }
  };
  walk("");
  return out;
}

/** The tar header blocks of one entry (a pax header first where a path is too long for ustar). */
function header(rel: string, stat: Stats, type: "File" | "Directory" | "SymbolicLink", linkpath?: string): Buffer {
  const path = type === "Directory" ? `${rel}/` : rel;
  const size = type === "File" ? stat.size : 0;
  // A folder's time is not kept, as tar's portable mode has it: the unpacker sets none.
  const mtime = type === "Directory" ? undefined : stat.mtime;
  const h = new tar.Header({ path, linkpath, mode: stat.mode & 0o7777, size, mtime, type });
  const blocks: Buffer[] = [];
  if (h.encode()) blocks.push(new tar.Pax({ path, linkpath, mtime, size }).encode());
  if (!h.block) throw new Error(`${rel}: its tar header could not be encoded`);
  blocks.push(h.block);
  return Buffer.concat(blocks);
}

/** Pack `envDir` into `file` (tar, zstd frames), streaming: an env of gigabytes never sits in memory. */
export async function packEnv(envDir: string, file: string): Promise<PackedArtifact> {
  const hasher = new Bun.CryptoHasher("sha256");
  const out = openSync(file, constants.O_WRONLY | constants.O_CREAT | constants.O_TRUNC, 0o600);
  let bytes = 0;
  let frame = Buffer.allocUnsafe(FRAME);
  let used = 0;
  /** Bytes of tar so far: entries are padded to its 512-byte blocks. */
  let offset = 0;
  const inFlight: { compressed: Promise<Buffer>; length: number }[] = [];
  const writeOldest = async () => {
    const { compressed, length } = inFlight.shift()!;
    const done = await compressed;
    for (const b of [frameIndex(done.length, length), done]) {
      hasher.update(b);
      bytes += b.length;
      for (let at = 0; at < b.length; ) at += writeSync(out, b, at);
    }
  };
  const send = async () => {
    if (!used) return;
    const compressed = Bun.zstdCompress(frame.subarray(0, used), { level: LEVEL });
    // Its failure is met when its turn comes; until then it is nobody's unhandled rejection.
    compressed.catch(() => {});
    inFlight.push({ compressed, length: used });
    frame = Buffer.allocUnsafe(FRAME);
    used = 0;
    while (inFlight.length >= FRAMES_IN_FLIGHT) await writeOldest();
  };
  const put = async (data: Buffer) => {
    for (let at = 0; at < data.length; ) {
      const n = data.copy(frame, used, at);
      used += n;
      offset += n;
      at += n;
      if (used === FRAME) await send();
    }
  };
  /** Pads what was written to tar's 512-byte blocks. */
  const pad = async () => {
    const over = offset % 512;
    if (over) await put(Buffer.alloc(512 - over));
  };
  try {
    for (const { rel, stat } of entries(envDir)) {
      const path = join(envDir, rel);
      if (stat.isDirectory()) await put(header(rel, stat, "Directory"));
      else if (stat.isSymbolicLink()) await put(header(rel, stat, "SymbolicLink", readlinkSync(path)));
      else if (!stat.isFile()) throw new Error(`${rel} is neither a file, a folder nor a symbolic link`);
      else {
        // Two names of one file (uv links from its cache, the bytecode store links one module into many packages) are two plain files: an unpacker refuses every hard link.
        const fd = openSync(path, constants.O_RDONLY | constants.O_NOFOLLOW);
        try {
          const size = fstatSync(fd).size;
          if (size !== stat.size) throw new Error(`${rel} changed while it was packed`);
          await put(header(rel, stat, "File"));
          let left = size;
          while (left > 0) {
            const n = readSync(fd, frame, used, Math.min(FRAME - used, left), null);
            if (n === 0) throw new Error(`${rel} changed while it was packed`);
            used += n;
            offset += n;
            left -= n;
            if (used === FRAME) await send();
          }
          await pad();
        } finally {
          closeSync(fd);
        }
      }
    }
    // The end of the archive: two empty blocks.
    await put(Buffer.alloc(1024));
    await send();
    while (inFlight.length) await writeOldest();
  } finally {
    // A failure leaves no frame compressing for nobody (the caller removes the file).
    await Promise.allSettled(inFlight.map((f) => f.compressed));
    closeSync(out);
  }
  return { sha256: hasher.digest("hex"), bytes };
}
