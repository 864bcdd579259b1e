#!/usr/bin/env bash
# Builds gpu-admission's container image without a container engine: the image the
# Dockerfile describes, from the release binary and this Debian machine's own libraries.
#
#   bash hack/image.sh            # build, print where it is and its size
#   bash hack/image.sh --check    # build, then hold it to the Dockerfile and run it
#
# What goes in (as the Dockerfile's distroless cc-debian12:nonroot base plus the binary):
#   /gpu-admission            the release binary (cargo build --release --locked)
#   the binary's shared libraries (ldd: glibc, libm, libgcc_s, the loader) at their paths
#   /etc/ssl/certs/ca-certificates.crt, /etc/passwd and /etc/group with root and
#   nonroot (65532), /home/nonroot, /tmp (1777), /etc/os-release; no shell, no package
#   manager, nothing else.
# Config: user 65532:65532, entrypoint ["/gpu-admission"], ports 3456/tcp and 3457/tcp.
#
# Output: an OCI image layout in $GPU_ADMISSION_IMAGE_DIR (default
# ~/.cache/gpu-admission/image/oci) tagged with the version deploy/ names, and the same as an
# OCI archive beside it (gpu-admission-oci.tar). To load it into a node's containerd:
#   ctr -n k8s.io images import --base-name ghcr.io/gpu-admission/gpu-admission \
#     ~/.cache/gpu-admission/image/gpu-admission-oci.tar
#
# --check also verifies that the image carries what the Dockerfile says (user, entrypoint,
# ports, the binary at the Dockerfile's path, no /bin/sh) and that the binary runs inside
# the image's root file system as user 65532 (chroot, as root).
# Needs umoci (Debian package `umoci`) and python3.
set -euo pipefail
repo="$(cd "$(dirname "$0")/.." && pwd)"
cd "$repo"
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-$HOME/.cache/gpu-admission/target}"
check=false
[[ "${1:-}" == "--check" ]] && check=true

# shellcheck source=hack/lib/oci.sh
source "$repo/hack/lib/oci.sh"
say() { echo "image: $*" >&2; }
die() { echo "image: FAILED: $*" >&2; exit 1; }
command -v umoci >/dev/null || die "umoci is not installed (apt-get install umoci)"

# The name deploy/ runs: ghcr.io/gpu-admission/gpu-admission:<tag>.
image="$(awk '/image: .*gpu-admission\/gpu-admission:/ {print $2; exit}' deploy/30-webhook.yaml)"
[[ -n "$image" ]] || die "deploy/30-webhook.yaml names no gpu-admission image"
name="${image%:*}"
tag="${image##*:}"

say "building the release binary"
cargo build --release --locked --bin gpu-admission >&2
binary="$CARGO_TARGET_DIR/release/gpu-admission"

out="${GPU_ADMISSION_IMAGE_DIR:-$HOME/.cache/gpu-admission/image}"
layout="$out/oci"
archive="$out/gpu-admission-oci.tar"
work="$(mktemp -d "${TMPDIR:-/tmp}/gpu-admission-image.XXXXXX")"
trap 'rm -rf "$work"' EXIT
rootfs="$work/rootfs"

# ---------------------------------------------------------------- the root file system
mkdir -p "$rootfs"/{etc/ssl/certs,home/nonroot,tmp}
chmod 1777 "$rootfs/tmp"
install -m 0755 "$binary" "$rootfs/gpu-admission"
# The libraries the binary links, and the loader, at the paths it looks for them.
while read -r lib; do
  [[ -n "$lib" ]] || continue
  mkdir -p "$rootfs$(dirname "$lib")"
  cp -L "$lib" "$rootfs$lib"
done < <(ldd "$binary" | awk '$2 == "=>" && $3 ~ /^\// {print $3} $1 ~ /^\// {print $1}')
cp -L /etc/ssl/certs/ca-certificates.crt "$rootfs/etc/ssl/certs/ca-certificates.crt"
printf 'root:x:0:0:root:/root:/sbin/nologin\nnonroot:x:65532:65532:nonroot:/home/nonroot:/sbin/nologin\n' \
  >"$rootfs/etc/passwd"
