#!/usr/bin/env bash
# loraplex set-up: installs every build and runtime dependency from Debian
# packages, makes sure LibTorch uses OpenBLAS, then configures and builds
# into ./build. Run as root (or through sudo) on Debian 12. Safe to run again:
# installed packages are skipped and the build is incremental.
#
#   sudo bash deploy/setup.sh            # install + build
#   LORAPLEX_SKIP_BUILD=1 bash deploy/setup.sh   # install only
set -euo pipefail

cd "$(dirname "${BASH_SOURCE[0]}")/.."

PACKAGES=(
  # Toolchain.
  cmake g++ make pkg-config git openssl
  # Tensor runtime and a fast BLAS for it.
  libtorch-dev libopenblas0-pthread
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

for tool in cmake g++ protoc grpc_cpp_plugin pkg-config; do
  command -v "$tool" >/dev/null 2>&1 || die "$tool missing after install"
done

if [ "${LORAPLEX_SKIP_BUILD:-0}" = "1" ]; then
  echo "==> dependencies ready (build skipped)"
  exit 0
fi

# Under sudo, build as the calling user so build/ stays theirs and the
# README's test command works without root.
as_user() {
  if [ "$(id -u)" -eq 0 ] && [ -n "${SUDO_USER:-}" ] && [ "$SUDO_USER" != root ]; then
    sudo -u "$SUDO_USER" -- "$@"
  else
    "$@"
  fi
}

# The project's Python environment (ignored by git): the pinned Tinker SDK
# that tests/tinker drives the server with, and the loraplex package. CMake finds it at .venv unless
# LORAPLEX_VENV names another directory.
venv="${LORAPLEX_VENV:-.venv}"
if [ ! -x "$venv/bin/python" ]; then
  echo "==> creating the Python environment $venv"
  as_user python3 -m venv "$venv" || die "cannot create the venv $venv"
fi
echo "==> installing tests/tinker/requirements.txt into $venv"
as_user "$venv/bin/pip" install -q --disable-pip-version-check \
  -r tests/tinker/requirements.txt || die "pip install into $venv failed"
echo "==> installing the Python package ./python into $venv"
as_user "$venv/bin/pip" install -q --disable-pip-version-check ./python ||
  die "pip install ./python into $venv failed"

jobs=$(nproc 2>/dev/null || echo 2)
echo "==> configuring and building in ./build with $jobs job(s)"
as_user cmake -S . -B build -DCMAKE_BUILD_TYPE=Release \
  -DLORAPLEX_VENV="$(cd "$venv" && pwd)" ||
  die "cmake configure failed"
as_user cmake --build build -j"$jobs" || die "build failed"
echo "==> done: programs are in build/bin; test with:"
echo "    ctest --test-dir build --output-on-failure -j2"
