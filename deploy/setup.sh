#!/usr/bin/env bash
# loraplex set-up: installs every build and runtime dependency (Debian
# packages; a pinned PyPI `torch`, whose LibTorch the project builds against,
# and the test tools into the project's Python environment), then configures
# and builds into ./build. Run as root (or through sudo) on Debian 12. Safe to
# run again: what is installed is skipped and the build is incremental.
#
#   bash deploy/setup.sh                 # as root: install + build
#   sudo bash deploy/setup.sh            # the same, from a non-root user
#   LORAPLEX_SKIP_BUILD=1 bash deploy/setup.sh   # install only
#
# LibTorch: PyPI's torch wheel (LORAPLEX_TORCH_PIN, default below) has CUDA
# and MKL in it, so one build runs on the CPU and on an NVIDIA GPU. Its CMake
# files need a CUDA toolkit: the machine's (nvcc on PATH or in
# /usr/local/cuda) when there is one, else NVIDIA's PyPI packages of the
# same CUDA release, installed into the environment. LORAPLEX_TORCH=debian
# builds against Debian's CPU-only libtorch-dev 1.13 instead (OpenBLAS).
# LORAPLEX_VENV names the environment (default: .venv).
set -euo pipefail

cd "$(dirname "${BASH_SOURCE[0]}")/.."

PACKAGES=(
  # Toolchain.
  cmake g++ make pkg-config git openssl
  # Service stack.
  libgrpc++-dev protobuf-compiler-grpc libprotobuf-dev protobuf-compiler
  libabsl-dev libsqlite3-dev libssl-dev libcli11-dev nlohmann-json3-dev
  # Tokenizers and distributed training.
  libsentencepiece-dev libpcre2-dev libutf8proc-dev libcpp-httplib-dev libgloo-dev
  # Tests and benchmarks (the Tinker SDK test runs in a Python venv).
  libgtest-dev libgmock-dev libbenchmark-dev python3 python3-venv
  # Fuzzing (tools/fuzz.sh): clang with libFuzzer and the sanitizers.
  clang libclang-rt-dev
)

torch_source=${LORAPLEX_TORCH:-pypi}
case "$torch_source" in
  pypi) ;;
  # Debian's LibTorch and a fast BLAS for it.
  debian) PACKAGES+=(libtorch-dev libopenblas0-pthread) ;;
  *) echo "deploy/setup.sh: error: LORAPLEX_TORCH must be pypi or debian," \
       "not $torch_source" >&2; exit 1 ;;
esac
# The LibTorch release the project is built and tested against.
torch_pin=${LORAPLEX_TORCH_PIN:-torch==2.15.0}

die() {
  echo "deploy/setup.sh: error: $*" >&2
  exit 1
}

as_root() {
  if [ "$(id -u)" -eq 0 ]; then
    "$@"
  elif command -v sudo >/dev/null 2>&1; then
    sudo "$@"
  else
    die "installing packages needs root; run: sudo bash deploy/setup.sh"
  fi
}

command -v apt-get >/dev/null 2>&1 ||
  die "apt-get not found: deploy/setup.sh supports Debian 12 (bookworm)"
if ! grep -q 'VERSION_CODENAME=bookworm' /etc/os-release 2>/dev/null; then
  echo "deploy/setup.sh: warning: not Debian 12 (bookworm); package names" \
    "and versions may differ" >&2
fi

# Freshly booted machines often run unattended upgrades; wait for the lock.
APT=(apt-get -y -q -o DPkg::Lock::Timeout=600)

missing=()
for package in "${PACKAGES[@]}"; do
  status=$(dpkg-query -W -f='${db:Status-Status}' "$package" 2>/dev/null || true)
  [ "$status" = "installed" ] || missing+=("$package")
done
if [ "${#missing[@]}" -gt 0 ]; then
  echo "==> installing ${#missing[@]} package(s): ${missing[*]}"
  as_root env DEBIAN_FRONTEND=noninteractive "${APT[@]}" update ||
    die "apt-get update failed"
  as_root env DEBIAN_FRONTEND=noninteractive "${APT[@]}" install "${missing[@]}" ||
    die "apt-get install failed for: ${missing[*]}"
