#!/usr/bin/env python3
"""Example agent that logs to stderr and fails with the protocol's error form."""

import json
import logging
import sys

logging.basicConfig(stream=sys.stderr, level=logging.INFO, format="[%(asctime)s] %(levelname)s: %(message)s")
logger = logging.getLogger("always_fails")


def main():
    params = json.load(sys.stdin)
    logger.info("agent started")
    try:
        raise RuntimeError(params.get("reason", "this agent always fails"))
    except RuntimeError as e:
        logger.error("giving up: %s", e)
        print(json.dumps({"status": "error", "error": f"Unexpected error: {e}", "details": "see the bridge log for this agent's stderr"}))
        return 1


if __name__ == "__main__":
    sys.exit(main())
