#!/usr/bin/env python3
"""Sorts ThreadSanitizer reports into kvpool's and its libraries' (scripts/sanitize.sh tsan).

Debian's gRPC and protobuf are not instrumented, so TSan does not see how they hand memory
between their threads (completion queues, combiners, their own atomics) and reports races on
it. Each access of a report is owned by the first frame of its stack that is neither the
sanitizer's runtime nor the C++ standard library's headers: kvpool when that frame is in
kvpool's sources (generated protobuf code included) or in Boost (header-only, instrumented
with kvpool), else the library it is in. A report is kvpool's when kvpool owns every access:
then TSan saw both sides and what ordered them; one access in a library (an allocation by
gRPC's arena, a send by its poller) means the order went through code TSan cannot see.
Prints the counts and every kvpool report in full; exits 1 if there is one.

usage: tsan_triage.py SOURCE_ROOT REPORT_FILE...
"""

import collections
import os
import re
import sys

FRAME = re.compile(r"^\s+#\d+ (?P<function>.*?) (?P<where>\S+) \((?P<module>[^()]*?)\+0x[0-9a-f]+\)$")
ACCESS = re.compile(r"^  (Previous )?(atomic )?(read|write|Read|Write|Atomic)\b|^  Mutex \S+ acquired")


def access_stacks(report):
    """The frames of each access (or lock acquisition) of a report, in order."""
    stacks, current = [], None
    for line in report.splitlines():
        if ACCESS.match(line):
            current = []
            stacks.append(current)
        elif current is not None:
            match = FRAME.match(line)
            if match:
                current.append(match)
            elif line.strip() == "":
                current = None
    return stacks


def owner(stack, root):
    """'kvpool', or the library of the first frame that is not the runtime's or std's."""
    for frame in stack:
        where, module = frame["where"], frame["module"]
        if "libsanitizer" in where or module.startswith("libtsan"):
            continue
        if where.startswith("/usr/include/c++/"):
            continue
        if where.startswith(root + "/") and "/abseil/" not in where:
            return "kvpool"
        if where.startswith("/usr/include/boost/"):
            return "kvpool"  # header-only and instrumented with kvpool: its locks are seen
        if where.startswith("/usr/include/"):
            return where.split("/")[3]  # grpcpp, google (protobuf), absl: inline library code
        return module.split("/")[-1].split(".so")[0]
    return "unknown"


def main(argv):
    root = argv[1].rstrip("/")
    paths = [path for path in argv[2:] if os.path.isfile(path)]
    counts = collections.Counter()
    ours = []
    for path in paths:
        with open(path, errors="replace") as log:
            text = log.read()
        for report in re.findall(r"WARNING: ThreadSanitizer:.*?\nSUMMARY: ThreadSanitizer:[^\n]*",
                                 text, re.S):
            owners = {owner(stack, root) for stack in access_stacks(report)} or {"unknown"}
            if owners == {"kvpool"}:
                ours.append((path, report))
                counts["kvpool"] += 1
            else:
                counts[" + ".join(sorted(owners))] += 1
    total = sum(counts.values())
    print(f"tsan_triage: {total} reports in {len(paths)} logs; "
          f"kvpool's: {counts['kvpool']}; libraries': "
          + (", ".join(f"{n} {who}" for who, n in counts.most_common() if who != "kvpool")
             or "none"))
    for path, report in ours:
        print(f"--- {path}\n{report}\n")
    return 1 if ours else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
