"""Compares a routed and a plain run of Keras's tests (see scripts/keras_suite.sh).

    python keras_suite/compare.py BACKEND PLAIN.json ROUTED.json EXPECTED_FAILURES.txt
    python keras_suite/compare.py --not-passed ROUTED.json ROOTDIR    # paths of tests to run plainly
    python keras_suite/compare.py --timed-out ROUTED.json ROOTDIR     # paths of tests that ran past the limit
    python keras_suite/compare.py --merge ROUTED.json AGAIN.json      # AGAIN's outcomes replace ROUTED's

Prints the counts, and each test that passes under plain Keras but not through kfit (with the first line
of its error). Exits 1 if one of them is not listed for BACKEND in EXPECTED_FAILURES.txt, whose lines are
``BACKEND NODEID  # why`` (``*`` as BACKEND: every backend); blank lines and ``#`` lines are ignored.
PLAIN.json may hold every test or only those that did not pass routed.
"""

import json
import os
import sys


def expected_failures(path: str, backend: str) -> set:
    listed = set()
    with open(path) as f:
        for line in f:
            line = line.split("#", 1)[0].strip()
            if not line:
                continue
            which, nodeid = line.split(None, 1)
            if which in (backend, "*"):
                listed.add(nodeid.strip())
    return listed


def not_passed(routed_path: str, rootdir: str) -> int:
    with open(routed_path) as f:
        routed = json.load(f)
    for nodeid, entry in sorted(routed.items()):
        if entry["outcome"] not in ("passed", "skipped") and "::" in nodeid:
            print(os.path.join(rootdir, nodeid))
    return 0


def timed_out(routed_path: str, rootdir: str) -> int:
    with open(routed_path) as f:
        routed = json.load(f)
    for nodeid, entry in sorted(routed.items()):
        if entry["outcome"] == "failed" and "TestTimeout" in entry["error"] and "::" in nodeid:
            print(os.path.join(rootdir, nodeid))
    return 0


def merge(routed_path: str, again_path: str) -> int:
    """Records the outcomes of a second run of some tests over the first's, each marked as run twice."""
    with open(routed_path) as f:
        routed = json.load(f)
    with open(again_path) as f:
        again = json.load(f)
    for nodeid, entry in again.items():
        entry["first_run"] = routed.get(nodeid, {}).get("error", "")
        routed[nodeid] = entry
        print(f"  ran again after a timeout: {entry['outcome']}: {nodeid}")
    with open(routed_path, "w") as f:
        json.dump(routed, f, indent=1, sort_keys=True)
    return 0


def main(backend: str, plain_path: str, routed_path: str, expected_path: str) -> int:
    with open(plain_path) as f:
        plain = json.load(f)
    with open(routed_path) as f:
        routed = json.load(f)
    expected = expected_failures(expected_path, backend)
    passed_routed = {k for k, v in routed.items() if v["outcome"] == "passed"}
    skipped_routed = {k for k, v in routed.items() if v["outcome"] == "skipped"}
    passed_plain = {k for k, v in plain.items() if v["outcome"] == "passed"}
    broken = sorted(passed_plain - passed_routed)
    new = [k for k in broken if k not in expected]
    fixed = sorted(k for k in expected if k in passed_routed)
    exercised = {k for k in passed_routed if routed[k].get("routed", 0) > 0}
    print(f"[keras-suite {backend}] routed through kfit.fit(seed=0): {len(routed)} tests, {len(passed_routed)} pass "
          f"({len(exercised)} of them call fit), {len(skipped_routed)} skipped, "
          f"{len(routed) - len(passed_routed) - len(skipped_routed)} do not pass; run plainly: {len(plain)} tests, "
          f"{len(passed_plain)} pass. Pass plainly but not routed: {len(broken)} ({len(new)} not in the expected list)")
    for k in broken:
        entry = routed.get(k, {"outcome": "missing", "error": ""})
        tag = "NEW " if k in new else "expected "
        print(f"  {tag}{entry['outcome']}: {k}\n      {entry['error']}")
    for k in fixed:
        print(f"  now passes routed (remove from the expected list): {k}")
    return 1 if new else 0


if __name__ == "__main__":
    if sys.argv[1] == "--not-passed":
        sys.exit(not_passed(*sys.argv[2:]))
    if sys.argv[1] == "--timed-out":
        sys.exit(timed_out(*sys.argv[2:]))
    if sys.argv[1] == "--merge":
        sys.exit(merge(*sys.argv[2:]))
    sys.exit(main(*sys.argv[1:]))
