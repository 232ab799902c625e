import { defineCommand } from "citty";

export default defineCommand({
  meta: { name: "job", description: "Run jobs: prepare their environment (timed apart), run, record status and logs" },
  subCommands: {},
});
