#!/usr/bin/env python3
"""Lists what `gpu_hide_system` (prefix-env.sh) covers: for the Debian packages named on the
command line that are installed here, every folder all of whose entries belong to them ("dir
PATH", topmost only) and every other regular file of theirs ("file PATH"). Symbolic links are
left alone (a bind mount over one would cover its target, which may belong to another package);
the files they point to are covered."""
import os
import subprocess
import sys

# Shared folders never covered whole, even where every entry happens to belong to the packages.
KEEP = {"/", "/etc", "/usr", "/usr/bin", "/usr/sbin", "/usr/include", "/usr/lib", "/usr/lib/x86_64-linux-gnu",
        "/usr/lib/x86_64-linux-gnu/cmake", "/usr/lib/x86_64-linux-gnu/pkgconfig", "/usr/share", "/usr/share/doc",
        "/usr/share/man", "/usr/share/cmake", "/usr/share/pkgconfig", "/usr/share/lintian",
        "/usr/share/lintian/overrides", "/usr/src"}


def main():
    owned = set()
    for pkg in sys.argv[1:]:
        r = subprocess.run(["dpkg", "-L", pkg], capture_output=True, text=True)
        if r.returncode == 0:
            owned.update(line for line in r.stdout.splitlines() if line not in ("", "/."))
    entries = {f for f in owned if os.path.islink(f) or os.path.isfile(f)}

    def wholly_owned(d):
        for root, dirs, names in os.walk(d):
            for n in names + [x for x in dirs if os.path.islink(os.path.join(root, x))]:
                if os.path.join(root, n) not in entries:
                    return False
        return True

    verdict, folders = {}, set()
    for f in entries:
        d = os.path.dirname(f)
        while d not in KEEP and d != "/":
            if d not in verdict:
                verdict[d] = wholly_owned(d)
            if verdict[d]:
                folders.add(d)
            d = os.path.dirname(d)
    top = {d for d in folders if not any(d.startswith(o + "/") for o in folders)}
    for d in sorted(top):
        print("dir", d)
    for f in sorted(entries):
        if not os.path.islink(f) and not any(f.startswith(d + "/") for d in top):
            print("file", f)


if __name__ == "__main__":
    main()
