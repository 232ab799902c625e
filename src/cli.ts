#!/usr/bin/env bun
import { defineCommand, runCommand, showUsage, type CommandDef } from "citty";
import { ExitCode, ExitError, UserError } from "./errors.ts";
import { onBrokenPipe } from "./ui/output.ts";
import { versionInfo } from "./version.ts";

const main = defineCommand({
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
});

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
  if (beforeDashes.includes("--help") || beforeDashes.includes("-h") || argv.length === 0) {
    const [cmd, parent, path] = await resolveCommand(main, beforeDashes);
    await showUsage(cmd, parent);
    const { EXAMPLES } = await import("./commands/_examples.ts");
    const examples = EXAMPLES[path.join(" ")];
    if (examples) process.stdout.write(`EXAMPLES\n\n${examples.map((e) => `  ${e}`).join("\n")}\n\n`);
    return ExitCode.ok;
  }
  if (argv.length === 1 && (argv[0] === "--version" || argv[0] === "-v")) {
    process.stdout.write(`${versionInfo.version}\n`);
    return ExitCode.ok;
  }
  const verbose = beforeDashes.includes("--verbose");
  try {
    await runCommand(main, { rawArgs: argv });
    return ExitCode.ok;
  } catch (error) {
    if (error instanceof ExitError) return error.exitCode;
    if (isBrokenPipe(error)) return ExitCode.ok;
    if (error instanceof UserError) {
      process.stderr.write(`error: ${error.message}\n`);
      return error.exitCode;
    }
    // citty's own parse errors (unknown command, missing argument) are usage errors.
    if (error instanceof Error && error.name === "CLIError") {
      process.stderr.write(`error: ${error.message.replace(/\u001b\[[0-9;]*m/g, "")} (see --help)\n`);
      return ExitCode.usage;
    }
    const message = error instanceof Error ? error.message : String(error);
    process.stderr.write(`internal error: ${message}\n`);
    if (verbose && error instanceof Error && error.stack) process.stderr.write(`${error.stack}\n`);
    else process.stderr.write("(run again with --verbose for the stack; this is a bug in gpulayer)\n");
    return ExitCode.internal;
  }
}

/** `gpulayer job list | head`: a reader that went away is not an error. */
function isBrokenPipe(error: unknown): boolean {
  return (error as NodeJS.ErrnoException | null)?.code === "EPIPE";
}
process.stdout.on("error", (error) => {
  if (isBrokenPipe(error)) onBrokenPipe.handler();
});

process.exitCode = await run(process.argv.slice(2)).catch((error) => {
  if (isBrokenPipe(error)) return ExitCode.ok;
  throw error;
});
