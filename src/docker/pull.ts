import { type Engine, engineMessage, type EngineEnv } from "./engine.ts";

/**
 * A pull through the engine's own CLI (it knows the user's registry
 * credentials, mirrors and insecure registries). Run in a pseudo-terminal
 * where Bun offers one: only then do Docker and Podman print bytes per layer;
 * their plain-pipe output names layers only.
 */
export interface PullProgress {
  /** Layers (blobs) seen so far, and how many of them are done. */
  layers: number;
  layersDone: number;
  /** Bytes downloaded and bytes known to come (0 while unknown). */
  bytesDone: number;
  bytesTotal: number;
  /** The engine's line that caused this update (ANSI stripped). */
  line: string;
}

export interface PullOutcome {
  ok: boolean;
  code: number;
  /** The engine's own message when it failed. */
  message: string;
  progress: PullProgress;
}

const UNITS: Record<string, number> = { b: 1, kb: 1e3, mb: 1e6, gb: 1e9, tb: 1e12, kib: 1024, mib: 1024 ** 2, gib: 1024 ** 3, tib: 1024 ** 4 };

function parseBytes(text: string): number {
  const m = /^([\d.]+)\s*([kmgt]?i?b)$/i.exec(text.trim());
  if (!m) return 0;
  return Math.round(Number(m[1]) * (UNITS[m[2]!.toLowerCase()] ?? 1));
}

interface Layer {
  current: number;
  total: number;
  done: boolean;
}

/** Turns the engines' pull output, line by line, into layer and byte counts. */
export class PullParser {
  private layers = new Map<string, Layer>();

  private layer(id: string): Layer {
    const short = id.replace(/^sha256:/, "").slice(0, 12);
    let l = this.layers.get(short);
    if (!l) this.layers.set(short, (l = { current: 0, total: 0, done: false }));
    return l;
  }

  /** Feed one line; returns the progress when the line was about a layer. */
  line(raw: string): PullProgress | null {
    const line = raw.replace(/\u001b\[[0-9;?]*[A-Za-z]/g, "").trim();
    if (!line) return null;
    // Docker: "929044f23243: Downloading [=>   ]  32.77kB/1.065MB", "...: Pull complete".
    let m = /^([0-9a-f]{12}): (Pulling fs layer|Waiting|Downloading|Verifying Checksum|Download complete|Extracting|Pull complete|Already exists)(?:\s+\[[^\]]*\]\s+([\d.]+\s*[kMGT]?B)\/([\d.]+\s*[kMGT]?B))?/.exec(line);
    if (m) {
      const l = this.layer(m[1]!);
      const status = m[2]!;
      if (status === "Downloading" && m[3] && m[4]) {
        l.current = parseBytes(m[3]);
        l.total = parseBytes(m[4]);
      } else if (status === "Download complete" || status === "Pull complete" || status === "Extracting") {
        if (l.total) l.current = l.total;
        if (status !== "Extracting") l.done = true;
      } else if (status === "Already exists") l.done = true;
      return this.snapshot(line);
    }
    // Podman: "Copying blob 929044f23243 [====>---] 1.0MiB / 1.9MiB", "Copying blob 929044f23243 done",
    // "Copying blob sha256:929044f2..." (no terminal), "Copying blob 9290... skipped: already exists".
    m = /^Copying blob (?:sha256:)?([0-9a-f]{6,64})(.*)$/.exec(line);
    if (m) {
      const l = this.layer(m[1]!);
      const rest = m[2]!;
      const bytes = /\]\s*([\d.]+\s*[KMGT]?i?B)\s*\/\s*([\d.]+\s*[KMGT]?i?B)/i.exec(rest);
      if (bytes) {
        l.current = parseBytes(bytes[1]!);
        l.total = parseBytes(bytes[2]!);
      }
      if (/\bdone\b|skipped|already exists/i.test(rest)) {
        l.done = true;
        if (l.total) l.current = l.total;
      }
      return this.snapshot(line);
    }
    return null;
  }

  snapshot(line = ""): PullProgress {
    let bytesDone = 0;
    let bytesTotal = 0;
    let layersDone = 0;
    for (const l of this.layers.values()) {
      bytesDone += l.current;
      bytesTotal += l.total;
      if (l.done) layersDone++;
    }
    return { layers: this.layers.size, layersDone, bytesDone, bytesTotal, line };
  }
}

/** Split a stream of terminal output into lines at \n and \r, calling `onLine` for each. */
function lineSplitter(onLine: (line: string) => void) {
  let buffer = "";
  const decoder = new TextDecoder();
  return {
    push(chunk: Uint8Array | string) {
      buffer += typeof chunk === "string" ? chunk : decoder.decode(chunk, { stream: true });
      const parts = buffer.split(/\r\n|\r|\n/);
      buffer = parts.pop() ?? "";
      for (const p of parts) onLine(p);
    },
    end() {
      if (buffer) onLine(buffer);
      buffer = "";
    },
  };
}

/** `<engine> pull REF`, streaming progress; never throws for the engine's own failure (see `ok`). */
export async function pullImage(engine: Engine, ref: string, opts: { env: EngineEnv; onProgress?: (p: PullProgress) => void; onLine?: (line: string) => void }): Promise<PullOutcome> {
  const parser = new PullParser();
  const tail: string[] = [];
  const splitter = lineSplitter((raw) => {
    const line = raw.replace(/\u001b\[[0-9;?]*[A-Za-z]/g, "").trimEnd();
    if (!line.trim()) return;
    tail.push(line);
    if (tail.length > 40) tail.shift();
    opts.onLine?.(line);
    const p = parser.line(line);
    if (p) opts.onProgress?.(p);
  });
  const argv = [engine.bin, "pull", ref];
  const env = { ...opts.env, TERM: "dumb", NO_COLOR: "1" };
  let code: number;
  let signal: string | number | null = null;
  if (typeof Bun.Terminal === "function") {
    // A pseudo-terminal: the engines print per-layer bytes only to one.
    let eof!: () => void;
    const closed = new Promise<void>((r) => (eof = r));
    const proc = Bun.spawn(argv, { env, stdin: "ignore", terminal: { cols: 160, rows: 40, data: (_t, d) => splitter.push(d), exit: () => eof() } });
    code = await proc.exited;
    signal = proc.signalCode;
    // The terminal's last bytes may arrive just after the exit.
    let timer: ReturnType<typeof setTimeout> | undefined;
    await Promise.race([closed, new Promise<void>((r) => (timer = setTimeout(r, 2000)))]);
    clearTimeout(timer);
    proc.terminal?.close();
  } else {
    const proc = Bun.spawn(argv, { env, stdin: "ignore", stdout: "pipe", stderr: "pipe" });
    const pump = async (s: ReadableStream<Uint8Array>) => {
      for await (const chunk of s) splitter.push(chunk);
    };
    await Promise.all([pump(proc.stdout), pump(proc.stderr)]);
    code = await proc.exited;
    signal = proc.signalCode;
  }
  splitter.end();
  const ok = code === 0;
  // Killed mid-pull, its last line is progress, not a reason: say what happened.
  const died = signal ? `the ${engine.name} process died mid-pull (${signal})` : "";
  return { ok, code, message: ok ? "" : died || engineMessage(tail.join("\n")) || `${engine.name} pull exited ${code}`, progress: parser.snapshot() };
}
