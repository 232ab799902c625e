import { closeSync, constants, fstatSync, openSync, readSync } from "node:fs";
import { UsageError } from "../../errors.ts";

/** More than any requirements file; a bigger one is not a requirements file (a device, a data file). */
export const MAX_REQUIREMENTS_FILE = 8 * 1024 * 1024;

/** In a file, pip splits on the line breaks itself; these others are never in a real requirements file. */
const FILE_FORBIDDEN = /[\x00-\x08\x0e-\x1b\x1f\x7f\ufeff]/;

/** The one line for a requirements file that is not there, wherever it is looked for (here, or before it is sent to a server). */
export function requirementsFileNotFound(shown: string): UsageError {
  return new UsageError(`requirements file not found: ${shown}`);
}

/** Read a file that may be a requirements file: a regular file, not too big, UTF-8. */
export function readRequirementsText(path: string, shown: string): string {
  let fd: number;
  try {
    // Non-blocking: opening a FIFO for reading would otherwise wait for a writer forever.
    fd = openSync(path, constants.O_RDONLY | constants.O_NONBLOCK);
  } catch (error) {
    const code = (error as NodeJS.ErrnoException).code;
    throw code === "ENOENT" ? requirementsFileNotFound(shown) : new UsageError(`cannot read requirements file ${shown}: ${(error as Error).message}`);
  }
  try {
    const st = fstatSync(fd);
    if (!st.isFile()) throw new UsageError(`${shown} is not a regular file (a requirements file is a text file)`);
    if (st.size > MAX_REQUIREMENTS_FILE) throw new UsageError(`${shown} is ${st.size} bytes: too big for a requirements file (at most ${MAX_REQUIREMENTS_FILE})`);
    // A plain byte array: Buffer is made on first use, ~0.2 ms of a warm prepare.
    const buf = new Uint8Array(st.size);
    let got = 0;
    while (got < st.size) {
      const n = readSync(fd, buf, got, st.size - got, got);
      if (n === 0) break;
      got += n;
    }
    let bytes = buf.subarray(0, got);
    if (bytes[0] === 0xef && bytes[1] === 0xbb && bytes[2] === 0xbf) bytes = bytes.subarray(3);
    else if ((bytes[0] === 0xff && bytes[1] === 0xfe) || (bytes[0] === 0xfe && bytes[1] === 0xff)) throw new UsageError(`${shown} is UTF-16: save it as UTF-8`);
    let text: string;
    try {
      text = new TextDecoder("utf-8", { fatal: true }).decode(bytes);
    } catch {
      throw new UsageError(`${shown} is not UTF-8 text`);
    }
    const coding = /^[ \t\f]*#.*?coding[:=][ \t]*([-\w.]+)/m.exec(text.split(/\n/, 2).join("\n"));
    if (coding && !/^utf-?8$/i.test(coding[1]!)) throw new UsageError(`${shown} declares the encoding ${coding[1]}: save it as UTF-8 and drop the coding line`);
    const bad = FILE_FORBIDDEN.exec(text);
    if (bad) throw new UsageError(`${shown} holds a control character (U+${bad[0].charCodeAt(0).toString(16).padStart(4, "0").toUpperCase()}): not a requirements file`);
    return text;
  } finally {
    closeSync(fd);
  }
}

