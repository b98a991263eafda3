#!/usr/bin/env bash
# Checks that every module of go.work stands alone: its go.mod and go.sum
# are tidy (`go mod tidy -diff` prints what tidy would change) and it builds
# outside the workspace (GOWORK=off), as in a user's module graph. Called by
# `make test`.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

status=0
for dir in $(sed -n '/^use (/,/^)/{s/^[[:space:]]*//;/^use (/d;/^)/d;p}' go.work); do
	if ! out=$(cd "$dir" && GOWORK=off go mod tidy -diff 2>&1); then
		printf 'check-modules: %s: go.mod/go.sum not tidy (run `cd %s && GOWORK=off go mod tidy`):\n%s\n' "$dir" "$dir" "$out" >&2
		status=1
		continue
	fi
	if ! out=$(cd "$dir" && GOWORK=off go build ./... 2>&1); then
		printf 'check-modules: %s does not build outside the workspace:\n%s\n' "$dir" "$out" >&2
		status=1
	fi
done
exit $status
