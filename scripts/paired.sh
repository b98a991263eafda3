#!/usr/bin/env bash
# paired.sh: paired builds of dev/bench, run alternately, medians.
#
# Measures whether a change (a speed trick, or its removal) pays: builds
# dev/bench from two sources, A and B, and runs them alternately
# (A B A B ...) so that load from other processes weighs on both alike.
#
#   scripts/paired.sh [-n PAIRS] [-m time|callgrind] A B [-- dedup-bench flags]
#
# A and B are git revisions (exported with git archive), "." for the
# working tree as it is (uncommitted changes included), or a directory
# holding a copy of the repository. Examples:
#
#   scripts/paired.sh HEAD .                  # the committed code against the edit in progress
#   scripts/paired.sh -m callgrind HEAD~1 HEAD
#   scripts/paired.sh -n 7 HEAD . -- -stores redis -c 16
#
# time (default): each run is `dedup-bench -reps 1` of the router lanes
# (router, router+dedup, router+raw pair, router+raw CAS pair) on memory,
# redis and redis-ap at c = 16 and 64 (DEFAULT_FLAGS; flags after -- are
# added after them), then the allocation samples. It prints, per store, c
# and variant, the median msg/s and CPU µs/msg of A and of B over the
# pairs, their spread [min-max] and B/A, the allocations per message,
# router+dedup over each router floor, and `uptime` before every pair.
#
# callgrind: instructions per message under valgrind --tool=callgrind,
# which the machine's load does not move: for each build and each store
# (CG_STORES, store:c), two runs of `dedup-bench -messages N`
# (CG_SMALL and CG_LARGE messages, each after as many for warm-up) and
# (Ir(large) - Ir(small)) / (2 (CG_LARGE - CG_SMALL)), so that start-up
# cancels. Go's asynchronous preemption is off (GODEBUG), and so is the
# runtime's use of RDTSCP (valgrind 3.19 cannot decode it: on a CPU that
# has it, the benchmark dies of SIGILL in runtime.cputicks), and the Redis
# stores use a redis-server this script starts (a child of the benchmark
# would abort callgrind).
set -euo pipefail

pairs=5
mode=time
while getopts "n:m:" opt; do
	case $opt in
	n) pairs=$OPTARG ;;
	m) mode=$OPTARG ;;
	*) exit 2 ;;
	esac
done
shift $((OPTIND - 1))
if [ $# -lt 2 ]; then
	sed -n '2,30p' "$0" >&2
	exit 2
fi
srcA=$1 srcB=$2
shift 2
[ "${1:-}" = "--" ] && shift
extra=("$@")

DEFAULT_FLAGS=(-q -lines -stores memory,redis,redis-ap -c 16,64 -reps 1 -duration 1s -warmup 300ms
	-redis-records none -alloc-messages 1000 -variants "router,router+dedup,router+raw pair,router+raw CAS pair")
CG_STORES=${CG_STORES:-"memory:16 redis:16 redis-ap:64"}
CG_SMALL=${CG_SMALL:-200}
CG_LARGE=${CG_LARGE:-1200}

root=$(git rev-parse --show-toplevel)
work=$(mktemp -d /tmp/paired.XXXXXX)
redis_pid=
cleanup() {
	[ -n "$redis_pid" ] && kill "$redis_pid" 2>/dev/null
	rm -rf "$work"
}
trap cleanup EXIT

# build SRC NAME: $work/NAME is dev/bench built from SRC (cmd/dedup-bench
# in revisions from before the tooling moved to dev/).
build() {
	local src=$1 name=$2 dir
	if [ "$src" = "." ]; then
		dir=$root
	elif [ -d "$src" ]; then
		dir=$src
	else
		dir=$work/src-$name
		mkdir -p "$dir"
		git -C "$root" archive "$src" | tar -x -C "$dir"
	fi
	local pkg=./dev/bench
	[ -d "$dir/dev/bench" ] || pkg=./cmd/dedup-bench
	(cd "$dir" && go build -buildvcs=false -o "$work/$name" "$pkg")
	echo "built $name from $src ($(cd "$root" && git rev-parse --short "$src" 2>/dev/null || echo 'working tree'))" >&2
}
build "$srcA" A
build "$srcB" B

out=$work/lines
: >"$out"
case $mode in
time)
	for i in $(seq "$pairs"); do
		echo "pair $i/$pairs: uptime$(uptime | sed 's/.*load average//')" >&2
		echo "load	$i	$(cut -d' ' -f1-3 /proc/loadavg)" >>"$out"
		for b in A B; do
			"$work/$b" "${DEFAULT_FLAGS[@]}" "${extra[@]}" | grep -E '^(rate|cpu|srvcpu|allocs)	' | sed "s/^/$b	/" >>"$out"
		done
	done
	;;