else
  echo "==> all ${#PACKAGES[@]} packages already installed"
fi

# Without OpenBLAS, Debian's LibTorch falls back to the reference BLAS, which
# is about 25x slower for the GEMMs training spends its time in.
select_openblas() {
multiarch=$(dpkg-architecture -qDEB_HOST_MULTIARCH 2>/dev/null || gcc -print-multiarch)
alternative="libblas.so.3-${multiarch}"
openblas="/usr/lib/${multiarch}/openblas-pthread/libblas.so.3"
[ -e "$openblas" ] || die "OpenBLAS not found at $openblas"
current=$(readlink -f "/usr/lib/${multiarch}/libblas.so.3" || true)
if [ "$current" != "$(readlink -f "$openblas")" ]; then
  echo "==> pointing $alternative at OpenBLAS (was: ${current:-unset})"
  as_root update-alternatives --set "$alternative" "$openblas" ||
    die "cannot select OpenBLAS for $alternative"
  current=$(readlink -f "/usr/lib/${multiarch}/libblas.so.3")
fi
[ "$current" = "$(readlink -f "$openblas")" ] ||
  die "libblas.so.3 resolves to $current, not OpenBLAS"
echo "==> BLAS: $current"
}
if [ "$torch_source" = debian ]; then select_openblas; fi

for tool in cmake g++ protoc grpc_cpp_plugin pkg-config; do
  command -v "$tool" >/dev/null 2>&1 || die "$tool missing after install"
done

# Under sudo, build as the calling user so build/ stays theirs and the
# README's test command works without root.
as_user() {
  if [ "$(id -u)" -eq 0 ] && [ -n "${SUDO_USER:-}" ] && [ "$SUDO_USER" != root ]; then
    sudo -u "$SUDO_USER" -- "$@"
  else
    "$@"
  fi
}

# The project's Python environment (ignored by git): torch (its LibTorch is
# what the build links), the pinned Tinker SDK and cookbook that tests/tinker
# drive the server with, and the loraplex package. CMake finds it at .venv unless
# LORAPLEX_VENV names another directory.
venv="${LORAPLEX_VENV:-.venv}"
if [ ! -x "$venv/bin/python" ]; then
  echo "==> creating the Python environment $venv"
  as_user python3 -m venv "$venv" || die "cannot create the venv $venv"
fi
pip_install() {
  as_user "$venv/bin/pip" install -q --disable-pip-version-check "$@"
}
if [ "$torch_source" = pypi ]; then
  # One resolve for both, so the test tools' pins and torch's agree.
  echo "==> installing $torch_pin and tests/tinker/requirements.txt into $venv"
  pip_install "$torch_pin" -r tests/tinker/requirements.txt ||
    die "pip install into $venv failed"
else
  echo "==> installing tests/tinker/requirements.txt into $venv"
  pip_install -r tests/tinker/requirements.txt ||
    die "pip install into $venv failed"
fi
echo "==> installing tests/tinker/requirements-nodeps.txt into $venv"
pip_install --no-deps -r tests/tinker/requirements-nodeps.txt ||
  die "pip install --no-deps -r tests/tinker/requirements-nodeps.txt failed"
# Published chat templates for tests/chat_live (fetched, never committed):
# llama.cpp's collection in PyPI's llama-cpp-python source distribution, with
# its vocabulary-only GGUF file of Qwen2's tokenizer.
templates_pin=${LORAPLEX_TEMPLATES_PIN:-0.3.36}
templates_dir="$venv/published-chat-templates"
if ! grep -qs "llama-cpp-python $templates_pin " "$templates_dir/SOURCE" ||
  [ ! -f "$templates_dir/ggml-vocab-qwen2.gguf" ]; then
  echo "==> fetching published chat templates (llama-cpp-python $templates_pin sdist)"
  as_user "$venv/bin/python" tools/fetch_published_templates.py \
    "$templates_dir" --version "$templates_pin" ||
    die "fetching the published chat templates failed"
