import type { ResolvedSettings } from "./resolve.ts";
import { SETTING_NAMES, SETTINGS, type SettingDef } from "./table.ts";

/** One row of `gpulayer config`: a setting's effective value and where it came from (as `git config --show-origin`). */
export interface SettingRow {
  name: string;
  /** Typed: sizes in bytes, durations in seconds, secrets as "***"; null when nothing set it and it has no default. */
  value: unknown;
  /** As people write it (200G, 10s). */
  shown: string;
  /** worker: `python`, as `join --python` saved it (worker.json), where nothing else set it. */
  source: "flag" | "env" | "file" | "worker" | "default";
  /** The flag, the variable, the config file's path, or "default". */
  origin: string;
  variable: string;
  flag: string | null;
  help: string;
}

/** `saved`: what `join --python` saved, and where: the effective `python` when no flag, variable or file sets one. */
export function settingsReport(settings: ResolvedSettings, saved: { python?: string; file: string }): SettingRow[] {
  return SETTING_NAMES.map((name) => {
    const def = SETTINGS[name] as SettingDef<unknown>;
    const value = (settings.values as Record<string, unknown>)[name];
    const origin = settings.origins[name];
    if (name === "python" && !value && saved.python) {
      return { name, value: saved.python, shown: saved.python, source: "worker" as const, origin: saved.file, variable: def.env, flag: def.flag ?? null, help: def.help };
    }
    const set = value !== undefined && value !== null;
    return {
      name,
      value: set ? (def.kind.json ? def.kind.json(value) : value) : null,
      shown: set ? def.kind.show(value) : `(${def.defaultText ?? "none"})`,
      source: origin.source,
      origin: origin.name,
      variable: def.env,
      flag: def.flag ?? null,
      help: def.help,
    };
  });
}

/** The settings reference's table (docs/reference/settings.md), made from the same table of settings by scripts/gen-reference.ts. */
export function settingsMarkdown(): string {
  const rows = SETTING_NAMES.map((name) => {
    const def = SETTINGS[name] as SettingDef<unknown>;
    const shown = def.default !== undefined ? `\`${def.kind.show(def.default)}\`` : (def.defaultText ?? "none");
    const key = def.inFile === false ? `(${name}: not in the file)` : `\`${name}\``;
    return `| ${key} | \`${def.env}\` | ${def.flag ? `\`${def.flag}\`` : ""} | ${def.kind.name.replaceAll("|", "\\|")} | ${shown} | ${def.help} |`;
  });
  return ["| config.yaml key | variable | flag | kind | default | what it sets |", "|---|---|---|---|---|---|", ...rows].join("\n");
}
