#!/usr/bin/env bash
# Runs a command inside a QEMU guest booted on a Debian kernel package, with
# the host's own userland as the guest's root, and exits with the command's
# status. Tests are built on the host (go test -c) and run inside; nothing
# is built in the guest. Inside the guest the command runs as root with its
# own kernel: modules load (modprobe ip_vs), and rules may go anywhere.
#
#   hack/vm.sh [-k KERNEL_PACKAGE] [-t TIMEOUT_S] [-m MEM_MB] -- CMD [ARGS...]
#   hack/vm.sh -- uname -r                        # 6.1.0-…-amd64
#   hack/vm.sh -- sh -c 'modprobe ip_vs && lsmod | grep ip_vs'
#
# How: the kernel package (default: the versioned package linux-image-amd64
# depends on, Debian bookworm's 6.1 LTS) is fetched with apt-get download
# and unpacked into a cache; a busybox initramfs loads virtio, 9p and
# overlay, mounts the host's / read-only over virtio-9p with a tmpfs
# overlay on top (writes stay in the guest), mounts the package's
# lib/modules in place, and a writable 9p share carries the command, its
# output and its exit status back. No network device: tests make their own
# namespaces and veths. The guest gets the host's environment variables
# named VIPPROXY_* and GO* (so test settings pass through), PATH, and the
# current directory.
#
# QEMU runs under TCG (software emulation) unless VM_ACCEL=kvm: a KVM guest
# hangs in early boot on this kind of machine. Everything the guest needs
# comes from Debian packages (qemu-system-x86, busybox-static, kmod, cpio),
# installed when missing. Every exit removes the run directory and stops
# QEMU (by PID).
#
# Environment: VM_CACHE (default ${XDG_CACHE_HOME:-$HOME/.cache}/vipproxy/vm),
# VM_ACCEL (tcg or kvm), VM_CPUS (default 2).
set -euo pipefail
export PATH="$PATH:/usr/sbin:/sbin"

kpkg="" timeout=600 mem=2048
while getopts "k:t:m:" opt; do
	case $opt in
	k) kpkg=$OPTARG ;;
	t) timeout=$OPTARG ;;
	m) mem=$OPTARG ;;
	*) echo "usage: $0 [-k KERNEL_PACKAGE] [-t TIMEOUT_S] [-m MEM_MB] -- CMD [ARGS...]" >&2; exit 2 ;;
	esac
