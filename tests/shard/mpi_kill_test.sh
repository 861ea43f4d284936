#!/bin/bash
# A rank killed with SIGKILL during a collective checkpoint (mpi_checkpoint_test kill): the job
# ends (mpirun takes the other ranks down: no hang), the previous version restores, and nothing of
# the interrupted one is visible; embstore-ckpt verify agrees.
#   mpi_kill_test.sh MPIEXEC MPI_CHECKPOINT_TEST EMBSTORE_CKPT DIR
set -u
mpiexec=$1 test=$2 ckpt=$3 dir=$4
rm -rf "$dir"
start=$(date +%s)
timeout 120 "$mpiexec" --oversubscribe --allow-run-as-root -np 3 "$test" kill 3 "$dir"
rc=$?
echo "mpirun exited with $rc after $(( $(date +%s) - start )) s"
if [ "$rc" -eq 0 ] || [ "$rc" -eq 124 ]; then
  echo "FAILED: the job should end with an error when a rank is killed (124: it hung)"
  exit 1
fi
"$test" check-killed 3 "$dir" || { echo "FAILED: check-killed"; exit 1; }
"$ckpt" verify "$dir" || { echo "FAILED: embstore-ckpt verify"; exit 1; }
"$ckpt" ls "$dir"
rm -rf "$dir"
echo "mpi_kill_test: passed"
