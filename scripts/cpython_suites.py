"""Helper of scripts/cpython-suites.sh (run it with the interpreter under test).

    cpython_suites.py run RESULTS MODULE
        Runs MODULE like `python -m unittest -v MODULE`, with two changes:
        test classes whose name contains "VSOCK" (any case) are left out
        (test_socket's AF_VSOCK tests hang, with or without the preload, on
        machines where /dev/vsock exists but a connection to the machine's
        own CID never completes), and every outcome is appended to RESULTS as
        one JSON line as soon as it is known, so that a run cut short by a
        time limit still leaves what it finished. The verbose text output
        goes to standard error, as with unittest. Under the preload (with
        SDP_LOG_FILE set), the start of each test is marked in the
        library's log, so that its lines can be told apart by test.

    cpython_suites.py report DIR MODULE...
        Reads DIR/MODULE.{plain,sdp}.{jsonl,status,log} and DIR/MODULE.sdp.preload.log
        (written by cpython-suites.sh), prints the comparison and the SDP
        connection count, writes it to DIR/report.txt too, and exits 1 if a
        test failed only under the preload, a module run timed out or
        crashed only under the preload, or no connection used SDP.
"""

import json
import os
import re
import sys
import time
import unittest
from collections import Counter, defaultdict

# Ranks for merging several outcomes of one test (subtests): the worst wins.
RANK = {
    "skipped": 0,
    "expected failure": 1,
    "ok": 2,
    "unexpected success": 3,
    "FAIL": 4,
    "ERROR": 5,
}
PASSED = {"ok", "expected failure"}
FAILED = {"FAIL", "ERROR", "unexpected success"}


# ---------------------------------------------------------------- run

MARK = "cpython-suites: test "


def excluded(cls):
    return "vsock" in cls.__name__.lower()


class Loader(unittest.TestLoader):
    def loadTestsFromTestCase(self, testCaseClass):
        if excluded(testCaseClass):
            return self.suiteClass([])
        return super().loadTestsFromTestCase(testCaseClass)


class RecordingResult(unittest.TextTestResult):
    path = None
    # Under the preload: the library's log file, where each test's start
    # is marked so that the report can tell which test made a connection.
    marks = os.environ.get("SDP_LOG_FILE") or None
    started = time.monotonic()

    def startTest(self, test):
        RecordingResult.started = time.monotonic()
        if self.marks:
            with open(self.marks, "a", encoding="utf-8") as f:
                f.write(f"{MARK}{test.id()}\n")
        super().startTest(test)

    def _record(self, test, outcome, err=None, reason=None, sub=None):
        if isinstance(test, unittest.case._SubTest):
            sub = sub or test._subDescription()
            test = test.test_case
        rec = {"id": test.id(), "outcome": outcome, "secs": round(time.monotonic() - self.started, 3)}
        if sub:
            rec["sub"] = sub
        if reason:
            rec["reason"] = reason
        if err is not None:
            rec["detail"] = self._exc_info_to_string(err, test)
        with open(self.path, "a", encoding="utf-8") as f:
            f.write(json.dumps(rec) + "\n")

    def addSuccess(self, test):
        super().addSuccess(test)
        self._record(test, "ok")

    def addFailure(self, test, err):
        super().addFailure(test, err)
        self._record(test, "FAIL", err)

    def addError(self, test, err):
        super().addError(test, err)
        self._record(test, "ERROR", err)

    def addSkip(self, test, reason):
        super().addSkip(test, reason)
        self._record(test, "skipped", reason=reason)

    def addExpectedFailure(self, test, err):
        super().addExpectedFailure(test, err)
        self._record(test, "expected failure")

    def addUnexpectedSuccess(self, test):
        super().addUnexpectedSuccess(test)
        self._record(test, "unexpected success")

    def addSubTest(self, test, subtest, err):
        super().addSubTest(test, subtest, err)
        if err is not None:
            failed = issubclass(err[0], test.failureException)
            outcome = "FAIL" if failed else "ERROR"
            self._record(test, outcome, err, sub=subtest._subDescription())


class Runner(unittest.TextTestRunner):
    resultclass = RecordingResult


