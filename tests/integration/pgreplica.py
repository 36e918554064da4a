"""A PostgreSQL primary and a streaming replica in a temporary directory, for tests of replica gating
(issue 14 point 4): initdb, a primary on a free loopback port, pg_basebackup -R for the replica on
another, both stopped and removed afterwards. Runs the server binaries as the `postgres` user when
the tests run as root (PostgreSQL refuses root). Queries go through psql over TCP (trust auth).

    with PgReplicaPair() as pg:
        pg.primary("CREATE TABLE t (id int)")
        pg.replica("SELECT pg_wal_replay_pause()")
"""

import os
import pwd
import shutil
import subprocess
import tempfile

import pytest

from mcraw import free_port, wait_until

PG_BIN = os.environ.get("SHOAL_PG_BIN", "/usr/lib/postgresql/15/bin")


def _as_pg(cmd):
    if os.geteuid() == 0:
        return ["runuser", "-u", "postgres", "--"] + cmd
    return cmd


class PgReplicaPair:
    def __init__(self):
        if not os.path.exists(f"{PG_BIN}/initdb"):
            pytest.skip(f"{PG_BIN}/initdb not found: apt-get install postgresql (scripts/deps.sh)")
        self.base = tempfile.mkdtemp(prefix="shoal-pgrepl-")
        os.chmod(self.base, 0o755)
        if os.geteuid() == 0:
            pw = pwd.getpwnam("postgres")
            os.chown(self.base, pw.pw_uid, pw.pw_gid)
        self.pdir, self.rdir = f"{self.base}/primary", f"{self.base}/replica"
        self.pport, self.rport = free_port(), free_port()
        self.started = []

    def _run(self, cmd, **kw):
        r = subprocess.run(_as_pg(cmd), capture_output=True, text=True, **kw)
        if r.returncode != 0:
            raise AssertionError(f"{' '.join(cmd)} failed:\n{r.stdout}\n{r.stderr}\n{self.logs()}")
        return r.stdout

    def logs(self):
        out = []
        for name in ("primary", "replica"):
            path = f"{self.base}/{name}.log"
            if os.path.exists(path):
                out.append(f"--- {name}.log\n" + open(path, errors="replace").read()[-4000:])
        return "\n".join(out)

    def _start(self, datadir, port, name):
        opts = (f"-c port={port} -c listen_addresses=127.0.0.1 -c unix_socket_directories={self.base} "
                "-c fsync=off -c synchronous_commit=off -c full_page_writes=off "
                "-c shared_buffers=16MB -c max_wal_senders=4 -c wal_level=logical "
                "-c hot_standby=on -c wal_receiver_status_interval=1")
        self._run([f"{PG_BIN}/pg_ctl", "-D", datadir, "-l", f"{self.base}/{name}.log", "-w",
                   "-t", "30", "-o", opts, "start"])
        self.started.append(datadir)

    def __enter__(self):
        try:
            self._run([f"{PG_BIN}/initdb", "-D", self.pdir, "-U", "postgres", "--auth=trust",
                       "-E", "UTF8", "--no-sync"])
            with open(f"{self.pdir}/pg_hba.conf", "a") as f:
                f.write("host replication all 127.0.0.1/32 trust\n")
            self._start(self.pdir, self.pport, "primary")
            self._run([f"{PG_BIN}/pg_basebackup", "-h", "127.0.0.1", "-p", str(self.pport),
                       "-U", "postgres", "-D", self.rdir, "-R", "-X", "stream", "--no-sync"])
            self._start(self.rdir, self.rport, "replica")
            wait_until(lambda: self.replica("SELECT pg_is_in_recovery()") == "t",
                       timeout=20, message="the replica in recovery")
        except BaseException:
            self.__exit__(None, None, None)
            raise
        return self

    def __exit__(self, *exc):
        for datadir in reversed(self.started):
            subprocess.run(_as_pg([f"{PG_BIN}/pg_ctl", "-D", datadir, "-m", "immediate", "-w",
                                   "stop"]), capture_output=True)
        self.started = []
        shutil.rmtree(self.base, ignore_errors=True)

    def conninfo(self, port):
        return f"host=127.0.0.1 port={port} user=postgres dbname=postgres"

    def _psql(self, port, sql):
        r = subprocess.run([f"{PG_BIN}/psql", "-h", "127.0.0.1", "-p", str(port), "-U", "postgres",
                            "-d", "postgres", "-AtqX", "-v", "ON_ERROR_STOP=1", "-c", sql],
                           capture_output=True, text=True, timeout=30)
        if r.returncode != 0:
            raise AssertionError(f"psql {sql!r}: {r.stderr}")
        return r.stdout.strip()

    def primary(self, sql):
        return self._psql(self.pport, sql)

    def replica(self, sql):
        return self._psql(self.rport, sql)


def lsn_int(text):
    hi, lo = text.split("/")
    return int(hi, 16) << 32 | int(lo, 16)
