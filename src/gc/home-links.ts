import { lstatSync, readlinkSync } from "node:fs";
import type { HomeLayout } from "../config/paths.ts";
import { UserError } from "../errors.ts";

/**
 * The folders of a home that gc lists and deletes in. gc removes only inside
 * its home: one of these that is a symbolic link would make it list and
 * delete wherever the link points (a `trash` linked to a folder of the
 * user's would be emptied), so gc refuses to run on such a home rather than
 * guess whether the link was meant. The home itself may be a link: the user
 * named it.
 */
export function gcFolders(layout: HomeLayout): string[] {
  return [layout.envs, layout.trash, layout.locks, layout.leases, layout.jobs, layout.images, layout.wheelhouse, layout.cluster, layout.clusterWork, layout.clusterBundles];
}

/** Is `path` a symbolic link (not followed)? A missing path is not. */
export function isLink(path: string): boolean {
  try {
    return lstatSync(path).isSymbolicLink();
  } catch {
    return false;
  }
}

/** Refuse, in one line, a home one of whose gc folders is a symbolic link. */
export function refuseLinkedFolders(layout: HomeLayout): void {
  for (const folder of gcFolders(layout)) {
    if (!isLink(folder)) continue;
    let target = "?";
    try {
      target = readlinkSync(folder);
    } catch {
      // gone meanwhile: still refused, the next run sees again
    }
    throw new UserError(`gc: ${folder} is a symbolic link (to ${target}); gc deletes only inside its home and never follows a link out of it: make it a plain folder, or set GPULAYER_HOME to the place itself`);
  }
}
