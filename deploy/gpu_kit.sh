#!/usr/bin/env bash
# Makes the kit deploy/gpu_check.sh builds with on a GPU machine that has
# PyTorch, CUDA, cmake and ninja but no package registries: the Debian 12
# packages of every C++ dependency but LibTorch (gRPC, Protobuf, abseil,
# SQLite, OpenSSL, CLI11, nlohmann-json, sentencepiece, PCRE2, utf8proc, Gloo,
# cpp-httplib, GoogleTest, Google Benchmark, pkg-config), with what they
# need beyond the C library and compiler runtime, unpacked into one folder
# (ignored by git). Run on a Debian 12 machine with Debian's registry; no
# root needed.
#
#   bash deploy/gpu_kit.sh [KIT_DIR]      # default: gpu-kit
#
# KIT_DIR/env.sh sets PATH, LD_LIBRARY_PATH, PKG_CONFIG_* and
# CMAKE_PREFIX_PATH for it; copy KIT_DIR, or the same folder packed as
# KIT_DIR.tar.xz (written beside it, about a quarter of its size), to the
# GPU machine with the source: deploy/gpu_check.sh takes either.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

kit=${1:-gpu-kit}
limit_mib=60
roots=(
  libgrpc++-dev protobuf-compiler-grpc libprotobuf-dev protobuf-compiler
  libabsl-dev libsqlite3-dev libssl-dev libcli11-dev nlohmann-json3-dev
  libsentencepiece-dev libpcre2-dev libutf8proc-dev libcpp-httplib-dev
  libgloo-dev libgtest-dev libgmock-dev libbenchmark-dev pkgconf
)
# What any machine that builds C++ has (the C library, the compiler's
# runtime, the base system) and what only pulls those in; and the RDMA
# drivers libgloo0 wants at run time (the build takes Gloo's headers
# only: LibTorch has Gloo in it).
skip='^(gcc-[0-9]+-base|libc6|libc6-dev|libc-dev-bin|libgcc-s1|libstdc\+\+6|linux-libc-dev|libcrypt1|libcrypt-dev|libnsl2|libnsl-dev|libtirpc.*|rpcsvc-proto|libcom-err2|libgssapi-krb5-2|libk5crypto3|libkeyutils1|libkrb5-3|libkrb5support0|adduser|passwd|debconf|cdebconf|dpkg|tar|install-info|readline-common|libreadline8|libtinfo6|libacl1|libaudit1|libaudit-common|libbz2-1\.0|libcap-ng0|libdb5\.3|libdebian-installer4|liblzma5|libmd0|libnewt0\.52|libpam.*|libselinux1|libsemanage.*|libsepol2|libslang2|libtextwrap1|libzstd1|ibverbs-providers)$'

command -v apt-get >/dev/null 2>&1 || {
  echo "gpu_kit.sh: needs a Debian 12 machine (apt-get)" >&2
  exit 1
}
mapfile -t packages < <(
  apt-cache depends --recurse --no-recommends --no-suggests --no-conflicts \
    --no-breaks --no-replaces --no-enhances "${roots[@]}" |
    grep -v '^ ' | grep -v '^<' | sort -u | grep -Ev "$skip")

rm -rf "$kit"
mkdir -p "$kit/debs" "$kit/root"
echo "==> downloading ${#packages[@]} packages into $kit/debs"
(cd "$kit/debs" && apt-get download -q "${packages[@]}" > /dev/null)
for deb in "$kit"/debs/*.deb; do dpkg-deb -x "$deb" "$kit/root"; done
# googletest ships its sources in /usr/src; the -dev packages' libraries
# and headers are what the build uses.
rm -rf "$kit/debs" "$kit/root/usr/share/doc" "$kit/root/usr/share/man" \
  "$kit/root/usr/share/lintian" "$kit/root/usr/src"
multiarch=$(dpkg-architecture -qDEB_HOST_MULTIARCH 2>/dev/null ||
            gcc -print-multiarch)
# The build links the shared libraries: static copies of those go (what
# exists only static, GoogleTest and benchmark_main, stays).
for archive in "$kit/root/usr/lib/$multiarch"/*.a; do
  if [ -e "${archive%.a}.so" ]; then rm -f "$archive"; fi
done
cat > "$kit/env.sh" <<EOF
# Source this (bash) to build against the kit in this folder.
kit_root="\$(cd "\$(dirname "\${BASH_SOURCE[0]}")" && pwd)/root"
export PATH="\$kit_root/usr/bin:\$PATH"
export LD_LIBRARY_PATH="\$kit_root/usr/lib/$multiarch\${LD_LIBRARY_PATH:+:\$LD_LIBRARY_PATH}"
export PKG_CONFIG_SYSROOT_DIR="\$kit_root"
export PKG_CONFIG_LIBDIR="\$kit_root/usr/lib/$multiarch/pkgconfig:\$kit_root/usr/share/pkgconfig"
export CMAKE_PREFIX_PATH="\$kit_root/usr\${CMAKE_PREFIX_PATH:+:\$CMAKE_PREFIX_PATH}"
export LORAPLEX_GPU_KIT="\$kit_root"
EOF
printf '%s\n' "${packages[@]}" > "$kit/packages.txt"

size_mib=$(( $(du -sk "$kit" | cut -f1) / 1024 ))
echo "==> $kit: ${#packages[@]} packages, ${size_mib} MiB"
if [ "$size_mib" -gt "$limit_mib" ]; then
  echo "gpu_kit.sh: the kit is ${size_mib} MiB, over ${limit_mib} MiB" >&2
  exit 1
fi
archive="${kit%/}.tar.xz"
tar -C "$(dirname "$kit")" -cJf "$archive" "$(basename "$kit")"
echo "==> $archive: $(( $(du -sk "$archive" | cut -f1) / 1024 )) MiB"
