"""``voxline trace report TRACE.jsonl [--png FILE] [--json]``."""

from __future__ import annotations

import argparse
import json


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("trace", help="inspect latency traces")
    tsub = p.add_subparsers(dest="trace_command", metavar="SUBCOMMAND", required=True)
    r = tsub.add_parser("report", help="p50/p95/p99 per span, budget violations, waterfall")
    r.add_argument("trace", metavar="TRACE.jsonl")
    r.add_argument("--png", metavar="FILE", help="draw a per-turn waterfall of spans vs budgets")
    r.add_argument("--json", action="store_true", help="print the summary as one JSON object")
    r.set_defaults(func=main)


def main(args: argparse.Namespace) -> int:
    from agent.report import draw_waterfall, format_table, load_records, summarize

    records = load_records(args.trace)
    summary = summarize(records)
    if args.json:
        print(json.dumps(summary))
    else:
        print(format_table(summary))
    if args.png:
        n = draw_waterfall(records, args.png)
        if not args.json:
            print(f"waterfall of {n} turns written to {args.png}")
    return 0
