#!/usr/bin/env bash
# The event log on a full disk (log/tests/event_log/full_disk.rs): mounts a 512 KiB tmpfs, runs the
# test there, unmounts. Needs root (mount); prints SKIP and exits 0 where it cannot mount one.
#   scripts/log-full-disk.sh
set -euo pipefail
cd "$(dirname "$0")/.."
if [ "$(id -u)" != 0 ]; then
    echo "SKIP: log full-disk test: mounting a tmpfs needs root"
    exit 0
fi
mnt=$(mktemp -d "${TMPDIR:-/tmp}/lanestream-full-disk.XXXXXX")
if ! mount -t tmpfs -o size=512k tmpfs "$mnt" 2>/dev/null; then
    rmdir "$mnt"
    echo "SKIP: log full-disk test: cannot mount a tmpfs here"
    exit 0
fi
trap 'umount "$mnt"; rmdir "$mnt"' EXIT
LANESTREAM_TINY_TMPFS="$mnt" cargo test --quiet -p lanestream-log --test event_log full_disk:: -- --ignored
echo "PASS: log full-disk test (a 512 KiB tmpfs)"
