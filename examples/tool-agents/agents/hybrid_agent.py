#!/usr/bin/env python3
"""Example agent reading both sources; command-line arguments take precedence."""

import argparse
import json
import sys


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--repo")
    parser.add_argument("--dry-run", action="store_true")
    args = parser.parse_args()
    params = json.load(sys.stdin)

    repo_name = args.repo or params.get("repo_name")
    dry_run = args.dry_run or params.get("dry_run", False)
    sources = params.get("sources", ["github"])
    print(json.dumps({
        "status": "success",
        "data": {
            "repo_name": repo_name,
            "repo_from": "cli" if args.repo else "stdin",
            "dry_run": dry_run,
            "mentions": {source: 0 for source in sources},
        },
    }))


if __name__ == "__main__":
    sys.exit(main())
