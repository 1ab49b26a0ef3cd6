#!/usr/bin/env bash
# Redis + webdis + two Envoy replicas sharing loopguard's counts, all on
# loopback (`make run-cluster` builds first and calls this). Ctrl-C stops
# everything this script started.
#
#   replica A  http://127.0.0.1:10010  (admin :9910)
#   replica B  http://127.0.0.1:10020  (admin :9920)
#   webdis     http://127.0.0.1:7390   -> Redis 127.0.0.1:6390
set -euo pipefail

here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)
cd "$root"
ENVOY=${ENVOY:-$root/.venv/envoy}
for tool in redis-server redis-cli webdis "$ENVOY"; do
  command -v "$tool" >/dev/null || { echo "run-cluster: $tool not found (make run-cluster installs it)" >&2; exit 1; }
done

work=$(mktemp -d)
pids=()
stop() {
  trap - EXIT INT TERM
  for pid in "${pids[@]}"; do kill "$pid" 2>/dev/null || true; done
  wait 2>/dev/null || true
  rm -rf "$work"
}
trap stop EXIT INT TERM

wait_port() { # port name
  for _ in $(seq 100); do
    (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null && return 0
    sleep 0.1
  done
  echo "run-cluster: $2 did not listen on 127.0.0.1:$1" >&2
  exit 1
}

admin_pass=$(sed -n 's/^user loopguard-admin on >\([^ ]*\).*/\1/p' "$here/redis.conf")

# Redis, with loopguard's function loaded (functions are not persisted here).
sed "s|^save .*|save \"\"\ndir $work|" "$here/redis.conf" >"$work/redis.conf"
redis-server "$work/redis.conf" --logfile "$work/redis.log" &
pids+=($!)
wait_port 6390 redis
redis-cli -p 6390 --user loopguard-admin --pass "$admin_pass" --no-auth-warning \
  -x FUNCTION LOAD REPLACE <envoy/redis/loopguard.lua >/dev/null

# webdis: FCALL and PING only.
webdis "$here/webdis.json" &
pids+=($!)
wait_port 7390 webdis

# Two replicas: A as shipped, B with its ports moved.
sed -e 's/port_value: 10010/port_value: 10020/' -e 's/port_value: 10011/port_value: 10021/' \
  -e 's/port_value: 9910/port_value: 9920/' "$here/envoy.yaml" >"$work/envoy-b.yaml"
for replica in "A:$here/envoy.yaml" "B:$work/envoy-b.yaml"; do
  IFS=: read -r name config <<<"$replica"
  "$ENVOY" -c "$config" --concurrency 2 --disable-hot-restart \
    --log-level warn --component-log-level wasm:info --file-flush-interval-msec 500 \
    > >(sed -u "s/^/[replica $name] /") 2>&1 &
  pids+=($!)
done
wait_port 10010 "replica A"
wait_port 10020 "replica B"

cat <<'EOF'

Two loopguard replicas share one Redis. Alternate one request between them:

  for i in 1 2 3 4 5 6; do
    port=$((i % 2 ? 10010 : 10020))
    curl -s -o /dev/null -w "replica :$port -> %{http_code}\n" http://127.0.0.1:$port/v1/chat/completions \
      -H 'content-type: application/json' -H 'authorization: Bearer sk-demo' \
      -d '{"model":"gpt-4o-mini","messages":[{"role":"user","content":"same question"}]}'
  done

Neither replica sees five requests, yet the 5th is rejected (threshold 5).
Store calls per replica: curl -s 127.0.0.1:9910/stats | grep store_
Ctrl-C stops Redis, webdis and both replicas.
EOF
wait -n "${pids[@]}"
