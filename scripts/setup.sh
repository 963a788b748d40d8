#!/usr/bin/env bash
# Installs the Debian 12 (bookworm) packages libmwms needs to build, test and run its examples.
# Fast on a machine that has them: apt is only called when `dpkg-query` reports one missing.
# Runs as root, or through sudo when not root. Honours DEBIAN_FRONTEND (default noninteractive).
set -euo pipefail

packages=(
  build-essential cmake g++ pkg-config  # toolchain
  nlohmann-json3-dev                     # JSON (TF_CONFIG, metrics, bench --json)
  catch2                                 # unit and integration tests (Catch2 v2)
  libopenmpi-dev openmpi-bin             # MPI bootstrap, `mpirun`, bench --compare mpi
  zlib1g-dev                             # libmwms: ps checkpoint CRC32; train: gzip'ed IDX files
  libssl-dev                             # libcrypto: HMAC-SHA256 auth handshake (MWMS_AUTH_KEY)
  dataset-fashion-mnist                  # train: /usr/share/datasets/fashion-mnist/*.gz
  libeigen3-dev                          # train: the MLP's matrix products
  libcli11-dev                           # command lines of train and the bench tools
  iproute2                               # tests: test hosts in network namespaces (ip, tc)
  doxygen                                # tests: every public declaration documented
  python3-dev python3-venv               # the Python package (python/, docs/python.md) and its tests
  openjdk-17-jre-headless                # mwms.spark's tests: the JVM of a real Spark (pyspark)
)

# Optional, for the bench only (all_reduce_perf --compare gloo): installed after the required
# packages, and a failure to install them never fails the setup (the bench then builds without).
optional=(libgloo-dev)
install_optional() {
  local want=() p root=()
  for p in "${optional[@]}"; do
    [[ $(dpkg-query -W -f='${Status}' "$p" 2>/dev/null || true) == "install ok installed" ]] ||
      want+=("$p")
  done
  [[ ${#want[@]} -gt 0 ]] || return 0
  if [[ $(id -u) -ne 0 ]]; then
    command -v sudo >/dev/null 2>&1 || { echo "setup.sh: skipping optional ${want[*]} (no root)"; return 0; }
    root=(sudo env "DEBIAN_FRONTEND=${DEBIAN_FRONTEND:-noninteractive}")
  fi
  echo "setup.sh: installing optional ${want[*]} (bench: --compare gloo)"
  DEBIAN_FRONTEND=${DEBIAN_FRONTEND:-noninteractive} "${root[@]}" apt-get install -y \
    --no-install-recommends "${want[@]}" ||
    echo "setup.sh: could not install ${want[*]}; the bench builds without --compare gloo" >&2
}

if ! command -v dpkg-query >/dev/null 2>&1 || ! command -v apt-get >/dev/null 2>&1; then
  echo "setup.sh: not a Debian system (no dpkg-query/apt-get); install the equivalents of:" >&2
  echo "  ${packages[*]}" >&2
  echo "setup.sh: continuing; the CMake configure step reports whatever is missing." >&2
  exit 0
fi

missing=()
for package in "${packages[@]}"; do
  status=$(dpkg-query -W -f='${Status}' "$package" 2>/dev/null || true)
  [[ "$status" == "install ok installed" ]] || missing+=("$package")
done
if [[ ${#missing[@]} -eq 0 ]]; then
  echo "setup.sh: all ${#packages[@]} packages are installed"
  install_optional
  exit 0
fi
echo "setup.sh: installing ${missing[*]}"

export DEBIAN_FRONTEND="${DEBIAN_FRONTEND:-noninteractive}"
if [[ $(id -u) -eq 0 ]]; then
  as_root=()
elif command -v sudo >/dev/null 2>&1; then
  # sudo resets the environment; pass DEBIAN_FRONTEND through explicitly.
  as_root=(sudo env "DEBIAN_FRONTEND=$DEBIAN_FRONTEND")
else
  echo "setup.sh: need root or sudo to install: ${missing[*]}" >&2
  exit 1
fi

"${as_root[@]}" apt-get update
"${as_root[@]}" apt-get install -y --no-install-recommends "${missing[@]}"
install_optional
