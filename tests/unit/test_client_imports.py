"""Layering: `minibroker.client` imports only `minibroker.protocol` of ours (never the
broker), and never pulls in pyspark (test_layering.py holds the rest of the rule)."""

import ast
import subprocess
import sys
from pathlib import Path

CLIENT = Path(__file__).resolve().parents[2] / "client"
FORBIDDEN = ("minibroker.broker", "minibroker.deploy", "pyspark")


def test_importing_client_loads_neither_broker_nor_pyspark(tmp_path):
    code = (
        "import sys, minibroker.client; "
        f"print(sorted(m for m in sys.modules if m.startswith({FORBIDDEN!r})))"
    )
    # From a neutral directory: what is imported is the installed package, nothing else.
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, cwd=tmp_path, check=True
    )
    assert out.stdout.strip() == "[]"


def test_client_modules_import_neither_broker_nor_pyspark():
    # client/spark* belongs to the Spark source and may import pyspark.
    for path in CLIENT.glob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.module:
                names = [node.module]
            elif isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            else:
                continue
            for name in names:
                assert not name.startswith(FORBIDDEN), (path.name, name)
