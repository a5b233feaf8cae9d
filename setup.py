"""The one compiled module: Pillow's LANCZOS passes, vectorised (app/adapters/imaging/lanczos.py says why).

Optional: without a C compiler the package installs without it, and Pillow resamples everything.
Everything else about the package is in pyproject.toml.
"""

from setuptools import Extension, setup

setup(ext_modules=[Extension("app.adapters.imaging._lanczos", ["app/adapters/imaging/_lanczos.c"],
                             extra_compile_args=["-O3"], optional=True)])
