"""The console script sets polars' allocator options before polars loads, unless the user did."""

from __future__ import annotations

import os
import subprocess
import sys

from ckptwatch import entry


def test_the_console_script_sets_the_allocator_options_before_polars_loads():
    code = ("import sys, os; sys.argv = ['ckptwatch', '--help']\n"
            "from ckptwatch import entry\n"
            "assert 'polars' not in sys.modules, 'polars loaded before the options were set'\n"
            "try:\n    entry.main()\nexcept SystemExit:\n    pass\n"
            "print(os.environ['_RJEM_MALLOC_CONF'], 'polars' in sys.modules)")
    env = {k: v for k, v in os.environ.items() if k != "_RJEM_MALLOC_CONF"}
    # polars puts its own defaults in front when it loads; jemalloc applies options in order,
    # so the last of each wins: ours
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
    conf, loaded = out.stdout.split()[-2:]
    assert conf.endswith("," + entry.ALLOCATOR_CONF) and loaded == "True", conf
    env["_RJEM_MALLOC_CONF"] = "dirty_decay_ms:5000"  # the user's own stays
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
    conf, loaded = out.stdout.split()[-2:]
    assert conf.endswith(",dirty_decay_ms:5000") and entry.ALLOCATOR_CONF not in conf, conf
