#!/bin/sh
# Makes the .deb from a tree `make install` filled (the Makefile's `deb`
# target, docs/deploy.md): dpkg-shlibdeps finds the library packages the
# binaries need, dpkg-gencontrol writes the control file, dpkg-deb builds.
#   build-deb.sh WORK VERSION DIST_DIR
# WORK holds debian/lmcached/, the installed tree.  The .deb goes to
# DIST_DIR/lmcached_VERSION_ARCH.deb; its path is the last line printed.
set -eu
work=$1 version=$2 dist=$3
here=$(cd "$(dirname "$0")" && pwd)
root=debian/lmcached
maintainer=${DEB_MAINTAINER:-"lmcached maintainers <maintainers@users.noreply.a-seed-5edfd875.example>"}
date=$(date -u -R -d "@${SOURCE_DATE_EPOCH:-$(date +%s)}")
commit=$(git -C "$here" rev-parse --short=12 HEAD 2>/dev/null || echo unknown)

mkdir -p "$dist"
dist=$(cd "$dist" && pwd)
cd "$work"
sed "s|@MAINTAINER@|$maintainer|" "$here/control.in" > debian/control
cat > debian/changelog <<CHANGES
lmcached ($version) unstable; urgency=medium

  * Built from commit $commit.

 -- $maintainer  $date
CHANGES

doc=$root/usr/share/doc/lmcached
install -d "$doc" "$root/usr/share/lintian/overrides" "$root/DEBIAN"
gzip -9n < debian/changelog > "$doc/changelog.gz"
install -m 0644 "$here/copyright" "$doc/copyright"
install -m 0644 "$here/lintian-overrides" "$root/usr/share/lintian/overrides/lmcached"
# Larger documents compressed, as Debian policy 12.3 asks.
gzip -9n "$doc/README.md"

# The ELF files, stripped as dh_strip does (the build keeps its symbols);
# dpkg-shlibdeps reads their DT_NEEDED.
elves=$(find "$root" -type f -exec sh -c \
  'head -c 4 "$1" | grep -q "ELF" && echo "$1"' _ {} \;)
strip --strip-unneeded --remove-section=.comment --remove-section=.note $elves
dpkg-shlibdeps -Tdebian/lmcached.substvars $elves
echo "misc:Depends=" >> debian/lmcached.substvars
dpkg-gencontrol -plmcached -Tdebian/lmcached.substvars -P"$root"

# /etc/default/* are the administrator's: an upgrade keeps their edits.
(cd "$root" && find etc -type f | sed 's|^|/|') > "$root/DEBIAN/conffiles"
(cd "$root" && find usr lib -type f ! -path 'DEBIAN/*' | sort | xargs md5sum) \
  > "$root/DEBIAN/md5sums"
chmod 0644 "$root/DEBIAN/conffiles" "$root/DEBIAN/md5sums"

arch=$(dpkg --print-architecture)
deb=$dist/lmcached_${version}_${arch}.deb
dpkg-deb --root-owner-group -Zxz --build "$root" "$deb" >/dev/null
echo "$deb"
