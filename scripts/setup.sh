#!/usr/bin/env bash
# Installs everything droce needs to build and run its tests (Debian 12).
# Idempotent: when every package is already installed it does nothing, so
# reruns are fast. Installing needs root (or sudo).
set -euo pipefail

packages=(
  # toolchain
  build-essential g++ meson ninja-build pkg-config
  # DPDK (headers, runtime, the memif and ring PMDs droce uses for links)
  libdpdk-dev dpdk librte-net-memif23 librte-net-ring23
  # links on kernel interfaces and capture files (docs/CONFIG.md)
  librte-net-af-packet23 librte-net-af-xdp23 librte-net-pcap23 librte-net-tap23
  # verbs API headers and the unmodified example programs used in tests
  libibverbs-dev ibverbs-utils perftest
  # libraries
  libabsl-dev libisal-dev libpcap-dev
  # operations (docs/OPERATIONS.md): JSON for droce ctl, the Prometheus endpoint,
  # droced's TOML config file, sd_notify, and systemd-analyze to verify the unit
  nlohmann-json3-dev libmicrohttpd-dev libtomlplusplus-dev libsystemd-dev systemd curl
  # tests and benchmarks (clang + its runtimes for the libFuzzer run, tests/fuzz)
  libgtest-dev googletest libbenchmark-dev clang libclang-rt-14-dev
  # UCX as a verbs consumer that looks at /dev/infiniband and sysfs (ucx_info)
  ucx-utils
  # librdmacm programs over droce's connection manager (tests/integration/cm_pair.sh),
  # rsockets, libfabric's verbs provider, and tshark to decode the CM MADs
  rdmacm-utils librdmacm-dev libfabric-bin tshark fio
  # rdma-core's own conformance suite (tests/integration/pyverbs_suite.sh)
  python3-pyverbs
  # Open MPI over droce (pml ucx; tests/integration/mpi_jobs.sh, slow suite)
  openmpi-bin libopenmpi-dev
  # the Linux RoCE peer of the interop suite (tools/linux-peer): QEMU, busybox
  # for its initramfs, kmod to order the guest kernel's modules
  qemu-system-x86 busybox-static kmod
  # tools used by the scripts and tests
  iproute2 procps iputils-ping tcpdump
  # bench/run: dpdk-testpmd (the raw-DPDK ceiling) and the kernel TCP baselines
  dpdk-dev sockperf iperf3
  # `droce cc-scenario --png`: plots of the congestion-control experiments
  gnuplot-nox
  # the man pages, Markdown turned into roff at build time (docs/man), and
  # man to read them
  pandoc man-db
  # bash completion of droce (tools/droce/droce.bash-completion; tested)
  bash-completion
  # droce's own Debian packages (debian/; the debian_package test builds,
  # lints and installs them)
  debhelper lintian
)

missing=()
for p in "${packages[@]}"; do
  status=$(dpkg-query -W -f='${db:Status-Abbrev}' "$p" 2>/dev/null || true)
  if [[ $status != ii* ]]; then
    missing+=("$p")
  fi
done

# The Linux peer's kernel and initramfs (downloaded with apt-get download,
# never installed; cached in /var/cache/droce/linux-peer).
prepare_peer() {
  "$(dirname "${BASH_SOURCE[0]}")/../tools/linux-peer/linux-peer" prepare
}

if [ ${#missing[@]} -eq 0 ]; then
  echo "setup: all ${#packages[@]} packages already installed"
  prepare_peer
  exit 0
fi

echo "setup: installing: ${missing[*]}"
if [ "$(id -u)" -eq 0 ]; then
  sudo=()
elif command -v sudo >/dev/null 2>&1; then
  sudo=(sudo)
else
  echo "setup: need root (or sudo) to install: ${missing[*]}" >&2
  exit 1
fi

export DEBIAN_FRONTEND=noninteractive
apt_opts=(-o DPkg::Lock::Timeout=300)
"${sudo[@]}" env DEBIAN_FRONTEND=noninteractive apt-get "${apt_opts[@]}" update
"${sudo[@]}" env DEBIAN_FRONTEND=noninteractive apt-get "${apt_opts[@]}" install -y \
  --no-install-recommends "${missing[@]}"
prepare_peer
echo "setup: done"
