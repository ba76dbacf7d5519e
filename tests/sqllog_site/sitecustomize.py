"""Puts the SQL log's recorder into every Python child of a recording (see tests/sqllog.py).

On ``PYTHONPATH`` only while ``EPISODIC_SQL_LOG`` records; loads ``tests/sqllog.py`` by its
path, so a child needs neither the ``tests`` package nor pytest.
"""

import importlib.util
import os
import sys
from pathlib import Path

if os.environ.get("SQLLOG_CHILD_DIR"):
    _path = Path(__file__).resolve().parent.parent / "sqllog.py"
    _spec = importlib.util.spec_from_file_location("_sqllog_child", _path)
    if _spec is not None and _spec.loader is not None:
        _module = importlib.util.module_from_spec(_spec)
        sys.modules["_sqllog_child"] = _module
        _spec.loader.exec_module(_module)
        _module.install_child()
