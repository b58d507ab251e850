#!/usr/bin/env bash
# Every floating-point option of every command, found in the commands' help (CLI11 types it FLOAT;
# no list by hand), is refused unless it is a finite decimal number, zero or normal, in its stated
# range: NaN, infinities, a subnormal, an overflow, hexadecimal and values below and above the range
# each exit 2 naming the option, before anything runs. (NaN passes a range check `x >= lo && x <= hi` is not
# written to catch: --temperature nan sampled garbage, --stop-grace nan waited for the 300 s timeout.)
source "$(dirname "$0")/lib.sh"

subcommands() { "$LLMTRAIN" "$@" --help | sed -n '/^Subcommands:/,/^$/p' | awk 'NR > 1 && NF { print $1 }'; }
paths=()
for c in $(subcommands); do
  nested=$(subcommands $c)
  if [[ -n $nested ]]; then
    for s in $nested; do paths+=("$c $s"); done
  else
    paths+=("$c")
  fi
done
((${#paths[@]} >= 10)) && pass "found ${#paths[@]} commands in the help" || fail "only ${#paths[@]} commands: ${paths[*]}"

seen=()
for path in "${paths[@]}"; do
  help=$("$LLMTRAIN" $path --help)
  # One placeholder per required positional, so that only the option can be what is refused.
  dummies=()
  for ((i = 0; i < $(sed -n '/^Positionals:/,/^$/p' <<<"$help" | grep -c REQUIRED); ++i)); do dummies+=(x); done
  while read -r names rule; do
    opt=$(tr ',' '\n' <<<"$names" | grep -m1 -- '^--')
    seen+=("$opt")
    [[ $rule == FLOAT:finite* ]] && pass "$path $opt: $rule" || fail "$path $opt: a FLOAT option without the finite rule: $rule"
    # Outside the stated range: below its low end, above its high one.
    read -r lo hi < <(sed -nE 's/.*finite in [[(]([^,]+), ([^])]+)[])].*/\1 \2/p' <<<"$rule")
    [[ -n $lo && -n $hi ]] || fail "$path $opt: no range in its rule: $rule"
    below=$(awk -v x="$lo" 'BEGIN { print x - 1 }') above=$(awk -v x="$hi" 'BEGIN { printf "%.17g", x * 2 + 1 }')
    for bad in nan NaN inf -inf 1e-320 1e999 0x10 "$below" "$above"; do
      run_cmd "$path $opt=$bad" "$LLMTRAIN" $path "${dummies[@]}" "$opt=$bad"
      [[ $status == 2 ]] && grep -qF -- "$opt: $bad is not a finite number in" <<<"$out" ||
        fail "$path $opt=$bad: expected exit 2 naming the option, got $status: $out"
    done
  done < <(grep -E '^ +-[^ ]+ FLOAT' <<<"$help" | sed -E 's/^ +//; s/ {2,}.*//')
done
for opt in --temperature --top-p --stop-grace --inter-node-gbps --valid-fraction --progress-interval; do
  printf '%s\n' "${seen[@]}" | grep -qxF -- "$opt" && pass "$opt is among the options found" || fail "$opt was not found"
done
finish
