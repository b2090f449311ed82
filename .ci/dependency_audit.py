"""`make lint`'s dependency audit: pip-audit against the installed environment, failing
clearly when the vulnerability service could not answer.

pip-audit reports a package it could not look up as "skipped", not as an error, so an
audit run where PyPI's JSON API (the default service) is unreachable, or answers 404
behind a mirror that serves only /simple/, would print "No known vulnerabilities found"
having checked nothing. This wrapper counts what was really audited and fails, naming
the cause, when that is not (nearly) everything.

    python .ci/dependency_audit.py [pip-audit arguments, e.g. --vulnerability-service osv]

Exit status: 0 clean; 1 known vulnerabilities; 2 the audit could not be done.
"""

import json
import subprocess  # nosec B404 - runs pip-audit from this venv with a fixed argv
import sys
from pathlib import Path

# The project's own packages are installed from this checkout, never from PyPI.
OWN = {"agentplatform", "agentplatform-client"}
# Below this share of dependencies actually audited, the audit is reported as not done.
MIN_AUDITED_SHARE = 0.9


def main(argv: list[str]) -> int:
    pip_audit = Path(sys.executable).parent / "pip-audit"
    command = [str(pip_audit), "--format", "json", "--progress-spinner", "off", *argv]
    # Our own venv's pip-audit with our arguments; no shell.
    done = subprocess.run(command, capture_output=True, text=True, check=False)  # nosec B603
    try:
        report = json.loads(done.stdout)
    except json.JSONDecodeError:
        last = (done.stderr.strip().splitlines() or ["no output"])[-1]
        print(f"dependency audit: NOT DONE, pip-audit failed: {last}", file=sys.stderr)
        return 2
    deps = [d for d in report.get("dependencies", []) if d.get("name") not in OWN]
    skipped = [d for d in deps if d.get("skip_reason")]
    audited = len(deps) - len(skipped)
    vulnerable = [d for d in deps if d.get("vulns")]
    for dep in vulnerable:
        for vuln in dep["vulns"]:
            fixes = ", ".join(vuln.get("fix_versions") or []) or "no fixed version yet"
            print(f"{dep['name']} {dep['version']}: {vuln['id']} (fixed in: {fixes})")
    if vulnerable:
        return 1
    if not deps or audited < MIN_AUDITED_SHARE * len(deps):
        example = skipped[0]["skip_reason"] if skipped else "no dependencies listed"
        print(
            f"dependency audit: NOT DONE, the vulnerability service answered for {audited} of "
            f"{len(deps)} installed packages (e.g. {example}). PyPI's JSON API "
            "(https://pypi.org/pypi/<name>/<version>/json) or OSV (https://api.osv.dev) must be "
            "reachable; a mirror serving only /simple/ cannot answer. Run `make lint` where one "
            "is, or pass PIP_AUDIT_ARGS='--vulnerability-service osv'.",
            file=sys.stderr,
        )
        return 2
    print(f"dependency audit: {audited} packages audited, no known vulnerabilities")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
