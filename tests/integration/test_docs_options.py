"""Every option a daemon's --help lists has a row in that daemon's options table in the docs,
and every row names an option the daemon knows: the tables operators read cannot fall behind
the binaries (the router's failover options once sat in shoal-node's table, and shoal-control's
and shoal-invalidator's had none)."""

import os
import re
import subprocess
from pathlib import Path

import pytest

pytestmark = pytest.mark.shoal_only

REPO = Path(__file__).resolve().parents[2]

# daemon, its binary's env var, the doc, and the section its table is in (to the next of these)
DAEMONS = [
    ("shoal-node", "SHOAL_NODE_BIN", "docs/operations.md", "## shoal-node", "## shoal-router"),
    ("shoal-router", "SHOAL_ROUTER_BIN", "docs/operations.md", "## shoal-router",
     "## shoal-control"),
    ("shoal-control", "SHOAL_CONTROL_BIN", "docs/operations.md", "## shoal-control",
     "### Failure handling"),
    ("shoal-invalidator", "SHOAL_INVALIDATOR_BIN", "docs/invalidator.md", "## Options",
     "## Admin port"),
]


def help_options(binary):
    out = subprocess.run([binary, "--help"], capture_output=True, text=True, timeout=10)
    opts = set(re.findall(r"^\s+(?:-\w, )?(--[a-z0-9-]+)", out.stdout + out.stderr, re.M))
    assert len(opts) > 10, out.stdout + out.stderr
    return opts - {"--help", "--version"}


def documented_options(doc, start, end):
    text = (REPO / doc).read_text()
    a = text.index(start)
    section = text[a:text.index(end, a + len(start))]
    return set(re.findall(r"^\| (?:`-\w`, )?`(--[a-z0-9-]+)", section, re.M))


@pytest.mark.parametrize("name,env,doc,start,end", DAEMONS, ids=[d[0] for d in DAEMONS])
def test_every_option_has_a_row_in_its_daemons_table(name, env, doc, start, end):
    binary = os.environ.get(env) or str(REPO / "build" / "bin" / name)
    known, rows = help_options(binary), documented_options(doc, start, end)
    assert sorted(known - rows) == [], f"{name} options without a row in {doc} ({start})"
    assert sorted(rows - known) == [], f"rows in {doc} ({start}) that {name} does not know"
