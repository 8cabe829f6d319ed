# Helpers shared by scripts/bench and scripts/redis-lua-cost (sourced, not run).

# A free TCP port on 127.0.0.1.
free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }

# write_bench_rules FILE: the rule every bench run decides under, a token bucket so
# large that no call goes over it (domain `bench`, descriptor `user`).
write_bench_rules() {
  cat >"$1" <<'RULES'
domain: bench
descriptors:
  - key: user
    rate_limit:
      unit: second
      requests_per_unit: 1000000000
      algorithm: token_bucket
RULES
}

# script_calls PORT: the script calls the Redis on PORT has run, FCALL (the function
# library, Redis >= 7) plus EVALSHA.
script_calls() {
  redis-cli -p "$1" info commandstats |
    sed -n 's/^cmdstat_\(fcall\|evalsha\):calls=\([0-9]*\),.*/\2/p' | awk '{n += $1} END {print n + 0}'
}
