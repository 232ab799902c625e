import { UsageError } from "../errors.ts";

/**
 * Split a string into words as a POSIX shell would, without expanding
 * anything: whitespace separates, '...' is literal, "..." keeps spaces and
 * honours \" \\ \$ \`, a backslash outside quotes escapes the next character.
 */
export function shellSplit(input: string, origin = "value"): string[] {
  const words: string[] = [];
  let word = "";
  let inWord = false;
  let quote: "'" | '"' | null = null;
  for (let i = 0; i < input.length; i++) {
    const c = input[i]!;
    if (quote === "'") {
      if (c === "'") quote = null;
      else word += c;
      continue;
    }
    if (quote === '"') {
      if (c === '"') quote = null;
      else if (c === "\\" && i + 1 < input.length && '"\\$`\n'.includes(input[i + 1]!)) {
        const next = input[++i]!;
        if (next !== "\n") word += next;
      } else word += c;
      continue;
    }
    if (c === "'" || c === '"') {
      quote = c;
      inWord = true;
    } else if (c === "\\") {
      if (i + 1 < input.length) {
        const next = input[++i]!;
        if (next !== "\n") word += next;
      }
      inWord = true;
    } else if (/\s/.test(c)) {
      if (inWord) words.push(word);
      word = "";
      inWord = false;
    } else {
      word += c;
      inWord = true;
    }
  }
  if (quote) throw new UsageError(`${origin}: unterminated ${quote === "'" ? "single" : "double"} quote`);
  if (inWord) words.push(word);
  return words;
}
