"""src/libraries.txt, read the way CMakeLists.txt reads it: the libraries,
their folders, the libraries each may use, and the symbol prefixes each
exports under (docs/architecture.md, "Libraries" and "Symbols")."""
import pathlib
import re

ROOT = pathlib.Path(__file__).resolve().parents[2]
SRC = ROOT / "src"
LIST = SRC / "libraries.txt"


class Library:
    def __init__(self, name, folders, uses):
        self.name, self.folders, self.uses = name, folders, uses
        self.prefixes = []


def read():
    """{name: Library} in file order; raises ValueError on a malformed list
    (a use of a library not defined above, or a folder that is not there)."""
    libs = {}
    for lineno, raw in enumerate(LIST.read_text().splitlines(), 1):
        line = raw.split("#", 1)[0].strip()
        if not line:
            continue
        words = line.split()
        if words[0] == "@symbols":
            if len(words) < 3 or words[1] not in libs:
                raise ValueError(f"{LIST}:{lineno}: '@symbols <library> <prefix>...'")
            libs[words[1]].prefixes += words[2:]
            continue
        name, rest = words[0], words[1:]
        folders, uses = [], []
        for w in rest:
            if w == "-":
                continue
            if (SRC / w).is_dir() and w not in libs:
                folders.append(w)
            elif w in libs:
                uses.append(w)
            else:
                raise ValueError(f"{LIST}:{lineno}: {name} uses '{w}', which is neither a folder "
                                 f"under src/ nor a library listed above it")
        if not folders:
            raise ValueError(f"{LIST}:{lineno}: {name} has no folder")
        libs[name] = Library(name, folders, uses)
    return libs


def closure(libs, name):
    """Every library `name` may use, directly or through others."""
    seen, todo = set(), list(libs[name].uses)
    while todo:
        n = todo.pop()
        if n not in seen:
            seen.add(n)
            todo += libs[n].uses
    return seen


def owner_of(libs, path):
    """The library whose folder holds `path` (a file under src/), or None."""
    rel = path.parent.relative_to(SRC).as_posix()
    for lib in libs.values():
        if rel in lib.folders:
            return lib.name
    return None
