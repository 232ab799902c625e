"""Writes the rows both reports read."""
import json
import os

rows = int(os.environ["ROWS"])
with open("rows.json", "w") as f:
    json.dump(list(range(rows)), f)
print(f"wrote {rows} rows")
