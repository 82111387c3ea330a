#!/usr/bin/env bash
# Obtains DeepSpeed and the two pure-Python dependencies the GPU machine lacks, as source,
# into DEST (default .carry-ds/ in the checkout root, ignored by git: none of it is part of
# ckptd), ready for PYTHONPATH=DEST. Nothing is built and nothing is pip-installed:
# DeepSpeed runs with DS_BUILD_OPS=0 (no compiled op is used by ckpt.deepspeed's paths).
#
#   tools/deepspeed-src/obtain.sh [DEST]    (a folder name with a dash: tools/ is on sys.path in
#   the tests, and a tools/deepspeed/ folder would be imported as the deepspeed package)
#
# Sources, as git repositories (a local mirror or bare clone in DS_GIT / PYDANTIC_GIT /
# HJSON_GIT, else cloned from GitHub, which needs the network):
#   deepspeedai/DeepSpeed  v0.14.5   the newest release before the pydantic 2 migration
#                                    (v0.15.0 requires pydantic>=2.0.0; 0.14.x imports
#                                    pydantic.v1 or pydantic 1 through deepspeed/pydantic_v1.py)
#   pydantic/pydantic      v1.10.26  pydantic 1, used as pure Python (no Cython build)
#   hjson/hjson-py         v3.1.0 (commit 22fd1c9, "Release 3.1.0"; the repo's newest tag is
#                                    the older v3.0.2)
# What is kept: deepspeed/ (its accelerator/ and ops/op_builder/ symlinks replaced by the
# real folders; csrc/ left out: with DS_BUILD_OPS=0 and no JIT op loaded, no C++ source is
# read), pydantic/ and hjson/ packages only (no tests, docs, benchmarks, .git). A
# deepspeed/git_version_info_installed.py is written as DeepSpeed's setup.py writes it (the
# version, no installed ops), since a source tree reports version 0.0.0 without it.
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
dest=${1:-$root/.carry-ds}
DS_TAG=${DS_TAG:-v0.14.5}
PYDANTIC_TAG=${PYDANTIC_TAG:-v1.10.26}
HJSON_REV=${HJSON_REV:-22fd1c9}
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT

git_dir() {  # NAME VAR_VALUE URL -> a git dir holding the repository
  local name=$1 given=$2 url=$3
  if [ -n "$given" ]; then echo "$given"; return; fi
  git clone -q --bare "$url" "$tmp/$name.git" >&2
  echo "$tmp/$name.git"
}
ds=$(git_dir deepspeed "${DS_GIT:-}" https://github.com/deepspeedai/DeepSpeed)
py=$(git_dir pydantic "${PYDANTIC_GIT:-}" https://github.com/pydantic/pydantic)
hj=$(git_dir hjson "${HJSON_GIT:-}" https://github.com/hjson/hjson-py)

rm -rf "$dest"; mkdir -p "$dest" "$tmp/ds"
git --git-dir="$ds" archive "$DS_TAG" deepspeed accelerator op_builder version.txt | tar -x -C "$tmp/ds"
rm -f "$tmp/ds/deepspeed/accelerator" "$tmp/ds/deepspeed/ops/op_builder" "$tmp/ds/deepspeed/ops/csrc"
mv "$tmp/ds/accelerator" "$tmp/ds/deepspeed/accelerator"
mv "$tmp/ds/op_builder" "$tmp/ds/deepspeed/ops/op_builder"
# The CUDA/C++ kernel sources inside the package (inference/v2/kernels): never compiled here.
find "$tmp/ds/deepspeed" \( -name "*.cu" -o -name "*.cuh" -o -name "*.cpp" -o -name "*.h" \) -delete
ds_version=$(cat "$tmp/ds/version.txt")
ds_hash=$(git --git-dir="$ds" rev-parse --short "$DS_TAG^{commit}")
cat > "$tmp/ds/deepspeed/git_version_info_installed.py" <<PY
version='$ds_version+$ds_hash'
git_hash='$ds_hash'
git_branch='$DS_TAG'
installed_ops={}
accelerator_name=''
torch_info={'version': '0.0', 'cuda_version': '0.0', 'hip_version': '0.0', 'nccl_version': '0.0', 'bf16_support': False}
PY
mv "$tmp/ds/deepspeed" "$dest/deepspeed"
# The distribution metadata pip would write, so that importlib.metadata finds DeepSpeed
# (transformers' is_deepspeed_available asks it).
mkdir -p "$dest/deepspeed-$ds_version.dist-info"
printf 'Metadata-Version: 2.1\nName: deepspeed\nVersion: %s\n' "$ds_version" > "$dest/deepspeed-$ds_version.dist-info/METADATA"
echo deepspeed > "$dest/deepspeed-$ds_version.dist-info/top_level.txt"
git --git-dir="$py" archive "$PYDANTIC_TAG" pydantic | tar -x -C "$dest"
git --git-dir="$hj" archive "$HJSON_REV" hjson | tar -x -C "$dest"
rm -rf "$dest/hjson/tests"
find "$dest" -name '*.c' -o -name '*.pyx' | xargs -r rm -f
cat > "$dest/SOURCES" <<TXT
deepspeed $ds_version $DS_TAG $(git --git-dir="$ds" rev-parse "$DS_TAG^{commit}")
pydantic $PYDANTIC_TAG $(git --git-dir="$py" rev-parse "$PYDANTIC_TAG^{commit}")
hjson 3.1.0 $(git --git-dir="$hj" rev-parse "$HJSON_REV^{commit}")
TXT
echo "$dest: $(du -sh "$dest" | cut -f1)"; cat "$dest/SOURCES"
