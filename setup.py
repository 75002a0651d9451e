"""Package list only (the rest is pyproject.toml): ``conf/`` ships inside the wheel as ``stapo.conf``.

pyproject's ``packages.find`` cannot add a package whose folder sits outside its parent's, so the
discovered packages and the config groups (every folder under ``conf/``) are listed here.
"""

from setuptools import find_namespace_packages, find_packages, setup

CONFIG_PACKAGES = ["stapo.conf"] + [f"stapo.conf.{group}" for group in find_namespace_packages("conf")]

setup(
    packages=find_packages(include=["stapo*", "recipe*"]) + CONFIG_PACKAGES,
    package_dir={"stapo.conf": "conf"},
)
