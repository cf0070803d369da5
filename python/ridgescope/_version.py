"""The version of ridgescope: the one place it is written. pyproject.toml reads it (setuptools'
``attr:``, statically) and CMakeLists.txt reads it at configure time (a regex over this file),
so the Python package, ``_C.VERSION``, libridgescope's SOVERSION and package config, and the
``ridgescope_version`` a C++ session writes into its trace all say the same. Imports nothing."""

__version__ = "0.1.0"
