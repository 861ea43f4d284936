#!/usr/bin/env bash
# The Python package's tests, from a clean virtual environment: `pip install .[torch]` builds
# libembstore.so with CMake (scikit-build-core) into the package, then the tests in tests/python
# run against the installed package (not the source tree).
#   scripts/test-python.sh [--cuda]
#     --cuda: build the package's library with the CUDA backend where nvcc is found (the
#             default here builds it host-only: this machine has no GPU and CI's time is short)
# scripts/test.sh runs it after the C++ suite.
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/env.sh

cuda=OFF
for arg in "$@"; do
  case "$arg" in
    --cuda) cuda=ON ;;
    *) echo "usage: scripts/test-python.sh [--cuda]" >&2; exit 2 ;;
  esac
done
if [ "$cuda" = ON ] && ! command -v nvcc >/dev/null 2>&1; then cuda=OFF; fi

bash scripts/setup.sh
python=${PYTHON:-python3}
venv=build-python/venv
"$python" -m venv --clear "$venv"
"$venv/bin/pip" install --quiet --disable-pip-version-check \
  -C cmake.define.EMBSTORE_CUDA="$cuda" ".[torch]"
"$venv/bin/embstore-ckpt" --help >/dev/null
# From another directory, so that `import embstore` can only find the installed package.
elsewhere=$(mktemp -d)
trap 'rm -rf "$elsewhere"' EXIT
cd "$elsewhere"
"$OLDPWD/$venv/bin/python" -c 'import embstore, embstore.torch; print("embstore", embstore.__version__, "from", embstore.__file__)'
"$OLDPWD/$venv/bin/python" -m unittest discover -s "$OLDPWD/tests/python" -t "$OLDPWD/tests/python" -v
