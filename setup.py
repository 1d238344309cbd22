"""Optional C extension (protocol/_record_walk.c): the produce path's per-record walk at C speed.

Everything else lives in pyproject.toml. optional=True: without a compiler the pure-Python walk in
protocol/record_walk.py is used. In a checkout: `python setup.py build_ext --inplace`."""

from setuptools import Extension, setup

setup(ext_modules=[
    Extension("protocol._record_walk", ["protocol/_record_walk.c"], optional=True, extra_compile_args=["-O2"]),
    Extension("protocol._codec", ["protocol/_codec.c"], optional=True, extra_compile_args=["-O2"]),
])
