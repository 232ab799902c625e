#!/usr/bin/env bun
import type { CommandDef } from "citty";
import { errorReport, ExitCode, ExitError, UsageError, UserError } from "./errors.ts";
import type { ErrorDoc } from "./commands/_json.ts";
import { versionInfo } from "./version.ts";
import { writeOut, writeErr } from "./ui/terminal.ts";
import { closeUmask } from "./core/owner-only.ts";

// Before anything is written: a home's files are its user's alone, whatever the caller's umask (core/owner-only.ts).
closeUmask();

// A plain definition (citty's defineCommand returns its argument): citty itself loads only where a command runs.
const main: CommandDef = {
  meta: {
    name: "gpulayer",
    version: versionInfo.version,
    description: "Turn GPU boxes into workers for Python jobs: environments built once, cached by content, reused forever",
  },
  subCommands: {
    env: () => import("./commands/env/index.ts").then((m) => m.default),
    job: () => import("./commands/job/index.ts").then((m) => m.default),
    gc: () => import("./commands/gc.ts").then((m) => m.default),
    config: () => import("./commands/config.ts").then((m) => m.default),
    server: () => import("./commands/server.ts").then((m) => m.default),
    join: () => import("./commands/join.ts").then((m) => m.default),
    workers: () => import("./commands/workers.ts").then((m) => m.default),
    version: () => import("./commands/version.ts").then((m) => m.default),
  },
};

/** Walk the subcommands named in argv to the one --help is about. */
async function resolveCommand(cmd: CommandDef, args: string[], parent?: CommandDef, path: string[] = []): Promise<[CommandDef, CommandDef | undefined, string[]]> {
  const subs = typeof cmd.subCommands === "function" ? await cmd.subCommands() : await cmd.subCommands;
  const name = args.find((a) => !a.startsWith("-"));
  if (subs && name && name in subs) {
    const entry = subs[name]!;
    const sub = (typeof entry === "function" ? await entry() : await entry) as CommandDef;
    return resolveCommand(sub, args.slice(args.indexOf(name) + 1), cmd, [...path, name]);
  }
  return [cmd, parent, path];
}

async function run(argv: string[]): Promise<number> {
  const beforeDashes = argv.includes("--") ? argv.slice(0, argv.indexOf("--")) : argv;
  if (argv.length === 1 && (argv[0] === "--version" || argv[0] === "-v")) {
    writeOut(`${versionInfo.version}\n`);
    return ExitCode.ok;
  }
  const verbose = beforeDashes.includes("--verbose");
  try {
    // `gpulayer help env prepare` is `gpulayer env prepare --help`, as git and cargo have it.
    const helpFor = beforeDashes[0] === "help" ? beforeDashes.slice(1) : undefined;
    if (helpFor || beforeDashes.includes("--help") || beforeDashes.includes("-h") || argv.length === 0) {
      const words = helpFor ?? beforeDashes;
      const [cmd, , path] = await resolveCommand(main, words);
      const named = words.filter((a) => !a.startsWith("-"));
      if (helpFor && named.length > path.length) throw new UsageError(`unknown command ${named[path.length]} (see ${["gpulayer", ...path].join(" ")} --help)`);
      const [{ helpText }, { colorFor }] = await Promise.all([import("./commands/_help.ts"), import("./commands/_context.ts")]);
      writeOut(await helpText(cmd, path, { color: colorFor(process.stdout) }));
      return ExitCode.ok;
    }
    // Options and no command (`gpulayer -x`): citty would say only that no command was given.
    if (beforeDashes.length && beforeDashes.every((a) => a.startsWith("-"))) throw new UsageError(`no command given, only ${beforeDashes[0]} (see gpulayer --help)`);
    // The warm lane: a prepare whose env is ready answers without the command tree (it steps aside for anything else).
    if (argv[0] === "env" && argv[1] === "prepare" && (await (await import("./commands/env/_warm-lane.ts")).warmPrepare(argv.slice(2)))) return ExitCode.ok;
    const { runCommand } = await import("citty");
    await runCommand(main, { rawArgs: argv });
    return ExitCode.ok;
  } catch (error) {
    if (isBrokenPipe(error)) return ExitCode.ok;
    // Loaded for a failure only: messages quote what users and files wrote, and a control character stays escaped
    // (line by line: an installer's own lines follow some messages, indented, on lines of their own).
    const { printable } = await import("./ui/escape.ts");
    const escaped = (text: string) => text.split("\n").map(printable).join("\n");
    return reportFailure(error, { verbose, json: beforeDashes.includes("--json"), printable: escaped });
  }
}

/**
 * A failure, shown once: its line on stderr (`error: ...`; a bug says
 * `internal error: ...` and how to see its stack) and, with --json, the error
 * document on stdout. An ExitError shows nothing: its command printed what it
 * had (a job's status) and only passes the code on.
 */
function reportFailure(error: unknown, opts: { verbose: boolean; json: boolean; printable: (text: string) => string }): number {
  const report = errorReport(error, { verbose: opts.verbose });
  if (error instanceof ExitError) return report.exitCode;
  const internal = report.exitCode === ExitCode.internal && !(error instanceof UserError);
  if (opts.json) writeOut(`${JSON.stringify(errorDocument(report), null, 2)}\n`);
  writeErr(`${internal ? "internal error" : "error"}: ${opts.printable(report.message)}\n`);
  if (internal) writeErr(report.stack ? `${report.stack}\n` : "(run again with --verbose for the stack; this is a bug in gpulayer)\n");
  return report.exitCode;
}

/** The --json error document (its schema: ErrorDocument in src/commands/_json.ts). */
function errorDocument(report: { message: string; exitCode: number }): ErrorDoc {
  return { error: { message: report.message, exit_code: report.exitCode } };
}

/** `gpulayer job list | head`: a reader that went away is not an error. */
function isBrokenPipe(error: unknown): boolean {
  return (error as NodeJS.ErrnoException | null)?.code === "EPIPE";
}

process.exitCode = await run(process.argv.slice(2)).catch((error) => {
  if (isBrokenPipe(error)) return ExitCode.ok;
  throw error;
});
