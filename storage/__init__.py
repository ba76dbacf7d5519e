"""Storage: SQLAlchemy models, engine setup, migrations, the pipeline lock and repositories.

This package's ``__init__`` imports nothing: its modules import from it (``from storage
import tx``), so an import here would be a package-init cycle (``tests/unit/test_layout.py``).
"""
