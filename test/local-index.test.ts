import { expect, test } from "bun:test";
import { mkdirSync, writeFileSync } from "node:fs";
import { join } from "node:path";
import { localIndexFolders } from "../src/docker/local-index.ts";
import { tempDir } from "./helpers.ts";

/**
 * What an image build is given of an index on this machine's disk: the index, and the folders beside it its pages
 * link to (a mirror's simple/ pages link ../../files/). Never wider: a page's link to /etc, far above the index,
 * or to the index's parent itself would otherwise put a host folder over the image's own, or a home into the build.
 */

const root = tempDir("gpl-local-index-");

function index(name: string, links: Record<string, string>): string {
  const dir = join(root, name, "simple");
  for (const [project, href] of Object.entries(links)) {
    mkdirSync(join(dir, project), { recursive: true });
    writeFileSync(join(dir, project, "index.html"), `<!DOCTYPE html><html><body><a href="${href}#sha256=00">${project}</a></body></html>\n`);
  }
  return dir;
}

test("a mirror's layout: the index and the files folder beside it", () => {
  const dir = index("mirror", { aa: "../../files/aa-1.0-py3-none-any.whl", bb: "../../files/bb-1.0-py3-none-any.whl" });
  expect(localIndexFolders(dir)).toEqual([dir, join(root, "mirror", "files")]);
});

test("links far above, to system folders, to the index's parent itself, to other hosts, or unreadable: none widens what is mounted", () => {
  const dir = index("hostile", { a: "file:///etc/passwd", b: "../../../../../../../x.whl" });
  expect(localIndexFolders(dir)).toEqual([dir]);
  const more = index("hostile2", { a: "../x.whl", b: "https://files.example/x.whl", c: "../../files/100%.whl" });
  expect(localIndexFolders(more)).toEqual([more]);
});

test("links inside the index, or a folder that is no index: the index alone", () => {
  const dir = index("inside", { a: "a-1.0-py3-none-any.whl" });
  expect(localIndexFolders(dir)).toEqual([dir]);
  expect(localIndexFolders(join(root, "nowhere"))).toEqual([join(root, "nowhere")]);
});
