import { closeSync, fsyncSync, openSync, renameSync, rmSync, writeFileSync } from "node:fs";

/** Write a file so that a reader sees all of it or none of it: temp, fsync, rename. */
export function writeFileAtomic(file: string, data: string | Uint8Array, opts: { mode?: number } = {}): void {
  // Unique per call: two writers of one file never share a temp.
  const tmp = `${file}.${process.pid}.${Math.random().toString(36).slice(2)}.tmp`;
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
  renameSync(tmp, file);
}