done
shift $((OPTIND - 1))
[ "${1:-}" = "--" ] && shift
if [ $# -eq 0 ]; then
	echo "vm: no command" >&2
	exit 2
fi
if [ "$(id -u)" -ne 0 ]; then
	echo "vm: needs root (the guest's root is the host's /, shared read-only)" >&2
	exit 2
fi
log() { echo "vm: $*" >&2; }

need=()
command -v qemu-system-x86_64 >/dev/null || need+=(qemu-system-x86)
[ -x /bin/busybox ] || need+=(busybox-static)
command -v depmod >/dev/null || need+=(kmod)
command -v cpio >/dev/null || need+=(cpio)
if [ "${#need[@]}" -gt 0 ]; then
	log "installing ${need[*]}"
	apt-get update -qq
	DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${need[@]}" >/dev/null
fi
if ! grep -qx insmod <<<"$(/bin/busybox --list)"; then
	echo "vm: /bin/busybox is not busybox-static (no insmod applet)" >&2
	exit 1
fi

cache=${VM_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/vipproxy/vm}
mkdir -p "$cache"
if [ -z "$kpkg" ]; then
	kpkg=$(apt-cache depends linux-image-amd64 2>/dev/null | awk '/Depends: linux-image-[0-9]/ {print $2; exit}')
	[ -n "$kpkg" ] || { echo "vm: cannot resolve linux-image-amd64 (apt-get update?)" >&2; exit 1; }
fi
kdir="$cache/$kpkg"
if [ ! -f "$kdir/.complete" ]; then
	log "fetching $kpkg"
	rm -rf "$kdir"
	mkdir -p "$kdir/pkg"
	(cd "$kdir" && apt-get download "$kpkg" >/dev/null 2>&1) || { echo "vm: apt-get download $kpkg failed" >&2; exit 1; }
	dpkg-deb -x "$kdir"/*.deb "$kdir/pkg"
	rm -f "$kdir"/*.deb
	kver=$(ls "$kdir/pkg/lib/modules")
	depmod -b "$kdir/pkg" "$kver"

	# The initramfs: busybox, the modules the guest needs before its root
	# exists (in dependency order), and /init.
	ird="$kdir/initramfs"
	mkdir -p "$ird/bin" "$ird/mods" "$ird/proc" "$ird/sys" "$ird/dev" "$ird/host" "$ird/upper" "$ird/newroot"
	cp /bin/busybox "$ird/bin/busybox"
	: >"$ird/mods/order"
	for m in $(for mod in virtio_pci 9pnet_virtio 9p overlay; do
		modprobe -d "$kdir/pkg" -S "$kver" --show-depends "$mod"
	done | awk '$1 == "insmod" {print $2}'); do
		b=$(basename "$m")
		grep -qx "$b" "$ird/mods/order" && continue
		cp "$m" "$ird/mods/$b"
		echo "$b" >>"$ird/mods/order"
	done
	cat >"$ird/init" <<'EOF'
#!/bin/busybox sh
/bin/busybox --install -s /bin
mount -t proc proc /proc
mount -t sysfs sys /sys
mount -t devtmpfs dev /dev
for m in $(cat /mods/order); do insmod /mods/$m || echo "vm-init: insmod $m failed"; done
o=trans=virtio,version=9p2000.L,msize=512000
mount -t 9p -o ro,$o,cache=loose hostroot /host || { echo "vm-init: cannot mount the host root"; poweroff -f; }
mount -t tmpfs -o size=75% tmpfs /upper
mkdir -p /upper/u /upper/w
mount -t overlay overlay -o lowerdir=/host,upperdir=/upper/u,workdir=/upper/w /newroot
mkdir -p /newroot/lib/modules /newroot/vmout
mount -t 9p -o ro,$o modules /newroot/lib/modules
mount -t 9p -o $o vmout /newroot/vmout
# switch_root, not chroot: the kernel runs its module loader (request_module,
# /sbin/modprobe) in pid 1's root, which must be the host's userland.
exec switch_root /newroot /bin/sh /vmout/guest.sh
EOF
	chmod +x "$ird/init"
	(cd "$ird" && find . | cpio -o -H newc --quiet | gzip -1) >"$kdir/initramfs.cpio.gz"
	touch "$kdir/.complete"
	log "kernel $kver ready in $kdir"
fi
kver=$(ls "$kdir/pkg/lib/modules")

run=$(mktemp -d /tmp/vipproxy-vm.XXXXXX)
qpid=""
cleanup() {
	if [ -n "$qpid" ] && kill -0 "$qpid" 2>/dev/null; then
		kill "$qpid" 2>/dev/null || true
		sleep 1
		kill -9 "$qpid" 2>/dev/null || true
	fi
	rm -rf "$run"
}
trap cleanup EXIT INT TERM

# The command, its environment and working directory, for the guest.
{
	echo '#!/bin/sh'
	echo 'exec 2>/vmout/setup.err'
	echo 'mount -t proc proc /proc; mount -t sysfs sys /sys; mount -t devtmpfs dev /dev'
	echo 'mkdir -p /dev/pts /dev/shm; mount -t devpts devpts /dev/pts; mount -t tmpfs tmpfs /dev/shm'
	echo 'mount -t tmpfs tmpfs /run; mkdir -p /run/netns'
	echo 'mount -t cgroup2 cgroup2 /sys/fs/cgroup 2>/dev/null'
	echo 'mount -t bpf bpf /sys/fs/bpf 2>/dev/null'
	echo 'ip link set lo up; echo vm > /proc/sys/kernel/hostname'
	printf 'export PATH=%q\n' "$PATH"
	env | { grep -E '^(VIPPROXY_|GO)[A-Za-z0-9_]*=' || true; } | while IFS= read -r kv; do printf 'export %q\n' "$kv"; done
	printf 'cd %q 2>/dev/null || cd /\n' "$PWD"
	printf 'echo "vm-guest: kernel $(uname -r)"\n'
	echo 'exec 2>&1'
	printf '%q ' "$@"
	echo '>/vmout/out 2>&1'
	echo 'echo $? >/vmout/rc'
	echo 'sync; /bin/busybox poweroff -f'
} >"$run/guest.sh"

accel=${VM_ACCEL:-tcg}
cpu=max
[ "$accel" = kvm ] && cpu=host
qemu-system-x86_64 -machine pc,accel="$accel" -cpu "$cpu" -smp "${VM_CPUS:-2}" -m "$mem" \
	-nographic -no-reboot -nodefaults -serial file:"$run/console" \
	-kernel "$kdir/pkg/boot/vmlinuz-$kver" -initrd "$kdir/initramfs.cpio.gz" \
	-append "console=ttyS0 panic=-1 quiet loglevel=3" \
	-fsdev local,id=hostroot,path=/,security_model=none,readonly=on,multidevs=remap -device virtio-9p-pci,fsdev=hostroot,mount_tag=hostroot \
	-fsdev local,id=modules,path="$kdir/pkg/lib/modules",security_model=none,readonly=on -device virtio-9p-pci,fsdev=modules,mount_tag=modules \
	-fsdev local,id=vmout,path="$run",security_model=none -device virtio-9p-pci,fsdev=vmout,mount_tag=vmout \
	</dev/null >/dev/null 2>"$run/qemu.err" &
qpid=$!
start=$(date +%s)
while kill -0 "$qpid" 2>/dev/null; do
	if [ $(($(date +%s) - start)) -ge "$timeout" ]; then
		log "timeout after ${timeout}s; console tail:"
		tail -20 "$run/console" >&2 || true
		[ -f "$run/out" ] && tail -50 "$run/out" >&2
		exit 124
	fi
	sleep 1
done
wait "$qpid" || true
qpid=""
[ -s "$run/setup.err" ] && { log "guest setup:"; cat "$run/setup.err" >&2; }
[ -f "$run/out" ] && cat "$run/out"
if [ ! -f "$run/rc" ]; then
	log "the guest ended without a status (kernel $kver); console tail:"
	tail -30 "$run/console" >&2 || true
	cat "$run/qemu.err" >&2 || true
	exit 125
fi
log "kernel $kver: exit $(cat "$run/rc") after $(($(date +%s) - start)) s"
exit "$(cat "$run/rc")"
