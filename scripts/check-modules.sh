#!/usr/bin/env bash
# Checks that the go.mod and go.sum of every module of go.work are tidy:
# `go mod tidy -diff`, outside the workspace (GOWORK=off), prints what tidy
# would change. Between releases every module reaches its sibling modules
# through replace directives (CONTRIBUTING.md, Releasing), so this resolves
# them from the same checkout: it checks the files as the repository holds
# them. The release step changes only the siblings' versions and replace
# directives, so the third-party requirements tidy keeps here are those a
# release publishes.
#
# It does not check a user's module graph (a module proxy, no replace, no
# workspace): dev/release's TestUserBuild, part of `go test` in `make test`,
# packs the modules a release would tag and builds against them as a user
# does. Called by `make test`.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

status=0
for dir in $(sed -n '/^use (/,/^)/{s/^[[:space:]]*//;/^use (/d;/^)/d;p}' go.work); do
	if ! out=$(cd "$dir" && GOWORK=off go mod tidy -diff 2>&1); then
		printf 'check-modules: %s: go.mod/go.sum not tidy (run `cd %s && GOWORK=off go mod tidy`):\n%s\n' "$dir" "$dir" "$out" >&2
		status=1
	fi
done
exit $status
