#!/usr/bin/env python3
"""Example agent reading its parameters from JSON on stdin (the recommended style)."""

import json
import sys


def suggest_labels(repo_name, issue_number):
    labels = ["triage"]
    if issue_number % 2 == 0:
        labels.append("bug")
    else:
        labels.append("enhancement")
    if repo_name.lower().endswith("docs"):
        labels.append("documentation")
    return labels


def main():
    params = json.load(sys.stdin)
    repo_name = params.get("repo_name")
    issue_number = params.get("issue_number")
    dry_run = params.get("dry_run", True)
    if not repo_name or not isinstance(issue_number, int):
        print(json.dumps({"status": "error", "error": "Invalid input: repo_name and issue_number are required"}))
        return 1
    print(json.dumps({
        "status": "success",
        "data": {
            "repo_name": repo_name,
            "issue_number": issue_number,
            "dry_run": dry_run,
            "labels": suggest_labels(repo_name, issue_number),
            "confidence": 0.5,
        },
    }))
    return 0


if __name__ == "__main__":
    sys.exit(main())
