/**
 * The name a typo was probably meant to be: `prepare_timout` → `prepare_timeout`,
 * `--pyhton` → `--python`. Edits counted as Damerau–Levenshtein (a swap of two
 * neighbours is one edit, the commonest slip); a name further than a third of its
 * length away is no suggestion, and neither is a tie between two.
 */
export function closestName(typed: string, names: readonly string[]): string | undefined {
  const limit = Math.max(1, Math.floor(typed.length / 3));
  let best: string | undefined;
  let bestDistance = Infinity;
  let tied = false;
  for (const name of names) {
    const d = editDistance(typed.toLowerCase(), name.toLowerCase());
    if (d < bestDistance) [best, bestDistance, tied] = [name, d, false];
    else if (d === bestDistance && name !== best) tied = true;
  }
  return bestDistance <= limit && !tied ? best : undefined;
}

/** ` (did you mean X?)`, or nothing: the tail of an "unknown …" line. */
export function didYouMean(typed: string, names: readonly string[]): string {
  const name = closestName(typed, names);
  return name ? ` (did you mean ${name}?)` : "";
}

function editDistance(a: string, b: string): number {
  // Optimal string alignment: rows of the classic table, two back for the swap.
  let before: number[] = [];
  let previous = Array.from({ length: b.length + 1 }, (_, j) => j);
  for (let i = 1; i <= a.length; i++) {
    const row = [i];
    for (let j = 1; j <= b.length; j++) {
      const cost = a[i - 1] === b[j - 1] ? 0 : 1;
      let d = Math.min(previous[j]! + 1, row[j - 1]! + 1, previous[j - 1]! + cost);
      if (i > 1 && j > 1 && a[i - 1] === b[j - 2] && a[i - 2] === b[j - 1]) d = Math.min(d, before[j - 2]! + 1);
      row.push(d);
    }
    [before, previous] = [previous, row];
  }
  return previous[b.length]!;
}
