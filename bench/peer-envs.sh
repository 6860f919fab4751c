#!/usr/bin/env bash
# Creates one virtual environment per peer data loader under bench-envs/<name>/ (git-ignored) for
# the reader scripts stoker/bench/readers/peer_<name>.py that `stoker bench loader` runs.
#
#   bash bench/peer-envs.sh                 all peers
#   bash bench/peer-envs.sh ffcv spdl       only these
#
# Idempotent: a venv whose install list is unchanged (bench-envs/<name>/.peer-installed) is skipped.
# Torch rule: every venv gets `torch==2.13.0` (the local CPU build) FIRST, and a peer that depends on
# torch or torchvision is installed with --no-deps plus its real needs, so that pip never resolves
# an unpinned torch (a multi-GB CUDA build). torchvision is never installed.
# Debian packages (FFCV's build, SPDL's FFmpeg 5.1) are installed with apt-get when run as root,
# otherwise the script says which ones to install.
set -euo pipefail
cd "$(dirname "$0")/.."

PYTHON=${PYTHON:-python3}
ENVS=bench-envs
ALL=(webdataset streaming litdata spdl dali ffcv)
TORCH="torch==2.13.0"

# What each peer's venv gets after torch. "--no-deps" makes the rest of the line install without deps.
declare -A SPEC=(
  # webdataset needs only braceexpand, numpy, pyyaml; decoding and crops use Pillow.
  [webdataset]="webdataset==1.0.2 pillow"
  # streaming 0.13 requires torch + torchvision + transformers + every cloud SDK; local MDS reading needs these
  # (`import streaming` imports torchvision and transformers for unused parts: the reader stubs those names).
  [streaming]="pillow numpy<2.2 xxhash<4 zstd<2 python-snappy<1 Brotli catalogue<3 tqdm<5 filelock --no-deps mosaicml-streaming==0.13.0"
  # litdata 0.2.76 requires torch + torchvision; optimize() and local reading need these.
  [litdata]="pillow numpy lightning-utilities filelock requests urllib3 tifffile boto3 obstore tqdm --no-deps litdata==0.2.76"
  # spdl 0.8 = spdl_io (needs numpy and FFmpeg 4-9 shared libraries from the system) + spdl_core; pillow only
  # because the crop-box helper it shares with the other readers lives beside Pillow code.
  [spdl]="spdl==0.8.0 spdl_io==0.8.0 spdl_core==0.8.0 numpy pillow"
  # DALI runs CPU-only with device_id=None; --no-deps skips nvimgcodec's [all] CUDA extras (nvjpeg, nvjpeg2k,
  # nvtiff) and nvcomp, so each run prints "Failed to load nvjpeg library!" (and nvjpeg2k, nvtiff) to stderr:
  # harmless, the CPU decoders (libjpeg-turbo) are registered.
  [dali]="numpy astunparse gast six optree packaging nvtx makefun libcst~=1.8 nvidia-nvimgcodec-cu12<0.10.0,>=0.9.0 --no-deps nvidia-dali-cuda120==2.4.0"
  # FFCV 1.0.2 has no wheel: build the sdist against Debian's OpenCV and libturbojpeg, in this venv.
  [ffcv]="numpy numba opencv-python pillow terminaltables pytorch_pfn_extras fastargs assertpy tqdm psutil pkgconfig setuptools wheel cython --no-deps --no-build-isolation ffcv==1.0.2"
)
declare -A APT=(
  [spdl]="libavdevice59 libavfilter8 libavformat59 libavcodec59 libavutil57 libswscale6 libswresample4"
  [ffcv]="libopencv-dev libturbojpeg0-dev pkg-config"
)

apt_install() {
  local packages=$1
  if dpkg -s $packages >/dev/null 2>&1; then return; fi
  if [ "$(id -u)" = 0 ]; then
    apt-get update -q && DEBIAN_FRONTEND=noninteractive apt-get install -y -q $packages
  else
    echo "peer-envs: as root, run: apt-get install -y $packages" >&2
    return 1
  fi
}

make_env() {
  local name=$1 env=$ENVS/$1 spec=${SPEC[$1]}
  local marker="$env/.peer-installed" want="$TORCH | $spec | ${APT[$1]:-}"
  if [ -f "$marker" ] && [ "$(cat "$marker")" = "$want" ]; then
    echo "peer-envs: $name up to date ($env)"
    return
  fi
  echo "peer-envs: $name -> $env"
  if [ -n "${APT[$name]:-}" ]; then apt_install "${APT[$name]}"; fi
  [ -x "$env/bin/python" ] || "$PYTHON" -m venv "$env"
  "$env/bin/pip" install -q --upgrade pip
  "$env/bin/pip" install -q "$TORCH"                           # FIRST, always
  # Before "--no-deps": installed with their dependencies (torch pinned on the same line, so pip keeps it).
  # After it: the peer itself, without dependencies (pip then warns about the ones left out: expected).
  local deps=${spec%%--no-deps*} nodeps=
  if [[ $spec == *--no-deps* ]]; then nodeps=${spec#*--no-deps}; fi
  # shellcheck disable=SC2086  # word splitting is intended: these are package lists
  if [ -n "${deps// }" ]; then "$env/bin/pip" install -q $deps "$TORCH"; fi
  # shellcheck disable=SC2086
  if [ -n "${nodeps// }" ]; then "$env/bin/pip" install -q --no-deps $nodeps; fi
  "$env/bin/python" -c "import torch; assert torch.__version__.startswith('2.13.0'), torch.__version__"
  echo "$want" > "$marker"
}

peers=("$@")
[ ${#peers[@]} -gt 0 ] || peers=("${ALL[@]}")
for name in "${peers[@]}"; do
  [ -n "${SPEC[$name]:-}" ] || { echo "peer-envs: unknown peer $name (known: ${ALL[*]})" >&2; exit 2; }
  make_env "$name"
done
