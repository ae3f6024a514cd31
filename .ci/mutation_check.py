"""Mutation check: flip one sign at a time in a copy of the committed tree and run the
named test files with `-x`; a mutant is killed when a test fails. Each mutant is a
sign in a formulation's dynamics, in Braun-Goldfarb's corrections, in the Newton
projection or in a controller law; a survivor means the suite would not notice that
mistake.

    python .ci/mutation_check.py            # every mutant (about 20 minutes on 2 cores)
    python .ci/mutation_check.py Newton     # the mutants whose name contains "Newton"

Run it from the repository root, in the test environment. It works on
`git archive HEAD` in a temporary directory, so uncommitted changes are not seen and
the checkout is never modified.
"""
import os
import pathlib
import subprocess
import sys
import tempfile
import time

ROOT = pathlib.Path(__file__).resolve().parents[1]
SRC = pathlib.Path(tempfile.mkdtemp(prefix="cdiff-mutants-"))
subprocess.run(f"git -C {ROOT} archive HEAD | tar -x -C {SRC}", shell=True, check=True)
MUTANTS = [
 ("Lagrange dynamics", "cdiff/_formulation/lagrange.py",
  "return Dynamics((qdot, a + mf.unweight(y_v)), force, lam)",
  "return Dynamics((qdot, a - mf.unweight(y_v)), force, lam)", ["tests/formulations/test_formulations.py"]),
 ("Lagrange Baumgarte term", "cdiff/_formulation/lagrange.py",
  "r_v = kin.b_v - kin.A_v @ a - baumgarte", "r_v = kin.b_v - kin.A_v @ a + baumgarte",
  ["tests/formulations/test_formulations.py"]),
 ("UdwadiaKalaba dynamics (eq. 17)", "cdiff/_formulation/udwadia_kalaba.py",
  "return Dynamics((qdot, a + mf.unweight(y_v)), force, multipliers)",
  "return Dynamics((qdot, a - mf.unweight(y_v)), force, multipliers)", ["tests/formulations/test_formulations.py"]),
 ("Braun-Goldfarb velocity correction (eq. 16, Delta_q)", "cdiff/_formulation/udwadia_kalaba.py",
  "r_q = -kin.dphi_q - frozen.delta_q", "r_q = -kin.dphi_q + frozen.delta_q", ["tests/formulations/test_formulations.py"]),
 ("Braun-Goldfarb acceleration correction (Delta_v)", "cdiff/_formulation/udwadia_kalaba.py",
  "r_v = kin.b_v - matvec(kin.A_v, a) - frozen.delta_v", "r_v = kin.b_v - matvec(kin.A_v, a) + frozen.delta_v",
  ["tests/formulations/test_formulations.py"]),
 ("Braun-Goldfarb energy correction (eq. 20, Delta_e)", "cdiff/_formulation/udwadia_kalaba.py",
  "- frozen.delta_e -", "+ frozen.delta_e -", ["tests/formulations/test_formulations.py"]),
 ("Projection dynamics (eq. 25)", "cdiff/_formulation/projection.py",
  "P @ f + K @ qdd_perp", "P @ f - K @ qdd_perp", ["tests/formulations/test_projection.py"]),
 ("NullSpace dynamics (eq. 28)", "cdiff/_formulation/nullspace.py",
  "nudot = cho_solve(chol, S.T @ (F - M @ gamma))", "nudot = cho_solve(chol, S.T @ (F + M @ gamma))",
  ["tests/formulations/test_nullspace.py"]),
 ("Regularized dynamics (eqs. 32-35)", "cdiff/_formulation/regularized.py",
  "return Dynamics((qdot, a + B @ f), kin.A_v.T @ f, f)", "return Dynamics((qdot, a - B @ f), kin.A_v.T @ f, f)",
  ["tests/solvers/test_planar_arm_dae.py", "tests/solvers/test_bdf.py"]),
 ("GGL residual (eqs. 15-18)", "cdiff/_formulation/dae.py",
  "dynamic = [vdot - mass_factor(model, t, q).solve(f)]", "dynamic = [vdot + mass_factor(model, t, q).solve(f)]",
  ["tests/solvers/test_bdf.py", "tests/solvers/test_planar_arm_dae.py"]),
 ("IndexOne residual", "cdiff/_formulation/dae.py",
  "            vdot - w,\n            model.mass_matrix(t, q) @ w - f,", "            vdot + w,\n            model.mass_matrix(t, q) @ w - f,",
  ["tests/solvers/test_bdf.py", "tests/solvers/test_ida_reference.py"]),
 ("Newton projection (eq. 37)", "cdiff/_projection.py",
  "solve(A, -phi)", "solve(A, phi)", ["tests/solvers/test_projected.py"]),
 ("PIDC / hybrid controller law (eq. 44's PD term)", "cdiff/control/_aghili.py",
  "_apply_gain(ctrl.gp, q_d - q)", "_apply_gain(ctrl.gp, q - q_d)", ["tests/formulations/test_control.py"]),
]
only = sys.argv[1:]
for name, path, old, new, tests in MUTANTS:
    if only and not any(o in name for o in only):
        continue
    f = SRC / path
    text = f.read_text()
    assert text.count(old) >= 1, (name, old)
    f.write_text(text.replace(old, new))
    t = time.time()
    try:
        r = subprocess.run([sys.executable, "-m", "pytest", "-n", "0", "-p", "no:cacheprovider", "-x", "-q",
                            "-W", "ignore", *tests], cwd=SRC, capture_output=True, text=True, timeout=1500,
                           env={**os.environ, "PYTHONPATH": str(SRC)})
        out = r.stdout
        failed = [l for l in out.splitlines() if l.startswith("FAILED")]
        status = "KILLED by " + failed[0][7:120] if failed else ("survived" if r.returncode == 0 else f"rc {r.returncode}: " + out[-300:])
    except subprocess.TimeoutExpired:
        status = "timeout"
    finally:
        f.write_text(text)
    print(f"{name} [{path}]: {status} ({time.time() - t:.0f} s)", flush=True)