callgrind)
	port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
	redis-server --port "$port" --bind 127.0.0.1 --save '' --appendonly no --dir "$work" >/dev/null &
	redis_pid=$!
	until redis-cli -p "$port" ping >/dev/null 2>&1; do sleep 0.1; done
	export DEDUP_BENCH_REDIS_ADDR=127.0.0.1:$port GODEBUG=asyncpreemptoff=1,cpu.rdtscp=off
	ir() { # ir BUILD STORE C N: instructions of one run
		valgrind --tool=callgrind --callgrind-out-file=/dev/null "$work/$1" -q -messages "$4" -profile-store "$2" -profile-c "$3" "${extra[@]}" 2>&1 |
			sed -n 's/.*Collected : //p'
	}
	for i in $(seq "$pairs"); do
		echo "pair $i/$pairs: uptime$(uptime | sed 's/.*load average//')" >&2
		echo "load	$i	$(cut -d' ' -f1-3 /proc/loadavg)" >>"$out"
		for sc in $CG_STORES; do
			store=${sc%:*} c=${sc#*:}
			for b in A B; do
				small=$(ir "$b" "$store" "$c" "$CG_SMALL")
				large=$(ir "$b" "$store" "$c" "$CG_LARGE")
				echo "$b	ir	$store	$c	router+dedup	$i	$(((large - small) / (2 * (CG_LARGE - CG_SMALL))))" >>"$out"
			done
		done
	done
	;;
*)
	echo "paired.sh: unknown mode $mode (time or callgrind)" >&2
	exit 2
	;;
esac

python3 - "$out" "$srcA" "$srcB" "$mode" <<'EOF'
import sys, statistics
from collections import defaultdict
path, a, b, mode = sys.argv[1:]
vals = defaultdict(list)
loads = []
for line in open(path):
    f = line.rstrip("\n").split("\t")
    if f[0] == "load":
        loads.append(f[2])
        continue
    build, metric, store, c, variant = f[:5]
    if metric == "allocs":
        vals[(metric + " n", store, c, variant, build)].append(float(f[6]))
        vals[(metric + " B", store, c, variant, build)].append(float(f[7]))
    else:
        vals[(metric, store, c, variant, build)].append(float(f[6]))
print(f"paired.sh -m {mode}: A = {a}, B = {b}; {len(loads)} pairs, A B alternated; load (1/5/15 min) before each pair: {'; '.join(loads)}")
keys = sorted({k[:4] for k in vals}, key=lambda k: (k[1], int(k[2]), k[3], k[0]))
print(f"{'metric':10} {'store':9} {'c':>3} {'variant':19} {'A median [min-max]':>28} {'B median [min-max]':>28} {'B/A':>6}")
for k in keys:
    A, B = vals.get(k + ("A",), []), vals.get(k + ("B",), [])
    if not A or not B:
        continue
    ma, mb = statistics.median(A), statistics.median(B)
    fmt = lambda v: f"{v:.1f}" if v < 1000 else f"{v:.0f}"
    sa = f"{fmt(ma)} [{fmt(min(A))}-{fmt(max(A))}]"
    sb = f"{fmt(mb)} [{fmt(min(B))}-{fmt(max(B))}]"
    print(f"{k[0]:10} {k[1]:9} {k[2]:>3} {k[3]:19} {sa:>28} {sb:>28} {mb/ma if ma else 0:6.3f}")
# router+dedup / each router floor within each run (same build, store, c,
# repetition), then the median over the runs of each build.
runs = defaultdict(dict)
n = defaultdict(int)
for line in open(path):
    f = line.rstrip("\n").split("\t")
    if len(f) > 6 and f[1] == "rate":
        build, _, store, c, variant, rep = f[:6]
        runs[(build, store, c)].setdefault(variant, []).append(float(f[6]))
for floor in ("router+raw pair", "router+raw CAS pair"):
    ratios = defaultdict(list)
    for (build, store, c), v in runs.items():
        for num, den in zip(v.get("router+dedup", []), v.get(floor, [])):
            ratios[(store, c, build)].append(num / den)
    if not ratios:
        continue
    print(f"router+dedup / {floor}, within each run; median [min-max] over the runs")
    for store, c in sorted({k[:2] for k in ratios}, key=lambda k: (k[0], int(k[1]))):
        cells = []
        for build in "AB":
            r = ratios.get((store, c, build), [])
            cells.append(f"{build} {statistics.median(r):.2f} [{min(r):.2f}-{max(r):.2f}]" if r else f"{build} -")
        print(f"  {store:9} c={c:>3}  " + "   ".join(cells))
EOF
