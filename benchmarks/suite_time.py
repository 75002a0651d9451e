"""``python -m benchmarks.suite_time NAME=JUNIT.xml [NAME=JUNIT.xml ...] [--json OUT]``: where the suite's time goes.

Each JUNIT is pytest's ``--junitxml`` of a full ``pytest -n 2 tests`` run; its test times (set-up, call and tear-down
of each test, summed by pytest) are added up by module, so a module's figure is the worker time it holds, a shared
trainer run counted in the first test that asks for it. The wall time is pytest's own, from the XML.
"""

from __future__ import annotations

import argparse
import json
import xml.etree.ElementTree as ET
from collections import Counter
from pathlib import Path


def read(junit: Path) -> dict:
    root = ET.parse(junit).getroot()
    suite = root if root.tag == "testsuite" else root.find("testsuite")
    modules: Counter[str] = Counter()
    for case in suite.iter("testcase"):
        modules[case.get("classname").replace(".", "/") + ".py"] += float(case.get("time"))
    return {
        "wall_s": round(float(suite.get("time")), 1),
        "tests": int(suite.get("tests")),
        "skipped": int(suite.get("skipped")),
        "failures": int(suite.get("failures")) + int(suite.get("errors")),
        "worker_s": round(sum(modules.values()), 1),
        "modules_s": {name: round(seconds, 1) for name, seconds in modules.most_common()},
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("runs", nargs="+", help="NAME=JUNIT.xml, one a suite run")
    parser.add_argument("--json", type=Path, help="write the runs' figures here")
    args = parser.parse_args()
    found = {}
    for item in args.runs:
        name, _, path = item.partition("=")
        if not path:
            parser.error(f"a run is NAME=JUNIT.xml, got {item!r}")
        found[name] = read(Path(path))
    for name, run in found.items():
        top = ", ".join(f"{module} {seconds:.0f}" for module, seconds in list(run["modules_s"].items())[:5])
        print(f"{name}: wall {run['wall_s']:.0f} s, worker {run['worker_s']:.0f} s, {run['tests']} tests; {top}")
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(found, indent=1) + "\n", encoding="utf-8")


if __name__ == "__main__":
    main()
