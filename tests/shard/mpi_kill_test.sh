#!/bin/bash
# A rank killed with SIGKILL during a collective checkpoint (mpi_checkpoint_test kill), once while
# its files are being written and once after, while the others wait for it: the job ends (mpirun
# takes the other ranks down when it sees the rank die: no hang), the previous version restores,
# and nothing of the interrupted one is visible; embstore-ckpt verify agrees.
#   mpi_kill_test.sh MPIEXEC MPI_CHECKPOINT_TEST EMBSTORE_CKPT DIR
set -u
mpiexec=$1 test=$2 ckpt=$3 dir=$4
for delay_ms in 0 300; do
  echo "== rank 1 killed ${delay_ms} ms after the capture of version 4"
  rm -rf "$dir"
  start=$(date +%s)
  out=$(timeout 120 "$mpiexec" --oversubscribe --allow-run-as-root -np 3 "$test" kill 3 "$dir" \
        "$delay_ms" 2>&1)
  rc=$?
  echo "$out" | grep -v "io engine"
  echo "mpirun exited with $rc after $(( $(date +%s) - start )) s"
  if [ "$rc" -eq 0 ] || [ "$rc" -eq 124 ]; then
    echo "FAILED: the job should end with an error when a rank is killed (124: it hung)"
    exit 1
  fi
  if ! echo "$out" | grep -q "rank 1 .*exited on signal 9"; then
    echo "FAILED: rank 1 did not die of SIGKILL: something else ended the job"
    exit 1
  fi
  if ! ls -a "$dir" | grep -q '^\.tmp-4-'; then
    echo "FAILED: no staging directory of version 4: the kill did not land mid-checkpoint"
    exit 1
  fi
  "$test" check-killed 3 "$dir" || { echo "FAILED: check-killed"; exit 1; }
  "$ckpt" verify "$dir" || { echo "FAILED: embstore-ckpt verify"; exit 1; }
done
rm -rf "$dir"
echo "mpi_kill_test: passed"