def run(results, module):
    RecordingResult.path = results
    open(results, "w").close()
    unittest.main(
        module=None,
        argv=[sys.executable + " -m unittest", "-v", module],
        testLoader=Loader(),
        testRunner=Runner,
    )


# ---------------------------------------------------------------- report


def load_outcomes(path):
    """{test id: Outcome}, in the order the tests ran."""
    merged = {}
    try:
        with open(path, encoding="utf-8") as f:
            for line in f:
                try:
                    rec = json.loads(line)
                except ValueError:
                    continue  # a line cut by the time limit
                o = merged.setdefault(rec["id"], Outcome())
                o.records.append(rec)
                if o.outcome is None or RANK[rec["outcome"]] > RANK[o.outcome]:
                    o.outcome = rec["outcome"]
                o.secs = max(o.secs, rec.get("secs", 0.0))
    except FileNotFoundError:
        pass
    return merged


class Outcome:
    def __init__(self):
        self.outcome = None
        self.secs = 0.0
        self.records = []


NOT_RUN = Outcome()
NOT_RUN.outcome = "not run"


def load_status(path):
    """(exit status, seconds) of one module run."""
    try:
        with open(path) as f:
            rc, secs = f.read().split()
        return int(rc), float(secs)
    except (FileNotFoundError, ValueError):
        return None, 0.0


def tail(path, n):
    try:
        with open(path, encoding="utf-8", errors="replace") as f:
            return f.read().splitlines()[-n:]
    except FileNotFoundError:
        return ["(no output)"]


def in_progress(path, outcomes):
    """The test a run was in when it ended without finishing, from its log."""
    last = None
    for line in tail(path, 100000):
        m = re.match(r"^\w+ \(([\w.]+)\)", line)
        if m:
            last = m.group(1)
    return last if last and last not in outcomes else None


def short(tid, module):
    return tid[len(module) + 1 :] if tid.startswith(module + ".") else tid


def excerpt(detail, n=12):
    """The end of a traceback: where it failed and why."""
    lines = detail.rstrip().splitlines()
    if len(lines) > n:
        lines = ["..."] + lines[-n:]
    return ["      " + line for line in lines]


CONNECT = re.compile(r"^libsdp\[\d+\] info: fd \d+: connect .* -> (SDP|TCP \((.*)\))$")
PROBLEM = re.compile(r"^libsdp\[\d+\] (warn|error): (.*)$")
ADDRESSES = re.compile(r"\b(fd \d+|\d+\.\d+\.\d+\.\d+:\d+|port \d+)|\[[0-9a-f:]+\]:\d+|libsdp\[\d+\]")


class PreloadLog:
    """What the preload logged in one module's run, each line under the
    test that was running (the runner marks every test's start)."""

    def __init__(self, path):
        self.sdp = 0
        self.tcp = Counter()  # reason -> connections
        self.tcp_by_test = Counter()  # (test, reason) -> connections
        self.problems = Counter()  # warn/error line, addresses elided -> count
        self.problem_tests = defaultdict(set)
        self.found = os.path.exists(path)
        test = "(before the first test)"
        if not self.found:
            return
        with open(path, encoding="utf-8", errors="replace") as f:
            for line in f:
                line = line.rstrip("\n")
                if line.startswith(MARK):
                    test = line[len(MARK) :]
                    continue
                m = CONNECT.match(line)
                if m:
                    if m.group(1) == "SDP":
                        self.sdp += 1
                    else:
                        self.tcp[m.group(2)] += 1
                        self.tcp_by_test[(test, m.group(2))] += 1
                    continue
                m = PROBLEM.match(line)
                if m:
                    # Alike lines count as one: fd numbers and addresses elided.
                    text = f"{m.group(1)}: {ADDRESSES.sub('…', m.group(2))}"
                    self.problems[text] += 1
                    self.problem_tests[text].add(test)


def status_text(rc):
    if rc is None:
        return "not run"
    if rc == 0:
        return "ok"
    if rc in (124, 137):
        return "TIMEOUT"
    if rc > 128:
        return f"signal {rc - 128}"
    if rc == 1:
        return "failures"
    return f"exit {rc}"


