#!/usr/bin/env bash
# Trains with incremental checkpoints while a serving replica follows the checkpoint directory:
# the follower starts first and waits for the trainer's first checkpoint, then applies each
# delta as it is committed (and loads each new full checkpoint whole); when training ends it is
# stopped, and checks its rows against a restore of the version it serves.
#   examples/train_and_serve.sh DEMO FOLLOW [STEPS]
# DEMO and FOLLOW: the embstore-demo and embstore-follow executables. Exits 0 when the follower
# matched the restore, 1 otherwise.
set -euo pipefail
demo=$1
follow=$2
steps=${3:-300}
dir=$(mktemp -d "${TMPDIR:-/tmp}/embstore-serve-XXXXXX")
follower=
cleanup() {
  if [ -n "$follower" ]; then kill "$follower" 2>/dev/null || true; fi
  rm -rf "$dir"
}
trap cleanup EXIT

echo "== a follower waits for $dir/ckpt; the trainer writes it"
# (timeout passes the TERM below on to the follower.)
timeout 600 "$follow" "$dir/ckpt" --interval-ms 100 --wait-seconds 120 >"$dir/follower.log" 2>&1 &
follower=$!
"$demo" train "$dir/ckpt" --steps "$steps" --incremental-every 10 --full-every 100
echo
echo "== training ended: the follower is stopped (it polls once more, then checks)"
kill -TERM "$follower"
set +e
wait "$follower"
rc=$?
set -e
follower=
echo "== what the follower printed"
cat "$dir/follower.log"
if [ "$rc" -ne 0 ]; then exit "$rc"; fi
# It followed while training went on: it moved to newer versions before it was stopped.
moves=$(grep -c '^serving version' "$dir/follower.log" || true)
if [ "$moves" -lt 2 ]; then
  echo "the follower served $moves version(s) while training went on, expected several" >&2
  exit 1
fi
grep -q 'the rows served equal a restore' "$dir/follower.log"
