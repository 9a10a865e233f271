#!/bin/bash
# node-image.sh: the kind node image, built without any registry (part of
# `cargo xtask kind-node-image`). Run as root. Inputs (environment):
#   IMAGE        the image name to give it
#   K8S_VERSION  the Kubernetes version (kubeadm's image list)
#   KIND_SRC     kind's Go module directory (its images/base/files)
#   BIN          the Go binaries of `cargo xtask node-image` (containerd, kubeadm, ...)
#   WORK         a scratch directory
#   ROOTFS_TAR   the Debian root (made here with mmdebstrap when missing)
#
# What it is: a Debian bookworm root (systemd, iptables/nft, runc and the CNI
# plugins from Debian) + kind's base-image files (entrypoint, systemd units,
# /kind/bin) + containerd, kubeadm, kubelet and kubectl + a static bridge CNI
# config (one node) + the control-plane images (single-layer docker archives,
# made as xtask/src/node_image.rs makes them) imported into the node's
# /var/lib/containerd at build time, then `docker import`.
set -euo pipefail
HERE=$(cd "$(dirname "$0")" && pwd)
: "${IMAGE:?}" "${K8S_VERSION:?}" "${KIND_SRC:?}" "${BIN:?}" "${WORK:?}" "${ROOTFS_TAR:?}"
BASE=$KIND_SRC/images/base/files
t0=$(date +%s)
log() { echo "[$(( $(date +%s) - t0 ))s] $*" >&2; }

if [ ! -f "$ROOTFS_TAR" ]; then
  mkdir -p "$(dirname "$ROOTFS_TAR")"
  include=$(grep -v '^[[:space:]]*#' "$HERE/packages" | grep -v '^[[:space:]]*$' | paste -sd, -)
  mmdebstrap --variant=minbase --format=tar --include="$include" bookworm "$ROOTFS_TAR.partial"
  mv "$ROOTFS_TAR.partial" "$ROOTFS_TAR"
  log "Debian root made"
fi
rm -rf "$WORK"; mkdir -p "$WORK"
ROOT=$WORK/root
mkdir -p "$ROOT"
tar -C "$ROOT" --numeric-owner -xpf "$ROOTFS_TAR"
log "rootfs unpacked"

