#!/usr/bin/env bash
# Downloads into .whl/ the wheels mithril-spec needs beyond a GPU image's PyTorch and JAX (Python 3.12,
# x86-64 Linux), for benchmarks/gpu.sh on a machine that cannot reach PyPI. Run here, where pip works.
set -euo pipefail
cd "$(dirname "$0")/.."
grep -qx '/.whl/' .git/info/exclude 2>/dev/null || echo /.whl/ >> .git/info/exclude
platforms=()
for p in manylinux_2_28_x86_64 manylinux_2_17_x86_64 manylinux2014_x86_64 manylinux_2_5_x86_64 manylinux1_x86_64; do
  platforms+=(--platform "$p")
done
py=$( [[ -x .venv/bin/python ]] && echo .venv/bin/python || echo python3 )
pkgs=$("$py" - <<'PY'
from importlib.metadata import version
print(" ".join(f"{n}=={version(n)}" for n in ("pydantic", "pydantic-core", "annotated-types", "typing-inspection",
                                               "ruff", "typing-extensions")))
PY
)
# shellcheck disable=SC2086
"$py" -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
  "${platforms[@]}" -d .whl $pkgs
ls .whl
