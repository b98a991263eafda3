#!/usr/bin/env bash
# Installs what the test suite needs and is missing; fast and silent-ish when
# everything is already there. Idempotent. Called by `make test`.
#
#   Debian packages: redis-server (redis-server, redis-cli), postgresql
#   (only if no server answers on 127.0.0.1:5432 and no postgres binaries
#   exist), spin (model checking), nodejs/npm (only if node is missing),
#   rabbitmq-server (RabbitMQ 3.10 and Erlang, for the AMQP broker tests;
#   the tests run their own node, never the service the package starts).
#   prometheus (the server and promtool, for the ops/ rules tests; the tests
#   run their own server on a free loopback port, never the service the
#   package sets up).
#   npm packages:    tools/ (dynalite, fauxqs) via `npm ci --prefix tools`
#                    when tools/node_modules is missing or older than
#                    tools/package-lock.json.
#   optional:        moto_server (Python moto 5.2.1, a second DynamoDB
#                    implementation): Debian has no package of it, so when it
#                    is missing the script tries pip once and otherwise says
#                    how to get it; without it the stores/dynamo moto run is
#                    skipped with that advice (dynalite stays required).
#
# The tests start their own servers (internal/testsupport/testserver); this script only
# installs programs and never starts or stops a service.
set -euo pipefail

cd "$(dirname "${BASH_SOURCE[0]}")/.."

say() { printf 'ensure-test-deps: %s\n' "$*"; }

SUDO=()
if [[ $(id -u) -ne 0 ]]; then
	SUDO=(sudo)
fi

have() { command -v "$1" >/dev/null 2>&1; }

postgres_answers() {
	# A plain TCP dial; internal/testsupport/testserver checks the login itself.
	timeout 2 bash -c 'exec 3<>/dev/tcp/127.0.0.1/5432' 2>/dev/null
}

postgres_binaries() {
	if have postgres && have initdb; then
		return 0
	fi
	compgen -G '/usr/lib/postgresql/*/bin/postgres' >/dev/null
}

did=0
pkgs=()
if ! have redis-server || ! have redis-cli; then
	pkgs+=(redis-server)
fi
if ! postgres_answers && ! postgres_binaries; then
	pkgs+=(postgresql)
fi
if ! have spin; then
	pkgs+=(spin)
fi
if ! have node || ! have npm; then
	pkgs+=(nodejs npm)
fi
if [[ ! -x /usr/lib/rabbitmq/bin/rabbitmq-server ]] && ! have rabbitmq-server; then
	pkgs+=(rabbitmq-server)
fi
if ! have prometheus || ! have promtool; then
	pkgs+=(prometheus)
fi

# apt_locked runs apt-get with its arguments; while another process (an
# unattended upgrade, another apt-get) holds the package manager's lock it
# says so once and tries again every 5 s, for at most APT_LOCK_WAIT seconds
# (default 600), instead of failing at once.
apt_locked() {
	local waited=0 limit=${APT_LOCK_WAIT:-600} out status
	while :; do
		status=0
		out=$("${SUDO[@]}" apt-get -o DPkg::Lock::Timeout=5 "$@" 2>&1) || status=$?
		if ((status == 0)); then
			return 0
		fi
		if ! grep -q -e 'Could not get lock' -e 'Unable to acquire the dpkg frontend lock' -e 'Unable to lock directory' <<<"$out" || ((waited >= limit)); then
			printf '%s\n' "$out" >&2
			return "$status"
		fi
		if ((waited == 0)); then
			say "waiting for the package manager's lock, held by another apt-get or dpkg process (at most ${limit}s; APT_LOCK_WAIT sets it)"
		fi
		sleep 5
		waited=$((waited + 5))
	done
}

if ((${#pkgs[@]})); then
	export DEBIAN_FRONTEND=noninteractive
	say "apt-get update (to install: ${pkgs[*]})"
	apt_locked update -qq
	for p in "${pkgs[@]}"; do
		say "apt-get install $p"
	done
	apt_locked install -y -qq --no-install-recommends "${pkgs[@]}" >/dev/null
	did=1
fi

node_major=$(node -p 'process.versions.node.split(".")[0]' 2>/dev/null || echo 0)
if ((node_major < 20)); then
	say "warning: node $(node --version 2>/dev/null || echo missing) is older than 20, which dynalite 4 and fauxqs need"
fi

stamp=tools/node_modules/.package-lock.json # written last by npm
if [[ ! -f $stamp || tools/package-lock.json -nt $stamp ]]; then
	say "npm ci --prefix tools"
	npm ci --prefix tools --no-audit --no-fund --loglevel=error
	did=1
fi

moto_spec='moto[server]==5.2.1'
if ! have moto_server; then
	if python3 -m pip --version >/dev/null 2>&1 &&
		python3 -m pip install --quiet --disable-pip-version-check --retries 0 --timeout 15 "$moto_spec" >/dev/null 2>&1 &&
		have moto_server; then
		say "pip install $moto_spec"
		did=1
	else
		say "note: moto_server not found and pip could not install it (no PyPI here?): the DynamoDB suite's moto run will be skipped; to run it: python3 -m pip install '$moto_spec'"
	fi
fi

if ((did == 0)); then
	say "all required programs present"
fi
