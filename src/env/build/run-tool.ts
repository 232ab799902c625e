import { InstallError } from "../../errors.ts";
import { killTree } from "../../core/process-tree.ts";
import { redactUrl } from "../request/url-credentials.ts";
import { type BuildUser, buildUserArgv } from "./build-user.ts";

/**
 * What a build tells whoever watches it: steps with their times, and the installers' own lines. A step is shown
 * as `<step> <detail>`, one sentence: `fetching env 3f2a… from w1 (…)`, `waiting for w3, which is building …`.
 */
export type BuildStep = ShippingStep | "creating" | "linking" | "installing" | "compiling" | "checking";
/** The steps of asking the fleet before a build (env/shipping.ts). */
export type ShippingStep = "fetching" | "refused" | "waiting" | "building";

export interface BuildHooks {
  onStep?(step: BuildStep, detail: string): void;
  onStepDone?(step: BuildStep, seconds: number): void;
  onOutput?(line: string): void;
  /** The tool has said nothing for `seconds` (told every QUIET_MS while it stays silent): whoever watches says it is still running. */
  onQuiet?(tool: string, seconds: number): void;
}

/** After this long without a line from the installer, a line says it is still running. */
export const QUIET_MS = 60_000;

/** The build was stopped (its time limit, a cancel): the tool's whole process group is gone. */
export class ToolStopped extends Error {
  constructor(readonly tool: string) {
    super(`${tool} was stopped`);
  }
}

/** Records a tool's process group with the build's lock; returns the forgetting of it (core/lock.ts `keep`). */
export type KeepGroup = (pid: number) => () => void;

/**
 * Run a process, streaming its lines to the hooks, keeping them for the error
 * message. When `signal` aborts, the process and all it started are SIGKILLed
 * (pip's build backends, uv's workers: core/process-tree.ts) and ToolStopped
 * thrown. With `keep` (a build's tools, under its lock) it leads its own
 * session and process group, recorded with the lock while it runs: if gpulayer dies
 * alone, the next builder ends that group before it touches the env. gpulayer
 * ends it itself on SIGINT, SIGTERM and SIGHUP (the signal aborts). Without
 * `keep` it stays in our process group.
 */
export async function runTool(argv: string[], opts: { env: Record<string, string>; cwd: string; hooks: BuildHooks; signal?: AbortSignal; keep?: KeepGroup; quietMs?: number; input?: Blob | Promise<string>; as?: BuildUser }): Promise<{ code: number; lines: string[] }> {
  opts.signal?.throwIfAborted();
  const spawned = opts.as ? buildUserArgv(opts.as, argv) : argv;
  // Input still to come: the tool is started now and waits on its stdin (started ahead of its work, its start-up is off the build's path).
  const later = opts.input instanceof Promise ? opts.input : null;
  let proc: Bun.Subprocess<"ignore" | "pipe" | Blob, "pipe", "pipe">;
  try {
    proc = Bun.spawn(spawned, { env: opts.env, cwd: opts.cwd, stdin: later ? "pipe" : ((opts.input as Blob | undefined) ?? "ignore"), stdout: "pipe", stderr: "pipe", detached: Boolean(opts.keep) });
  } catch (error) {
    throw new InstallError(`cannot run ${argv[0]}: ${(error as Error).message}`, "");
  }
  const stop = () => {
    if (opts.keep) {
      try {
        process.kill(-proc.pid, "SIGKILL");
      } catch {
        // gone already
      }
    }
    killTree(proc.pid);
  };
  try {
    const forget = opts.keep?.(proc.pid);
    // Forgotten once it has ended, however runTool itself ends.
    if (forget) void proc.exited.then(forget, forget);
  } catch (error) {
    stop(); // not recorded (a full disk): it must not outlive us unrecorded
    throw error;
  }
  // What the user knows it by: `python -m pip` is pip.
  const tool = argv[1] === "-m" && argv[2] ? argv[2] : argv[0]!.split("/").pop()!;
  opts.signal?.addEventListener("abort", stop, { once: true });
  let lastLine = performance.now();
  let lastNotice = 0;
  const quietMs = opts.quietMs ?? QUIET_MS;
  const quiet = setInterval(() => {
    const now = performance.now();
    if (now - lastLine >= quietMs && now - lastNotice >= quietMs) {
      lastNotice = now;
      opts.hooks.onQuiet?.(tool, (now - lastLine) / 1000);
    }
  }, Math.min(quietMs, 5_000));
  quiet.unref();
  if (later) {
    const sink = proc.stdin as Bun.FileSink;
    const give = (text: string) => {
      // Quiet from when it has its work, not while it waits for it.
      lastLine = performance.now();
      try {
        if (text) sink.write(text);
        void Promise.resolve(sink.end()).catch(() => undefined);
      } catch {
        // it is gone already: its exit code says why
      }
    };
    later.then(give, () => give(""));
  }
  const lines: string[] = [];
  const emit = (raw: string) => {
    lastLine = performance.now();
    // pip masks passwords but shows user names, uv may show either; nothing of a URL's credentials leaves gpulayer.
    const line = redactUrl(raw.replace(/\r$/, ""));
    lines.push(line);
    opts.hooks.onOutput?.(line);
  };
  const pump = async (stream: ReadableStream<Uint8Array>) => {
    const decoder = new TextDecoder();
    let buf = "";
    for await (const chunk of stream) {
      buf += decoder.decode(chunk, { stream: true });
      let i: number;
      while ((i = buf.indexOf("\n")) !== -1) {
        emit(buf.slice(0, i));
        buf = buf.slice(i + 1);
      }
    }
    if (buf) emit(buf);
  };
  try {
    await Promise.all([pump(proc.stdout), pump(proc.stderr)]);
    const code = await proc.exited;
    // As the build's user: nothing it started outlives it in its group (the env is taken back once the build's processes are done).
    if (opts.as && opts.keep) {
      try {
        process.kill(-proc.pid, "SIGKILL");
      } catch {
        // none left
      }
    }
    if (opts.signal?.aborted) throw new ToolStopped(tool);
    return { code, lines };
  } finally {
    clearInterval(quiet);
    opts.signal?.removeEventListener("abort", stop);
  }
}

