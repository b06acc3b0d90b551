#!/usr/bin/env python3
"""The dependency check of the libraries (docs/architecture.md, "Libraries").

Reads src/libraries.txt and fails on:
  - a folder under src/ with C sources that no library owns;
  - an #include "x/y.h" from one library into another it may not use
    (directly or through the libraries it uses);
  - a private header included from outside its owner: any *_internal.h,
    the L1 headers (src/storage/l1/) and the storage subsystem's own data
    structures (docs/storage.md, "Leases");
  - a header for the tests only (storage_manager_testing.h) included by a
    file under src/ other than the one that defines its functions;
  - with --build DIR: an undefined symbol of lmc_<lib>'s archive that only a
    library it may not use defines (a call that bypasses the headers);
  - a cycle between libraries, in the includes or the links;
  - docs/architecture.md's copy of the list differing from the list.
Prints each offence and exits 1, or prints a summary and exits 0."""
import argparse
import pathlib
import re
import subprocess
import sys

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
import libraries  # noqa: E402

ROOT, SRC = libraries.ROOT, libraries.SRC
INCLUDE = re.compile(r'^\s*#\s*include\s+"([^"]+)"')
# Header -> the libraries that may include it besides its owner.
SHARED_PRIVATE = {
    "storage/key_table.h": {"storage_l2"},
    "storage/eviction_policy.h": {"storage_l2"},
    "storage/storage_tier.h": {"storage_l2"},
    # CacheBlend reads the server-driven registrations it retrieves into
    # (docs/cacheblend.md, "The blend module").
    "modules/transfer/server/server_internal.h": {"blend_serve"},
}
# Header -> the one file under src/ that may include it (its definer): the
# hooks of the tests, so that no server code path depends on them.
TESTS_ONLY = {
    "storage/storage_manager_testing.h": "src/storage/storage_manager.c",
}
PRIVATE_TO_OWNER = ("storage/l1/", "storage/storage_telemetry.h")


def is_private(header):
    return header.endswith("_internal.h") or header.startswith(PRIVATE_TO_OWNER) \
        or header in SHARED_PRIVATE


def include_offences(libs, edges):
    sources = sorted(p for p in SRC.rglob("*") if p.suffix in (".c", ".h", ".cu"))
    for path in sources:
        me = libraries.owner_of(libs, path)
        rel = path.relative_to(ROOT)
        if me is None:
            yield f"{rel}: no library in src/libraries.txt owns {path.parent.relative_to(SRC)}/"
            continue
        allowed = libraries.closure(libs, me)
        for lineno, line in enumerate(path.read_text(errors="replace").splitlines(), 1):
            m = INCLUDE.match(line)
            if not m or not (SRC / m.group(1)).is_file():
                continue  # a local header ("alloc_fault.h") or a system one
            header = m.group(1)
            if header in TESTS_ONLY and str(rel) != TESTS_ONLY[header]:
                yield f"{rel}:{lineno}: includes {header}, for the tests only"
            owner = libraries.owner_of(libs, SRC / header)
            if owner != me:
                edges.setdefault(me, {}).setdefault(owner, f"{rel}:{lineno}")
            if owner != me and owner not in allowed:
                yield (f"{rel}:{lineno}: lmc_{me} includes {header} of lmc_{owner}, "
                       f"which it may not use (src/libraries.txt)")
            elif owner != me and is_private(header) and me not in SHARED_PRIVATE.get(header, ()):
                yield f"{rel}:{lineno}: includes {header}, private to lmc_{owner}"


def defined_and_undefined(archive):
    out = subprocess.run(["nm", "-g", archive], capture_output=True, text=True, check=True).stdout
    defined, undefined = set(), set()
    for line in out.splitlines():
        parts = line.split()
        if len(parts) == 2 and parts[0] == "U":
            undefined.add(parts[1])
        elif len(parts) == 3 and parts[1] in "TDBRCVW":
            defined.add(parts[2])
    return defined, undefined - defined


def link_offences(libs, build, edges):
    archives = {n: build / f"liblmc_{n}.a" for n in libs if (build / f"liblmc_{n}.a").exists()}
    if not archives:
        yield f"{build}: no liblmc_*.a (build first)"
        return
    symbols = {n: defined_and_undefined(a) for n, a in archives.items()}
    definer = {}
    for n, (defined, _) in symbols.items():
        for s in defined:
            definer.setdefault(s, set()).add(n)
    for n, (_, undefined) in sorted(symbols.items()):
        allowed = libraries.closure(libs, n)
        for s in sorted(undefined):
            owners = definer.get(s, set()) - {n}
            if not owners:
                continue  # the C library or an external package
            for o in sorted(owners):
                edges.setdefault(n, {}).setdefault(o, f"liblmc_{n}.a needs {s}")
            if not owners & allowed:
                yield (f"liblmc_{n}.a: needs {s}, defined only by lmc_{'/lmc_'.join(sorted(owners))}, "
                       f"which lmc_{n} may not use (src/libraries.txt)")


def cycles(edges):
    """One cycle per strongly connected set of libraries, as 'a -> b -> a'."""
    found, state, stack = [], {}, []

    def visit(n):
        state[n] = "open"
        stack.append(n)
        for m in sorted(edges.get(n, {})):
            if state.get(m) == "open":
                ring = stack[stack.index(m):] + [m]
                found.append(" -> ".join(ring) + f" (first: {edges[n][m]})")
            elif m not in state:
                visit(m)
        stack.pop()
        state[n] = "done"

    for n in sorted(edges):
        if n not in state:
            visit(n)
    return found


def doc_offences():
    """docs/architecture.md carries the list in a ```libraries block."""
    doc = ROOT / "docs" / "architecture.md"
    m = re.search(r"```libraries\n(.*?)```", doc.read_text(), re.S)
    if not m:
        yield f"{doc.relative_to(ROOT)}: no ```libraries block (the list of src/libraries.txt)"
        return
    norm = lambda text: [" ".join(l.split("#", 1)[0].split()) for l in text.splitlines()
                         if l.split("#", 1)[0].strip()]
    if norm(m.group(1)) != norm(libraries.LIST.read_text()):
        yield (f"{doc.relative_to(ROOT)}: its ```libraries block differs from src/libraries.txt "
               f"(copy the list's lines into it)")


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--build", type=pathlib.Path, help="build directory with liblmc_*.a")
    args = ap.parse_args()
    try:
        libs = libraries.read()
    except ValueError as e:
        print(e)
        return 1
    include_edges, link_edges = {}, {}
    bad = list(include_offences(libs, include_edges))
    if args.build:
        bad += list(link_offences(libs, args.build, link_edges))
    bad += [f"include cycle between libraries: {c}" for c in cycles(include_edges)]
    bad += [f"link cycle between libraries: {c}" for c in cycles(link_edges)]
    bad += list(doc_offences())
    for line in bad:
        print(line)
    files = sum(1 for p in SRC.rglob("*") if p.suffix in (".c", ".h", ".cu"))
    print(f"{0 if bad else 1} passed, {1 if bad else 0} failed: {len(bad)} offences against "
          f"src/libraries.txt ({len(libs)} libraries, {files} files"
          f"{', archives in ' + str(args.build) if args.build else ''})")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
