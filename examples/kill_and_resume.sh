#!/usr/bin/env bash
# Trains with incremental checkpoints, kills the trainer partway (SIGKILL, possibly while a
# checkpoint is being written), lists what the checkpoint directory holds, then resumes from it
# and checks the restored tables bit for bit against a replay of the same training.
#   examples/kill_and_resume.sh DEMO CKPT [STEPS KILL_AT]
# DEMO and CKPT: the embstore-demo and embstore-ckpt executables. Exits 0 when the resume
# matched, 1 otherwise.
set -euo pipefail
demo=$1
ckpt=$2
steps=${3:-300}
kill_at=${4:-237}
dir=$(mktemp -d "${TMPDIR:-/tmp}/embstore-demo-XXXXXX")
trap 'rm -rf "$dir"' EXIT

echo "== train, killed at step $kill_at"
set +e
"$demo" train "$dir/ckpt" --steps "$steps" --kill-at "$kill_at"
rc=$?
set -e
if [ "$rc" -ne 137 ]; then
  echo "the trainer exited with $rc, expected 137 (SIGKILL)" >&2
  exit 1
fi
echo "the trainer was killed (exit status $rc)"
echo
echo "== what the checkpoint directory holds"
"$ckpt" ls "$dir/ckpt"
echo
echo "== resume"
"$demo" resume "$dir/ckpt"
