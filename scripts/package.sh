#!/usr/bin/env bash
# Builds the Debian package of the project: everything in release, the
# manual pages (scripts/man.py), then the .deb with cargo-deb from the
# metadata in preload/Cargo.toml. Prints the path of the .deb on the last
# line of standard output; the rest goes to standard error.
#
#   scripts/package.sh
#
# Installs cargo-deb (`cargo install cargo-deb --locked`) when it is
# missing. Needs python3 and gzip.
set -euo pipefail

root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
target=${CARGO_TARGET_DIR:-$root/target}
# The package puts the library in /usr/lib/x86_64-linux-gnu (see the
# metadata): refuse to build it on a machine where that is not the
# library directory.
want=x86_64-linux-gnu
have=$(dpkg-architecture -qDEB_HOST_MULTIARCH 2>/dev/null || gcc -print-multiarch 2>/dev/null || echo unknown)
if [ "$have" != "$want" ]; then
    echo "package: this machine's multiarch directory is $have, the package's $want" >&2
    exit 1
fi
for f in packaging/libsdp.conf packaging/sdp-portmapper.conf packaging/sdp-portmapper.service; do
    [ -f "$f" ] || { echo "package: $f is missing" >&2; exit 1; }
done
if ! cargo deb --version >/dev/null 2>&1; then
    echo "package: installing cargo-deb" >&2
    cargo install cargo-deb --locked >&2
fi

# The library and sdprun/sdp-stat (preload), the daemon (portmapper).
cargo build --release -p preload -p portmapper >&2

man=$target/release/man
rm -rf "$man"
python3 scripts/man.py --bin "$target/release" "$man" >&2
gzip -9nf "$man"/*.[0-9]

# --no-build: cargo-deb would build only the preload crate, and the
# daemon comes from another one.
out=$target/debian
mkdir -p "$out"
# --strip: the release profile keeps line tables (debug = 1), the
# package does not need them.
deb=$(cargo deb -p preload --no-build --strip --output "$out" | tail -n 1)
[ -f "$deb" ] || { echo "package: cargo deb did not name a .deb ($deb)" >&2; exit 1; }
echo "$deb"
