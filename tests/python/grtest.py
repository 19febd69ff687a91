"""Shared setup of the Python tests (tests/python/test_*.py), run by scripts/run-tests like the
C test binaries: each file is executable, finds the extension built by `make python` under
$GR_BUILD_DIR/python (build/python by default), and prints cmocka's summary lines so its tests
count in "N passed, N failed".

- When torch is not importable the file prints why and passes with 0 tests (the only skip).
- Under an ASan build (GR_BUILD_DIR ending in /address) the interpreter is not instrumented,
  so the file re-executes itself with libasan preloaded (LD_PRELOAD, as the ASan runtime must
  come first; libstdc++ right after it, for ASan's C++ exception interceptor) and
  ASAN_OPTIONS=detect_leaks=0: the interpreter's own allocations at exit would
  otherwise be reported as leaks. Everything else ASan checks (overflows, use after free, in the
  extension and libgranary) stays on and aborts the test.
"""
import os
import subprocess
import sys
import unittest

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
BUILD = os.environ.get("GR_BUILD_DIR", "build")
if not os.path.isabs(BUILD):
    BUILD = os.path.join(REPO, BUILD)
GRANARY_BIN = os.path.join(BUILD, "granary")


def _asan_reexec():
    if not BUILD.rstrip("/").endswith("address") or os.environ.get("GR_PY_ASAN") == "1":
        return
    def cc_lib(name):
        return subprocess.run(["cc", "-print-file-name=" + name], capture_output=True,
                              text=True).stdout.strip()
    # libstdc++ right after libasan: ASan's __cxa_throw interceptor finds the real one only
    # if libstdc++ is loaded when the runtime starts (torch's gloo threads throw and catch
    # exceptions; without it ASan's CHECK fails on the first throw).
    lib = cc_lib("libasan.so") + ":" + cc_lib("libstdc++.so.6")
    env = dict(os.environ)
    env["GR_PY_ASAN"] = "1"
    env["LD_PRELOAD"] = lib + (":" + env["LD_PRELOAD"] if env.get("LD_PRELOAD") else "")
    opts = [o for o in env.get("ASAN_OPTIONS", "").split(":") if o and
            not o.startswith("detect_leaks=")]
    env["ASAN_OPTIONS"] = ":".join(opts + ["detect_leaks=0"])
    print("grtest: ASan build: re-running with LD_PRELOAD=%s ASAN_OPTIONS=%s"
          % (lib, env["ASAN_OPTIONS"]), flush=True)
    os.execve(sys.executable, [sys.executable] + sys.argv, env)


_asan_reexec()
sys.path.insert(0, os.path.join(BUILD, "python"))

try:
    import torch  # noqa: F401
    TORCH_ERROR = None
except Exception as e:  # ImportError, or a broken install
    TORCH_ERROR = "%s: %s" % (type(e).__name__, e)

if TORCH_ERROR is None:
    import granary  # noqa: E402,F401  (the extension must import once torch does)


def main():
    """Runs the calling module's tests and prints cmocka-style summary lines."""
    name = os.path.basename(sys.argv[0])
    if TORCH_ERROR is not None:
        print("%s: SKIPPED: torch is not importable (%s); install python3-torch "
              "(GRANARY_TORCH=1 scripts/setup)" % (name, TORCH_ERROR))
        print("[  PASSED  ] 0 test(s).")
        sys.exit(0)
    suite = unittest.defaultTestLoader.loadTestsFromModule(sys.modules["__main__"])
    result = unittest.TextTestRunner(verbosity=2, stream=sys.stdout).run(suite)
    bad = len(result.failures) + len(result.errors)
    print("[  PASSED  ] %d test(s)." % (result.testsRun - bad))
    if bad:
        print("[  FAILED  ] %d test(s), listed below:" % bad)
        for t, _ in result.failures + result.errors:
            print("[  FAILED  ] %s" % t.id())
    sys.stdout.flush()
    os._exit(1 if bad else 0)


def local_cluster(shards=1):
    import granary
    return granary.LocalCluster(shards)
