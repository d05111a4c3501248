#!/usr/bin/env bash
# Regenerates proto/ into a scratch directory and fails if any generated file
# differs from, is missing from, or is extra to what is committed.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
scratch=$(mktemp -d)
trap 'rm -rf "$scratch"' EXIT

cd "$root/proto"
"$BUF" generate --output "$scratch"

generated() { (cd "$1" && find . -type f \( -name '*.pb.go' -o -name '*.pb.gw.go' -o -name '*.swagger.json' \) | sort); }
if ! diff <(generated "$root/proto") <(generated "$scratch") >/dev/null; then
	echo "generated files differ in name from a fresh 'make generate':" >&2
	diff <(generated "$root/proto") <(generated "$scratch") >&2 || true
	exit 1
fi
status=0
while read -r f; do
	if ! cmp -s "$root/proto/$f" "$scratch/$f"; then
		echo "stale generated file: proto/${f#./}" >&2
		status=1
	fi
done < <(generated "$scratch")
if [ "$status" -ne 0 ]; then
	echo "run 'make generate' and commit the result" >&2
fi
exit "$status"