SLOWER = 5.0  # seconds more under the preload worth a mention


def report(out_dir, modules):
    out = []
    p = out.append
    rows = []
    only_preload = []  # (module, test id, Outcome under the preload)
    both = []  # (module, test id, plain outcome, preload outcome)
    skipped_only_preload = []  # (module, test id, Outcome)
    slower = []  # (module, test id, plain secs, preload secs)
    broken = []  # (module, which, status, last lines): timeouts, crashes
    fallbacks = []  # (module, test id, reason, connections)
    total_sdp, total_tcp, problems, problem_tests = 0, Counter(), Counter(), defaultdict(set)

    for module in modules:
        plain = load_outcomes(f"{out_dir}/{module}.plain.jsonl")
        sdp = load_outcomes(f"{out_dir}/{module}.sdp.jsonl")
        prc, psecs = load_status(f"{out_dir}/{module}.plain.status")
        src, ssecs = load_status(f"{out_dir}/{module}.sdp.status")
        log = PreloadLog(f"{out_dir}/{module}.sdp.preload.log")
        total_sdp += log.sdp
        total_tcp.update(log.tcp)
        problems.update(log.problems)
        for text, tests in log.problem_tests.items():
            problem_tests[text].update(short(t, module) for t in tests)
        fallbacks += [(module, t, r, n) for (t, r), n in log.tcp_by_test.items()]

        ids = list(plain) + [t for t in sdp if t not in plain]
        n_only = 0
        for tid in ids:
            po, so = plain.get(tid, NOT_RUN), sdp.get(tid, NOT_RUN)
            if so.outcome in FAILED and po.outcome not in FAILED:
                only_preload.append((module, tid, so))
                n_only += 1
            elif so.outcome in FAILED and po.outcome in FAILED:
                both.append((module, tid, po.outcome, so.outcome))
            elif so.outcome == "skipped" and po.outcome in PASSED:
                skipped_only_preload.append((module, tid, so))
            if tid in plain and tid in sdp and so.secs - po.secs >= SLOWER:
                slower.append((module, tid, po.secs, so.secs))

        for which, rc, outcomes in (("plain", prc, plain), ("sdp", src, sdp)):
            # A timeout, a crash, or an exit without a single test result.
            if rc is not None and rc != 0 and not (rc == 1 and outcomes):
                log_path = f"{out_dir}/{module}.{which}.log"
                how = status_text(rc)
                running = in_progress(log_path, outcomes)
                if running:
                    how += f" in {short(running, module)}"
                broken.append((module, which, how, tail(log_path, 25)))
        not_reached = [t for t in plain if t not in sdp] if src not in (0, 1) else []

        rows.append(
            [
                module,
                len(ids),
                sum(o.outcome in PASSED for o in plain.values()),
                sum(o.outcome in PASSED for o in sdp.values()),
                sum(o.outcome == "skipped" for o in plain.values()),
                sum(o.outcome in FAILED for o in plain.values()),
                sum(o.outcome in FAILED for o in sdp.values()),
                n_only + len(not_reached),
                f"{psecs:.1f}",
                f"{ssecs:.1f}",
                status_text(prc),
                status_text(src),
                log.sdp if log.found or src is not None else "-",
                sum(log.tcp.values()),
            ]
        )

    head = ["module", "tests", "ok plain", "ok sdp", "skipped", "fail plain", "fail sdp",
            "sdp only", "s plain", "s sdp", "plain", "sdp", "SDP conns", "TCP conns"]
    rows.append(["total", *(sum(r[i] for r in rows) for i in range(1, 8)),
                 f"{sum(float(r[8]) for r in rows):.1f}", f"{sum(float(r[9]) for r in rows):.1f}",
                 "", "", total_sdp, sum(total_tcp.values())])
    widths = [max(len(str(r[i])) for r in [head, *rows]) for i in range(len(head))]
    for r in [head, *rows]:
        p(" ".join(f"{str(c):<{w}}" if i == 0 else f"{str(c):>{w}}" for i, (c, w) in enumerate(zip(r, widths))))
    p("(ok: passed or expected failure; sdp only: failed only under the preload, or not reached by a")
    p(" preloaded run that timed out or crashed; plain/sdp: how each run ended)")
    p("")

    if broken:
        p("Runs that timed out, crashed or reported no test (their last output):")
        for module, which, how, lines in broken:
            p(f"  {module} ({which}): {how}")
            p("\n".join("      " + line for line in lines))
        p("")

    if both:
        p(f"Failing plain and under the preload ({len(both)}; not counted against the preload):")
        for module, tid, po, so in both:
            p(f"  {module}  {short(tid, module)}  ({po} / {so})")
        p("")

    if skipped_only_preload:
        p(f"Passed plain, skipped under the preload ({len(skipped_only_preload)}):")
        for module, tid, o in skipped_only_preload:
            reason = next((r["reason"] for r in o.records if r.get("reason")), "")
            p(f"  {module}  {short(tid, module)}: {reason}")
        p("")

    if slower:
        p(f"At least {SLOWER:.0f} s slower under the preload:")
        for module, tid, ps, ss in slower:
            p(f"  {module}  {short(tid, module)}  {ps:.1f} s plain, {ss:.1f} s under the preload")
        p("")

    if fallbacks:
        p("TCP fallbacks under the preload, by test (pm-deny: no SDP listener at that port,")
        p("e.g. nothing listening):")
        fallbacks.sort(key=lambda f: (f[2] == "pm-deny", f[0], f[1]))
        for module, tid, reason, n in fallbacks[:40]:
            p(f"  {reason:<15} {n:3}  {module}  {short(tid, module)}")
        if len(fallbacks) > 40:
            p(f"  ... and {len(fallbacks) - 40} more tests")
        p("")

    if problems:
        p("Preload warnings and errors (fd numbers and addresses elided):")
        for text, n in problems.most_common(20):
            tests = sorted(problem_tests[text])
            where = ", ".join(tests[:3]) + (f" and {len(tests) - 3} more" if len(tests) > 3 else "")
            p(f"  {n:5}  {text[:150]}")
            p(f"         in {where}")
        if len(problems) > 20:
            p(f"  ... and {len(problems) - 20} more kinds of line")
        p("")

    p(f"Failing only under the preload: {len(only_preload)}")
    for module, tid, o in only_preload:
        p(f"  {module}  {short(tid, module)}  {o.outcome}")
        for rec in o.records:
            if rec["outcome"] in FAILED and rec.get("detail"):
                if rec.get("sub"):
                    p(f"    subtest {rec['sub']}:")
                p("\n".join(excerpt(rec["detail"])))
    p("")

    reasons = ", ".join(f"{n} {r}" for r, n in total_tcp.most_common()) or "none"
    p(f"SDP connections: {total_sdp} (TCP fallbacks: {sum(total_tcp.values())}: {reasons})")

    verdict = []
    preload_broken = {m for m, w, _, _ in broken if w == "sdp"} - {m for m, w, _, _ in broken if w == "plain"}
    if preload_broken:
        verdict.append(f"FAILED: preloaded runs that timed out or crashed: {', '.join(sorted(preload_broken))}")
    if only_preload:
        verdict.append(f"FAILED: {len(only_preload)} tests fail only under the preload")
    if total_sdp == 0:
        verdict.append("FAILED: no connection used SDP: the preload was not in effect")
    out += verdict or ["PASSED: no test fails only under the preload"]

    text = "\n".join(out)
    print(text)
    with open(f"{out_dir}/report.txt", "w", encoding="utf-8") as f:
        f.write(text + "\n")
    # For the re-runs: the tests failing only under the preload, one id a
    # line, when nothing else failed.
    with open(f"{out_dir}/only-preload.txt", "w", encoding="utf-8") as f:
        if only_preload and len(verdict) == 1:
            f.write("".join(f"{tid}\n" for _, tid, _ in only_preload))
    return 1 if verdict else 0


def main(argv):
    if len(argv) >= 4 and argv[1] == "run":
        run(argv[2], argv[3])
    elif len(argv) >= 4 and argv[1] == "report":
        sys.exit(report(argv[2], argv[3:]))
    else:
        sys.exit(__doc__)


if __name__ == "__main__":
    main(sys.argv)
