import { defineCommand } from "citty";

export default defineCommand({
  meta: { name: "env", description: "Prepare, list, inspect and remove cached Python environments" },
  subCommands: {
    prepare: () => import("./prepare.ts").then((m) => m.default),
    list: () => import("./list.ts").then((m) => m.default),
    show: () => import("./show.ts").then((m) => m.default),
    rm: () => import("./rm.ts").then((m) => m.default),
  },
});
