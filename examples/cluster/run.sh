#!/usr/bin/env bash
# Redis + webdis + two Envoy replicas sharing loopguard's counts, all on
# loopback (`make run-cluster` builds first and calls this). Ctrl-C stops
# everything this script started.
#
#   replica A  http://127.0.0.1:10010  (admin :9910)
#   replica B  http://127.0.0.1:10020  (admin :9920)
#   webdis     http://127.0.0.1:7390   -> Redis 127.0.0.1:6390
#
# CLUSTER=1 (`make run-cluster CLUSTER=1`): a Redis Cluster instead of one
# Redis, from examples/cluster/cluster (the replicas' store has
# "topology": "cluster"):
#
#   webdis     http://127.0.0.1:7390   -> redis_proxy 127.0.0.1:6400 (an Envoy of its own, admin :9930)
#   Redis      127.0.0.1:6401..6406    3 masters, 3 replicas (cluster bus :16401..16406)
set -euo pipefail

here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)
cd "$root"
ENVOY=${ENVOY:-$root/.venv/envoy}
for tool in redis-server redis-cli webdis "$ENVOY" ${CLUSTER:+curl}; do
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

single_redis() {
  local admin_pass
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
}

# The Redis Cluster, its redis_proxy Envoy and webdis (examples/cluster/cluster).
# No script is loaded: loopguard sends EVAL when a node answers NOSCRIPT.
redis_cluster() {
  local conf=$here/cluster admin_pass ports=(6401 6402 6403 6404 6405 6406) port ok
  admin_pass=$(sed -n 's/^user loopguard-admin on >\([^ ]*\).*/\1/p' "$conf/redis-node.conf")
  for port in "${ports[@]}"; do
    mkdir "$work/node-$port"
    sed "s/^port .*/port $port/" "$conf/redis-node.conf" >"$work/node-$port/redis.conf"
    printf 'dir %s\nlogfile %s\n' "$work/node-$port" "$work/node-$port/redis.log" >>"$work/node-$port/redis.conf"
    redis-server "$work/node-$port/redis.conf" &
    pids+=($!)
  done
  for port in "${ports[@]}"; do wait_port "$port" "redis :$port"; done
  admin() { redis-cli -p "$1" --user loopguard-admin --pass "$admin_pass" --no-auth-warning "${@:2}"; }
  # The first three nodes become masters, one replica each.
  admin 6401 --cluster create "${ports[@]/#/127.0.0.1:}" --cluster-replicas 1 --cluster-yes >"$work/cluster-create.log" \
    || { cat "$work/cluster-create.log" >&2; echo "run-cluster: redis-cli --cluster create failed" >&2; exit 1; }
  # Ready when every node says ok and knows the three replicas, and every
  # replica has copied its master.
  for _ in $(seq 200); do
    ok=1
    for port in "${ports[@]}"; do
      [[ $(admin "$port" CLUSTER INFO) == *cluster_state:ok* ]] || ok=
      [[ $(admin "$port" CLUSTER NODES | awk '$3 ~ /slave/' | wc -l) == 3 ]] || ok=
      if [[ $(admin "$port" ROLE) == slave* ]]; then
        [[ $(admin "$port" INFO replication) == *master_link_status:up* ]] || ok=
      fi
    done
    [[ $ok ]] && break
    sleep 0.1
  done
  [[ $ok ]] || { echo "run-cluster: the Redis Cluster did not become ok" >&2; exit 1; }

  # redis_proxy: ready once it has discovered the cluster (CLUSTER SLOTS).
  "$ENVOY" -c "$conf/redis-proxy.yaml" --concurrency 1 --disable-hot-restart --log-level warn \
    > >(sed -u "s/^/[redis_proxy] /") 2>&1 &
  pids+=($!)
  for _ in $(seq 100); do
    [[ $(curl -s -o /dev/null -w '%{http_code}' http://127.0.0.1:9930/ready) == 200 ]] && break
    sleep 0.1
  done
  [[ $(curl -s http://127.0.0.1:9930/ready) == LIVE* ]] \
    || { echo "run-cluster: redis_proxy (admin :9930) did not become ready" >&2; exit 1; }

  # webdis: EVALSHA, EVAL and PING only (its "acl"), through redis_proxy, to
  # which it authenticates with "redis_auth" (redis-proxy.yaml's
  # downstream_auth_passwords). "database" stays 0: in cluster mode
  # redis_proxy refuses SELECT of any other database.
  webdis "$conf/webdis.json" &
  pids+=($!)
  wait_port 7390 webdis
  echo "run-cluster: Redis Cluster (6401..6406), redis_proxy :6400 and webdis :7390 are up"
}

if [[ ${CLUSTER:-} ]]; then
  redis_cluster
  envoy_yaml=$here/cluster/envoy.yaml
else
  single_redis
  envoy_yaml=$here/envoy.yaml
fi

# Two replicas: A as shipped, B with its ports moved.
sed -e 's/port_value: 10010/port_value: 10020/' -e 's/port_value: 10011/port_value: 10021/' \
  -e 's/port_value: 9910/port_value: 9920/' "$envoy_yaml" >"$work/envoy-b.yaml"
for replica in "A:$envoy_yaml" "B:$work/envoy-b.yaml"; do
  IFS=: read -r name config <<<"$replica"
  "$ENVOY" -c "$config" --concurrency 2 --disable-hot-restart \
    --log-level warn --component-log-level wasm:info --file-flush-interval-msec 500 \
    > >(sed -u "s/^/[replica $name] /") 2>&1 &
  pids+=($!)
done
wait_port 10010 "replica A"
wait_port 10020 "replica B"

if [[ ${CLUSTER:-} ]]; then
  shared="one Redis Cluster (through webdis and redis_proxy)"
  servers="the Redis Cluster, redis_proxy, webdis"
else
  shared="one Redis"
  servers="Redis, webdis"
fi
printf '\nTwo loopguard replicas share %s. Alternate one request between them:\n' "$shared"
cat <<'EOF'

  for i in 1 2 3 4 5 6; do
    port=$((i % 2 ? 10010 : 10020))
    curl -s -o /dev/null -w "replica :$port -> %{http_code}\n" http://127.0.0.1:$port/v1/chat/completions \
      -H 'content-type: application/json' -H 'authorization: Bearer sk-demo' \
      -d '{"model":"gpt-4o-mini","messages":[{"role":"user","content":"same question"}]}'
  done

Neither replica sees five requests, yet the 5th is rejected (threshold 5).
Store calls per replica: curl -s 127.0.0.1:9910/stats | grep store_
EOF
echo "Ctrl-C stops $servers and both replicas."
wait -n "${pids[@]}"
