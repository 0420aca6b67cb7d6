#!/usr/bin/env bash
# Runs every Go fuzz target of the module (each func FuzzXxx(f *testing.F) in a _test.go
# file) for FUZZTIME, one after another: go test takes one -fuzz target at a time. A new
# target is picked up without editing this script. An input that fails is written to the
# package's testdata/fuzz/FuzzXxx/, where plain go test runs it from then on.
#
#   FUZZTIME=30s bash scripts/fuzz.sh            # longer runs
#   bash scripts/fuzz.sh ./internal/memfill      # only these packages
set -euo pipefail
cd "$(dirname "$0")/.."

GO=${GO:-go}
FUZZTIME=${FUZZTIME:-4s}
# Minimizing each new interesting input may take up to a minute by default, which would
# eat a short run; a failing input is kept whether it is minimized or not.
FUZZMINIMIZETIME=${FUZZMINIMIZETIME:-2s}
export CGO_CFLAGS=${CGO_CFLAGS:--O2 -g -Wno-deprecated-declarations}

shopt -s nullglob
failed=()
start=$SECONDS
while read -r pkg dir; do
	tests=("$dir"/*_test.go)
	((${#tests[@]})) || continue
	names=$(sed -nE 's/^func (Fuzz[A-Za-z0-9_]*)\(f \*testing\.F\).*/\1/p' "${tests[@]}" | sort -u)
	for name in $names; do
		echo "fuzz: $pkg $name ($FUZZTIME)"
		# Go's fuzzer can end a run with "context deadline exceeded" when the time runs out
		# while it minimizes a new input, with no failing input found: such a run is tried
		# again (four times at most: on CI's two cores one target met it twice in a row), and
		# counts as failed only if it keeps failing or writes a failing input.
		for try in 1 2 3 4 5; do
			out=$("$GO" test -run '^$' -fuzz "^${name}\$" -fuzztime "$FUZZTIME" -fuzzminimizetime "$FUZZMINIMIZETIME" "$pkg" </dev/null 2>&1) && { echo "$out" | tail -1; break; }
			echo "$out"
			if [ "$try" = 5 ] || ! grep -q "context deadline exceeded" <<<"$out" || grep -q "Failing input written" <<<"$out"; then
				failed+=("$pkg $name")
				break
			fi
			echo "fuzz: $name stopped at the deadline with no failing input; trying again"
		done
	done
done < <("$GO" list -f '{{.ImportPath}} {{.Dir}}' "${@:-./...}")

echo "fuzz: done in $((SECONDS - start))s"
if ((${#failed[@]})); then
	printf 'fuzz: FAILED %s\n' "${failed[@]}" >&2
	exit 1
fi