# ---- kind base image files (images/base/Dockerfile, COPY steps) ----
install -m 0755 "$BASE/usr/local/bin/entrypoint" "$ROOT/usr/local/bin/entrypoint"
mkdir -p "$ROOT/kind/bin" "$ROOT/kind/manifests" "$ROOT/etc/systemd/system/kubelet.service.d" "$ROOT/etc/default" "$ROOT/etc/sysctl.d" "$ROOT/etc/containerd"
chmod 0755 "$ROOT/kind" "$ROOT/kind/bin"
install -m 0755 "$BASE"/kind/bin/*.sh "$ROOT/kind/bin/"
install -m 0644 "$BASE/etc/crictl.yaml" "$ROOT/etc/crictl.yaml"
# kubelet >= 1.35 refuses cgroup v1 unless told: the flag here makes the image work even
# without the KubeletConfiguration patch of the kind config (flags beat the config file).
echo 'KUBELET_EXTRA_ARGS=--runtime-cgroups=/system.slice/containerd.service --fail-cgroupv1=false' > "$ROOT/etc/default/kubelet"
install -m 0644 "$BASE"/etc/sysctl.d/* "$ROOT/etc/sysctl.d/"
for f in kubelet.service kubelet.slice containerd.service undo-mount-hacks.service; do
  install -m 0644 "$BASE/etc/systemd/system/$f" "$ROOT/etc/systemd/system/$f"
done
install -m 0644 "$BASE"/etc/systemd/system/kubelet.service.d/* "$ROOT/etc/systemd/system/kubelet.service.d/"

# Our pre-entrypoint: docker mounts the cgroup v1 hierarchies read-only in a
# non-privileged container; make them writable (per-mount flag only), then run kind's.
cat > "$ROOT/usr/local/bin/capl-kind-entrypoint" <<'EOS'
#!/bin/bash
set -o errexit -o nounset -o pipefail
if [[ ! -f /sys/fs/cgroup/cgroup.controllers ]]; then
  for m in $(findmnt -rn -t cgroup,cgroup2 -o TARGET); do
    findmnt -rn -o OPTIONS "$m" | grep -q '^ro' && mount -o remount,bind,rw "$m"
  done
fi
exec /usr/local/bin/entrypoint "$@"
EOS
chmod 0755 "$ROOT/usr/local/bin/capl-kind-entrypoint"

# containerd configuration: kind's (config version 2, migrated by containerd 2.x),
# without the fuse-overlayfs proxy plugin and the two keys containerd 2.4 warns about
# (discard_unpacked_layers, tolerate_missing_hugepages_controller), with our pause image, and with
# restrict_oom_score_adj = true (the node lacks CAP_SYS_RESOURCE: it cannot lower
# oom_score_adj below its own).
cat > "$ROOT/etc/containerd/config.toml" <<'EOS'
version = 2

[plugins."io.containerd.grpc.v1.cri".containerd]
  snapshotter = "overlayfs"
  default_runtime_name = "runc"
[plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
  runtime_type = "io.containerd.runc.v2"
  base_runtime_spec = "/etc/containerd/cri-base.json"
  [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc.options]
    SystemdCgroup = true

[plugins."io.containerd.grpc.v1.cri"]
  sandbox_image = "registry.k8s.io/pause:3.10.2"
  restrict_oom_score_adj = true

[plugins."io.containerd.grpc.v1.cri".cni]
  bin_dir = "/opt/cni/bin"
  conf_dir = "/etc/cni/net.d"
EOS

# ---- binaries ----
for b in containerd containerd-shim-runc-v2 ctr; do install -m 0755 "$BIN/$b" "$ROOT/usr/local/bin/$b"; done
for b in kubeadm kubelet kubectl; do install -m 0755 "$BIN/$b" "$ROOT/usr/bin/$b"; done
# crictl (00-install-kind.sh builds it): kind's `export logs` runs it in the node
if [ -n "${CRICTL:-}" ] && [ -x "$CRICTL" ]; then install -m 0755 "$CRICTL" "$ROOT/usr/local/bin/crictl"; fi
mkdir -p "$ROOT/opt/cni/bin"
for p in "$ROOT"/usr/lib/cni/*; do ln -sf "/usr/lib/cni/$(basename "$p")" "$ROOT/opt/cni/bin/$(basename "$p")"; done
"$BIN/ctr" oci spec \
  | jq '.hooks.createContainer[.hooks.createContainer| length] |= . + {"path": "/kind/bin/mount-product-files.sh"}' \
  | jq 'del(.process.rlimits)' > "$ROOT/etc/containerd/cri-base.json"

# ---- pod network ----
# ---- pod network: Debian's reference CNI plugins, one bridge per node ----
# Single-node clusters only (every node would hand out the same range).
mkdir -p "$ROOT/etc/cni/net.d"
cat > "$ROOT/etc/cni/net.d/10-capl-kind-bridge.conflist" <<'EOS'
{
  "cniVersion": "0.4.0",
  "name": "capl-kind",
  "plugins": [
    {
      "type": "bridge",
      "bridge": "capl-kind0",
      "isGateway": true,
      "ipMasq": true,
      "hairpinMode": true,
      "ipam": {
        "type": "host-local",
        "ranges": [[{ "subnet": "10.244.0.0/24" }]],
        "routes": [{ "dst": "0.0.0.0/0" }]
      }
    },
    { "type": "portmap", "capabilities": { "portMappings": true } }
  ]
}
EOS
# kind applies /kind/manifests/default-cni.yaml unless disableDefaultCNI: a no-op marker.
cat > "$ROOT/kind/manifests/default-cni.yaml" <<'EOS'
apiVersion: v1
kind: ConfigMap
metadata:
  name: capl-kind-cni
  namespace: kube-system
data:
  note: "Pod network: static bridge CNI config /etc/cni/net.d/10-capl-kind-bridge.conflist in the node image (10.244.0.0/24, single node)."
EOS
echo -n "$K8S_VERSION" > "$ROOT/kind/version"
mkdir -p "$ROOT/etc/kubernetes/manifests"

# ---- systemd as kind's base image sets it up ----
chroot "$ROOT" /bin/sh -ec '
find /lib/systemd/system/sysinit.target.wants/ -name "systemd-tmpfiles-setup.service" -delete
rm -f /lib/systemd/system/multi-user.target.wants/*
rm -f /etc/systemd/system/*.wants/*
rm -f /lib/systemd/system/local-fs.target.wants/*
rm -f /lib/systemd/system/sockets.target.wants/*udev*
rm -f /lib/systemd/system/sockets.target.wants/*initctl*
rm -f /lib/systemd/system/basic.target.wants/*
echo "ReadKMsg=no" >> /etc/systemd/journald.conf
systemctl enable kubelet.service containerd.service undo-mount-hacks.service >/dev/null 2>&1
systemctl mask systemd-binfmt.service >/dev/null 2>&1
rm -f /etc/machine-id; touch /etc/machine-id
'
log "node files installed"

# ---- container images: single-layer docker archives (as xtask/src/node_image.rs) ----
ARCH=$WORK/archives; mkdir -p "$ARCH"
PATH_ENV="PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"

# layer_base DIR: passwd, group, nsswitch.conf, /tmp
layer_base() {
  mkdir -p "$1/etc" "$1/tmp"; chmod 1777 "$1/tmp"
  printf 'root:x:0:0:root:/root:/sbin/nologin\nnobody:x:65534:65534:nobody:/nonexistent:/sbin/nologin\n' > "$1/etc/passwd"
  printf 'root:x:0:\nnogroup:x:65534:\n' > "$1/etc/group"
  printf 'hosts: files dns\n' > "$1/etc/nsswitch.conf"
}
# copy_libs LAYER FILE...: shared libraries the files load, resolved by ldd in $ROOT
copy_libs() {
  local layer=$1; shift
  mkdir -p "$ROOT/tmp/ldd"
  local f libs=()
  for f in "$@"; do
    local inside=$f
    if [ -f "$layer$f" ]; then cp "$layer$f" "$ROOT/tmp/ldd/x"; inside=/tmp/ldd/x; fi
    local out; out=$(chroot "$ROOT" ldd "$inside" 2>&1 || true)
    if grep -q "not found" <<<"$out"; then echo "ldd: missing libraries for $f: $out" >&2; exit 1; fi
    libs+=($(awk '{ for (i=1;i<=NF;i++) if ($i ~ /^\//) { print $i; break } }' <<<"$out"))
  done
  rm -rf "$ROOT/tmp/ldd"
  local l
  for l in $(printf '%s\n' "${libs[@]}" | sort -u); do
    [ -e "$layer$l" ] && continue
    mkdir -p "$layer$(dirname "$l")"
    cp -L "$ROOT$(chroot "$ROOT" readlink -f "$l")" "$layer$l"
  done
}
# write_archive LAYER NAME ENTRYPOINT_JSON OUT
write_archive() {
  local layer=$1 name=$2 ep=$3 out=$4 s; s=$(mktemp -d "$WORK/arch.XXXX")
  tar --sort=name --owner=0 --group=0 --numeric-owner --mtime=@0 --format=gnu -C "$layer" -cf "$s/layer.tar" .
  local diff; diff=$(sha256sum "$s/layer.tar" | cut -d' ' -f1)
  mkdir "$s/$diff"; mv "$s/layer.tar" "$s/$diff/layer.tar"
  printf '{"architecture":"amd64","os":"linux","created":"1970-01-01T00:00:00Z","config":{"Env":["%s"],"Entrypoint":%s,"WorkingDir":"/"},"rootfs":{"type":"layers","diff_ids":["sha256:%s"]},"history":[{"created":"1970-01-01T00:00:00Z","created_by":"cargo xtask kind-node-image"}]}' \
    "$PATH_ENV" "$ep" "$diff" > "$s/config.json"
  local cid; cid=$(sha256sum "$s/config.json" | cut -d' ' -f1)
  mv "$s/config.json" "$s/$cid.json"
  printf '[{"Config":"%s.json","RepoTags":["%s"],"Layers":["%s/layer.tar"]}]' "$cid" "$name" "$diff" > "$s/manifest.json"
  tar --owner=0 --group=0 --numeric-owner --mtime=@0 -C "$s" -cf "$out" manifest.json "$cid.json" "$diff"
  rm -rf "$s"
}

mapfile -t IMAGES < <("$BIN/kubeadm" config images list --kubernetes-version "$K8S_VERSION")
for img in "${IMAGES[@]}"; do
  name=${img##*/}; name=${name%%:*}
  L=$WORK/layers/$name; rm -rf "$L"; mkdir -p "$L"; layer_base "$L"
  case $name in
    pause)   install -m 0755 "$BIN/pause" "$L/pause"; ep='["/pause"]' ;;
    coredns) install -m 0755 "$BIN/coredns" "$L/coredns"; ep='["/coredns"]' ;;
    etcd)    mkdir -p "$L/usr/local/bin"; install -m 0755 "$BIN/etcd" "$L/usr/local/bin/etcd"; ep='null' ;;
    kube-*)
      mkdir -p "$L/usr/local/bin"; install -m 0755 "$BIN/$name" "$L/usr/local/bin/$name"
      need=("/usr/local/bin/$name")
      if [ "$name" = kube-proxy ]; then
        X=/usr/lib/x86_64-linux-gnu/xtables
        mkdir -p "$L/usr/sbin" "$L$X"
        for t in /usr/sbin/xtables-nft-multi /usr/sbin/nft /usr/sbin/conntrack; do install -m 0755 "$ROOT$t" "$L$t"; need+=("$t"); done
        for l in iptables iptables-save iptables-restore ip6tables ip6tables-save ip6tables-restore \
                 iptables-nft iptables-nft-save iptables-nft-restore ip6tables-nft ip6tables-nft-save ip6tables-nft-restore; do
          ln -s xtables-nft-multi "$L/usr/sbin/$l"; done
        for x in "$ROOT$X"/*; do install -m 0644 "$x" "$L$X/"; need+=("$X/$(basename "$x")"); done
      fi
      copy_libs "$L" "${need[@]}"
      ep="[\"/usr/local/bin/$name\"]" ;;
    *) echo "unknown image $img" >&2; exit 1 ;;
  esac
  write_archive "$L" "$img" "$ep" "$ARCH/$name.tar"
done
rm -rf "$WORK/layers"
log "image archives written: ${IMAGES[*]}"

# ---- preload into the node's containerd store (build-host containerd, CRI disabled) ----
STORE=$ROOT/var/lib/containerd; mkdir -p "$STORE"
D=$(mktemp -d /tmp/capl-kind-ctrd.XXXX)
cat > "$D/config.toml" <<EOS
version = 3
root = "$STORE"
state = "$D/state"
disabled_plugins = ['io.containerd.grpc.v1.cri', 'io.containerd.cri.v1.images', 'io.containerd.cri.v1.runtime', 'io.containerd.nri.v1.nri']
[grpc]
  address = "$D/c.sock"
EOS
"$BIN/containerd" --config "$D/config.toml" > "$D/log" 2>&1 &
CPID=$!
trap 'kill $CPID 2>/dev/null || true' EXIT
for i in $(seq 100); do "$BIN/ctr" --address "$D/c.sock" version >/dev/null 2>&1 && break; sleep 0.2; done
for a in "$ARCH"/*.tar; do
  "$BIN/ctr" --address "$D/c.sock" -n k8s.io images import --local --snapshotter overlayfs "$a" >/dev/null
done
"$BIN/ctr" --address "$D/c.sock" -n k8s.io images list -q >&2
kill $CPID; wait $CPID || true; trap - EXIT
rm -rf "$D" "$ARCH"
log "images imported into the node's containerd store"

# ---- docker image ----
tar -C "$ROOT" --numeric-owner -cf "$WORK/node.tar" .
docker import \
  --change 'ENV container=docker' \
  --change 'ENTRYPOINT ["/usr/local/bin/capl-kind-entrypoint", "/sbin/init"]' \
  "$WORK/node.tar" "$IMAGE" >/dev/null
rm -rf "$ROOT" "$WORK/node.tar"
log "built $IMAGE"
