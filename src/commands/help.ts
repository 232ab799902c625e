import { defineCommand } from "citty";

/**
 * `gpulayer help [COMMAND...]`: the same page as `gpulayer COMMAND... --help`,
 * as git and cargo have it. src/cli.ts answers it before any command runs
 * (help never loads a command's code); this definition is what the reference
 * pages and the top-level listing read.
 */
export default defineCommand({
  meta: { name: "help", description: "Show a command's help: gpulayer help job run is gpulayer job run --help" },
  args: {
    command: { type: "positional", required: false, valueHint: "COMMAND...", description: "the command (and subcommands) to show the help of; none: the list of commands" },
  },
});
