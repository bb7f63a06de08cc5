"""Helpers the report_*.py scripts share: reading the benches' JSON and JSON-lines files and
writing a report's rows as CSV and as a Markdown table. Standard library only (the report
scripts run where PyTorch is missing too)."""
import csv
import json
import os

_REQUIRED = object()


def load_json(d, name, missing=_REQUIRED):
    """The JSON document `d/name`; `missing` where that file does not exist, if given (else
    the missing file is an error)."""
    path = f"{d}/{name}"
    if missing is not _REQUIRED and not os.path.exists(path):
        return missing
    return json.load(open(path))


def load_jsonl(path, skip_bad=True):
    """The JSON objects of the lines of `path` that start with `{` (other lines are logs);
    a line that does not parse is passed over when `skip_bad`, else an error."""
    rows = []
    with open(path) as f:
        for line in f:
            line = line.strip()
            if line.startswith("{"):
                try:
                    rows.append(json.loads(line))
                except json.JSONDecodeError:
                    if not skip_bad:
                        raise
    return rows


def write_csv(path, columns, rows):
    """Writes `rows` (dicts) to `path` as CSV with the header `columns`."""
    with open(path, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=columns)
        w.writeheader()
        w.writerows(rows)


def print_markdown(columns, rows):
    """Prints `rows` (dicts) as a Markdown table of `columns`."""
    print("| " + " | ".join(columns) + " |")
    print("|" + "---|" * len(columns))
    for r in rows:
        print("| " + " | ".join(str(r[k]) for k in columns) + " |")
