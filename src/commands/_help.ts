import type { ArgDef, CommandDef } from "citty";
import { EXAMPLES } from "./_examples.ts";

/**
 * `--help`, in one voice: the usage line names the program and the command's
 * real shape, each option once with its value, then the subcommands and the
 * examples. Plain text unless the stream is a terminal that takes colour.
 */

/** What follows a command's options that its args cannot say (the command after `--`). */
const USAGE_TAIL: Record<string, string> = {
  "job run": "[-- COMMAND ...]",
};

export type Resolvable<T> = T | Promise<T> | (() => T | Promise<T>);
export const resolveValue = async <T>(v: Resolvable<T> | undefined): Promise<T | undefined> => (typeof v === "function" ? await (v as () => T | Promise<T>)() : await v);

/** A command's definition as its help and its reference page read it: meta, subcommands, and its shown args split into positionals and options. */
export async function commandShape(cmd: CommandDef) {
  const meta = (await resolveValue(cmd.meta)) ?? {};
  const args = ((await resolveValue(cmd.args)) ?? {}) as Record<string, ArgDef>;
  const subs = (await resolveValue(cmd.subCommands)) as Record<string, Resolvable<CommandDef>> | undefined;
  const entries = Object.entries(args).filter(([, d]) => !("hidden" in d && d.hidden));
  return { meta, subs, positionals: entries.filter(([, d]) => d.type === "positional"), options: entries.filter(([, d]) => d.type !== "positional") };
}

/** An option as help and the reference write it: `-p, --spec SPEC`. */
export function optionName(name: string, def: ArgDef): string {
  const aliases = "alias" in def && def.alias ? (Array.isArray(def.alias) ? def.alias : [def.alias]) : [];
  const short = aliases.filter((a) => a.length === 1).map((a) => `-${a}`);
  const value = def.type === "boolean" ? "" : ` ${("valueHint" in def && def.valueHint) || name.toUpperCase()}`;
  return [...short, `--${name}`].join(", ") + value;
}

export async function helpText(cmd: CommandDef, path: string[], opts: { color: boolean }): Promise<string> {
  const bold = (s: string) => (opts.color ? `\u001b[1m${s}\u001b[22m` : s);
  const { meta, subs, positionals, options } = await commandShape(cmd);
  const key = path.join(" ");
  const shape = [
    "gpulayer",
    ...path,
    // A command that runs on its own too (server: serve; server token: manage) takes its subcommand optionally.
    ...(subs && Object.keys(subs).length ? [cmd.run ? "[COMMAND]" : "<COMMAND>"] : []),
    ...(options.length ? ["[OPTIONS]"] : []),
    ...positionals.map(([n, d]) => {
      const hint = ("valueHint" in d && d.valueHint) || n.toUpperCase();
      return d.required === false ? `[${hint}]` : hint;
    }),
    ...(USAGE_TAIL[key] ? [USAGE_TAIL[key]] : []),
  ].join(" ");
  const lines = [meta.description ?? "", "", `${bold("USAGE")}  ${shape}`];
  const table = (rows: [string, string][]) => {
    const width = Math.max(...rows.map(([l]) => l.length));
    return rows.map(([l, r]) => `  ${l.padEnd(width)}  ${r}`.trimEnd());
  };
  if (positionals.length) lines.push("", bold("ARGUMENTS"), ...table(positionals.map(([n, d]) => [("valueHint" in d && d.valueHint) || n.toUpperCase(), d.description ?? ""])));
  if (options.length) lines.push("", bold("OPTIONS"), ...table(options.map(([n, d]) => [optionName(n, d), d.description ?? ""])));
  if (subs) {
    const rows: [string, string][] = [];
    for (const [name, entry] of Object.entries(subs)) {
      const sub = (await resolveValue(entry)) as CommandDef;
      const subMeta = (await resolveValue(sub.meta)) ?? {};
      if (!subMeta.hidden) rows.push([name, subMeta.description ?? ""]);
    }
    // Not in the tree citty runs: the entry point answers it before any command loads (src/cli.ts, commands/help.ts).
    if (!path.length) {
      const { default: help } = await import("./help.ts");
      rows.push(["help", String((help.meta as { description: string }).description)]);
    }
    lines.push("", bold("COMMANDS"), ...table(rows), "", `Run gpulayer ${[...path, "<COMMAND>"].join(" ")} --help for a command's options.`);
  }
  const examples = EXAMPLES[key];
  if (examples) lines.push("", bold("EXAMPLES"), ...examples.map((e) => `  ${e}`));
  return `${lines.join("\n")}\n`;
}
