#!/bin/bash
# PID 1 of the Linux peer (a QEMU guest running Debian's stock kernel on the
# host's root, shared read-only over virtio-9p). The initramfs has loaded the
# modules; this script makes a few writable places, configures eth0 from the
# kernel command line, adds Soft-RoCE on it (rdma_rxe) and runs the command
# agent (tools/linux-peer/agent.py) that the host drives the guest through.
#
# Kernel command line: droce.ip=A.B.C.D/N droce.ip6=X::Y/N droce.mtu=M
# droce.agent=PATH droce.port=P.
export PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin LANG=C.UTF-8

mount -t proc proc /proc
mount -t sysfs sys /sys
mount -t devtmpfs dev /dev
mkdir -p /dev/pts /dev/shm 2>/dev/null
mount -t devpts devpts /dev/pts
# Writable places on the read-only root. Not /tmp, /var/tmp or /root: the
# host's checkout (and with it this script, the agent and the programs the
# tests run) may be under any of them, and a tmpfs there would hide it.
# Commands get HOME and TMPDIR on tmpfs instead.
for d in /dev/shm /run /var/log /var/lib/dhcp; do
  mount -t tmpfs tmpfs "$d" 2>/dev/null
done
mkdir -p /run/home /run/tmp
export HOME=/run/home TMPDIR=/run/tmp
mount -t configfs configfs /sys/kernel/config 2>/dev/null
mount -t debugfs debugfs /sys/kernel/debug 2>/dev/null
echo linux-peer >/proc/sys/kernel/hostname

ip= ip6= mtu=1500 agent= port=7777
for a in $(</proc/cmdline); do
  case $a in
    droce.ip=*) ip=${a#droce.ip=} ;;
    droce.ip6=*) ip6=${a#droce.ip6=} ;;
    droce.mtu=*) mtu=${a#droce.mtu=} ;;
    droce.agent=*) agent=${a#droce.agent=} ;;
    droce.port=*) port=${a#droce.port=} ;;
  esac
done

ip link set lo up
sysctl -qw net.ipv6.conf.all.accept_ra=0 net.ipv6.conf.default.accept_ra=0 \
  net.ipv6.conf.all.accept_dad=0 net.ipv6.conf.default.accept_dad=0 \
  net.ipv6.conf.eth0.accept_dad=0 net.ipv6.conf.eth0.accept_ra=0 >/dev/null 2>&1
ip link set eth0 mtu "$mtu"
[ -n "$ip" ] && ip addr add "$ip" dev eth0
[ -n "$ip6" ] && ip addr add "$ip6" dev eth0 nodad
ip link set eth0 up
if ! rdma link add rxe0 type rxe netdev eth0; then
  echo "linux-peer: rdma link add rxe0 failed"
fi
echo "linux-peer: eth0 $ip $ip6 mtu $mtu; $(rdma link show 2>&1)"

/usr/bin/python3 "$agent" serve --port "$port" </dev/null &
echo "linux-peer: agent on port $port"
# PID 1 reaps every orphan and never exits (that would panic the guest).
while :; do wait; sleep 1; done
