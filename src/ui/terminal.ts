import { writeSync } from "node:fs";

/**
 * stdout and stderr, written with one system call per write. Bun's
 * process.stdout and process.stderr load Node's stream machinery on first
 * touch: about 5 ms here, half of a warm `env prepare`. A descriptor that
 * cannot take the bytes now (a non-blocking pipe that is full) hands the
 * rest, and every write after it, to the process stream, so order is kept.
 * A reader that went away (EPIPE) on stdout calls `onBrokenPipe`; on stderr the
 * bytes are dropped, as there is no one left to tell.
 */

type Fd = 1 | 2;

const streamed = new Set<Fd>();
const encoder = new TextEncoder();
const stream = (fd: Fd) => (fd === 1 ? process.stdout : process.stderr);

/**
 * What to do when the reader of stdout goes away (`gpulayer job list | head`):
 * by default end quietly; a running job is cancelled instead, as SIGPIPE would
 * end a plain command, so it is never left orphaned.
 */
export const onBrokenPipe = { handler: (): void => process.exit(0) };

/** Where writes go instead while set: a test that runs a command in-process reads what it printed. */
export const capture: { sink: ((fd: Fd, text: string) => void) | null } = { sink: null };

function write(fd: Fd, data: string | Uint8Array): void {
  if (capture.sink) {
    capture.sink(fd, typeof data === "string" ? data : new TextDecoder().decode(data));
    return;
  }
  if (streamed.has(fd)) {
    stream(fd).write(data);
    return;
  }
  // TextEncoder, not Buffer.from: Bun makes Buffer on its first use, ~0.2 ms of a warm prepare's start.
  const bytes = typeof data === "string" ? encoder.encode(data) : data;
  let off = 0;
  while (off < bytes.length) {
    try {
      off += writeSync(fd, bytes, off);
    } catch (error) {
      const code = (error as NodeJS.ErrnoException).code;
      if (code === "EAGAIN") {
        streamed.add(fd);
        const s = stream(fd);
        s.on("error", (e: NodeJS.ErrnoException) => {
          if (e.code === "EPIPE" && fd === 1) onBrokenPipe.handler();
        });
        s.write(bytes.subarray(off));
      } else if (code === "EPIPE") {
        if (fd === 1) onBrokenPipe.handler();
      } else if (code !== "EINTR") throw error;
      if (code !== "EINTR") return;
    }
  }
}

export function writeOut(data: string | Uint8Array): void {
  write(1, data);
}

export function writeErr(data: string | Uint8Array): void {
  write(2, data);
}
