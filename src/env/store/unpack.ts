import { chmodSync, closeSync, constants, createReadStream, fchmodSync, futimesSync, mkdirSync, openSync, readdirSync, symlinkSync, writeSync } from "node:fs";
import { dirname, join } from "node:path";
import * as tar from "tar";
import { EntryGuard, entryPath } from "./artifact.ts";
import { parseTarFrames } from "./frames.ts";

/**
 * Unpacking an artifact (artifact.ts) as its bytes come: zstd (frames.ts), then tar, each
 * entry checked by an EntryGuard and written at once, synchronously (an env is
 * thousands of small files: tar's own extractor spends most of a fetch on its
 * per-file asynchronous steps, while the decompressor works on its own
 * thread either way). Each entry gets its final mode as it is written, opened
 * to readers as store.ts markReady would open a built env, so no second walk
 * over the files follows.
 */

/** Folders enterable and readable by all, files readable (executables runnable): what openToReaders makes of an env. */
function openMode(mode: number, isDir: boolean): number {
  const own = mode & 0o700;
  return own | (isDir || own & 0o100 ? 0o055 : 0o044);
}

/** O_EXCL: a file is only ever created, never written through whatever is already at its path. */
const CREATE = constants.O_WRONLY | constants.O_CREAT | constants.O_EXCL | constants.O_NOFOLLOW;

/**
 * Unpack the zstd-compressed tar that `source` yields into `into`, a fresh
 * empty folder. Symbolic links keep their absolute targets (an env's
 * bin/python points at the worker's interpreter); every entry passes an
 * EntryGuard, and after the first refused entry nothing more is written and
 * the unpack fails naming it. The caller removes `into` on a failure.
 */
export async function unpackEnvStream(source: AsyncIterable<Uint8Array>, into: string): Promise<void> {
  if (readdirSync(into).length) throw new Error(`${into} is not empty`);
  chmodSync(into, 0o755);
  const guard = new EntryGuard();
  const dirs = new Set<string>([""]);
  let failure: Error | null = null;
  const unclosed = new Set<() => void>();
  const folder = (rel: string, mode: number) => {
    if (!dirs.has(rel)) {
      const up = dirname(rel);
      folder(up === "." ? "" : up, 0o755);
      mkdirSync(join(into, rel));
      dirs.add(rel);
    }
    chmodSync(join(into, rel), openMode(mode, true));
  };
  const write = (entry: tar.ReadEntry): void => {
    const refused = guard.refusal(entry.path, entry.type);
    if (refused) throw new Error(`the artifact holds an entry that may not be unpacked: ${refused}`);
    const rel = entryPath(entry.path)!;
    const parent = dirname(rel);
    if (!dirs.has(parent === "." ? "" : parent)) folder(parent === "." ? "" : parent, 0o755);
    const mode = entry.mode ?? 0o644;
    if (entry.type === "Directory" || entry.type === "SymbolicLink") {
      entry.resume();
      if (entry.type === "Directory") folder(rel, mode);
      else symlinkSync(entry.linkpath ?? "", join(into, rel));
      return;
    }
    const fd = openSync(join(into, rel), CREATE, 0o600);
    let closed = false;
    const close = () => {
      if (!closed) closeSync(fd);
      closed = true;
      unclosed.delete(close);
    };
    unclosed.add(close);
    try {
      fchmodSync(fd, openMode(mode, false));
    } catch (error) {
      close();
      throw error;
    }
    entry.on("data", (chunk: Buffer) => {
      if (closed) return;
      try {
        for (let at = 0; at < chunk.length; ) at += writeSync(fd, chunk, at);
      } catch (error) {
        failure ??= error as Error;
        close();
      }
    });
    entry.on("end", () => {
      if (closed) return;
      try {
        // Times kept: the bytecode of a .py is valid only against its source's mtime.
        if (entry.mtime) futimesSync(fd, entry.mtime, entry.mtime);
      } catch (error) {
        failure ??= error as Error;
      }
      close();
    });
  };
  const parser = new tar.Parser({
    strict: true,
    onReadEntry: (entry) => {
      if (failure) return void entry.resume();
      try {
        write(entry);
      } catch (error) {
        failure = error as Error;
        entry.resume();
      }
    },
  });
  // Frames decompress on the thread pool while this thread writes the files of the ones before.
  try {
    await parseTarFrames(source, parser, () => failure !== null);
  } finally {
    // A stream that fails inside a file leaves that file open: closed here, so its folder can go.
    for (const close of [...unclosed]) close();
  }
  if (failure) throw failure;
}

/** Unpack an artifact file (already checked against its sha256) into `into`, a fresh empty folder. */
export async function unpackEnv(file: string, into: string): Promise<void> {
  await unpackEnvStream(createReadStream(file), into);
}
