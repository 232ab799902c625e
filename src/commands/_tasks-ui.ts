import type { ConsolaInstance } from "consola/core";
import type { TasksIO } from "../jobs/job-tasks.ts";
import type { JobStatus } from "../jobs/model.ts";
import { Output } from "../ui/output.ts";
import { writeErr, writeOut } from "../ui/terminal.ts";
import { imageHooks } from "./_image-ui.ts";
import { preparedLine, prepareHooks } from "./_prepare-ui.ts";

/** A task's lines on the terminal: every one says which task it is, as `docker compose` does. */
export class PrefixedOutput extends Output {
  constructor(
    private readonly parent: Output,
    private readonly prefix: string,
  ) {
    super(parent.flags);
  }
  override progress(message: string): void {
    this.parent.progress(`${this.prefix}${message}`);
  }
  override phase(message: string): void {
    this.parent.phase(`${this.prefix}${message}`);
  }
  override tool(line: string): void {
    this.parent.tool(`${this.prefix}${line}`);
  }
  override debug(message: () => string): void {
    this.parent.debug(() => `${this.prefix}${message()}`);
  }
  /** Errors and warnings too: `error: [name] ...`. */
  override get log(): ConsolaInstance {
    const log = this.parent.log;
    const prefix = this.prefix;
    return new Proxy(log, {
      get(target, key, receiver) {
        const value = Reflect.get(target, key, receiver) as unknown;
        if (typeof value !== "function" || !["error", "warn", "info", "log", "success", "debug"].includes(String(key))) return value;
        return (...args: unknown[]) => (value as (...a: unknown[]) => void).call(target, `${prefix}${args.map((a) => (a instanceof Error ? a.message : String(a))).join(" ")}`);
      },
    });
  }
}

/** Whole lines of one stream, each with the prefix; a line cut between chunks waits for its end (or the task's). */
export function prefixedLines(prefix: string, write: (text: string) => void) {
  const decoder = new TextDecoder();
  let pending = "";
  return {
    push(chunk: Uint8Array) {
      const text = pending + decoder.decode(chunk, { stream: true });
      const end = text.lastIndexOf("\n");
      if (end === -1) {
        pending = text;
        return;
      }
      pending = text.slice(end + 1);
      write(text.slice(0, end + 1).replace(/^(?=.)/gm, prefix));
    },
    flush() {
      const rest = pending + decoder.decode();
      pending = "";
      if (rest) write(`${prefix}${rest}\n`);
    },
  };
}

/** The terminal side of a job of tasks: each task's output and progress with `[name] ` before it. */
export function tasksIO(out: Output, opts: { stdout: (text: string) => void }): TasksIO & { flush(name: string): void } {
  const streams = new Map<string, ReturnType<typeof prefixedLines>[]>();
  return {
    flush(name) {
      for (const s of streams.get(name) ?? []) s.flush();
    },
    forTask(name) {
      const prefix = `[${name}] `;
      const taskOut = new PrefixedOutput(out, prefix);
      const stdout = prefixedLines(prefix, opts.stdout);
      const stderr = prefixedLines(prefix, (t) => writeErr(t));
      streams.set(name, [stdout, stderr]);
      return {
        onStdout: (c) => stdout.push(c),
        onStderr: (c) => stderr.push(c),
        prepareHooks: prepareHooks(taskOut),
        imageHooks: imageHooks(taskOut),
        onPrepared: (p) => taskOut.progress(preparedLine(p)),
        onPrepareFailed: (m) => taskOut.log.error(`task.prepare failed: ${m}`),
      };
    },
    onTask(name, state, detail) {
      if (state !== "started") for (const s of streams.get(name) ?? []) s.flush();
      out.progress(`[${name}] ${state === "started" ? "started" : `${state}${detail ? ` (${detail})` : ""}`}`);
    },
  };
}

/** The job's end in one line: each task and how it ended. */
export function tasksSummary(status: JobStatus): string {
  const tasks = (status.tasks ?? []).map((t) => `${t.name} ${t.state}${t.exit_code !== null && t.state === "failed" ? ` (exit ${t.exit_code})` : ""}`);
  return `job ${status.id} ${status.state}: ${tasks.join(", ")}`;
}

/** stdout for a job's output: the terminal's, or stderr under --json (stdout keeps the one document); nothing once its reader is gone. */
export function jobStdout(json: boolean, gone: () => boolean): (data: string | Uint8Array) => void {
  return json ? (t) => writeErr(t) : (t) => void (gone() || writeOut(t));
}
