"""Packaging for tf_loss_scale: everything is declared in pyproject.toml.

Kept for tools that still call `setup.py`; `pip install .` reads the
metadata from pyproject.toml.
"""

import setuptools

setuptools.setup()
