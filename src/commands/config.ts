import { defineCommand } from "citty";
import { settingsReport } from "../config/report.ts";
import { Output, table } from "../ui/output.ts";
import { outputArgs, rejectUnknownFlags } from "./_args.ts";
import { commandContext } from "./_context.ts";
import { loadWorkerSettings, workerSettingsFile } from "../worker/settings.ts";
import type { ConfigDoc, ConfigPathDoc } from "./_json.ts";

const args = { json: outputArgs.json } as const;

const path = defineCommand({
  meta: { name: "path", description: "Print the config file gpulayer reads ($GPULAYER_CONFIG, else $GPULAYER_HOME/config.yaml), whether or not it exists" },
  args,
  async run({ args: a, rawArgs }) {
    rejectUnknownFlags(rawArgs, args);
    const { settings } = await commandContext({}, { configMayBeMissing: true });
    const doc: ConfigPathDoc = { config_file: settings.configFile, exists: settings.configFound };
    new Output(a).result(doc, () => settings.configFile);
  },
});

export default defineCommand({
  meta: { name: "config", description: "Show every setting's effective value and where it came from: a flag, a GPULAYER_* variable, the config file, or the default" },
  args,
  subCommands: { path },
  async run({ args: a, rawArgs }) {
    if ((a._ as string[])[0] === "path") return; // citty ran the subcommand
    rejectUnknownFlags(rawArgs, args);
    const { settings, layout } = await commandContext();
    const rows = settingsReport(settings, { python: loadWorkerSettings(layout).python, file: workerSettingsFile(layout) });
    const doc: ConfigDoc = {
      config_file: settings.configFile,
      config_file_exists: settings.configFound,
      settings: rows.map((r) => ({ name: r.name, value: r.value, shown: r.shown, source: r.source, origin: r.origin, variable: r.variable, flag: r.flag, help: r.help })),
    };
    new Output(a).result(doc, () => [
      `config file: ${settings.configFile}${settings.configFound ? "" : " (not there: defaults and variables only)"}`,
      "",
      ...table([["SETTING", "VALUE", "FROM"], ...rows.map((r) => [r.name, r.shown, r.source === "file" ? `config file` : r.source === "worker" ? "join --python (worker.json)" : r.origin])]),
    ]);
  },
});
