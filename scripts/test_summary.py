"""The end of ``scripts/test.sh``: one summary of its phases, read from each pytest run's JUnit XML report.

    python3 scripts/test_summary.py NAME EXIT REPORT [NAME EXIT REPORT ...]

Per phase: passed, failed (failures and errors) and skipped tests, and how it ended; then every skip
reason with its count, the failed tests, and as the last line the totals alone: ``N passed, N failed, N
skipped``. The reports are counted, not pytest's printed summary line (whose wording changes between
versions). A phase whose pytest exit says it failed but whose report holds no failed test (pytest's usage or
internal error, a killed process, no report at all) counts as one failure, so the totals never say 0 failed
for a run that failed. Exit 0 when no phase failed (pytest's exit 5, no test collected, is not a failure),
else 1. Standard library only: it runs with the system's ``python3``.
"""

from __future__ import annotations

import sys
import xml.etree.ElementTree as ET
from collections import Counter
from dataclasses import dataclass, field

#: pytest's exit statuses (pytest.ExitCode) as the summary names them.
OK, TESTS_FAILED, INTERRUPTED, NO_TESTS = 0, 1, 2, 5
ENDED = {OK: "ok", NO_TESTS: "no tests collected (pytest exit 5)", TESTS_FAILED: "FAILED",
         INTERRUPTED: "FAILED: interrupted, or errors while collecting (pytest exit 2)", 3: "FAILED: pytest internal error", 4: "FAILED: pytest usage error",
         127: "FAILED: not run, its python is missing (run scripts/setup.sh)"}


@dataclass
class Phase:
    name: str
    exit: str  # pytest's exit status, or "not-run" (the run was interrupted before it)
    passed: int = 0
    failed: list[str] = field(default_factory=list)
    skips: Counter = field(default_factory=Counter)
    report_error: str | None = None

    @property
    def ran(self) -> bool:
        return self.exit != "not-run"

    @property
    def ok(self) -> bool:
        return self.exit in (str(OK), str(NO_TESTS))

    @property
    def failures(self) -> int:
        """Failed tests; a failed phase without one counts as one."""
        return len(self.failed) or (0 if self.ok or not self.ran else 1)

    @property
    def skipped(self) -> int:
        return sum(self.skips.values())

    def result(self) -> str:
        if not self.ran:
            return "not run (the run was interrupted before it)"
        code = int(self.exit) if self.exit.lstrip("-").isdigit() else None
        text = ENDED.get(code, f"FAILED: pytest exit {self.exit}" + (" (killed by a signal)" if code and code > 128
                                                                     else ""))
        if not self.ok and not self.failed:
            text += f"; no failed test in its report ({self.report_error or 'see its output'}): counted as one"
        return text


def read_report(phase: Phase, path: str) -> None:
    """Count ``path``'s test cases into ``phase`` (a testcase with a <failure> or <error> is failed once)."""
    try:
        root = ET.parse(path).getroot()
    except (OSError, ET.ParseError) as exc:
        phase.report_error = "no report" if isinstance(exc, FileNotFoundError) else f"report unreadable: {exc}"
        return
    for case in root.iter("testcase"):
        if case.get("name") is None:
            continue  # what pytest leaves of the test a Ctrl-C interrupted: neither passed nor failed
        name = f"{case.get('classname', '')}::{case.get('name')}"
        if case.find("failure") is not None or case.find("error") is not None:
            phase.failed.append(name)
            continue
        skipped = case.find("skipped")
        if skipped is None:
            phase.passed += 1
            continue
        reason = skipped.get("message", "") or (skipped.text or "").strip()
        if skipped.get("type") == "pytest.xfail":
            reason = f"expected failure: {reason}"
        phase.skips[reason] += 1


def parse(argv: list[str]) -> list[Phase]:
    if not argv or len(argv) % 3:
        raise SystemExit("usage: test_summary.py NAME EXIT REPORT [NAME EXIT REPORT ...]")
    phases = []
    for name, exit_status, path in zip(argv[0::3], argv[1::3], argv[2::3]):
        phase = Phase(name, exit_status)
        if phase.ran:
            read_report(phase, path)
        phases.append(phase)
    return phases


def render(phases: list[Phase]) -> list[str]:
    width = max(len("phase"), *(len(p.name) for p in phases))
    lines = [f"{'phase':<{width}}  {'passed':>7}  {'failed':>7}  {'skipped':>7}  result"]
    for p in phases:
        lines.append(f"{p.name:<{width}}  {p.passed:>7}  {p.failures:>7}  {p.skipped:>7}  {p.result()}")
    skips = Counter()
    for p in phases:
        skips.update(p.skips)
    if skips:
        lines.append("skipped, by reason:")
        lines += [f"  {count:>4} x {reason}" for reason, count in sorted(skips.items(), key=lambda kv: (-kv[1], kv[0]))]
    failed = [(p.name, test) for p in phases for test in p.failed]
    if failed:
        lines.append("failed:")
        lines += [f"  {test}  [{name}]" for name, test in failed]
    lines.append(f"{sum(p.passed for p in phases)} passed, {sum(p.failures for p in phases)} failed, "
                 f"{sum(p.skipped for p in phases)} skipped")
    return lines


def main(argv: list[str]) -> int:
    phases = parse(argv)
    print("\n".join(render(phases)))
    return 0 if all(p.ok for p in phases if p.ran) else 1  # a phase not run follows an interrupted one


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
