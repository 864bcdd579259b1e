# shellcheck shell=bash
# oci_image ROOTFS LAYOUT IMAGE ARCHIVE [umoci config flags...]: packs the directory ROOTFS as
# a one-layer linux/amd64 OCI image tagged with IMAGE's tag in the layout LAYOUT (made
# anew), named IMAGE (the annotation `ctr images import` reads), configured with the flags
# given, and written as the OCI archive ARCHIVE. Used by hack/image.sh and
# hack/scheduler-image.sh; needs umoci.
oci_image() {
  local rootfs=$1 layout=$2 image=$3 archive=$4
  shift 4
  local tag=${image##*:} bundle status=0
  bundle="$(mktemp -d "${TMPDIR:-/tmp}/oci-bundle.XXXXXX")"
  rm -rf "$layout"
  mkdir -p "$(dirname "$layout")" "$(dirname "$archive")"
  # Chained, so that the unpacked bundle (a whole root filesystem) is removed however
  # the packing ends; the caller's `set -e` still stops on the status returned.
  umoci init --layout "$layout" &&
    umoci new --image "$layout:$tag" &&
    umoci unpack --image "$layout:$tag" "$bundle/b" >/dev/null &&
    cp -a "$rootfs/." "$bundle/b/rootfs/" &&
    umoci repack --image "$layout:$tag" "$bundle/b" &&
    umoci config --image "$layout:$tag" --os linux --architecture amd64 "$@" \
      --manifest.annotation "org.opencontainers.image.ref.name=$image" &&
    umoci gc --layout "$layout" || status=$?
  rm -rf "$bundle"
  if [ "$status" -ne 0 ]; then
    echo "oci_image: packing $image into $layout failed (status $status)" >&2
    return "$status"
  fi
  tar -C "$layout" -cf "$archive.tmp" . && mv "$archive.tmp" "$archive"
}
