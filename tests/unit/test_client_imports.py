"""Layering: `client` imports only `protocol` (never `broker`), and never pulls in pyspark."""

import ast
import subprocess
import sys
from pathlib import Path

CLIENT = Path(__file__).resolve().parents[2] / "client"


def test_importing_client_loads_neither_broker_nor_pyspark():
    code = "import sys, client; print(sorted(m for m in sys.modules if m.split('.')[0] in ('broker', 'pyspark', 'deploy')))"
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, cwd=CLIENT.parent, check=True
    )
    assert out.stdout.strip() == "[]"


def test_client_modules_import_only_protocol_of_ours():
    for path in CLIENT.glob(
        "*.py"
    ):  # client/spark* belongs to the Spark source and may import more
        tree = ast.parse(path.read_text())
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                assert node.module.split(".")[0] not in ("broker", "deploy"), (
                    path.name,
                    node.module,
                )
            if isinstance(node, ast.Import):
                for alias in node.names:
                    assert alias.name.split(".")[0] not in ("broker", "deploy", "pyspark"), (
                        path.name,
                        alias.name,
                    )
