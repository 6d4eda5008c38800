#!/bin/bash
# Python interpreter of the Bazel toolchain: the project's virtualenv, .venv.
# Bazel calls this script through runfiles symlinks that lead back to the
# source tree, so resolving them finds the workspace wherever it was cloned.
set -euo pipefail
workspace="$(dirname "$(dirname "$(readlink -f "${BASH_SOURCE[0]}")")")"
python="${workspace}/.venv/bin/python"
if [[ ! -x "${python}" ]]; then
  echo "venv_python.sh: no ${python}; create the venv as the README says" >&2
  exit 1
fi
exec "${python}" "$@"
