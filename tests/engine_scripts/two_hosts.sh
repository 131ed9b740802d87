#!/usr/bin/env bash
# Two "machines" for tests/test_multinode.py, without root: a user and network namespace (host A, address
# 10.77.0.1 on veth0) and a network namespace inside it (host B, 10.77.0.2 on veth1), joined by a veth pair.
# Nothing else is reachable from either (not even the other's loopback). Runs RANK 0 on A and RANK 1 on B:
#   unshare -rn bash tests/engine_scripts/two_hosts.sh PYTHON SCRIPT OUT_PREFIX
set -euo pipefail
python=$1
script=$2
out=$3
port=29577
ip link set lo up
ip link add veth0 type veth peer name veth1
ip addr add 10.77.0.1/24 dev veth0
ip link set veth0 up
sync_dir=$(mktemp -d)
mkfifo "$sync_dir/up" "$sync_dir/moved"
# Host B: a network namespace of its own; it says so, then waits until veth1 has been moved into it.
unshare -n bash -c '
  echo up > "$0/up"
  read -r _ < "$0/moved"
  ip link set lo up
  ip addr add 10.77.0.2/24 dev veth1
  ip link set veth1 up
  exec env RANK=1 LOCAL_RANK=0 WORLD_SIZE=2 LOCAL_WORLD_SIZE=1 MASTER_ADDR=10.77.0.1 MASTER_PORT='"$port"' \
    GLOO_SOCKET_IFNAME=veth1 "$1" "$2" "$3"
' "$sync_dir" "$python" "$script" "$out" &
b=$!
read -r _ < "$sync_dir/up"
ip link set veth1 netns "$b"
echo moved > "$sync_dir/moved"
RANK=0 LOCAL_RANK=0 WORLD_SIZE=2 LOCAL_WORLD_SIZE=1 MASTER_ADDR=10.77.0.1 MASTER_PORT=$port \
  GLOO_SOCKET_IFNAME=veth0 "$python" "$script" "$out" &
a=$!
status=0
wait "$a" || status=$?
wait "$b" || status=$?
rm -rf "$sync_dir"
exit $status
