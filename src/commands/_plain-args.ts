import type { ArgsDef } from "citty";

/** Flags as a command reads them: a flag's value (the last one given), the positionals in `_` and by name. */
export type PlainArgs = Record<string, string | boolean | string[] | undefined> & { _: string[] };

/**
 * Arguments read without citty, for a lane that must start fast: only the plainest forms (`--flag`, `--flag VALUE`,
 * `--flag=VALUE`, a one-letter alias with its value as the next word, positionals), each as citty reads it over the
 * same definition (test/plain-args.test.ts holds the two side by side). Anything else (`--`, `--no-x`, a flag the
 * definition lacks, a camelCase spelling, `-abc`, an empty value or one that looks like a flag, more positionals than
 * named ones) is null: the caller leaves those to citty, and the command's own checks (rejectUnknownFlags).
 */
export function plainArgs(rawArgs: string[], def: ArgsDef): PlainArgs | null {
  const byName = new Map<string, { name: string; type: string }>();
  const positionals: string[] = [];
  for (const [name, d] of Object.entries(def)) {
    if (d.type === "positional") positionals.push(name);
    else if (d.type === "boolean" || d.type === "string") {
      byName.set(`--${name}`, { name, type: d.type });
      for (const alias of [d.alias ?? []].flat()) byName.set(alias.length === 1 ? `-${alias}` : `--${alias}`, { name, type: d.type });
    } else return null;
  }
  const out: PlainArgs = { _: [] };
  for (let i = 0; i < rawArgs.length; i++) {
    const word = rawArgs[i]!;
    if (!word.startsWith("-")) {
      out._.push(word);
      continue;
    }
    const eq = word.startsWith("--") ? word.indexOf("=") : -1;
    const flag = byName.get(eq > 0 ? word.slice(0, eq) : word);
    if (!flag || word.startsWith("--no-")) return null;
    if (flag.type === "boolean") {
      if (eq > 0) return null;
      out[flag.name] = true;
      continue;
    }
    const value = eq > 0 ? word.slice(eq + 1) : rawArgs[++i];
    if (!value || (eq < 0 && value.startsWith("-"))) return null;
    out[flag.name] = value;
  }
  if (out._.length > positionals.length) return null;
  positionals.forEach((name, n) => (out[name] = out._[n]));
  return out;
}
