"""Ship runners/ and configs/ inside the wheel (as dstui/bundled/) for non-editable installs.

The checkout keeps them at the top level, where users read and edit them; an editable install
uses them in place. A regular `pip install .` has no checkout to point at, so the build copies
both folders into the package, and :mod:`dstui.core.paths` falls back to that copy.
"""

import shutil
from pathlib import Path

from setuptools import setup
from setuptools.command.build_py import build_py

SHIPPED = ("runners", "configs")


class BuildWithRunnersAndConfigs(build_py):
    def run(self) -> None:
        super().run()
        if getattr(self, "editable_mode", False):
            return
        here = Path(__file__).resolve().parent
        for name in SHIPPED:
            shutil.copytree(
                here / name,
                Path(self.build_lib) / "dstui" / "bundled" / name,
                dirs_exist_ok=True,
                ignore=shutil.ignore_patterns("__pycache__", "*.pyc"),
            )


setup(cmdclass={"build_py": BuildWithRunnersAndConfigs})
