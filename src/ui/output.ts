// consola's core: the logger without its reporters (ours writes the lines), its colour and terminal code, or node:util.
import type { ConsolaInstance } from "consola/core";
import { writeErr, writeOut } from "./terminal.ts";
// The units live in core/ (a server or worker formats sizes too); commands keep importing them from here.
export { formatBytes, formatSeconds } from "../core/units.ts";

export interface OutputFlags {
  json?: boolean;
  quiet?: boolean;
  verbose?: boolean;
}

/**
 * What a command prints, in one place: logs and progress on stderr (always,
 * so stdout carries only the result), the result on stdout as text or one
 * JSON document.
 */
export class Output {
  private logger?: ConsolaInstance;
  constructor(readonly flags: OutputFlags) {}

  get log(): ConsolaInstance {
    if (!this.logger) {
      // Loaded at the first log: a command that logs nothing (a warm prepare) never evaluates it.
      const { createConsola } = require("consola/core") as typeof import("consola/core");
      // consola sends info to stdout by default; all logs belong on stderr.
      // One voice: `error: …`, `warning: …`, plain info lines; no colour codes, no padding, no badges.
      const prefix: Record<string, string> = { error: "error: ", fatal: "error: ", warn: "warning: " };
      this.logger = createConsola({
        level: this.flags.quiet ? 1 : this.flags.verbose ? 4 : 3,
        reporters: [
          {
            log: (entry) => {
              const text = entry.args.map((a) => (a instanceof Error ? a.message : String(a))).join(" ");
              writeErr(`${prefix[entry.type] ?? ""}${text}\n`);
            },
          },
        ],
      });
    }
    return this.logger;
  }

  /** A debug line, built only with --verbose. */
  debug(message: () => string): void {
    if (this.flags.verbose) this.log.debug(message());
  }

  get json(): boolean {
    return Boolean(this.flags.json);
  }

  /** The result: JSON with --json, else the human lines (skipped with --quiet unless essential). */
  result(data: unknown, human: () => string | string[], essential = false): void {
    if (this.flags.json) {
      writeOut(`${JSON.stringify(data, null, 2)}\n`);
      return;
    }
    if (this.flags.quiet && !essential) return;
    const text = human();
    const lines = Array.isArray(text) ? text : [text];
    if (lines.length) writeOut(`${lines.join("\n")}\n`);
  }

  /** A progress line on stderr, not shown with --quiet or --json. */
  progress(message: string): void {
    if (this.flags.quiet || this.flags.json) {
      if (this.flags.verbose) writeErr(`${message}\n`);
      return;
    }
    writeErr(`${message}\n`);
  }

  /** A build's progress on stderr: shown with --json too (stdout keeps the one document), not with --quiet. */
  phase(message: string): void {
    if (!this.flags.quiet || this.flags.verbose) writeErr(`${message}\n`);
  }

  /** Raw tool output (pip's), shown only with --verbose. */
  tool(line: string): void {
    if (this.flags.verbose) writeErr(`  │ ${line}\n`);
  }
}

export function shortKey(key: string): string {
  return key.slice(0, 12);
}

/** How long ago, each unit rounded before the next is chosen (59.6 s is "1 min ago", never "60s ago"). */
export function formatAgo(ms: number, now = Date.now()): string {
  const s = Math.round(Math.max(0, (now - ms) / 1000));
  if (s < 60) return `${s}s ago`;
  if (Math.round(s / 60) < 60) return `${Math.round(s / 60)} min ago`;
  if (Math.round(s / 3600) < 24) return `${Math.round(s / 3600)} h ago`;
  const days = Math.round(s / 86400);
  return `${days} day${days === 1 ? "" : "s"} ago`;
}

/** Left-aligned columns for tables. */
export function table(rows: string[][]): string[] {
  const widths: number[] = [];
  for (const row of rows) row.forEach((c, i) => (widths[i] = Math.max(widths[i] ?? 0, c.length)));
  return rows.map((row) => row.map((c, i) => (i === row.length - 1 ? c : c.padEnd(widths[i] ?? 0))).join("  ").trimEnd());
}

