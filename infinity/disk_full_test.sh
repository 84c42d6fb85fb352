#!/bin/bash
# Runs disk_full_test's binary with a 4 MiB tmpfs of its own: a private
# user and mount namespace (unshare -rm: no privileges needed, nothing
# mounted outside this process tree), the tmpfs at $TEST_TMPDIR/small_disk.
# Usage: disk_full_test.sh BINARY [gtest args...]
set -euo pipefail
bin="$1"; shift
disk="${TEST_TMPDIR:-$(mktemp -d)}/small_disk"
mkdir -p "$disk"
if ! unshare -rm true 2>/dev/null; then
  echo "disk_full_test needs user namespaces (unshare -rm) to mount its small tmpfs;" \
       "this machine refuses them (kernel.unprivileged_userns_clone=0?)" >&2
  exit 1
fi
exec unshare -rm sh -c 'mount -t tmpfs -o size=4m memwall_small_disk "$0" && MEMWALL_SMALL_DISK="$0" exec "$@"' \
  "$disk" "$bin" "$@"
