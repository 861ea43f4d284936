# The behaviour-test executables that run with --backend cuda on a lent GPU: built and packed
# by scripts/pack-gpu.sh, run by scripts/test-gpu.sh (sourced by both).
gpu_behaviour_tests=(api optimizer table checkpoint eviction admission serving_backend tier)
