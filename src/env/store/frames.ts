import { Readable } from "node:stream";
import zlib from "node:zlib";
import type * as tar from "tar";

/**
 * The zstd framing of an artifact (pack.ts writes it, unpack.ts and the
 * server's check read it): the tar cut into frames of at most FRAME bytes,
 * each preceded by a zstd skippable frame that gives its compressed and its
 * whole length. Every zstd reader skips skippable frames, so an artifact is
 * one plain zstd stream to them (and an older gpulayer); this reader uses the
 * lengths to decompress frames in parallel on the thread pool while the
 * caller writes files. A stream without them (an artifact of an older
 * gpulayer) goes through the streaming decompressor instead.
 */

export const FRAME = 4 << 20;
/** A skippable frame's magic (0x184D2A50 to 0x184D2A5F are all skippable); this one marks a frame's lengths. */
const INDEX_MAGIC = 0x184d2a5e;
const INDEX_BYTES = 16;
/** The most a frame of FRAME bytes compresses to (zstd's ZSTD_compressBound): more is no frame of ours. */
const FRAME_BOUND = FRAME + (FRAME >> 8) + 64;
const IN_FLIGHT = 3;

/** The skippable frame to write before a compressed frame. */
export function frameIndex(compressed: number, length: number): Buffer {
  const b = Buffer.allocUnsafe(INDEX_BYTES);
  b.writeUInt32LE(INDEX_MAGIC, 0);
  b.writeUInt32LE(8, 4);
  b.writeUInt32LE(compressed, 8);
  b.writeUInt32LE(length, 12);
  return b;
}

const ZSTD_MAGIC = 0xfd2fb528;

/**
 * What the bytes of one indexed frame hold, read from zstd's own framing
 * (RFC 8878, 3.1.1): the content size its header declares (null when none),
 * and where the frame ends by its block headers (null when they run past the
 * bytes or use the reserved type). Bun's decompressor sizes its output by the
 * declared size and fails a frame that decodes to more, but it decodes every
 * frame it is given back to back: only bytes that are exactly one frame
 * declaring at most FRAME cannot fill memory, whatever they hold.
 */
export function frameShape(frame: Buffer): { size: number | null; end: number | null } {
  if (frame.length < 6 || frame.readUInt32LE(0) !== ZSTD_MAGIC) return { size: null, end: null };
  const descriptor = frame[4]!;
  const singleSegment = (descriptor >> 5) & 1;
  const fcsBytes = [singleSegment ? 1 : 0, 2, 4, 8][descriptor >> 6]!;
  const fcsAt = 5 + (singleSegment ? 0 : 1) + [0, 1, 2, 4][descriptor & 3]!;
  let size: number | null = null;
  if (fcsBytes && frame.length >= fcsAt + fcsBytes) {
    if (fcsBytes === 1) size = frame[fcsAt]!;
    else if (fcsBytes === 2) size = frame.readUInt16LE(fcsAt) + 256;
    else if (fcsBytes === 4) size = frame.readUInt32LE(fcsAt);
    else {
      const big = frame.readBigUInt64LE(fcsAt);
      size = big > BigInt(Number.MAX_SAFE_INTEGER) ? Number.MAX_SAFE_INTEGER : Number(big);
    }
  }
  let at = fcsAt + fcsBytes;
  for (;;) {
    if (at + 3 > frame.length) return { size, end: null };
    const block = frame[at]! | (frame[at + 1]! << 8) | (frame[at + 2]! << 16);
    at += 3;
    const type = (block >> 1) & 3;
    if (type === 3) return { size, end: null };
    // An RLE block's content is its one byte; raw and compressed blocks hold their size.
    at += type === 1 ? 1 : block >>> 3;
    if (block & 1) break;
  }
  return { size, end: at + ((descriptor >> 2) & 1 ? 4 : 0) };
}

/** What `source`, a zstd stream, decompresses to, in order. */
export async function* zstdFrames(source: AsyncIterable<Uint8Array>): AsyncGenerator<Buffer> {
  const input = source[Symbol.asyncIterator]();
  let held: Buffer = Buffer.alloc(0);
  let ended = false;
  /** Hold at least `n` bytes, unless the source ends first. */
  const hold = async (n: number) => {
    const parts = [held];
    let size = held.length;
    while (size < n && !ended) {
      const r = await input.next();
      if (r.done) ended = true;
      else {
        parts.push(Buffer.from(r.value.buffer, r.value.byteOffset, r.value.byteLength));
        size += r.value.byteLength;
      }
    }
    if (parts.length > 1) held = Buffer.concat(parts, size);
  };
  const inFlight: Promise<Buffer>[] = [];
  try {
    for (;;) {
      await hold(INDEX_BYTES);
      if (held.length === 0) break;
      if (held.length < INDEX_BYTES || held.readUInt32LE(0) !== INDEX_MAGIC || held.readUInt32LE(4) !== 8) break;
      const compressed = held.readUInt32LE(8);
      const length = held.readUInt32LE(12);
      if (compressed > FRAME_BOUND || length > FRAME) throw new Error(`a frame of ${compressed} bytes to ${length} is larger than any an artifact holds`);
      await hold(INDEX_BYTES + compressed);
      if (held.length < INDEX_BYTES + compressed) throw new Error("the artifact ends inside a frame");
      // A copy: `held` is cut below while the thread pool reads this.
      const frame = Buffer.from(held.subarray(INDEX_BYTES, INDEX_BYTES + compressed));
      held = held.subarray(INDEX_BYTES + compressed);
      // Bounded: bytes that are not exactly one frame, or one that declares no size or another than its index, are no frame of ours.
      const shape = frameShape(frame);
      if (shape.end !== compressed) throw new Error(`a frame's ${compressed} bytes are not one zstd frame`);
      if (shape.size !== length) throw new Error(`a frame declares ${shape.size ?? "no"} size where its index says ${length}`);
      const plain = Bun.zstdDecompress(frame);
      // Its failure is met when its turn comes; until then it is nobody's unhandled rejection.
      plain.catch(() => {});
      inFlight.push(plain);
      if (inFlight.length >= IN_FLIGHT) yield await inFlight.shift()!;
    }
    while (inFlight.length) yield await inFlight.shift()!;
    if (held.length === 0 && ended) return;
    // Not (or no longer) framed as ours: the rest is a plain zstd stream.
    const rest = held;
    const tail = async function* () {
      yield rest;
      for (let r = await input.next(); !r.done; r = await input.next()) yield r.value;
    };
    const fed = Readable.from(tail());
    const plain = zlib.createZstdDecompress({ chunkSize: 1 << 20 });
    fed.on("error", (error) => plain.destroy(error));
    for await (const chunk of fed.pipe(plain)) yield chunk as Buffer;
  } finally {
    await Promise.allSettled(inFlight);
  }
}

/**
 * Feed what `source` decompresses to into a tar parser, to its end: rejects
 * with the stream's or the parser's first error. `stopped` says when the
 * caller has seen enough (the rest is left unread).
 */
export async function parseTarFrames(source: AsyncIterable<Uint8Array>, parser: tar.Parser, stopped: () => boolean = () => false): Promise<void> {
  let failure: Error | null = null;
  const ended = new Promise<void>((resolve) => {
    parser.on("end", resolve);
    parser.on("error", (error: Error) => {
      failure ??= error;
      resolve();
    });
  });
  for await (const plain of zstdFrames(source)) {
    parser.write(plain);
    if (failure) throw failure;
    if (stopped()) return;
  }
  parser.end();
  await ended;
  if (failure) throw failure;
}
