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


# ZooKeeper and coordinated shards, for the coord= tests: Debian's ZooKeeper started on a free
# loopback port with its own folder and tickTime 500 (as tests/support/zk_harness.c does), and
# `granary server --coord` processes. Every process dies with the test (PR_SET_PDEATHSIG).
ZK_JAR = "/usr/share/java/zookeeper.jar"
SLF4J_JAR = "/usr/share/java/slf4j-simple.jar"


def _java():
    for j in ("/usr/bin/java", "/usr/lib/jvm/default-java/bin/java"):
        if os.access(j, os.X_OK):
            return j
    return None


def zk_available():
    return _java() is not None and os.access(ZK_JAR, os.R_OK)


def _die_with_parent():
    import ctypes
    import signal
    ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG


def free_port():
    import socket
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _four_letters(port, word):
    import socket
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=2) as s:
            s.sendall(word.encode())
            return s.recv(64).decode(errors="replace")
    except OSError:
        return ""


class ZooKeeper:
    """A ZooKeeper server on a free loopback port; .hosts is "127.0.0.1:PORT"."""

    def __init__(self, tmp):
        import time
        self.dir = os.path.join(tmp, "zk")
        os.makedirs(os.path.join(self.dir, "data"))
        self.port = free_port()
        self.hosts = "127.0.0.1:%d" % self.port
        cfg = os.path.join(self.dir, "zoo.cfg")
        with open(cfg, "w") as f:
            f.write("tickTime=500\ninitLimit=10\nsyncLimit=5\ndataDir=%s/data\nclientPort=%d\n"
                    "clientPortAddress=127.0.0.1\nadmin.enableServer=false\n"
                    "4lw.commands.whitelist=ruok,srvr\nmaxClientCnxns=0\n"
                    % (self.dir, self.port))
        cp = ZK_JAR + (":" + SLF4J_JAR if os.access(SLF4J_JAR, os.R_OK) else "")
        log = open(os.path.join(self.dir, "zk.log"), "w")
        self.proc = subprocess.Popen(
            [_java(), "-Xmx96m", "-Xss512k", "-XX:+UseSerialGC", "-XX:TieredStopAtLevel=1",
             "-Dzookeeper.admin.enableServer=false", "-cp", cp,
             "org.apache.zookeeper.server.quorum.QuorumPeerMain", cfg],
            stdin=subprocess.DEVNULL, stdout=log, stderr=log, preexec_fn=_die_with_parent)
        log.close()
        deadline = time.time() + 30
        while not _four_letters(self.port, "ruok").startswith("imok"):
            if self.proc.poll() is not None or time.time() > deadline:
                self.stop()
                raise RuntimeError("ZooKeeper did not start (log: %s/zk.log)" % self.dir)
            time.sleep(0.05)

    def url(self, path):
        return "zk://%s%s" % (self.hosts, path)

    def stop(self):
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


class CoordServer:
    """`granary server --coord URL --listen 127.0.0.1:0` plus args; .address once it listens."""

    def __init__(self, url, args, cwd):
        env = dict(os.environ, GRANARY_LOG=os.environ.get("GRANARY_LOG", "warn"))
        self.proc = subprocess.Popen([GRANARY_BIN, "server", "--coord", url, "--listen",
                                      "127.0.0.1:0"] + list(args), cwd=cwd, env=env,
                                     stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                     preexec_fn=_die_with_parent)
        line = self.proc.stdout.readline().decode().strip()
        if not line.startswith("listening on "):
            self.kill()
            raise RuntimeError("granary server --coord did not start (said %r)" % line)
        self.address = line[len("listening on "):]

    def kill(self, sig=9):
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
            self.proc.wait()
        self.proc.stdout.close()


def cluster_status(url):
    """`granary cluster status --json` of a coordinated job (a dict)."""
    import json
    r = subprocess.run([GRANARY_BIN, "cluster", "status", "--coord", url, "--json"],
                       stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, timeout=30)
    if r.returncode != 0:
        raise RuntimeError("cluster status: %s" % r.stderr)
    return json.loads(r.stdout)