fi
echo "==> installing the Python package ./python into $venv"
as_user "$venv/bin/pip" install -q --disable-pip-version-check ./python ||
  die "pip install ./python into $venv failed"

# The wheel's CMake files enable CUDA when its LibTorch has CUDA, which takes
# a CUDA toolkit (nvcc, headers, link libraries). Without one on the machine,
# NVIDIA's PyPI packages of the wheel's CUDA release make one in the venv.
cuda_configure=()
if [ "$torch_source" = pypi ]; then
  torch_cuda=$(as_user "$venv/bin/python" -c \
    'import torch; print(torch.version.cuda or "")') ||
    die "the torch installed in $venv does not import"
  nvcc=$(command -v nvcc || true)
  if [ -z "$nvcc" ] && [ -x /usr/local/cuda/bin/nvcc ]; then
    nvcc=/usr/local/cuda/bin/nvcc
  fi
  if [ -n "$torch_cuda" ] && [ -z "$nvcc" ]; then
    echo "==> no CUDA toolkit here: installing nvcc $torch_cuda from PyPI" \
      "into $venv"
    # nvcc, and cicc (NVVM), which nvcc runs.
    pip_install "nvidia-cuda-nvcc==${torch_cuda}.*" "nvidia-nvvm==${torch_cuda}.*" ||
      die "pip install nvidia-cuda-nvcc/nvidia-nvvm==${torch_cuda}.* failed"
    toolkit=$(as_user "$venv/bin/python" -c \
      'import os, sys, nvidia; print(os.path.join(nvidia.__path__[0], "cu" + sys.argv[1]))' \
      "${torch_cuda%%.*}")
    [ -x "$toolkit/bin/nvcc" ] || die "nvcc not found in $toolkit/bin"
    # The link step asks for libcudart.so & co.; the wheels ship only the
    # versioned names.
    for library in "$toolkit"/lib/lib*.so.*; do
      unversioned="${library%%.so.*}.so"
      [ -e "$unversioned" ] || as_user ln -s "$(basename "$library")" "$unversioned"
    done
    cuda_configure=(-DCUDAToolkit_ROOT="$toolkit"
                    -DCMAKE_CUDA_COMPILER="$toolkit/bin/nvcc")
  elif [ -n "$nvcc" ]; then
    echo "==> CUDA toolkit: $nvcc"
  fi
fi

if [ "${LORAPLEX_SKIP_BUILD:-0}" = "1" ]; then
  echo "==> dependencies ready (build skipped)"
  exit 0
fi

# A build/ configured against the other LibTorch starts afresh (CMake keeps
# the LibTorch it first found).
if [ -f build/CMakeCache.txt ]; then
  cached=$(sed -n 's/^Torch_DIR:[A-Z]*=//p' build/CMakeCache.txt)
  case "$torch_source:$cached" in
    pypi:"$(cd "$venv" && pwd)"/*|debian:/usr/*) ;;
    *) echo "==> build/ was configured against LibTorch at ${cached:-?}:" \
         "configuring it afresh"
       rm -rf build ;;
  esac
fi

jobs=$(nproc 2>/dev/null || echo 2)
echo "==> configuring and building in ./build with $jobs job(s)"
configure=(-DCMAKE_BUILD_TYPE=Release -DLORAPLEX_VENV="$(cd "$venv" && pwd)")
if [ "$torch_source" = debian ]; then
  configure+=(-DLORAPLEX_TORCH_FROM_VENV=OFF)
else
  # A CUDA wheel must give a CUDA build: fail here, not on the GPU.
  with_cuda=OFF
  [ -z "$torch_cuda" ] || with_cuda=ON
  configure+=(-DLORAPLEX_TORCH_FROM_VENV=ON -DLORAPLEX_WITH_CUDA="$with_cuda"
              "${cuda_configure[@]}")
fi
as_user cmake -S . -B build "${configure[@]}" || die "cmake configure failed"
as_user cmake --build build -j"$jobs" || die "build failed"
echo "==> done in ${SECONDS} s: programs are in build/bin; test with:"
echo "    ctest --test-dir build --output-on-failure -j2"
