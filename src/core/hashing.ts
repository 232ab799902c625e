import { closeSync, openSync, readSync } from "node:fs";

/** sha256 of the data, in hex. */
export function contentHash(data: string | Uint8Array): string {
  return new Bun.CryptoHasher("sha256").update(data).digest("hex");
}

/** sha256 of a file's bytes, read in 4 MiB pieces: a torch wheel is never held in memory whole. */
export function fileContentHash(path: string): string {
  const hasher = new Bun.CryptoHasher("sha256");
  const fd = openSync(path, "r");
  try {
    const buf = Buffer.allocUnsafe(4 * 1024 * 1024);
    for (let got = readSync(fd, buf, 0, buf.length, null); got > 0; got = readSync(fd, buf, 0, buf.length, null)) hasher.update(buf.subarray(0, got));
  } finally {
    closeSync(fd);
  }
  return hasher.digest("hex");
}
