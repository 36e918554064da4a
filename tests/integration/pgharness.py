"""A real PostgreSQL for shoal-invalidator's tests, and the invalidator started against it.

PostgreSQL (Debian's postgresql, /usr/lib/postgresql/<v>/bin) is initdb'd into a temporary
directory owned by the postgres user and started with wal_level=logical on a free loopback port
(its socket in the same directory), once per test module; it is stopped after. SQL goes through
/usr/bin/psql. logical_decoding_work_mem is at its minimum (64kB), so any transaction of more than
a few hundred rows is streamed to the invalidator in blocks before it commits: the streamed path
is the one most tests take.

    pg = PgServer.start(tmp_dir)
    pg.sql("UPDATE products SET price = 2 WHERE id = 1")
    inv = Invalidator.start(pg, config_dict, tmp_dir)   # waits for /healthz 200
    inv.kill9(); inv = inv.restart()
    replica = PgServer.start(replica_of=pg)              # a streaming replica (pgreplica.py)
"""

import glob
import json
import os
import pwd
import shutil
import signal
import subprocess
import tempfile
import time
from pathlib import Path

import pytest

from mcraw import free_port, healthz_ok, scrape_metrics, wait_until

REPO_ROOT = Path(__file__).resolve().parents[2]
PSQL = os.environ.get("SHOAL_PSQL_BIN", "/usr/bin/psql")


def invalidator_binary():
    rel = os.environ.get("SHOAL_INVALIDATOR_BIN", "build/bin/shoal-invalidator")
    path = Path(rel)
    return path if path.is_absolute() else REPO_ROOT / path


def pg_bindir():
    found = sorted(glob.glob("/usr/lib/postgresql/*/bin/initdb"))
    return Path(found[-1]).parent if found else None


def _as_postgres(args, **kw):
    """Run a PostgreSQL server program as the postgres user (initdb and postgres refuse root)."""
    if os.geteuid() == 0:
        args = ["runuser", "-u", "postgres", "--"] + args
    return subprocess.run(args, stdin=subprocess.DEVNULL, capture_output=True, text=True, **kw)


