#!/usr/bin/env python3
"""The storage manager is the only door to L1 (docs/storage.md, "Leases"):
the L1 headers are private to src/storage/ itself (the L2 tier in
src/storage/l2/ goes through the storage manager too), and the storage
subsystem's shared data structures (key table, eviction policies) are
private to src/storage/ and its L2 tier.  Prints each offending include and
exits 1, or prints a summary and exits 0."""
import pathlib
import re
import sys

ROOT = pathlib.Path(__file__).resolve().parents[2]
L1_PRIVATE = {
    "storage/l1_manager.h", "storage/l1_internal.h", "storage/l1_alloc.h",
    "storage/l1_eviction.h", "storage/storage_telemetry.h",
    "storage/storage_options_internal.h",
}
STORAGE_PRIVATE = {"storage/key_table.h", "storage/eviction_policy.h", "storage/grow.h"}
INCLUDE = re.compile(r'^\s*#\s*include\s+"([^"]+)"')


def offenders():
    storage = ROOT / "src" / "storage"
    for path in sorted((ROOT / "src").rglob("*.[ch]")):
        if path.parent == storage:
            continue
        private = L1_PRIVATE if storage in path.parents else L1_PRIVATE | STORAGE_PRIVATE
        for lineno, line in enumerate(path.read_text(errors="replace").splitlines(), 1):
            m = INCLUDE.match(line)
            if m and m.group(1) in private:
                yield f"{path.relative_to(ROOT)}:{lineno}: includes {m.group(1)}"


def main():
    bad = list(offenders())
    for line in bad:
        print(line)
    checked = sum(1 for _ in (ROOT / "src").rglob("*.[ch]"))
    print(f"{0 if bad else 1} passed, {1 if bad else 0} failed: "
          f"{len(bad)} private storage includes outside src/storage/ in {checked} files")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
