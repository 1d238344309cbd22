"""Packages under one import namespace, and the optional C extensions (protocol/_record_walk.c, protocol/_codec.c,
protocol/_batch_scan.c, protocol/_produce.c, protocol/_frames.c).

Everything else lives in pyproject.toml. The repository keeps its top-level folders (broker/, storage/, ...); the
wheel installs them as kbroker.broker, kbroker.storage, ... so a user's site-packages gains no generic names.
optional=True: without a compiler the pure-Python twins are used. In a checkout: `python setup.py build_ext --inplace`.
"""

from setuptools import Extension, find_packages, setup

ROOTS = ["broker", "console", "coordinator", "storage", "protocol", "schema_registry", "spark_jobs"]

packages = ["kbroker", *find_packages(include=["kbroker_tools", "kbroker_tools.*"])]
for root in ROOTS:
    packages += [f"kbroker.{name}" for name in find_packages(include=[root, f"{root}.*"])]

setup(
    packages=packages,
    package_dir={"kbroker": "kbroker", **{f"kbroker.{root}": root for root in ROOTS}},
    # The console's pages ship as they are: no build step for users.
    package_data={"kbroker.console": ["static/*"]},
    ext_modules=[
        Extension("kbroker.protocol._record_walk", ["protocol/_record_walk.c"], optional=True,
                  extra_compile_args=["-O2"]),
        Extension("kbroker.protocol._codec", ["protocol/_codec.c"], optional=True, extra_compile_args=["-O2"]),
        Extension("kbroker.protocol._batch_scan", ["protocol/_batch_scan.c"], optional=True,
                  extra_compile_args=["-O2"]),
        Extension("kbroker.protocol._produce", ["protocol/_produce.c"], optional=True, extra_compile_args=["-O2"]),
        Extension("kbroker.protocol._frames", ["protocol/_frames.c"], optional=True, extra_compile_args=["-O2"]),
    ],
)
