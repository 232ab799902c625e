import { closeSync, fsyncSync, openSync, renameSync, rmSync, writeFileSync } from "node:fs";

/** Write a file so that a reader sees all of it or none of it: temp, fsync, rename. */
export function writeFileAtomic(file: string, data: string | Uint8Array, opts: { mode?: number } = {}): void {
  // Unique per call: two writers of one file never share a temp.
  const tmp = `${file}.${process.pid}.${Math.random().toString(36).slice(2)}.tmp`;
  try {
    const fd = openSync(tmp, "w", opts.mode);
    try {
      writeFileSync(fd, data);
      fsyncSync(fd);
    } catch (error) {
      rmSync(tmp, { force: true });
      throw error;
    } finally {
      closeSync(fd);
    }
    try {
      renameSync(tmp, file);
    } catch (error) {
      rmSync(tmp, { force: true }); // a folder where the file goes: no temp left behind, run after run
      throw error;
    }
  } catch (error) {
    throw named(error, file);
  }
}

/** writeFileSync, with the file named in its error: Bun's says only "ENOSPC: no space left on device, write". */
export function writeFileNamed(file: string, data: string | Uint8Array, opts: { mode?: number } = {}): void {
  try {
    writeFileSync(file, data, opts);
  } catch (error) {
    throw named(error, file);
  }
}

/** A system call's error, naming what was being written (what a full disk's message names). */
function named(error: unknown, file: string): unknown {
  const e = error as NodeJS.ErrnoException;
  if (e && typeof e === "object" && e.code) e.path = file;
  return error;
}
