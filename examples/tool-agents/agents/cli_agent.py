#!/usr/bin/env python3
"""Example agent reading only its command-line arguments."""

import argparse
import json
import sys


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--repo", required=True)
    parser.add_argument("--issue", type=int, required=True)
    parser.add_argument("--dry-run", action="store_true")
    args = parser.parse_args()
    print(json.dumps({
        "status": "success",
        "result": {"repo": args.repo, "issue": args.issue, "dry_run": args.dry_run, "priority": "p2"},
    }))


if __name__ == "__main__":
    sys.exit(main())
