"""A PostgreSQL primary and a streaming replica, for tests of replica gating (issue 14 point 4):
two pgharness.PgServer, the second made with pg_basebackup -R from the first (hot standby), both
stopped and removed afterwards. Queries go through psql over TCP (trust auth).

    with PgReplicaPair() as pg:
        pg.primary("CREATE TABLE t (id int)")
        pg.replica("SELECT pg_wal_replay_pause()")
"""

from mcraw import wait_until
from pgharness import PgServer


class PgReplicaPair:
    def __init__(self, replica_opts=""):
        """`replica_opts`: more `-c name=value` options for the replica (e.g.
        recovery_min_apply_delay=300ms for one that lags on purpose)."""
        self.replica_opts = replica_opts
        self.p = self.r = None

    def __enter__(self):
        try:
            self.p = PgServer.start()
            self.r = PgServer.start(replica_of=self.p, extra_opts=self.replica_opts)
            wait_until(lambda: self.replica("SELECT pg_is_in_recovery()") == "t",
                       timeout=20, message="the replica in recovery")
        except BaseException:
            self.__exit__(None, None, None)
            raise
        return self

    def __exit__(self, *exc):
        for server in (self.r, self.p):
            if server is not None:
                server.stop()
        self.p = self.r = None

    @property
    def pport(self):
        return self.p.port

    @property
    def rport(self):
        return self.r.port

    def conninfo(self, port):
        return f"host=127.0.0.1 port={port} user=postgres dbname=postgres"

    def logs(self):
        return "\n".join(f"--- {name}.log\n" + s.log_text()[-4000:]
                         for name, s in (("primary", self.p), ("replica", self.r)) if s)

    @staticmethod
    def _text(rows):
        return "\n".join("|".join(r) for r in rows)

    def primary(self, sql):
        return self._text(self.p.sql(sql, timeout=30))

    def replica(self, sql):
        return self._text(self.r.sql(sql, timeout=30))


def lsn_int(text):
    hi, lo = text.split("/")
    return int(hi, 16) << 32 | int(lo, 16)