class PgServer:
    def __init__(self, base, port, bindir):
        self.base, self.port, self.bindir = base, port, bindir
        self.data = base / "data"

    @property
    def conninfo(self):
        return f"host=127.0.0.1 port={self.port} user=postgres dbname=postgres"

    @classmethod
    def start(cls, parent=None, replica_of=None, extra_opts=""):
        """initdb and start a server; with `replica_of` (a running PgServer), a streaming
        replica of it instead (pg_basebackup -R: hot standby, following the primary's WAL).
        `extra_opts` are more `-c name=value` options (e.g. recovery_min_apply_delay on a
        replica). `parent` is unused: the directory is under /tmp (see below)."""
        bindir = pg_bindir()
        if bindir is None or not os.path.exists(PSQL):
            message = "PostgreSQL not installed: apt-get install postgresql (scripts/deps.sh)"
            if os.environ.get("CI", "").lower() in ("1", "true", "yes"):
                pytest.fail(message)
            pytest.skip(message)
        # /tmp rather than pytest's directory: the postgres user must reach it, and a socket
        # path must stay short
        base = Path(tempfile.mkdtemp(prefix="shoal-pg-", dir="/tmp"))
        if os.geteuid() == 0:
            pw = pwd.getpwnam("postgres")
            os.chown(base, pw.pw_uid, pw.pw_gid)
        os.chmod(base, 0o755)
        if replica_of is None:
            # initdb's pg_hba.conf trusts replication connections from 127.0.0.1 too (-A trust)
            r = _as_postgres([str(bindir / "initdb"), "-D", str(base / "data"), "-U", "postgres",
                              "-A", "trust", "-E", "UTF8", "--no-sync", "--no-instructions"])
            what = "initdb"
        else:
            r = _as_postgres([str(bindir / "pg_basebackup"), "-h", "127.0.0.1", "-p",
                              str(replica_of.port), "-U", "postgres", "-D", str(base / "data"),
                              "-R", "-X", "stream", "--no-sync"])
            what = "pg_basebackup"
        if r.returncode != 0:
            shutil.rmtree(base, ignore_errors=True)
            pytest.fail(f"{what} failed:\n{r.stdout}\n{r.stderr}")
        for attempt in range(3):
            pg = cls(base, free_port(), bindir)
            # the same settings on a replica: a hot standby needs max_wal_senders and the
            # like at least as high as its primary's
            opts = (f"-c wal_level=logical -c port={pg.port} -c listen_addresses=127.0.0.1 "
                    f"-c unix_socket_directories={base} -c fsync=off -c synchronous_commit=off "
                    "-c full_page_writes=off -c logical_decoding_work_mem=64kB "
                    "-c max_wal_senders=10 -c max_replication_slots=10 -c shared_buffers=64MB "
                    "-c wal_sender_timeout=10s -c max_wal_size=1GB -c hot_standby=on "
                    f"-c wal_receiver_status_interval=1 {extra_opts}")
            pg.opts = opts
            r = pg._pg_ctl("start")
            if r.returncode == 0:
                return pg
            log = (base / "postgres.log").read_text(errors="replace")
            if "in use" not in log or attempt == 2:
                pg.stop()
                pytest.fail(f"pg_ctl start failed:\n{r.stdout}\n{r.stderr}\n{log}")
        raise AssertionError("unreachable")

    def _pg_ctl(self, action, *more):
        return _as_postgres([str(self.bindir / "pg_ctl"), "-D", str(self.data), "-l",
                             str(self.base / "postgres.log"), "-o", self.opts, "-w", "-t", "30",
                             *more, action])

    def halt(self):
        """Stop the server at once (as a crash would), keeping its data."""
        r = self._pg_ctl("stop", "-m", "immediate")
        assert r.returncode == 0, f"pg_ctl stop failed:\n{r.stdout}\n{r.stderr}"

    def resume(self):
        r = self._pg_ctl("start")
        assert r.returncode == 0, f"pg_ctl start failed:\n{r.stdout}\n{r.stderr}\n{self.log_text()}"

    def stop(self):
        self._pg_ctl("stop", "-m", "immediate")
        shutil.rmtree(self.base, ignore_errors=True)

    def log_text(self):
        try:
            return (self.base / "postgres.log").read_text(errors="replace")
        except OSError:
            return ""

    def sql(self, text, timeout=120):
        """Run SQL through psql; returns the rows as lists of strings (unaligned, tab-separated).
        Fails the test with psql's message on an error."""
        r = subprocess.run([PSQL, "-h", "127.0.0.1", "-p", str(self.port), "-U", "postgres",
                            "-d", "postgres", "-X", "-q", "-A", "-t", "-F", "\t",
                            "-v", "ON_ERROR_STOP=1", "-c", text],
                           stdin=subprocess.DEVNULL, capture_output=True, text=True,
                           timeout=timeout)
        if r.returncode != 0:
            raise AssertionError(f"psql failed on {text[:200]!r}:\n{r.stderr}")
        return [line.split("\t") for line in r.stdout.splitlines() if line]

    def value(self, text):
        rows = self.sql(text)
        return rows[0][0] if rows else None

    def session(self):
        """A psql session kept open (PsqlSession): a query costs a round trip, not a process."""
        return PsqlSession(self.port)