printf 'root:x:0:\nnonroot:x:65532:\n' >"$rootfs/etc/group"
chown 65532:65532 "$rootfs/home/nonroot"
cp -L /etc/os-release "$rootfs/etc/os-release"

# ---------------------------------------------------------------- the OCI image
oci_image "$rootfs" "$layout" "$image" "$archive" \
  --config.user 65532:65532 --config.entrypoint /gpu-admission \
  --config.exposedports 3456/tcp --config.exposedports 3457/tcp

# The manifest's layers (compressed, as a registry stores them) and the unpacked size.
read -r compressed config_json < <(python3 - "$layout" "$tag" <<'PY'
import json, os, sys
layout, tag = sys.argv[1], sys.argv[2]
def blob(digest):
    return os.path.join(layout, "blobs", *digest.split(":"))
index = json.load(open(os.path.join(layout, "index.json")))
manifest = next(m for m in index["manifests"]
                if m.get("annotations", {}).get("org.opencontainers.image.ref.name") == tag)
manifest = json.load(open(blob(manifest["digest"])))
size = sum(layer["size"] for layer in manifest["layers"]) + manifest["config"]["size"]
print(size, blob(manifest["config"]["digest"]))
PY
)
unpacked="$(du -sb "$rootfs" | cut -f1)"
binary_size="$(stat -c %s "$binary")"
mb() { awk -v b="$1" 'BEGIN {printf "%.1f MB", b / 1e6}'; }
echo "image: $name:$tag (OCI layout $layout, archive $archive)"
echo "image: compressed $(mb "$compressed"), unpacked $(mb "$unpacked") of which the binary $(mb "$binary_size")"

$check || exit 0

# ---------------------------------------------------------------- --check: the Dockerfile's word
dockerfile="$repo/Dockerfile"
want_user="$(awk '$1 == "USER" {print $2}' "$dockerfile" | tail -n1)"
want_ports="$(awk '$1 == "EXPOSE" {for (i = 2; i <= NF; i++) print $i "/tcp"}' "$dockerfile" | sort | paste -sd' ')"
want_entrypoint="$(awk '$1 == "ENTRYPOINT" {$1 = ""; print substr($0, 2)}' "$dockerfile" | tail -n1)"
want_binary="$(awk '$1 == "COPY" && $2 ~ /^--from=/ {print $4}' "$dockerfile" | tail -n1)"
python3 - "$config_json" "$want_user" "$want_ports" "$want_entrypoint" <<'PY' || die "the image does not carry what the Dockerfile says"
import json, sys
config_path, want_user, want_ports, want_entrypoint = sys.argv[1:]
config = json.load(open(config_path))["config"]
have = {
    "user": config.get("User"),
    "ports": " ".join(sorted(config.get("ExposedPorts", {}))),
    "entrypoint": config.get("Entrypoint"),
}
want = {"user": want_user, "ports": want_ports, "entrypoint": json.loads(want_entrypoint)}
bad = {k: (have[k], want[k]) for k in want if have[k] != want[k]}
if bad:
    for key, (h, w) in bad.items():
        print(f"image: {key}: the image has {h!r}, the Dockerfile says {w!r}", file=sys.stderr)
    sys.exit(1)
PY
[[ -x "$rootfs$want_binary" ]] || die "no executable at the Dockerfile's path $want_binary"
[[ ! -e "$rootfs/bin/sh" ]] || die "the image has a shell (/bin/sh); the Dockerfile's base has none"
# Unpack what was stored (not the directory it was built from) and run it as 65532.
umoci unpack --image "$layout:$tag" "$work/check" >/dev/null
version="$(chroot --userspec=65532:65532 "$work/check/rootfs" /gpu-admission version)" ||
  die "the binary does not run inside the image as user 65532"
say "ok: user $want_user, entrypoint $want_entrypoint, ports $want_ports, $want_binary runs as 65532 ($version)"
