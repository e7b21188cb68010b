"""Python that starts a new process as if the project venv's ``.pth`` line (scripts/setup) had
not deferred anything: the baseline of tests/fast/test_deferred_imports.py and
benchmarks/imports.py."""

UNDEFERRED = (
    "import sys\n"
    "sys.meta_path[:] = [f for f in sys.meta_path if type(f).__name__ != '_DeferredImports']\n"
    "sys.modules.pop('jsr_deferred', None)\n"
)