class PsqlSession:
    """One psql process reading queries from a pipe; each query's output is read up to a marker
    line. For tests that query in a loop (a reader racing writers, a load driver)."""

    MARK = "__shoal_psql_done__"

    def __init__(self, port):
        self.proc = subprocess.Popen([PSQL, "-h", "127.0.0.1", "-p", str(port), "-U", "postgres",
                                      "-d", "postgres", "-X", "-q", "-A", "-t", "-F", "\t"],
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                     stderr=subprocess.STDOUT, text=True, bufsize=1)

    def query(self, text):
        """Rows of `text` (one statement, no trailing semicolon needed) as lists of strings. An
        error comes back as a row starting with ERROR: (psql goes on)."""
        self.proc.stdin.write(text.rstrip().rstrip(";") + ";\n\\echo " + self.MARK + "\n")
        self.proc.stdin.flush()
        rows = []
        for line in self.proc.stdout:
            line = line.rstrip("\n")
            if line == self.MARK:
                return rows
            if line:
                rows.append(line.split("\t"))
        raise AssertionError("psql exited")

    def close(self):
        try:
            self.proc.stdin.close()
        except OSError:
            pass
        try:
            self.proc.wait(5)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(5)


class Invalidator:
    def __init__(self, pg, config_path, tmp_dir, extra, proc, admin, stderr_path):
        self.pg, self.config_path, self.tmp_dir, self.extra = pg, config_path, tmp_dir, extra
        self.proc, self.admin, self.stderr_path = proc, admin, stderr_path

    @classmethod
    def start(cls, pg, config, tmp_dir, *extra, wait=True):
        """Start shoal-invalidator with `config` (a dict, written to a file) and wait until its
        /healthz says the stream is up."""
        tmp_dir = Path(tmp_dir)
        path = config if isinstance(config, Path) else tmp_dir / f"invalidator-{free_port()}.json"
        if not isinstance(config, Path):
            path.write_text(json.dumps(config))
        return cls._launch(pg, path, tmp_dir, list(extra), wait)

    @classmethod
    def _launch(cls, pg, path, tmp_dir, extra, wait):
        binary = invalidator_binary()
        if not binary.exists():
            pytest.fail(f"{binary} not found: build it with `make` or set SHOAL_INVALIDATOR_BIN")
        from conftest import _die_with_parent
        admin = free_port()
        args = [str(binary), "--pg", pg.conninfo, "--config", str(path), "--admin-port",
                str(admin), "--spill-dir", str(tmp_dir / "spill"), *extra]
        fd, stderr_path = tempfile.mkstemp(prefix="invalidator-", suffix=".stderr", dir=tmp_dir)
        with os.fdopen(fd, "w") as err:
            proc = subprocess.Popen(args, stdin=subprocess.DEVNULL, stdout=err, stderr=err,
                                    start_new_session=True, preexec_fn=_die_with_parent)
        inv = cls(pg, path, tmp_dir, extra, proc, admin, stderr_path)
        if wait:
            inv.wait_healthy()
        return inv

    def stderr_text(self):
        return Path(self.stderr_path).read_text(errors="replace")

    def healthy(self):
        if self.proc.poll() is not None:
            raise AssertionError(f"shoal-invalidator exited with status {self.proc.returncode}:\n"
                                 f"{self.stderr_text()}")
        return healthz_ok(self.admin)

    def wait_healthy(self, timeout=15):
        wait_until(self.healthy, timeout=timeout, interval=0.05,
                   message=f"shoal-invalidator's /healthz (stderr so far: {self.stderr_text()})")

    def metrics(self):
        return scrape_metrics(self.admin)

    def kill9(self):
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(10)

    def restart(self, wait=True):
        return Invalidator._launch(self.pg, self.config_path, self.tmp_dir, self.extra, wait)

    def stop(self):
        """SIGTERM; returns None on a clean exit (or the exit the test expected, in
        expect_exit), else what went wrong."""
        if self.proc.poll() is not None:
            ok = (0, -9, getattr(self, "expect_exit", 0))
            return None if self.proc.returncode in ok else \
                f"exited with status {self.proc.returncode}"
        self.proc.send_signal(signal.SIGTERM)
        try:
            status = self.proc.wait(10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(5)
            return "did not exit within 10 s of SIGTERM"
        return None if status == 0 else f"exited with status {status} after SIGTERM"