/**
 * pip's own words, as a headline and the lines under it: its last telling
 * ERROR line heads the message ("No matching distribution found for x"),
 * what it said from its first error on follows; without any, the tail.
 * uv's words the same way: its first `error:` or `×` line heads the message.
 */
export function installerMessage(lines: string[]): { headline: string; detail: string } {
  const text = lines.map((l) => l.trimEnd()).filter((l) => l.trim());
  // pip crashed (an invalid marker, a bug): its exception's own line says it; the traceback is noise (--verbose shows it).
  const traceback = text.findLastIndex((l) => /Traceback \(most recent call last\):/.test(l));
  // A failure its process told after a traceback it printed (a handled exception, then `error: command 'gcc' failed`).
  let toldAfter: string | undefined;
  if (traceback !== -1) {
    const indent = (l: string) => l.length - l.trimStart().length;
    const at = indent(text[traceback]!);
    const after = text.slice(traceback + 1);
    // The exception's line: the first after the frames at the traceback's own indentation (its message may go on, notes may follow).
    const end = after.findIndex((l) => indent(l) <= at);
    const raised = end === -1 ? undefined : after[end]!.trim();
    toldAfter = end === -1 ? undefined : after.slice(end + 1).find((l) => indent(l) === at && /^(ERROR|error)\b[^:]*: /.test(l.trim()));
    if (raised && !toldAfter && /^[A-Za-z_][\w.]*(: |$)/.test(raised) && !/^(hint|help|note|warning|error):/i.test(raised)) return { headline: raised.replace(/^(?:[a-z_]\w*\.)+(?=[A-Z])/, ""), detail: "" };
  }
  const firstError = text.findIndex((l) => /^(ERROR|error):|^\s*×/.test(l.trim()));
  const shown = (firstError === -1 ? text.slice(-8) : text.slice(firstError)).slice(-40);
  const errors = shown.filter((l) => /^ERROR:/.test(l.trim()));
  const uvError = shown.find((l) => /^(error:|×)/.test(l.trim()));
  const headline = toldAfter ?? [...errors].reverse().find((l) => !/ResolutionImpossible/.test(l)) ?? errors[0] ?? uvError ?? "";
  const detail = shown.filter((l) => l !== headline).map((l) => (l.startsWith(" ") ? l : l.trim()));
  // pip's retries on a dead index are warnings before its errors: say so, or "no matching distribution" misleads.
  const unreachable = text.find((l) => /NewConnectionError|Connection refused|Failed to establish a new connection|Name or service not known|Temporary failure in name resolution/.test(l));
  if (unreachable) detail.push(`(an index did not answer: ${unreachable.trim().slice(0, 200)})`);
  return { headline: headline.trim().replace(/^×\s*/, ""), detail: detail.join("\n") };
}

/** An installer's failure: what failed, the installer's headline after a colon, the rest of what it said under it. */
export function installFailure(what: string, lines: string[]): InstallError {
  const { headline, detail } = installerMessage(lines);
  return new InstallError(headline ? `${what}: ${headline}` : what, detail);
}
