"""What the Python tests of scripts/*.py share: loading a script as a module, running its main()
with its output captured, reading and writing small files. Standard library only."""
import importlib.util
import io
import os
from contextlib import redirect_stderr, redirect_stdout


def load_script(repo, name):
    """scripts/<name>.py of the repository at repo, as a module."""
    spec = importlib.util.spec_from_file_location(name, os.path.join(repo, "scripts", name + ".py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def run_main(main, argv):
    """(exit status, stdout, stderr) of main(argv), a SystemExit's code as its status."""
    out, err = io.StringIO(), io.StringIO()
    with redirect_stdout(out), redirect_stderr(err):
        try:
            rc = main(argv)
        except SystemExit as e:
            rc = e.code
    return rc, out.getvalue(), err.getvalue()


def read(path):
    with open(path) as fh:
        return fh.read()


def write(path, text):
    with open(path, "w") as fh:
        fh.write(text)
