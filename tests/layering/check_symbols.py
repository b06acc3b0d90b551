#!/usr/bin/env python3
"""The symbol check of the libraries (docs/architecture.md, "Symbols").

From the archives in a build directory, fails on:
  - a symbol exported by two libraries that are linked into one binary
    (lmcached, lmcached-coordinator, lmcache-cli: a library and everything
    it may use, by src/libraries.txt);
  - an exported symbol whose longest matching prefix (the '@symbols' lines of
    src/libraries.txt) is not one of its own library's, or that has none;
  - a prefix declared by two libraries.
Prints each offence and exits 1, or prints a summary and exits 0."""
import argparse
import pathlib
import subprocess
import sys

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
import libraries  # noqa: E402

BINARIES = {"lmcached": "server", "lmcached-coordinator": "coordinator", "lmcache-cli": "cli"}


def exported(archive):
    """The archive's global definitions, less names reserved to the
    implementation ("__"...): those the compiler adds itself, such as
    ASan's ODR indicators (__odr_asan.<symbol>), follow our symbols and
    are not ours to name."""
    out = subprocess.run(["nm", "-g", "--defined-only", archive], capture_output=True, text=True,
                         check=True).stdout
    return {p[2] for p in (l.split() for l in out.splitlines())
            if len(p) == 3 and p[1] in "TDBRCVW" and not p[2].startswith("__")}


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--build", type=pathlib.Path, required=True)
    args = ap.parse_args()
    libs = libraries.read()
    symbols = {n: exported(args.build / f"liblmc_{n}.a") for n in libs
               if (args.build / f"liblmc_{n}.a").exists()}
    if not symbols:
        print(f"{args.build}: no liblmc_*.a (build first)")
        return 1
    bad = []
    prefix_owner = {}
    for lib in libs.values():
        for p in lib.prefixes:
            if p in prefix_owner:
                bad.append(f"prefix {p} declared by lmc_{prefix_owner[p]} and lmc_{lib.name}")
            prefix_owner[p] = lib.name
    for binary, root in BINARIES.items():
        linked = sorted(({root} | libraries.closure(libs, root)) & symbols.keys())
        for i, a in enumerate(linked):
            for b in linked[i + 1:]:
                for s in sorted(symbols[a] & symbols[b]):
                    bad.append(f"{s}: exported by lmc_{a} and lmc_{b}, both linked into {binary}")
    by_length = sorted(prefix_owner, key=len, reverse=True)
    for name, syms in sorted(symbols.items()):
        for s in sorted(syms):
            owner = next((prefix_owner[p] for p in by_length if s.startswith(p)), None)
            if owner is None:
                bad.append(f"liblmc_{name}.a exports {s}, which has no library's prefix "
                           f"(lmc_{name}'s: {' '.join(libs[name].prefixes)})")
            elif owner != name:
                bad.append(f"liblmc_{name}.a exports {s}, which carries lmc_{owner}'s prefix")
    for line in bad:
        print(line)
    total = sum(len(s) for s in symbols.values())
    print(f"{0 if bad else 1} passed, {1 if bad else 0} failed: {len(bad)} offences in "
          f"{total} exported symbols of {len(symbols)} libraries")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
